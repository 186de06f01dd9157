"""`mia-ray copycheck`: files → snippets → fine-tunes → samplers → features → file verdicts → report."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from mia_ray.pipelines.common import (
    check_target_early,
    fit_snippets_to_window,
    log,
    resolve_world,
)
from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig
from mia_ray.pipelines.copycheck.detection import evaluate_experiment
from mia_ray.pipelines.copycheck.features import baseline_features, meeus_of
from mia_ray.pipelines.copycheck.inputs import experiments_of, snippets_for
from mia_ray.pipelines.copycheck.report import build_report
from mia_ray.pipelines.copycheck.sampling import serve_backend
from mia_ray.pipelines.copycheck.training import finetune_members, member_names
from mia_ray.registry import pipeline


def resolve(cfg: CopyCheckJobConfig) -> CopyCheckJobConfig:
    """The demo world's documents, labels and models filled in (its sweep on the books, Meeus
    et al. trained on the web leads), and the snippet size fitted to the model's window."""
    if cfg.world.target:
        cfg = resolve_world(cfg)
        ex, dc = cfg.experiment, cfg.detect
        ex.source = ex.source or "books"
        if not dc.meeus_data:
            dc.meeus_data, dc.meeus_labels = cfg.data.path, cfg.data.labels
            dc.meeus_source = dc.meeus_source or "web"
    return fit_snippets_to_window(cfg)


@pipeline(
    "copycheck",
    CopyCheckJobConfig,
    help="CopyCheck: which suspected files the model has seen, from fine-tuning uncertainty",
    resolve=resolve,
)
def run(cfg: CopyCheckJobConfig, out: Path, scored: pd.DataFrame | None = None) -> dict:
    """``scored``: the target's rows of a pass the caller made over the same snippets with the
    same ``model`` config (the audit's), reused by the baselines instead of a second pass."""
    from mia_ray.reports.copycheck import render_copycheck_report
    from mia_ray.reports.io import write_json, write_parquet

    t0 = time.time()
    remote_only = cfg.uncertainty.samplers == ["blackbox"] and cfg.backend.kind == "openai"
    if not (remote_only and not cfg.backend.serve):  # an API-only model has no local files
        check_target_early(cfg.model)
    docs, exps = experiments_of(cfg)
    used = sorted(set().union(*(e["pseudo_label"].keys() for e in exps)))
    docs = docs[docs["doc_id"].isin(used)].reset_index(drop=True)
    snippets = snippets_for(cfg, docs)
    write_parquet(out / "snippets.parquet", snippets)
    n_per = snippets.groupby("doc_id").size()
    log(
        f"{len(exps)} experiment(s), {len(docs)} files, {len(snippets)} snippets "
        f"({n_per.mean():.1f} per file)"
    )
    timings = {"data_s": round(time.time() - t0, 2)}
    t1 = time.time()
    # The black-box sampler alone fine-tunes nothing.
    jobs, records = finetune_members(cfg, exps, snippets, out) if member_names(cfg) else ([], [])
    timings["finetune_s"] = round(time.time() - t1, 2)
    server = (
        serve_backend(cfg) if cfg.backend.serve and "blackbox" in cfg.uncertainty.samplers else None
    )
    t2 = time.time()
    union = set().union(*(e["suspected"] for e in exps))
    base = baseline_features(cfg, snippets, union, out, scored)
    meeus = meeus_of(cfg, snippets, union, base, out, scored)
    got = {"results": [], "files": [], "tables": [], "blind": []}
    try:
        for e in exps:
            one = evaluate_experiment(cfg, e, snippets, docs, jobs, base, meeus, out)
            for k, v in one.items():
                got[k].extend(v)
    finally:
        if server is not None:
            server()
    timings["detect_s"] = round(time.time() - t2, 2)
    snip_all = pd.concat(got["tables"], ignore_index=True)
    write_parquet(out / "uncertainty.parquet", snip_all)
    write_parquet(out / "files.parquet", pd.DataFrame(got["files"]))
    report = build_report(cfg, docs, snippets, exps, jobs, records, base, meeus, got, timings)
    write_json(out / "report.json", report)
    render_copycheck_report(report, snip_all, out / "report.html")
    return report
