"""Per-snippet features: the 13 uncertainty metrics per sampler, and the baselines' (Min-K% at 10 ratios, neighbour LOSS / PPL, Meeus et al.)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.errors import MiaError
from mia_ray.pipelines.common import log
from mia_ray.pipelines.copycheck.inputs import read_side, snippets_for


def uncertainty_of(cfg, preds: pd.DataFrame) -> tuple[np.ndarray, list[str], np.ndarray]:
    """39 (13 per sampler) features per suspected snippet, their names, and the orientation
    score: the snippet's aleatoric uncertainty averaged over the samplers."""
    from mia_ray.features.uncertainty import feature_names, uncertainty_features

    blocks, names, ale = [], [], []
    y = np.ones(len(preds), dtype=int)  # every suspected snippet carries pseudo-label 1
    for sampler in cfg.uncertainty.samplers:
        p = np.stack(preds[f"p_{sampler}"].to_numpy()).astype(np.float64)
        f = uncertainty_features(p, y, eps=cfg.uncertainty.eps)
        blocks.append(f)
        names += feature_names(sampler)
        ale.append(f[:, 0])
    return np.hstack(blocks), names, np.mean(ale, axis=0)


def score_target(
    cfg, rows: pd.DataFrame, out_dir: Path, token_stats: bool, scored: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Scorer pass (target model) over rows (snippet_id, text): loss, token log-probs.

    ``scored``: rows the caller already scored with this very ``cfg.model`` (text plus the
    Scorer's columns, token statistics included); snippets with one of those texts are not
    scored again, so a pass over the same snippets is the only one."""
    from mia_ray.scoring.pools import score_pool

    rows = rows[["snippet_id", "text"]].reset_index(drop=True)
    known = pd.DataFrame()
    if scored is not None and len(scored):
        by_text = scored.drop(columns=["snippet_id", "doc_id", "lower_loss"], errors="ignore")
        by_text = by_text.drop_duplicates("text").set_index("text")
        hit = rows["text"].isin(by_text.index)
        known = rows[hit].join(by_text, on="text").drop(columns="text")
        rows = rows[~hit].reset_index(drop=True)
        if len(known):
            log(f"{len(known)} snippets' target scores reused from the caller's pass")
        if not len(rows):
            return known.reset_index(drop=True)
    new = score_pool(
        rows, cfg.model, cfg.resources, cfg.model.name_or_path, "", False, token_stats, out_dir
    )
    return pd.concat([known, new], ignore_index=True) if len(known) else new


def baseline_features(
    cfg, snippets: pd.DataFrame, union_ids: set[str], out: Path, scored: pd.DataFrame | None
) -> dict:
    """Per-snippet baseline features for every suspected snippet of any experiment
    (``scored``: see :func:`score_target`)."""
    from mia_ray.features.attacks import min_k, stats_from_columns

    dc = cfg.detect
    feats: dict[str, Any] = {}
    rows = snippets[snippets["doc_id"].isin(union_ids)].reset_index(drop=True)
    need_scores = {"prob_tool", "neighbor_loss", "neighbor_ppl"} & set(dc.baselines)
    if not need_scores:
        return feats
    log(f"baselines: scoring {len(rows)} suspected snippets with the target")
    tgt = score_target(cfg, rows, out / "rows" / "target", True, scored)
    tgt = rows[["snippet_id", "doc_id", "text"]].merge(tgt, on="snippet_id", validate="one_to_one")
    if "prob_tool" in dc.baselines:
        stats = stats_from_columns(tgt["text"], tgt["token_logprobs"], tgt["mu"], tgt["sigma"])
        X = np.array([[min_k(s, r) for r in dc.min_k_ratios] for s in stats])
        # Min-K% scores are higher for members: the negated mean orients "unseen".
        feats["prob_tool"] = (tgt["snippet_id"].to_numpy(), X, -X.mean(axis=1))
    if {"neighbor_loss", "neighbor_ppl"} & set(dc.baselines):
        from mia_ray.features.neighbors import DESCRIPTION, Lexicon, make_neighbours

        lex = Lexicon.from_minilm()
        nb_rows = []
        for sid, text in zip(tgt["snippet_id"], tgt["text"], strict=True):
            nbs = make_neighbours(
                text, dc.n_neighbors, lex, seed=f"{dc.seed}:{sid}", rate=dc.neighbor_rate
            )
            nb_rows += [(f"{sid}#nb{j}", t) for j, t in enumerate(nbs)]
        nb = pd.DataFrame(nb_rows, columns=["snippet_id", "text"])
        log(f"baselines: scoring {len(nb)} neighbour texts ({dc.n_neighbors} per snippet)")
        nb_scores = score_target(cfg, nb, out / "rows" / "neighbours", False)
        nb_loss = nb_scores.set_index("snippet_id")["loss"]
        own = tgt["loss"].to_numpy(dtype=np.float64)
        L = np.array(
            [[nb_loss[f"{sid}#nb{j}"] for j in range(dc.n_neighbors)] for sid in tgt["snippet_id"]]
        )
        d_loss = own[:, None] - L  # Mattern et al.: a member's loss sits below its neighbours'
        d_ppl = np.exp(own)[:, None] - np.exp(L)
        if "neighbor_loss" in dc.baselines:
            feats["neighbor_loss"] = (tgt["snippet_id"].to_numpy(), d_loss, d_loss.mean(axis=1))
        if "neighbor_ppl" in dc.baselines:
            feats["neighbor_ppl"] = (tgt["snippet_id"].to_numpy(), d_ppl, d_ppl.mean(axis=1))
        feats["_neighbours"] = DESCRIPTION
    feats["_target_rows"] = tgt
    return feats


def meeus_classifier(cfg, suspected_rows: pd.DataFrame, out: Path) -> dict | None:
    """Train the Meeus et al. meta-classifier on labelled files disjoint from the audited ones;
    return its per-file seen-probabilities for the suspected files (or None, with why)."""

    from mia_ray.data.readers import load_manifest
    from mia_ray.data.splits import sample_per_class
    from mia_ray.detectors.meeus import MeeusClassifier, meeus_features

    dc = cfg.detect
    if not dc.meeus_data:
        return {"skipped": "no labelled training files (set detect.meeus_data and meeus_labels)"}
    docs = read_side(dc.meeus_data, cfg.data)
    labels = load_manifest(dc.meeus_labels) if dc.meeus_labels else None
    if labels is None:
        raise MiaError("detect.meeus_data needs detect.meeus_labels (doc_id -> 0/1)")
    where = dc.meeus_data
    if dc.meeus_source:
        docs = docs[docs["doc_id"].str.startswith(dc.meeus_source + "/")]
        where += f", source {dc.meeus_source!r}"
    docs = docs[docs["doc_id"].isin(labels.keys())]
    docs = docs[~docs["doc_id"].isin(set(suspected_rows["doc_id"]))]
    lab = sample_per_class(
        {d: labels[d] for d in docs["doc_id"]}, dc.meeus_max_docs_per_class, dc.seed
    )
    docs = docs[docs["doc_id"].isin(lab.keys())].reset_index(drop=True)
    train_rows = snippets_for(cfg, docs)
    log(f"Meeus et al.: scoring {len(train_rows)} snippets of {len(docs)} labelled training files")
    scored = score_target(cfg, train_rows, out / "rows" / "meeus_train", True)
    scored = train_rows.merge(scored, on="snippet_id", validate="one_to_one")
    ids, F = meeus_features(
        [np.asarray(v, dtype=np.float64) for v in scored["token_logprobs"]],
        scored["doc_id"].to_numpy(),
    )
    clf = MeeusClassifier(seed=dc.seed).fit(F, np.array([lab[d] for d in ids]))
    sids, SF = meeus_features(
        [np.asarray(v, dtype=np.float64) for v in suspected_rows["token_logprobs"]],
        suspected_rows["doc_id"].to_numpy(),
    )
    proba = clf.predict_proba(SF)[:, 1]
    n1 = sum(lab.values())
    return {
        "p_seen": dict(zip(sids, proba.tolist(), strict=True)),
        "train": {"where": where, "n_files": len(lab), "n_seen": n1, "n_unseen": len(lab) - n1},
    }


def meeus_of(cfg, snippets: pd.DataFrame, union: set, base: dict, out: Path, scored):
    """Meeus et al.'s classifier on the suspected files' target rows, when asked for."""
    if "meeus" not in cfg.detect.baselines:
        return None
    tgt = base.get("_target_rows")
    if tgt is None:
        rows = snippets[snippets["doc_id"].isin(union)]
        tgt = rows.merge(
            score_target(cfg, rows, out / "rows" / "target", True, scored), on="snippet_id"
        )
    return meeus_classifier(cfg, tgt, out)
