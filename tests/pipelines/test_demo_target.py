"""The shipped demo job on the demo world itself (not the test world): the acceptance numbers.

Builds the demo world once (about 10 minutes on 2 cores) into $MIA_RAY_HOME, the same
place `make demo` uses, so a machine that ran the demo reuses it.
"""

import json

import pytest

from mia_ray.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _run(out, target):
    code = main(
        [
            "attack",
            "--config",
            "jobs/attack_demo.yaml",
            "--set",
            f"world.target={target}",
            "--set",
            "eval.bootstrap=1000",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return json.loads((out / "report.json").read_text())


def test_demo_tiny_target_loss_auc_at_least_0_9(tmp_path, ray_local):
    report = _run(tmp_path / "tiny", "tiny")
    assert report["data"]["n_members"] >= 100 and report["data"]["n_nonmembers"] >= 100
    assert report["metrics"]["loss"]["auc"] >= 0.9


def test_demo_untrained_target_every_attack_ci_contains_half(tmp_path, ray_local):
    report = _run(tmp_path / "random", "tiny-random")
    for name in ["loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "ref"]:
        lo, hi = report["metrics"][name]["auc_ci"]
        assert lo <= 0.5 <= hi, (name, report["metrics"][name])
