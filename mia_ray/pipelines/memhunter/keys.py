"""What MemHunter's stages are keyed on: the target, the hunter and its adapter by content, the pairs' tokens, how a context is scored."""

from __future__ import annotations

import pandas as pd

from mia_ray.models.identity import model_key, tree_sha256
from mia_ray.pipelines.common import (
    fingerprint,
)
from mia_ray.pipelines.memhunter.config import MemHunterJobConfig

# How a context is built and scored; part of every cache key, so that rows cached by code
# that built contexts otherwise (before the BOS went in front of p + x) are never reused.
SCORING = "context=bos+prompt+x; mu=LCSS/|y| on tokens; loss=mean NLL of y; v2"


def target_key(cfg: MemHunterJobConfig, path: str | None = None) -> str:
    """A model the target pool loads (the target, or ``path``), by content, with the dtype
    and device it resolves to in the pool's actors."""
    return model_key(cfg.model, cfg.resources.scorer.gpus > 0, path)


def hunter_key(cfg: MemHunterJobConfig) -> str:
    """The hunter LM, loaded in the driver with the target's device and ``dtype: auto``."""
    from types import SimpleNamespace

    from mia_ray.models.hf import pick_device

    loads = SimpleNamespace(name_or_path=cfg.hunter.model, dtype="auto", device=cfg.model.device)
    return model_key(loads, pick_device(cfg.model.device) == "cuda")


def adapter_key(adapter: str) -> str:
    return tree_sha256(adapter) if adapter else ""


def pairs_key(part: pd.DataFrame) -> str:
    """The pairs by content: ids, x's text (the hunter reads it) and the token ids."""
    return fingerprint(
        [str(p) for p in part["pair_id"]],
        [str(x) for x in part["x"]],
        [[int(t) for t in v] for v in part["x_ids"]],
        [[int(t) for t in v] for v in part["y_ids"]],
    )


def extraction_key(cfg, adapter: str) -> str:
    """What decides extraction's prompts and scores, but the pairs: the hunter (base weights
    and adapter by content, its sampling options), the target by content, the seed, the k."""
    h = cfg.hunter
    return fingerprint(sorted(set(cfg.extraction.trials)), cfg.extraction.seed, h.prompt_tokens,
                       h.sample_top_k, h.sample_temperature, h.separator, h.max_x_tokens,
                       adapter_key(adapter), hunter_key(cfg), target_key(cfg),
                       SCORING)  # fmt: skip
