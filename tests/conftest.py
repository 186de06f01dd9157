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
