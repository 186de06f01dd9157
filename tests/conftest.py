import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance for the whole session (the `ray` tier)."""
    import ray

    from mia_ray.runtime import configure_data_context, connect

    connect(address="", num_cpus=2)
    configure_data_context(no_progress_timeout_s=600, progress=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def test_world(tmp_path_factory):
    """The small demo world (scale ``test``: tiny, tiny-ref, tiny-random), built once per session.

    Built under a session temp dir, or under ``$MIA_RAY_TEST_WORLD`` when set, so that reruns
    reuse it. Returns ``ensure_world``'s dict (paths of documents, books, manifest, models).
    """
    from mia_ray.config import WorldConfig
    from mia_ray.demo.world import ensure_world

    root = os.environ.get("MIA_RAY_TEST_WORLD") or str(tmp_path_factory.mktemp("world-test"))
    cfg = WorldConfig(root=root, scale="test", seed=0, target="tiny")
    return ensure_world(cfg, ["tiny", "tiny-random"], num_cpus=2)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def run_notebook(monkeypatch):
    """``run_notebook(name, run_dir)`` executes ``notebooks/<name>`` on ``run_dir`` (through
    ``MIA_RAY_RUN``, as a user would) and returns ``(notebook, text of every output)``."""
    import nbformat
    from nbclient import NotebookClient

    def execute(name: str, run_dir, timeout: int = 300, cwd: str = ""):
        monkeypatch.setenv("MIA_RAY_RUN", str(run_dir))
        nb = nbformat.read(os.path.join(REPO, "notebooks", name), as_version=4)
        resources = {"metadata": {"path": cwd}} if cwd else {}
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources=resources).execute()
        text = "".join(
            o.get("text", "") + o.get("data", {}).get("text/plain", "")
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.outputs
        )
        return nb, text

    return execute


@pytest.fixture
def null_check_calibrated():
    """``check(out, report)``: an audit run's null check is calibrated on its own scores."""
    import numpy as np
    import pandas as pd

    def check(out, r, splits: int = 20) -> None:
        """The null check is one random halving of the unseen files: under a calibrated test it
        rejects at most 5 % of the time, so one run's rejection can be chance (the demo world is
        trained anew on each machine; on one it rejected, at p = 0.047). Its calibration is what
        holds: on the run's own snippet scores, ``splits`` halvings (the run's first) reject at
        most 3 times (1.6 % likely at a true 5 % were the splits independent; they share the
        files, so roughly), and a rejection puts a caution in the verdict."""
        from mia_ray.detectors.dataset_inference import LinearFeatureScorer, null_check

        snip = pd.read_parquet(out / "snippet_scores.parquet")
        units = snip["doc_id"].astype(str).to_numpy()
        X = snip[r["features"]["names"]].to_numpy(dtype=np.float64)
        unseen = sorted({u for u in units if u.startswith("unseen/")})
        assert len(unseen) == r["data"]["n_unseen"]
        rounds, alpha = r["dataset_test"]["rounds"], r["null_check"]["alpha"]
        p = [
            null_check(units, X, unseen, LinearFeatureScorer, range(k, k + rounds), k, alpha)
            for k in range(splits)
        ]
        p = [x["p_value"] for x in p]
        assert p[0] == r["null_check"]["p_value"]  # the run's own split, recomputed
        assert sum(x < alpha for x in p) <= 3, p
        caution = "Caution: the null check rejects" in r["verdict"]["text"]
        assert caution == r["null_check"]["reject"]

    return check
