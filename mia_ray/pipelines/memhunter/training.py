"""The hunter's training (Algorithm 1) as MemHunter runs it: LoRA fine-tunes as Ray tasks that put their adapter into storage."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pandas as pd

from mia_ray import storage
from mia_ray.actors.target import TargetPool
from mia_ray.pipelines.common import (
    fingerprint,
    log,
)
from mia_ray.pipelines.memhunter.keys import SCORING, hunter_key, pairs_key, target_key
from mia_ray.runtime import ray_options


def finetune_task(model, adapter_in, rows, root, rel, spec, seed, xs, separator, max_x, threads):
    """One iteration's LoRA fine-tune of the hunter, on whichever node Ray gives it: it trains
    into a temp folder of that node and puts the adapter into storage (``root``/``rel``, its
    completion marker last); the driver pulls it from there. Returns the training record."""
    from mia_ray.train.hunter import finetune_hunter

    tmp = tempfile.mkdtemp(prefix="mia-hunter-adapter-")
    try:
        record = finetune_hunter(
            model, adapter_in, rows, tmp, spec, seed, xs, separator, max_x, threads
        )
        storage.open_storage(root).put_dir(tmp, rel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def hunter_dir(cfg, out: Path, train: pd.DataFrame) -> tuple[Path, dict]:
    """Where the hunter's iterations are checkpointed, and what that folder is keyed on. The
    hunter learns from the target's scores: other weights at the same paths (target or
    hunter), or other training pairs, train a new hunter beside the old one."""
    identity = {"target": target_key(cfg), "hunter": hunter_key(cfg), "scoring": SCORING,
                "pairs": pairs_key(train)}  # fmt: skip
    return out / "hunter" / fingerprint(identity), identity


def train_the_hunter(cfg, hunter, target: TargetPool, pairs: pd.DataFrame, out: Path) -> dict:
    import ray

    from mia_ray.train.hunter import train_hunter

    h = cfg.hunter
    spec = h
    train = pairs[pairs["split"] == "train"]
    xs = dict(zip(train["pair_id"], train["x"], strict=True))
    task = ray.remote(finetune_task).options(
        **ray_options(cfg.resources, cfg.resources.trainer.cpus, cfg.resources.trainer.gpus),
        # A fine-tune whose node died runs again elsewhere (Ray's retries of system
        # failures): it writes only its own temp folder, then storage, marker last.
        max_retries=3,
    )
    threads = cfg.resources.trainer.threads()
    ws = storage.workspace_of(out)

    def finetune(adapter_in, rows, out_dir, seed):
        rel = storage.inside(out_dir, ws.local)
        record = ray.get(
            task.remote(
                storage.for_remote(h.model), storage.for_remote(adapter_in), rows, ws.url(), rel, spec, seed, xs,
                h.separator, h.max_x_tokens, threads,
            )
        )  # fmt: skip
        ws.pull(rel)  # the adapter, into out_dir
        return record

    d, identity = hunter_dir(cfg, out, train)
    log(f"hunter: training on {len(train)} pairs, {h.iterations} iterations ({d})")
    return train_hunter(hunter, target.score, finetune, train, d, spec, identity=identity)
