"""File verdicts: per experiment, each clustering method (and each baseline through the same file pipeline), their confusion rows when labels are known, the blind baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mia_ray.pipelines.copycheck.features import uncertainty_of
from mia_ray.pipelines.copycheck.sampling import sample_experiment


def result_row(method: str, e: dict, conf: dict, features: str) -> dict:
    return {
        "method": method,
        "n_unseen": e["n_unseen"],
        "experiment": e["name"],
        "features": features,
        **{k: conf[k] for k in ("acc", "bacc", "tp", "fp", "fn", "tn")},
    }


def detect_files(cfg, e, X, snip_doc, unseen_score, method) -> dict:
    from mia_ray.detectors.filelevel import detect_files

    return detect_files(
        X,
        snip_doc,
        unseen_score,
        method=method,
        n_components=cfg.detect.pca_components,
        seed=cfg.detect.seed,
    )


def evaluate_experiment(cfg, e: dict, snippets, docs, jobs, base: dict, meeus, out: Path) -> dict:
    """One experiment: its samplers' uncertainty features, every clustering method's verdicts
    (and, with labels, their confusion rows), the baselines through the same file pipeline,
    and the blind baseline. Returns lists: results, files, tables (one), blind."""
    from mia_ray.detectors.blind import BlindBagOfWords
    from mia_ray.detectors.filelevel import confusion

    results, files, blind = [], [], []
    preds = sample_experiment(cfg, e, snippets, jobs, out)
    preds = preds.merge(snippets[["snippet_id", "doc_id"]], on="snippet_id", validate="one_to_one")
    X, names, ale = uncertainty_of(cfg, preds)
    snip_doc = preds["doc_id"].to_numpy()
    truth = e["truth"]
    known = bool(truth) and all(d in truth for d in e["suspected"])
    table = preds[["snippet_id", "doc_id"]].copy()
    table["experiment"], table["n_unseen"] = e["name"], e["n_unseen"]
    table["truth"] = table["doc_id"].map(truth) if known else np.nan
    for s in cfg.uncertainty.samplers:
        table[f"p_{s}"] = preds[f"p_{s}"]
    for j, n in enumerate(names):
        table[n] = X[:, j]
    for method in cfg.detect.methods:
        det = detect_files(cfg, e, X, snip_doc, ale, method)
        if known:
            conf = confusion(det["verdict"], [truth[f] for f in det["file_ids"]])
            results.append(result_row(method, e, conf, "uncertainty"))
        if method == cfg.detect.methods[0]:
            for f, v, c in zip(det["file_ids"], det["verdict"], det["confidence"], strict=True):
                files.append(
                    {
                        "experiment": e["name"],
                        "n_unseen": e["n_unseen"],
                        "method": method,
                        "file_id": f,
                        "verdict": "seen" if v == 1 else "unseen",
                        "confidence": float(c),
                        "label": int(truth[f]) if f in truth else None,
                    }
                )
    sus = set(e["suspected"])
    for name in ("prob_tool", "neighbor_loss", "neighbor_ppl"):
        if name not in base:
            continue
        sids, F, score = base[name]
        docs_of = snippets.set_index("snippet_id").loc[sids, "doc_id"].to_numpy()
        keep = np.isin(docs_of, list(sus))
        det = detect_files(cfg, e, F[keep], docs_of[keep], score[keep], cfg.detect.baseline_method)
        if known:
            conf = confusion(det["verdict"], [truth[f] for f in det["file_ids"]])
            results.append(result_row(name, e, conf, name))
    if meeus and "p_seen" in meeus and known:
        fids = sorted(sus)
        verdict = [int(meeus["p_seen"][f] >= 0.5) for f in fids]
        results.append(
            result_row("meeus", e, confusion(verdict, [truth[f] for f in fids]), "meeus")
        )
    if cfg.eval.blind_baseline and known:
        texts = docs.set_index("doc_id").loc[sorted(sus), "text"].tolist()
        y = np.array([truth[f] for f in sorted(sus)])
        if min(y.sum(), len(y) - y.sum()) >= 2:
            folds = int(min(cfg.eval.threshold_folds, y.sum(), len(y) - y.sum()))
            s = BlindBagOfWords(folds=folds, seed=cfg.eval.seed).oof_scores(texts, y)
            blind.append({"experiment": e["name"], "n_unseen": e["n_unseen"], **blind_row(s, y)})
    return {"results": results, "files": files, "tables": [table], "blind": blind}


def blind_row(scores: np.ndarray, y: np.ndarray) -> dict:
    from mia_ray.detectors.filelevel import confusion
    from mia_ray.stats.metrics import roc_auc

    conf = confusion((scores >= 0.5).astype(int), y)
    return {"auc": roc_auc(scores, y), **{k: conf[k] for k in ("acc", "bacc")}}
