"""`mia-ray lumia`: for each target, samples → activations → probes per layer → baselines → report."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pandas as pd

from mia_ray.pipelines.common import (
    check_target_early,
    fill_from_world,
    fingerprint,
    fit_snippets_to_window,
    log,
    resolved,
)
from mia_ray.pipelines.lumia.activations import extract_activations
from mia_ray.pipelines.lumia.baselines import baseline_attacks, baselines_of, blind_of
from mia_ray.pipelines.lumia.config import LumiaJobConfig
from mia_ray.pipelines.lumia.inputs import samples_of
from mia_ray.pipelines.lumia.probes import train_probes
from mia_ray.pipelines.lumia.report import report_notes
from mia_ray.pipelines.lumia.results import best_layer, comparison_rows, layer_rows, score_rows
from mia_ray.registry import pipeline
from mia_ray.runtime import describe


def run_target(cfg: LumiaJobConfig, name: str, out: Path) -> dict[str, Any]:
    from mia_ray.data.ngram import ngram_overlap_ds
    from mia_ray.detectors.probes import grouped_holdout_splits
    from mia_ray.models.hf import is_vision_language
    from mia_ray.reports.io import write_parquet

    cfg = fit_snippets_to_window(cfg)
    check_target_early(cfg.model)
    multimodal = is_vision_language(
        cfg.model.name_or_path, cfg.model.revision, cfg.model.trust_remote_code
    )
    log(f"[{name}] model {cfg.model.name_or_path}" + (" (vision-language)" if multimodal else ""))
    meta, docs = samples_of(cfg, multimodal)
    n_mem = int(meta["label"].sum())
    log(f"[{name}] {len(meta)} samples from {meta['doc_id'].nunique()} documents: {n_mem} members")
    y, groups = meta["label"].to_numpy(), meta["doc_id"].to_numpy()
    p = cfg.probe
    splits = grouped_holdout_splits(
        y, groups, n_repeats=p.repeats, test_size=p.test_size, seed=p.seed
    )

    from mia_ray.scoring.attacks import crop_to_scored_span

    stats = not multimodal and bool(baseline_attacks(cfg))
    if stats and "ref" in cfg.attacks and cfg.model.reference:
        # Both models score the same text: the span that fits either one's context.
        meta, n_cropped = crop_to_scored_span(meta, cfg.model, True)
        if n_cropped:
            log(f"[{name}] {n_cropped} of {len(meta)} samples cut to the text both models score")
    parts, t_extract, act_fp = extract_activations(cfg, meta, out, stats)
    probe_fp = fingerprint(
        [pd.read_parquet(f, columns=["snippet_id"]).shape[0] for f in parts],
        list(meta["snippet_id"]),
        meta["label"].tolist(),
        list(meta["doc_id"]),
        act_fp,  # new activations (another model, dtype, texts) retrain every probe
        # How the probes are scheduled does not change them: not part of the fingerprint.
        {k: v for k, v in vars(p).items() if k not in ("parallel", "cpus_per_task")},
    )
    results, t_probe = train_probes(cfg, parts, meta, splits, out, probe_fp)
    rows = sorted(
        layer_rows(results),
        key=lambda r: (r["part"] != "vision", r["part"], r["probe"], r["layer"]),
    )
    best, best_layers = best_layer(rows)
    log(
        f"[{name}] best layer: {best['part']} {best['layer']} ({best['probe']}) "
        f"AUC {best['auc_mean']:.3f} ± {best['auc_std']:.3f}"
    )

    t1 = time.time()
    notes = []
    baselines: dict[str, dict] = {}
    if multimodal:
        notes.append(
            "The classic attacks score text continuations; for a vision-language model they are "
            "not computed here, only the blind baseline."
        )
    else:
        if "ref" in cfg.attacks and not cfg.model.reference:
            notes.append("The reference attack was skipped: no model.reference was given.")
        baselines = baselines_of(cfg, meta, splits, out, parts)
    blind = blind_of(meta, splits, cfg.eval.seed) if cfg.eval.blind_baseline else None
    members = docs.filter(lambda r: r["label"] == 1)
    nonmembers = docs.filter(lambda r: r["label"] == 0)
    ngram = [ngram_overlap_ds(members, nonmembers, n, cfg.eval.ngram_p) for n in cfg.eval.ngram_n]
    t_base = time.time() - t1

    write_parquet(out / "layers.parquet", pd.DataFrame(rows))
    write_parquet(out / "probe_scores.parquet", score_rows(results, meta))
    write_parquet(out / "samples.parquet", meta.drop(columns=["text"]))
    n_test_non = min(int((y[test] == 0).sum()) for _, test in splits)
    notes += report_notes(cfg, meta, n_test_non, rows, best, baselines, blind)
    return {
        "target": name,
        "model": {
            "name_or_path": cfg.model.name_or_path,
            "reference": cfg.model.reference or None,
            "multimodal": multimodal,
        },
        "data": {
            "path": cfg.data.path,
            "labels": cfg.data.labels or None,
            "n_samples": len(meta),
            "n_members": n_mem,
            "n_nonmembers": len(meta) - n_mem,
            "n_documents": int(meta["doc_id"].nunique()),
            "sample": "one record (image + text)"
            if multimodal
            else f"{cfg.data.snippet_size} {cfg.data.snippet_unit}",
            "max_length": cfg.model.max_length,
        },
        "probe": {
            "kinds": list(p.kinds),
            "repeats": p.repeats,
            "test_size": p.test_size,
            "val_fraction": p.val_fraction,
            "mlp": {
                "hidden": p.hidden,
                "dropout": p.dropout,
                "lr": p.lr,
                "max_epochs": p.max_epochs,
                "patience": p.patience,
                "batch_size": p.batch_size,
                "optimizer": "Adam",
            },
            "seed": p.seed,
        },
        "layers": rows,
        "best_layer": best,
        "best_layers": best_layers,
        "baselines": baselines,
        "blind_baseline": blind,
        "comparison": comparison_rows(best, baselines, blind),
        "ngram_overlap": ngram,
        "notes": notes,
        "timings": {
            "extract_s": round(t_extract, 2),
            "probe_s": round(t_probe, 2),
            "baseline_s": round(t_base, 2),
            "samples_per_s": round(len(meta) / max(t_extract, 1e-9), 2),
        },
    }


def resolve(cfg: LumiaJobConfig) -> LumiaJobConfig:
    """Every demo-world target's paths (``targets``, else ``world.target``) found at once,
    the world built once for all of them, into ``target_paths``; a config without a world
    target as it is."""
    names = list(cfg.targets) or ([cfg.world.target] if cfg.world.target else [])
    if not names or cfg.target_paths:
        return cfg
    from mia_ray.demo.world import ensure_world

    cfg = copy.deepcopy(cfg)
    cfg.world.target = cfg.world.target or names[0]
    log(f"demo world at {cfg.world.resolved_root()} (targets {', '.join(names)})")
    info = ensure_world(cfg.world, names)
    cfg.targets = names
    cfg.target_paths = {t: {**info["targets"][t], "documents": str(info["documents"])}
                        for t in names}  # fmt: skip
    return resolved(cfg)


@pipeline(
    "lumia",
    LumiaJobConfig,
    help="LUMIA: membership signal per layer from linear probes",
    resolve=resolve,
)
def run(cfg: LumiaJobConfig, out: Path) -> dict:
    from mia_ray.reports.io import write_json
    from mia_ray.reports.lumia import render_lumia_report

    runs = []
    for t in list(cfg.targets) or [""]:
        tcfg = copy.deepcopy(cfg)
        if t:
            fill_from_world(tcfg, cfg.target_paths[t])
        name = t or Path(cfg.model.name_or_path.rstrip("/")).name or "model"
        runs.append(run_target(tcfg, name, out / name))
    report: dict[str, Any] = {
        "pipeline": "lumia",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "targets": [r["target"] for r in runs],
        **runs[0],
        "runs": runs,
        "runtime": describe(),
    }
    write_json(out / "report.json", report)
    render_lumia_report(report, out / "report.html")
    return report
