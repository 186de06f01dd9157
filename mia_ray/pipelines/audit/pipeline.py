"""`mia-ray audit`: the stages in order (inputs, scoring, analysis, methods, report)."""

from __future__ import annotations

import time
from pathlib import Path

from mia_ray.pipelines.audit.analysis import analyse, feature_columns
from mia_ray.pipelines.audit.config import AuditJobConfig
from mia_ray.pipelines.audit.inputs import (
    prepare_files,
    resolve_world,
)
from mia_ray.pipelines.audit.report import merge_copycheck, write_outputs
from mia_ray.pipelines.common import (
    check_model_early,
    check_target_early,
    fit_snippets_to_window,
    log,
)
from mia_ray.registry import pipeline
from mia_ray.runtime import describe

FLAGS = (
    ("model", "model.name_or_path", "the model to audit: a hub name or a local folder"),
    ("suspected", "audit.suspected", "the files you think it trained on"),
    ("unseen", "audit.unseen", "files of the same kind it surely never saw"),
    ("reference", "model.reference", "a reference model that did not train on the files"),
    ("group-by", "data.group_field", "the field naming each file's source (folder: its folder)"),
)


def resolve(cfg: AuditJobConfig) -> AuditJobConfig:
    """The demo world's books and models filled in, and the snippet size fitted to the
    models' window when ``data.snippet_size`` is 0."""
    cfg = resolve_world(cfg)
    return fit_snippets_to_window(cfg, cfg.audit.attack_config(bool(cfg.model.reference)).attacks)


@pipeline(
    "audit",
    AuditJobConfig,
    help="did this model train on these files? a dataset-level p-value and per-file verdicts "
    "under false-discovery control",
    flags=FLAGS,
    resolve=resolve,
)
def run(cfg: AuditJobConfig, out: Path) -> dict:
    from mia_ray.pipelines.audit.methods import method_configs, run_methods
    from mia_ray.scoring.attacks import score_attacks
    from mia_ray.scoring.config import Scoring

    t0 = time.time()
    a = cfg.audit
    methods = method_configs(cfg)  # every requested method's config checks out before any work
    check_target_early(cfg.model, a.attack_config(bool(cfg.model.reference)), "audit")
    if cfg.model.reference:
        check_model_early(cfg.model.reference, "model.reference")
    files, snippets, truth, calib, inputs = prepare_files(cfg)
    side = dict(zip(files["doc_id"], files["side"], strict=True))
    attack = a.attack_config(bool(cfg.model.reference))
    attacks = attack.attacks
    scoring = Scoring(data=cfg.data, model=cfg.model, resources=cfg.resources, attack=attack)
    with_ref_check = bool(cfg.model.reference) and a.reference_check
    snip, _, ctx = score_attacks(
        scoring,
        out,
        labels=side,
        snippets=snippets,
        prefixes=inputs.pop("prefixes"),
        reference_features=with_ref_check,
    )
    t_score = time.time() - t0
    features = feature_columns(snip, attacks)
    texts = ctx["snippets"].set_index("snippet_id")["text"]
    snip["text"] = snip["snippet_id"].map(texts)
    report = analyse(
        cfg, snip, features, files, truth, calib, inputs, reference=ctx["reference_scores"]
    )
    if methods:
        report["methods"] = run_methods(cfg, out, methods, ctx["target_rows"])
        merge_copycheck(report)
    write_outputs(out, snip, features, report)
    report["runtime"] = describe()
    report["timings"] = {
        "score_s": round(t_score, 2),
        "analysis_s": round(time.time() - t0 - t_score, 2),
        "n_snippets": int(len(snip)),
    }
    from mia_ray.reports.audit import render_audit_report
    from mia_ray.reports.io import write_json

    write_json(out / "report.json", report)
    render_audit_report(report, out / "report.html")
    log(report["verdict"]["text"])
    return report
