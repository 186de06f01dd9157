"""CopyCheck's black-box variant end to end on the test world, through real HTTP on loopback."""

import json

import numpy as np
import pandas as pd
import pytest

from mia_ray.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.slow]
N_UNSEEN = [2, 4]


def _args(test_world, out, *extra):
    return [
        "copycheck", "--config", "jobs/copycheck_blackbox_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        "--set", "experiment.n_suspected=10", "--set", "experiment.n_unseen=8",
        "--set", f"experiment.n_unseen_in_suspected={N_UNSEEN}",
        "--set", "data.snippet_size=48", "--set", "data.max_snippets_per_doc=2",
        *extra, "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local, test_world):
    out = tmp_path_factory.mktemp("copycheck-blackbox") / "run"
    assert main(_args(test_world, out)) == 0
    return out, json.loads((out / "report.json").read_text())


def test_report_has_copychecks_results_and_files_keys(run):
    _, report = run
    assert {"results", "files", "summary"} <= set(report)
    methods = {"gmm", "hierarchical", "kmeans", "isolation_forest", "one_class_svm", "dbscan"}
    assert {(r["method"], r["n_unseen"]) for r in report["results"]} == {
        (m, n) for m in methods for n in N_UNSEEN
    }
    for r in report["results"]:
        assert r["tp"] + r["fp"] + r["fn"] + r["tn"] == 10
    assert len(report["files"]) == 10 * len(N_UNSEEN)
    assert {f["verdict"] for f in report["files"]} <= {"seen", "unseen"}
    assert report["finetune"]["records"] == []  # nothing was fine-tuned
    assert any("Black-box sampler" in n and "openai backend at http://127.0.0.1:" in n
               for n in report["notes"])  # fmt: skip


def test_ten_prompts_per_snippet_give_p1_from_the_two_answers(run, test_world):
    from mia_ray.backends import LoglikRequest
    from mia_ray.backends.local import LocalHFBackend
    from mia_ray.models.prompt import BLACKBOX_PROMPTS, blackbox_p1

    out, _ = run
    table = pd.read_parquet(out / "uncertainty.parquet")
    assert table["p_blackbox"].map(len).eq(10).all()
    # Snippets were cropped so that every prompt fits the test tiny's 128 positions (the
    # server, like a real API, refuses a longer one); the text as prompted is kept.
    files = sorted((out / "samples" / "blackbox").glob("*/frame.parquet"))
    assert len(files) == len(N_UNSEEN)  # one stage per experiment: its suspected snippets
    assert all(json.loads((f.parent / ".complete.json").read_text())["key"] == f.parent.name
               for f in files)  # fmt: skip
    asked = pd.concat(pd.read_parquet(f) for f in files).drop_duplicates("snippet_id")
    asked = asked.set_index("snippet_id")
    snippets = pd.read_parquet(out / "snippets.parquet").set_index("snippet_id")
    local = LocalHFBackend(test_world["targets"]["tiny"]["model"], device="cpu")
    ids = lambda s: local.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    cropped = 0
    for sid, text in asked["text"].items():
        assert snippets.loc[sid, "text"].startswith(text)
        cropped += text != snippets.loc[sid, "text"]
        assert max(len(ids(t.format(text=text) + " 0")) for t in BLACKBOX_PROMPTS) < 128
    assert cropped > 0
    # The HTTP path gave what the model itself gives: recompute two snippets locally.
    for sid, p in zip(table["snippet_id"][:2], table["p_blackbox"][:2], strict=True):
        text = asked.loc[sid, "text"]
        want = []
        for t in BLACKBOX_PROMPTS:
            r0, r1 = local.loglikelihood(
                [LoglikRequest(t.format(text=text), " 0"), LoglikRequest(t.format(text=text), " 1")]
            )
            want.append(blackbox_p1(r0.total, r1.total))
        np.testing.assert_allclose(p, want, rtol=0, atol=1e-4)
    assert blackbox_p1(0.0, 0.0) == 0.5 and blackbox_p1(np.log(0.2), np.log(0.6)) == pytest.approx(
        0.75
    )


def test_rerun_sends_nothing_and_gives_the_same_verdicts(run, test_world, tmp_path, capfd):
    out, report = run
    # A new run folder with the old answers' cache: every prompt comes back from the cache.
    again = tmp_path / "again"
    (again / "backend-cache").parent.mkdir(parents=True)
    import shutil

    shutil.copytree(out / "backend-cache", again / "backend-cache")
    capfd.readouterr()
    assert main(_args(test_world, again)) == 0
    err = capfd.readouterr().err
    assert "blackbox: 0 HTTP requests" in err
    second = json.loads((again / "report.json").read_text())
    assert second["results"] == report["results"] and second["files"] == report["files"]


def test_the_local_backend_gives_what_the_http_path_gave(run, test_world, tmp_path):
    out, report = run
    local = tmp_path / "local"
    extra = ["--set", "backend.kind=local", "--set", "backend.serve=false"]
    assert main(_args(test_world, local, *extra)) == 0
    a = pd.read_parquet(out / "uncertainty.parquet").set_index(["experiment", "snippet_id"])
    b = pd.read_parquet(local / "uncertainty.parquet").set_index(["experiment", "snippet_id"])
    np.testing.assert_allclose(
        np.stack(b.loc[a.index, "p_blackbox"].to_numpy()),
        np.stack(a["p_blackbox"].to_numpy()),
        rtol=0,
        atol=1e-4,
    )
    again = json.loads((local / "report.json").read_text())
    assert not (local / "backend-cache").exists()  # nothing went over HTTP
    assert [r["method"] for r in again["results"]] == [r["method"] for r in report["results"]]


def test_a_served_or_local_target_is_keyed_by_its_weights_not_its_path(test_world, tmp_path):
    import shutil
    from pathlib import Path

    from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig
    from mia_ray.pipelines.copycheck.sampling import blackbox_spec

    def spec(model, **backend):
        cfg = CopyCheckJobConfig()
        cfg.model.name_or_path = str(model)
        for k, v in backend.items():
            setattr(cfg.backend, k, v)
        return blackbox_spec(cfg, tmp_path)

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        shutil.copytree(test_world["model"], d)
    served, local = spec(a, kind="openai", serve=True), spec(a, kind="local")
    # The same weights elsewhere are the same model: the answers cached for one serve both.
    assert served["cache_scope"] == spec(b, kind="openai", serve=True)["cache_scope"]
    assert str(a) not in served["cache_scope"] and local["model_key"] == spec(b)["model_key"]
    # New weights at the same path are another model: asked afresh.
    donor = Path(test_world["targets"]["tiny-random"]["model"]) / "model.safetensors"
    shutil.copy(donor, a / "model.safetensors")
    assert spec(a, kind="openai", serve=True)["cache_scope"] != served["cache_scope"]
    assert spec(a, kind="local")["model_key"] != local["model_key"]
    # A remote API's weights are not ours to hash: its endpoint and model name key it.
    assert spec(a, kind="openai", base_url="http://x/v1")["model_key"] == ""


def test_report_numbers_match_the_snapshot(run, report_snapshot):
    report_snapshot(run[1], "copycheck-blackbox")
