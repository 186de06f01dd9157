"""Hidden states per layer (mean over tokens) of every sample, from one pass of ActivationReader actors: a parts stage."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from mia_ray.pipelines.lumia.config import LumiaJobConfig
from mia_ray.stages import parts_key, parts_stage


def extract_activations(
    cfg: LumiaJobConfig, meta: pd.DataFrame, out: Path, token_stats: bool
) -> tuple[list[Path], float, str]:
    """Activation parts, the seconds they took, and the fingerprint they were keyed on.
    With ``token_stats`` the parts also hold the target's token statistics for the classic
    attacks, from the same forward pass (one target pass per sample in all)."""
    import ray

    from mia_ray import storage
    from mia_ray.actors import BATCH
    from mia_ray.actors.activations import ActivationReader
    from mia_ray.models.identity import tree_sha256
    from mia_ray.runtime import ray_options
    from mia_ray.scoring.pools import scorer_key

    res = cfg.resources
    cols = ["snippet_id", "text"] + (["image"] if "image" in meta else [])
    rows = meta[cols]
    inputs = {
        # The model by content (retrained in place = new activations), dtype and device.
        "model": scorer_key(cfg.model, res),
        "max_length": cfg.model.max_length,
        # An image file rewritten under the same name changes the activations too.
        "images": [tree_sha256(p) for p in meta["image"]] if "image" in meta else None,
        "token_stats": token_stats,
    }

    # The model folder and the images are on the driver's disk: the readers get the model
    # through storage and each image's bytes, read on the driver's node (on one node: paths).
    model = storage.stage(cfg.model.name_or_path)
    pinned = storage.node_affinity()

    def mapper(todo):
        cols = ["snippet_id", "text", BATCH] + (["image"] if "image" in meta else [])
        todo = todo.select_columns(cols)
        if "image" in meta and pinned:
            todo = todo.map_batches(read_images, batch_format="pandas", **pinned)
        return todo.map_batches(
            ActivationReader,
            fn_constructor_kwargs={
                "model": model,
                "device": cfg.model.device,
                "dtype": cfg.model.dtype,
                "max_length": cfg.model.max_length,
                "revision": cfg.model.revision,
                "trust_remote_code": cfg.model.trust_remote_code,
                "torch_threads": res.scorer.threads(),
                "token_stats": token_stats,
            },
            batch_size=None,  # whole blocks of whole model batches (model_blocks)
            batch_format="pandas",
            compute=ray.data.ActorPoolStrategy(size=res.scorer.actors),
            **ray_options(res, res.scorer.cpus, res.scorer.gpus),
        )

    t0 = time.time()
    parts = parts_stage(
        out, "activations", rows, mapper, cfg.model.batch_size, inputs=inputs, load=False
    )
    return parts, time.time() - t0, parts_key(rows, cfg.model.batch_size, inputs)


def read_images(batch: pd.DataFrame) -> pd.DataFrame:
    """The ``image`` column's paths -> the files' bytes (in a task on the driver's node)."""
    return batch.assign(image=[Path(p).read_bytes() for p in batch["image"]])
