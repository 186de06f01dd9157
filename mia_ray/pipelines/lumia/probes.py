"""One probe per layer and kind (Ray tasks in parallel), each layer's result a json stage."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.errors import MiaError
from mia_ray.pipelines.common import (
    log,
)
from mia_ray.pipelines.lumia.baselines import FPR
from mia_ray.pipelines.lumia.config import LumiaJobConfig
from mia_ray.stages import reuse_json, save_json


def probe_task(X, y, groups, splits, kinds, seed, val_fraction, mlp_params):
    from mia_ray.detectors.probes import probe_layer

    return probe_layer(
        X,
        y,
        groups,
        splits,
        kinds=kinds,
        fprs=(FPR,),
        val_fraction=val_fraction,
        seed=seed,
        mlp_params=mlp_params,
    )


def train_probes(
    cfg: LumiaJobConfig, parts: list[Path], meta: pd.DataFrame, splits, out: Path, fp: str
) -> tuple[dict[str, dict], float]:
    """Per layer column, the probe results (``probe_layer``'s dict); cached per layer."""
    import pyarrow.parquet as pq
    import ray

    from mia_ray.actors.activations import load_layer, parse_column
    from mia_ray.runtime import ray_options

    names = [c for c in pq.read_schema(parts[0]).names if parse_column(c)]
    names.sort(key=lambda c: (parse_column(c)[0] != "vision", parse_column(c)))
    p = cfg.probe
    mlp_params = {
        "hidden": p.hidden,
        "dropout": p.dropout,
        "lr": p.lr,
        "max_epochs": p.max_epochs,
        "patience": p.patience,
        "batch_size": p.batch_size,
    }
    y = meta["label"].to_numpy()
    groups = meta["doc_id"].to_numpy()
    order = pd.Series(np.arange(len(meta)), index=meta["snippet_id"])
    # Each task gets its layer's arrays (object store) and returns its result: no files.
    task = ray.remote(probe_task).options(**ray_options(cfg.resources, p.cpus_per_task))
    results: dict[str, dict] = {}
    pending: dict[Any, str] = {}
    t0 = time.time()
    for name in names:
        got = reuse_json(out, f"probes/{name}", fp)
        if got is not None:
            results[name] = got
            continue
        ids, X = load_layer(parts, name)
        if len(ids) != len(meta) or set(ids) != set(meta["snippet_id"]):
            raise MiaError(f"activations of {len(ids)} samples for {len(meta)} samples: rerun")
        X = X[np.argsort(order[ids].to_numpy())]  # rows in meta's (sorted id) order
        ref = task.remote(
            ray.put(X), y, groups, splits, list(p.kinds), p.seed, p.val_fraction, mlp_params
        )
        pending[ref] = name
        if not p.parallel:
            collect_layer(pending, results, out, fp, len(names))
    while pending:
        collect_layer(pending, results, out, fp, len(names))
    if len(results) < len(names):
        raise MiaError("probe training lost layers: rerun to resume")
    log(f"probes: {len(names)} layers done in {time.time() - t0:.1f} s")
    return {n: results[n] for n in names}, time.time() - t0


def collect_layer(pending: dict, results: dict, out: Path, fp: str, total: int) -> None:
    """The next finished layer's probes, kept as the stage ``probes/<layer>``."""
    import ray

    ready, _ = ray.wait(list(pending), num_returns=1)
    for ref in ready:
        name = pending.pop(ref)
        results[name] = save_json(out, f"probes/{name}", fp, ray.get(ref))
        log(f"probes: {len(results)}/{total} layers ({name})")
