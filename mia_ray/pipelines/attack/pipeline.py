"""`mia-ray attack`: documents → snippets → scores → evaluation → report."""

from __future__ import annotations

import time
from pathlib import Path

from mia_ray.pipelines.attack.config import AttackJobConfig
from mia_ray.pipelines.attack.evaluation import evaluate_attacks
from mia_ray.pipelines.attack.report import report_notes
from mia_ray.pipelines.common import (
    check_model_early,
    check_target_early,
    fit_snippets_to_window,
    resolve_world,
)
from mia_ray.registry import pipeline
from mia_ray.runtime import describe
from mia_ray.scoring.attacks import score_attacks
from mia_ray.scoring.config import Scoring


def resolve(cfg: AttackJobConfig) -> AttackJobConfig:
    """The demo world's paths filled in; DC-PDD counts tokens in the world's reference pool
    (the reference model's documents, never evaluated) unless told otherwise."""
    from_world = bool(cfg.world.target)
    cfg = resolve_world(cfg)
    if from_world and not cfg.attack.dc_pdd.corpus:
        pool = Path(cfg.world.resolved_root()) / "corpus" / "reference_pool.jsonl"
        cfg.attack.dc_pdd.corpus = str(pool)
    return fit_snippets_to_window(cfg, cfg.attack.attacks)


@pipeline(
    "attack",
    AttackJobConfig,
    help="membership attacks: LOSS, zlib, Min-K%, Min-K%++, lowercase, reference, ReCaLL, "
    "Con-ReCall, DC-PDD, PAC, neighbourhood, gradient norm",
    resolve=resolve,
)
def run(cfg: AttackJobConfig, out: Path) -> dict:
    from mia_ray.reports.html import render_attack_report
    from mia_ray.reports.io import write_json, write_parquet

    check_target_early(cfg.model, cfg.attack)
    if "ref" in cfg.attack.attacks:
        check_model_early(cfg.model.reference, "model.reference")
    snip_scores, doc_scores, ctx = score_attacks(Scoring.of(cfg), out)
    write_parquet(out / "snippet_scores.parquet", snip_scores)
    write_parquet(out / "document_scores.parquet", doc_scores)
    if ctx["prefixes"]:  # ReCaLL's and Con-ReCall's prefixes, as the model read them
        write_json(out / "recall_prefixes.json", ctx["prefixes"])
    t2 = time.time()
    report = evaluate_attacks(cfg, snip_scores, doc_scores, ctx)
    report["notes"] = report_notes(cfg, report)
    report["runtime"] = describe()
    report["timings"] = {**ctx["timings"], "eval_s": round(time.time() - t2, 2)}
    write_json(out / "report.json", report)
    render_attack_report(report, out / "report.html")
    return report
