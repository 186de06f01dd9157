"""The probes' results as rows: per layer, per sample, the best layer, the comparison."""

from __future__ import annotations

import pandas as pd

from mia_ray.pipelines.lumia.baselines import FPR


def layer_rows(results: dict[str, dict]) -> list[dict]:
    from mia_ray.actors.activations import parse_column
    from mia_ray.detectors.probes import summarize_layer

    rows = []
    for name, res in results.items():
        part, layer = parse_column(name)
        for kind, summary in summarize_layer(res, fpr=FPR).items():
            rows.append(
                {
                    "part": part,
                    "probe": kind,
                    "layer": layer,
                    **summary,
                    "auc_repeats": [float(a) for a in res[kind]["auc"]],
                }
            )
    return rows


def score_rows(results: dict[str, dict], meta: pd.DataFrame) -> pd.DataFrame:
    """Every test-part score of every probe: one row per (part, layer, probe, repeat, sample)."""
    from mia_ray.actors.activations import parse_column

    frames = []
    for name, res in results.items():
        part, layer = parse_column(name)
        for kind, r in res.items():
            for rep, (idx, scores) in enumerate(
                zip(r["test_index"], r["test_scores"], strict=True)
            ):
                frames.append(
                    pd.DataFrame(
                        {
                            "snippet_id": meta["snippet_id"].to_numpy()[idx],
                            "part": part,
                            "layer": layer,
                            "probe": kind,
                            "repeat": rep,
                            "score": scores,
                            "label": meta["label"].to_numpy()[idx],
                        }
                    )
                )
    return pd.concat(frames, ignore_index=True)


def best_layer(rows: list[dict]) -> tuple[dict, list[dict]]:
    """l* per (part, probe) and overall, chosen by the validation AUC (mean over repeats):
    picking the layer with the highest test AUC would select on the test part."""
    keys = ("part", "probe", "layer", "auc_mean", "auc_std", "tpr_at_1pct_fpr", "val_auc_mean")
    best_per: dict[tuple, dict] = {}
    for r in rows:
        k = (r["part"], r["probe"])
        # Ties go to the shallower layer: the earliest depth at which the signal is there.
        if k not in best_per or r["val_auc_mean"] > best_per[k]["val_auc_mean"]:
            best_per[k] = r
    best_layers = [{k: r[k] for k in keys} for r in best_per.values()]
    best = max(best_layers, key=lambda r: r["val_auc_mean"])
    return best, best_layers


def comparison_rows(best: dict, baselines: dict, blind: dict | None) -> list[dict]:
    """Paper Tables 1–2: improvement = (LUMIA - method) / method, in percent."""
    rows = []
    for name, m in [*baselines.items(), *([("blind", blind)] if blind else [])]:
        rows.append(
            {
                "method": name,
                "method_auc": m["auc"],
                "lumia_auc": best["auc_mean"],
                "improvement_pct": 100.0 * (best["auc_mean"] - m["auc"]) / m["auc"],
            }
        )
    return rows
