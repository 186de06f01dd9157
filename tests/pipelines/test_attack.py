"""The attack pipeline end to end on the test world: planted signal found, none invented."""

import json

import pandas as pd
import pytest

from mia_ray.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ATTACKS = ["loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "ref"]


def _args(test_world, target, out):
    return [
        "attack", "--config", "jobs/attack_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        "--set", f"world.target={target}", "--set", "eval.bootstrap=500", "--out", str(out),
    ]  # fmt: skip


def _attack(tmp_path, test_world, target, name):
    out = tmp_path / name
    assert main(_args(test_world, target, out)) == 0
    return out, json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, ray_local, test_world):
    import mia_ray.pipelines.common as common

    saved, common.PART_ROWS = common.PART_ROWS, 40  # several part files, to test resuming
    try:
        return _attack(tmp_path_factory.mktemp("runs"), test_world, "tiny", "tiny")
    finally:
        common.PART_ROWS = saved


def test_report_has_every_attack_with_ci_and_tpr(tiny_run):
    out, report = tiny_run
    for name in ATTACKS:
        m = report["metrics"][name]
        assert 0.0 <= m["auc"] <= 1.0
        lo, hi = m["auc_ci"]
        assert lo <= m["auc"] <= hi
        assert set(m["tpr_at_fpr"]) == {"0.001", "0.01", "0.05"}
    assert 0.0 <= report["blind_baseline"]["auc"] <= 1.0
    assert {o["n"] for o in report["ngram_overlap"]} == {7, 13}
    assert (out / "report.html").read_text().count("<img") >= 1
    assert (out / "config.yaml").exists()
    # Per-row results are what the numbers came from: recompute LOSS AUC from them.
    from sklearn.metrics import roc_auc_score

    docs = pd.read_parquet(out / "document_scores.parquet")
    assert roc_auc_score(docs["label"], docs["loss"]) == pytest.approx(
        report["metrics"]["loss"]["auc"]
    )


def test_loss_finds_members_of_a_memorising_target(tiny_run):
    _, report = tiny_run
    assert report["metrics"]["loss"]["auc"] >= 0.9


def test_interrupted_scoring_resumes_with_identical_numbers(tmp_path, test_world, tiny_run, capsys):
    out, report = tiny_run
    parts = sorted((out / "rows" / "target").glob("part-*.parquet"))
    assert len(parts) >= 2
    lost = len(pd.read_parquet(parts[-1]))
    total = sum(len(pd.read_parquet(p)) for p in parts)
    parts[-1].unlink()  # as if the run had stopped before its last part was written
    code = main(_args(test_world, "tiny", out))
    assert code == 0
    assert f"target: reusing {total - lost} of {total} rows" in capsys.readouterr().err
    again = json.loads((out / "report.json").read_text())
    assert again["metrics"] == report["metrics"]


def test_no_signal_invented_on_an_untrained_model(tmp_path, ray_local, test_world):
    _, report = _attack(tmp_path, test_world, "tiny-random", "random")
    for name in ATTACKS:
        lo, hi = report["metrics"][name]["auc_ci"]
        assert lo <= 0.5 <= hi, (name, report["metrics"][name]["auc"], lo, hi)
