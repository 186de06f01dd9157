"""Honest evaluation of the attacks: AUC, TPR at low FPR with intervals, the blind baseline, n-gram overlap."""

from __future__ import annotations

import time

import pandas as pd

from mia_ray.pipelines.attack.config import AttackJobConfig
from mia_ray.pipelines.common import (
    log,
)


def evaluate_attacks(cfg: AttackJobConfig, snip_scores, doc_scores, ctx: dict) -> dict:
    """Every attack's AUC, TPR at the FPRs and their intervals on the configured level, the
    blind baseline on the same units, and the members' n-gram overlap with non-members."""
    from mia_ray.data.ngram import ngram_overlap_ds
    from mia_ray.detectors.blind import blind_baseline
    from mia_ray.features.attacks import PASSES
    from mia_ray.stats.metrics import evaluate_scores

    unit = doc_scores if cfg.attack.level == "document" else snip_scores
    groups = None if cfg.attack.level == "document" else unit["doc_id"].to_numpy()
    y = unit["label"].to_numpy()
    ev = {
        "fprs": cfg.eval.fprs,
        "bootstrap": cfg.eval.bootstrap,
        "ci": cfg.eval.ci,
        "seed": cfg.eval.seed,
        "folds": cfg.eval.threshold_folds,
    }
    metrics = {}
    for name in ctx["score_cols"]:
        log(f"evaluating {name}")
        metrics[name] = evaluate_scores(unit[name].to_numpy(), y, groups=groups, **ev)

    report: dict = {
        "pipeline": "attack",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"name_or_path": cfg.model.name_or_path, "reference": cfg.model.reference or None},
        "data": {
            "path": cfg.data.path,
            "labels": cfg.data.labels or None,
            "n_documents": int(len(doc_scores)),
            "n_members": int(doc_scores["label"].sum()),
            "n_nonmembers": int((1 - doc_scores["label"]).sum()),
            "n_snippets": int(len(snip_scores)),
            "n_cropped": int(ctx["timings"]["n_cropped"]),
            "snippet": f"{cfg.data.snippet_size} {cfg.data.snippet_unit}",
            "level": cfg.attack.level,
            "aggregate": cfg.attack.aggregate,
        },
        "ci_level": cfg.eval.ci,
        "metrics": metrics,
        # What each attack cost: the passes over the snippets and which attacks read each.
        # (seconds: the pass's wall time over every run that computed its rows, so a
        # resumed run reports the whole pass; None for the lowercase pass, which runs in the
        # target's pool)
        "passes": {
            p: {
                "attacks": names,
                "cost": PASSES[p],
                "backend": pass_backend(cfg, p),
                "seconds": ctx["pass_seconds"].get(p),
            }  # fmt: skip
            for p, names in ctx["passes"].items()
        },
        "held_out": ctx["held_out"],
    }
    if cfg.eval.blind_baseline:
        log("blind baseline (bag of words, never sees the model)")
        texts = unit_texts(ctx, cfg.attack.level, unit)
        report["blind_baseline"] = blind_baseline(texts, y, groups=groups, **ev)
    log("n-gram overlap of members vs non-members")
    docs = ctx["docs"]
    members = docs.filter(lambda r: r["label"] == 1)
    nonmembers = docs.filter(lambda r: r["label"] == 0)
    report["ngram_overlap"] = [
        ngram_overlap_ds(members, nonmembers, n, cfg.eval.ngram_p) for n in cfg.eval.ngram_n
    ]
    return report


def unit_texts(ctx: dict, level: str, unit: pd.DataFrame) -> list[str]:
    if level == "document":
        docs = (
            ctx["docs"].select_columns(["doc_id", "text"]).to_pandas().set_index("doc_id")["text"]
        )
        return [docs[d] for d in unit["doc_id"]]
    snips = ctx["snippets"].set_index("snippet_id")["text"]
    return [snips[s] for s in unit["snippet_id"]]


def pass_backend(cfg, name: str) -> str:
    """Which engine ran a pass: SaMIA's samples come from ``attack.samia.backend``; every
    other pass is the Scorer's forward pass with transformers."""
    if name != "samples":
        return "transformers"
    from mia_ray.redact import redact

    b = cfg.attack.samia.backend
    if b.serve:
        return "transformers behind mia-ray serve"
    return {
        "local": "transformers",
        "vllm": "vllm",
        "openai": f"openai API ({redact(b.base_url)})",
    }[b.kind]
