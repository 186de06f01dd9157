"""`mia-ray leakage`: crawl shards → scan → leakage rates → (eval) output and detection rates → report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mia_ray.config import to_dict
from mia_ray.features.leaks import CATEGORIES
from mia_ray.log import log
from mia_ray.pipelines.leakage.config import LeakageJobConfig
from mia_ray.pipelines.leakage.inputs import check_paths, check_pool_fits, resolve_inputs
from mia_ray.pipelines.leakage.rates import rates_of_counts, score_against_truth
from mia_ray.pipelines.leakage.scan import (
    build_stores,
    findings_at,
    read_findings,
    scan_shards,
    scanned_documents,
    spans_of,
)
from mia_ray.registry import pipeline
from mia_ray.runtime import describe


def model_keys(cfg: LeakageJobConfig, evaluation: dict | None) -> dict[str, Any]:
    """output_rate, detection_rate and few_shot_curve of the first target (every target's
    under ``eval.models``), with how instances, prompts and counterparts were made."""
    if not evaluation or not evaluation["models"]:
        return {}
    from mia_ray.features import leaks

    first = evaluation["models"][cfg.eval.targets[0]]
    return {
        "output_rate": first["output_rate"],
        "detection_rate": first["detection_rate"],
        "few_shot_curve": first["few_shot_curve"],
        "eval": {
            "target": cfg.eval.targets[0],
            "instances": evaluation["instances"],
            "models": evaluation["models"],
            "method": " ".join((leaks.__doc__ or "").split()),
            "refusals": list(leaks.REFUSALS),
        },
    }


def truth_of(cfg: LeakageJobConfig, out: Path, names: list[str], found) -> dict | None:
    """Precision and recall against ``crawl.truth``; a sample's against what it scanned."""
    if not cfg.crawl.truth:
        return None
    scanned = scanned_documents(out, names) if cfg.crawl.sample != 1 else None
    return score_against_truth(found, cfg.crawl.truth, scanned)


def model_side(cfg: LeakageJobConfig, found, out: Path) -> tuple[dict | None, str]:
    """The evaluation of ``eval.targets`` (none: the scan only), or ``(None, why)`` when the
    scan found too few instances and ``eval.too_few`` is skip."""
    if not cfg.eval.targets:
        return None, ""
    from mia_ray.pipelines.leakage.evaluation import run_eval

    evaluation = run_eval(cfg, found, out)
    skipped = evaluation.pop("skipped", "")
    if skipped:
        log(f"eval: the model side did not run: {skipped}")
        return None, skipped
    return evaluation, ""


@pipeline(
    "leakage",
    LeakageJobConfig,
    help="leakage survey: personal data, copyrighted text and benchmark data in a corpus, and how models emit and detect it",
    resolve=resolve_inputs,
)
def run(cfg: LeakageJobConfig, out: Path) -> dict:
    from mia_ray.reports.leakage import write_report

    t0 = time.monotonic()
    shards = check_paths(cfg)
    check_pool_fits(cfg)
    stores = build_stores(cfg, out)
    counts = scan_shards(cfg, stores, out, shards)
    names = [name for name, _ in shards]
    rates = rates_of_counts(counts, cfg.scan.ci, spans_of(cfg))
    # The findings stay where the scanners wrote them; the driver reads them whole only for
    # what needs them all (the model evaluation's instances, scoring a planted truth).
    whole = bool(cfg.eval.targets or cfg.crawl.truth)
    found = read_findings(out, names, None if whole else cfg.scan.max_listed_matches)
    truth = truth_of(cfg, out, names, found)
    leakage_rate: dict = {}
    for c in CATEGORIES:
        if c != "pii" and c not in stores:  # no store: nothing to match, not a rate of 0
            leakage_rate[c] = {"scanned": False, "why": f"not scanned: scan.{c} is empty"}
            for shard in rates["shards"].values():
                shard.pop(c)
            continue
        row = dict(rates[c])
        if truth:
            row.update({k: truth[c][k] for k in ("planted", "found", "precision", "recall")})
        leakage_rate[c] = row
    evaluation, skipped = model_side(cfg, found, out)
    scanned_mb = sum(c["bytes"] for c in counts.values()) / 1e6
    report = {
        "pipeline": "leakage",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "crawl": {
            "shards": cfg.crawl.shards,
            "documents": rates["documents"],
            "megabytes": scanned_mb,
            "sample": cfg.crawl.sample,
            "findings": findings_at(out),
        },
        "leakage_rate": leakage_rate,
        "pii_types": rates["pii_types"],
        "pii_without_names": rates["pii_without_names"],
        "shards": rates["shards"],
        "truth": truth,
        **model_keys(cfg, evaluation),
        **({"eval_skipped": skipped} if skipped else {}),
        "matches": found.drop(columns=["instance_start", "instance"])
        .head(cfg.scan.max_listed_matches)
        .to_dict("records"),
        "matches_total": sum(c["findings"] for c in counts.values()),
        "config": to_dict(cfg),
        "runtime": {**describe(), "seconds": round(time.monotonic() - t0, 1)},
    }
    write_report(report, out)
    return report
