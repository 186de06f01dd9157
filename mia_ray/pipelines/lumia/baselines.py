"""What the probes are compared with: the classic attacks from the same pass, the blind baseline, on the same folds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.errors import MiaError
from mia_ray.pipelines.common import (
    log,
)
from mia_ray.pipelines.lumia.config import LumiaJobConfig

FPR = 0.01  # the report's TPR@FPR point (the paper reports AUC only)


def fold_metrics(scores, y: np.ndarray, splits) -> dict[str, Any]:
    """AUC and TPR@1%FPR on each repeat's test part: mean and std over repeats. ``scores``:
    one (n,) array for every repeat, or a list of (n,) arrays, one per repeat."""
    from mia_ray.stats.metrics import roc_auc, tpr_at_fpr

    per = scores if isinstance(scores, list) else [scores] * len(splits)
    tests = [test for _, test in splits]
    aucs = [roc_auc(s[t], y[t]) for s, t in zip(per, tests, strict=True)]
    tprs = [tpr_at_fpr(s[t], y[t], FPR) for s, t in zip(per, tests, strict=True)]
    return {
        "auc": float(np.mean(aucs)),
        "auc_std": float(np.std(aucs, ddof=1)) if len(aucs) > 1 else 0.0,
        "auc_repeats": [float(a) for a in aucs],
        "tpr_at_1pct_fpr": float(np.mean(tprs)),
    }


def baseline_attacks(cfg: LumiaJobConfig) -> list[str]:
    return [a for a in cfg.attacks if a != "ref" or cfg.model.reference]


def baselines_of(
    cfg: LumiaJobConfig, meta: pd.DataFrame, splits, out: Path, parts: list[Path]
) -> dict[str, dict]:
    """The classic attacks on the same samples and folds: the target's token statistics from
    the activation pass (``parts``), the reference model's loss from its own Scorer pass."""
    from mia_ray.features.attacks import score_table, stats_from_columns
    from mia_ray.scoring.pools import score_pool

    attacks = baseline_attacks(cfg)
    if not attacks:
        return {}
    cols = ["snippet_id", "token_logprobs", "mu", "sigma"]
    target = pd.concat([pd.read_parquet(p, columns=cols) for p in parts], ignore_index=True)
    m = meta[["snippet_id", "text"]].merge(target, on="snippet_id", validate="one_to_one")
    ref_loss = None
    if "ref" in attacks:
        log(f"scoring with reference {cfg.model.reference}")
        texts = meta[["snippet_id", "text"]]
        ref = score_pool(
            texts, cfg.model, cfg.resources, cfg.model.reference, "ref_", False, False,
            out / "rows" / "reference",
        )  # fmt: skip
        m = m.merge(ref[["snippet_id", "ref_loss"]], on="snippet_id", validate="one_to_one")
        ref_loss = m["ref_loss"]
    if len(m) != len(meta):
        raise MiaError(f"scored {len(m)} of {len(meta)} samples: results are missing")
    stats = stats_from_columns(m["text"], m["token_logprobs"], m["mu"], m["sigma"], None, ref_loss)
    table = score_table(stats, attacks, [cfg.min_k_ratio], cfg.min_k_ratio)
    y = meta["label"].to_numpy()
    return {a: fold_metrics(np.asarray(table[a], dtype=float), y, splits) for a in attacks}


def blind_of(meta: pd.DataFrame, splits, seed: int) -> dict[str, Any]:
    """The blind bag-of-words baseline, trained on each repeat's training part."""
    from mia_ray.detectors.blind import BlindBagOfWords

    texts = meta["text"].astype(str).tolist()
    y = meta["label"].to_numpy()
    per_repeat = []
    for train, test in splits:
        model = BlindBagOfWords(seed=seed).fit([texts[i] for i in train], y[train])
        s = np.full(len(meta), np.nan)
        s[test] = model.score_samples([texts[i] for i in test])
        per_repeat.append(s)
    return {
        **fold_metrics(per_repeat, y, splits),
        "method": "tfidf+logreg trained on each repeat's training part, scored on its test part",
    }
