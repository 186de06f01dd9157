"""The leakage survey's inputs: the demo crawl, the paths it reads, the scanner pool it fits in."""

from __future__ import annotations

from pathlib import Path

from mia_ray.errors import MiaError
from mia_ray.pipelines.common import log
from mia_ray.pipelines.leakage.config import LeakageJobConfig

# Bumped when a scanned shard's rows change shape or meaning (2: the ``words`` column; 3:
# parts written by the scanners), so a rerun rescans rather than read rows of another format.
SCAN_FORMAT = 3


def resolve_inputs(cfg: LeakageJobConfig) -> LeakageJobConfig:
    """``crawl.demo``: a copy of ``cfg`` on the demo world's crawl, its truth, books and
    benchmark."""
    if not cfg.crawl.demo or cfg.world.resolved:
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
    cfg.world.resolved = "crawl"  # resolved once: resolving again keeps these shards
    return cfg


def check_paths(cfg: LeakageJobConfig) -> list:
    """Every input listed (a local path, a shared folder, object storage, globs); returns the
    crawl's shards as :func:`shard_sources` gives them."""
    from mia_ray.data.sources import resolve_source, shard_sources

    for what, paths in (
        ("scan.copyright", cfg.scan.copyright),
        ("scan.benchmark", cfg.scan.benchmark),
    ):
        for p in paths:
            try:
                resolve_source(p)
            except MiaError as e:
                raise MiaError(f"{what}: {e}") from None
    if cfg.crawl.truth and not Path(cfg.crawl.truth).is_file():
        raise MiaError(f"crawl.truth: {cfg.crawl.truth} not found")
    try:
        return shard_sources(cfg.crawl.shards)
    except MiaError as e:
        msg = str(e)
        raise MiaError(msg if msg.startswith("crawl.shards") else f"crawl.shards: {msg}") from None


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
