"""`mia-ray memhunter`: one run (``single``), or a sweep of runs (``sweep``)."""

from __future__ import annotations

import copy
from pathlib import Path

from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
from mia_ray.pipelines.memhunter.inputs import resolve_inputs
from mia_ray.pipelines.memhunter.single import run_one
from mia_ray.pipelines.memhunter.sweep import run_sweep
from mia_ray.registry import pipeline


def resolve(cfg: MemHunterJobConfig) -> MemHunterJobConfig:
    """One run's config as it will run (a sweep's cells resolve their own)."""
    return cfg if cfg.sweep.datasets else resolve_inputs(cfg)


@pipeline(
    "memhunter",
    MemHunterJobConfig,
    help="MemHunter: extract memorized text, test a dataset",
    resolve=resolve,
)
def run(cfg: MemHunterJobConfig, out: Path) -> dict:
    if cfg.sweep.datasets:
        return run_sweep(copy.deepcopy(cfg), out)
    return run_one(copy.deepcopy(cfg), out)
