"""`mia-ray memhunter`: one run (``single``), or a sweep of runs (``sweep``)."""

from __future__ import annotations

import copy
from pathlib import Path

from mia_ray.config import MemHunterJobConfig
from mia_ray.pipelines.memhunter.single import run_one
from mia_ray.pipelines.memhunter.sweep import run_sweep
from mia_ray.registry import pipeline


@pipeline("memhunter", MemHunterJobConfig, help="MemHunter: extract memorized text, test a dataset")
def run(cfg: MemHunterJobConfig, out: Path) -> dict:
    if cfg.sweep.datasets:
        return run_sweep(copy.deepcopy(cfg), out)
    return run_one(copy.deepcopy(cfg), out)
