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
    """``check(out, report)``: an audit run's null check, recomputed from its own scores."""
    import numpy as np
    import pandas as pd

    def check(out, r, splits: int = 20) -> None:
        """The null check is one random halving of the unseen sources, tested by an exact
        permutation test: it rejects with probability alpha whatever the files. On the run's
        own snippet scores, the run's split gives the report's p-value, and ``splits``
        halvings reject at most 3 times (1.6 % likely at a true 5 % were the splits
        independent; they share the files, so roughly); the verdict names a rejection."""
        from mia_ray.detectors.dataset_inference import file_matrix, null_check
        from mia_ray.pipelines.audit import design_of
        from mia_ray.pipelines.audit.config import AuditJobConfig

        snip = pd.read_parquet(out / "snippet_scores.parquet")
        rows = [("suspected", f) for f in r["files"]] + [("unseen", f) for f in r["unseen_files"]]
        files = pd.DataFrame(
            {
                "doc_id": [f"{s}/{f['file_id']}" for s, f in rows],
                "side": [int(s == "suspected") for s, _ in rows],
                "source": [f"{s}/{f['source']}" for s, f in rows],
            }
        ).sort_values("doc_id", ignore_index=True)
        assert len(files) == r["data"]["n_suspected"] + r["data"]["n_unseen"]
        X = snip[r["features"]["names"]].to_numpy(dtype=np.float64)
        F = file_matrix(snip["doc_id"].astype(str).to_numpy(), X, files["doc_id"].tolist())
        cfg = AuditJobConfig()
        cfg.audit.rounds = r["dataset_test"]["rounds"]
        design = design_of(files, F, cfg, nonneg=True)
        alpha, n_perm = r["null_check"]["alpha"], r["null_check"]["permutations"]
        p = [null_check(design, n_perm, k, alpha)["p_value"] for k in range(splits)]
        assert p[0] == r["null_check"]["p_value"]  # the run's own split, recomputed
        assert sum(x <= alpha for x in p) <= 3, p
        assert ("The null check rejects" in r["verdict"]["text"]) == r["null_check"]["reject"]

    return check


SNAPSHOTS = os.path.join(REPO, "tests", "snapshots")


def cpu_kind() -> str:
    """The CPU family a snapshot's last bits belong to ("" for the project's reference machine,
    an x86-64 with AMX). PyTorch's CPU kernels (oneDNN, MKL) choose their code paths by vendor
    and instruction set, so a model trained and scored on an AMD EPYC with AVX-512 and no AMX
    differs from the reference in the last bits of its floats (measured 2026-12-06: 85 audit
    and 269 attack numbers, with the code before and after a change alike)."""
    vendor, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        return "unknown"
    if "amx_tile" in flags:
        return ""
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "x86"
    return f"{vendor or 'cpu'}-{isa}"


# Keys whose values change from run to run by nature (clock, host, paths): left out.
_VOLATILE = ("created", "runtime", "timings", "seconds", "took", "elapsed", "per_s", "mb_s")


def report_numbers(report, prefix: str = "") -> dict:
    """Every number and flag of a report.json, flattened to ``{"a/b/0/c": value}``, without
    the clock's (keys named in ``_VOLATILE``)."""
    out = {}
    items = report.items() if isinstance(report, dict) else enumerate(report)
    for key, value in items:
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(key, str) and any(v in key.lower() for v in _VOLATILE):
            continue
        if isinstance(value, (dict, list)):
            out.update(report_numbers(value, path))
        elif isinstance(value, (bool, int, float)) or value is None:
            out[path] = value
    return out


@pytest.fixture
def numbers_of():
    """:func:`report_numbers`, for a test that compares two runs' reports."""
    return report_numbers


@pytest.fixture
def report_snapshot():
    """``check(report, name)``: the report's numbers are bit-for-bit those in
    ``tests/snapshots/<name>.json`` (``<name>.<cpu kind>.json`` on another CPU family, see
    :func:`cpu_kind`), taken before a refactoring (``MIA_RAY_SNAPSHOT=update`` writes it). A
    refactoring that changes a number fails here."""
    import json
    import math

    def check(report, name: str, ignore=lambda key: False) -> None:
        """``ignore(key)``: numbers that differ between two runs of the same code (measured:
        MemHunter's wall-clock-budgeted baselines), left out of the comparison."""
        kind = cpu_kind()
        path = os.path.join(SNAPSHOTS, f"{name}.{kind}.json" if kind else f"{name}.json")
        if not os.path.exists(path) and os.environ.get("MIA_RAY_SNAPSHOT") != "update":
            pytest.fail(
                f"no snapshot of {name} for this CPU family ({kind}): take one with the code "
                f"before the change, MIA_RAY_SNAPSHOT=update, into {path}"
            )
        numbers = {k: v for k, v in report_numbers(report).items() if not ignore(k)}
        if os.environ.get("MIA_RAY_SNAPSHOT") == "update":
            os.makedirs(SNAPSHOTS, exist_ok=True)
            with open(path, "w") as f:
                json.dump(numbers, f, indent=0, sort_keys=True)
        with open(path) as f:
            want = {k: v for k, v in json.load(f).items() if not ignore(k)}
        # Keys a change added that depend on a model's last bits, in a family's snapshot taken
        # on another family: left out until a host of that family takes it (update drops the
        # list).
        unmeasured = set(want.pop("_unmeasured", []))
        numbers = {k: v for k, v in numbers.items() if k not in unmeasured}

        def same(a, b) -> bool:
            nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
            return a == b or nan

        diff = {k: (want.get(k), numbers.get(k)) for k in set(want) | set(numbers)
                if not same(want.get(k, "missing"), numbers.get(k, "missing"))}  # fmt: skip
        assert not diff, (
            f"{len(diff)} numbers differ from the snapshot: {dict(list(diff.items())[:10])}"
        )

    return check


@pytest.fixture
def sample_by_hand():
    """``(model, tokenizer, prompt, n, max_tokens, seed, top_k) -> n texts``: the local
    backend's sampling rule written out for one request alone, every step a full forward
    without cache or padding: its generator, seeded with its seed, draws an (n, top_k)
    exponential race each step over the top_k likeliest tokens (likeliest first), each row
    takes the token of largest p / E (token i with probability p_i), a row ends at EOS."""
    import torch

    def sample(model, tok, prompt, n, max_tokens, seed, top_k):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        g, rows = torch.Generator().manual_seed(seed), torch.tensor([ids] * n)
        with torch.inference_mode():
            for _ in range(max_tokens):
                top, token = model(input_ids=rows).logits[:, -1].float().topk(top_k, dim=-1)
                probs = torch.softmax(top, dim=-1)
                race = torch.empty_like(probs).exponential_(generator=g)
                pick = token.gather(-1, (probs / race).argmax(-1, keepdim=True))
                rows = torch.cat([rows, pick], 1)
        eos, out = tok.eos_token_id, []
        for new in rows[:, len(ids) :].tolist():
            out.append(tok.decode(new[: new.index(eos)] if eos in new else new))
        return out

    return sample
