"""The leakage survey's inputs: the demo crawl, the paths it reads, the scanner pool it fits in."""

from __future__ import annotations

from pathlib import Path

from mia_ray.errors import MiaError
from mia_ray.pipelines.common import log
from mia_ray.pipelines.leakage.config import LeakageJobConfig

# Bumped when a scanned shard's rows change shape or meaning (2: the ``words`` column), so a
# rerun rescans rather than read rows of another format.
SCAN_FORMAT = 2


def resolve_inputs(cfg: LeakageJobConfig) -> LeakageJobConfig:
    """``crawl.demo``: a copy of ``cfg`` on the demo world's crawl, its truth, books and
    benchmark."""
    if not cfg.crawl.demo:
        return cfg
    import copy

    from mia_ray.demo.world import ensure_world

    cfg = copy.deepcopy(cfg)
    log(f"demo crawl in the world at {cfg.world.resolved_root()}")
    info = ensure_world(cfg.world, [], crawl=True)["crawl"]
    cfg.crawl.shards = cfg.crawl.shards or info["shards"]
    cfg.crawl.truth = cfg.crawl.truth or info["planted"]
    cfg.scan.copyright = cfg.scan.copyright or [info["books_dir"]]
    cfg.scan.benchmark = cfg.scan.benchmark or [info["benchmark"]]
    span = info["meta"]["settings"]
    cfg.scan.copyright_span = min(cfg.scan.copyright_span, span["span_words"])
    cfg.scan.benchmark_span = min(cfg.scan.benchmark_span, span["bench_span_words"])
    return cfg


def check_paths(cfg: LeakageJobConfig) -> None:
    for what, paths in (
        ("crawl.shards", cfg.crawl.shards),
        ("scan.copyright", cfg.scan.copyright),
        ("scan.benchmark", cfg.scan.benchmark),
    ):
        for p in paths:
            if not Path(p).expanduser().exists():
                raise MiaError(f"{what}: {p} not found")
    if cfg.crawl.truth and not Path(cfg.crawl.truth).is_file():
        raise MiaError(f"crawl.truth: {cfg.crawl.truth} not found")
    names = [Path(p).name for p in cfg.crawl.shards]
    if len(set(names)) != len(names):
        raise MiaError(
            "crawl.shards: two shards have the same file name; findings name shards by it"
        )


def check_pool_fits(cfg: LeakageJobConfig) -> None:
    """Refuse a scanner pool that holds every CPU: Ray Data's read tasks would then wait for
    a CPU forever (until its no-progress timeout) while the actors wait for their input."""
    from mia_ray.runtime import cluster_cpus

    s, total = cfg.scan, cluster_cpus()
    if total - s.workers * s.cpus_per_worker < 1:
        raise MiaError(
            f"scan.workers x scan.cpus_per_worker = {s.workers} x {s.cpus_per_worker:g} CPUs of "
            f"the cluster's {total:g} leaves less than one CPU for Ray Data to read the shards "
            "with, so the scan would never start; lower scan.cpus_per_worker (e.g. 0.5) or "
            "scan.workers"
        )
