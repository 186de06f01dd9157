"""`audit.methods`: more evidence for an audit from the other pipelines, each run as itself.

:func:`method_configs` builds each requested pipeline's own job config from the audit's
(same model, resources and reading settings, the audit's suspected and unseen files) and
validates it, cheaply, before any scoring; :func:`run_methods` runs each pipeline into
``<out>/<name>`` and returns its headline numbers.

- ``copycheck`` (Li et al.): ``experiment.mode = audit`` on the suspected and unseen files,
  ``data.labels`` from the audit (labels only score the verdicts). Its baselines are only
  reported when labels score them, so without labels none runs; with labels the cheap
  Prob-Tool baseline (one scoring pass) does, not the neighbour ones (ten more passes) nor
  Meeus et al. (it trains on labelled files disjoint from the audited ones, which an audit
  does not have). ``finetune.max_length`` is CopyCheck's 300 tokens, or ``model.max_length``
  when smaller (the model's usable context, as the audit was told it).
- ``memhunter`` (Wu et al.): its documents are the suspected files as members (label 1: the
  dataset whose extraction rate is measured, split into the hunter's train / test / val
  pairs) and the unseen files as non-members (label 0: the ``nonmember`` pairs). So its
  dataset test runs as designed and soundly: the verdict compares the model's gain over the
  reference on suspected pairs with the same gain on pairs of the surely-unseen files. It
  needs ``model.reference`` (the dataset test's model that never saw the data, the base of
  the proxy fine-tuned on the suspected files, and the hunter, as in the demo world where
  the hunter is the reference ``tiny-ref``). Extraction runs on the test and nonmember
  splits with the Manual baseline (the prefix alone); MiniPrompt and the GCG plug-in, which
  compare attack methods rather than the model, are left out (each costs MemHunter's wall
  clock again). ``data.path`` here names the suspected files, read as the audit reads them;
  :func:`run_methods` replaces it with ``<out>/memhunter/documents.jsonl``, which holds both
  sides with their labels (ids ``suspected/<file id>``, ``unseen/<file id>``).
- ``leakage`` (Kaneko et al.): the scan of the suspected files as one shard (personal data
  and names; no copyright or benchmark store: the audit has no reference texts), and the
  model side through the local backend on the audited model (output and detection rates of
  the personal data found). A model the local backend cannot load as the audit does
  (``model.revision``, ``gguf_file`` or ``trust_remote_code`` set) gets the scan only. When
  the scan finds too few instances for the few-shot pool and one more, :func:`run_methods`
  reports the scan alone and says why.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia_ray.config import from_dict, to_dict
from mia_ray.errors import MiaError
from mia_ray.log import log
from mia_ray.pipelines.audit.config import AUDIT_METHODS, AuditJobConfig

if TYPE_CHECKING:
    import pandas as pd

# split_pairs fills train, test and val with member documents: 3 at least.
MEMHUNTER_MIN_DOCS = 3


def _job(name: str, sections: dict[str, Any]) -> Any:
    """Pipeline ``name``'s own job config from ``sections`` (its YAML as a dict): the audit
    reaches the other pipelines through the registry only, as the CLI does."""
    from mia_ray import registry

    return from_dict(registry.get("pipeline", name).config_cls, sections)


def _shared(cfg: AuditJobConfig, *names: str) -> dict[str, Any]:
    # The audit resolved the demo world already: sub-pipelines get concrete paths.
    out = {n: to_dict(getattr(cfg, n)) for n in names}
    out["world"] = {**to_dict(cfg.world), "target": ""}
    return out


def _copycheck(cfg: AuditJobConfig) -> Any:
    m = cfg.model
    sub = _job("copycheck", {
        **_shared(cfg, "data", "model", "resources"),
        "experiment": {"mode": "audit", "suspected": cfg.audit.suspected,
                       "unseen": cfg.audit.unseen},
        "uncertainty": {"batch_size": m.batch_size},
        "detect": {"baselines": ["prob_tool"] if cfg.data.labels else []},
        "backend": {"device": m.device, "dtype": m.dtype},
    })  # fmt: skip
    sub.finetune.max_length = min(sub.finetune.max_length, m.max_length)
    return sub


def _memhunter(cfg: AuditJobConfig) -> Any:
    if not cfg.model.reference:
        raise MiaError(
            "needs model.reference (--reference): its dataset test compares the model with one "
            "that surely never saw the suspected files, and that model writes the prompts"
        )
    sections = _shared(cfg, "data", "model", "resources")
    sections["data"].update(path=cfg.audit.suspected, labels="", max_docs_per_class=0,
                            min_docs_per_class=MEMHUNTER_MIN_DOCS)  # fmt: skip
    return _job("memhunter", {
        **sections,
        "hunter": {"model": cfg.model.reference},
        "extraction": {"splits": ["test", "nonmember"], "methods": ["manual"]},
    })  # fmt: skip


def _leakage(cfg: AuditJobConfig) -> Any:
    m, res = cfg.model, cfg.resources
    loadable = not (m.revision or m.gguf_file or m.trust_remote_code)
    return _job("leakage", {
        **_shared(cfg, "resources"),
        "crawl": {"shards": [cfg.audit.suspected] if cfg.audit.suspected else [],
                  "text_field": cfg.data.text_field, "id_field": cfg.data.id_field},
        "scan": {"workers": res.scorer.actors, "cpus_per_worker": res.scorer.cpus},
        "backend": {"kind": "local", "device": m.device, "dtype": m.dtype,
                    "batch_size": m.batch_size},
        "eval": {"targets": [m.name_or_path] if loadable and m.name_or_path else [],
                 "too_few": "skip"},
    })  # fmt: skip


_BUILDERS = {"copycheck": _copycheck, "memhunter": _memhunter, "leakage": _leakage}


def method_configs(cfg: AuditJobConfig) -> dict[str, object]:
    """``{name: job config}`` for each of ``audit.methods``, validated (no Ray, no model).

    Raises :class:`MiaError` ``audit.methods <name>: ...`` for an unknown method, a method
    the audit's settings cannot serve, or a sub-config that does not validate."""
    out: dict[str, object] = {}
    for name in cfg.audit.methods:
        build = _BUILDERS.get(name)
        if build is None:
            raise MiaError(
                f"audit.methods {name}: unknown method (known: {', '.join(AUDIT_METHODS)})"
            )
        try:
            sub = _with_settings(build(cfg), cfg.audit.method_settings.get(name, []))
            sub.validate()
        except MiaError as e:
            raise MiaError(f"audit.methods {name}: {e}") from None
        out[name] = sub
    return out


def _with_settings(sub: Any, settings: list[str]) -> Any:
    """``sub`` with ``--set``-style ``settings`` applied (unknown keys fail with a hint)."""
    if not settings:
        return sub
    from mia_ray.config import apply_override, from_dict, to_dict

    raw = to_dict(sub)
    for assignment in settings:
        apply_override(raw, type(sub), assignment)
    return from_dict(type(sub), raw)


def run_methods(
    cfg: AuditJobConfig, out: Path, configs: dict[str, object], scored: pd.DataFrame | None = None
) -> dict:
    """Run each pipeline of ``configs`` (from :func:`method_configs`) into ``out/<name>``, with
    its own config.yaml, report.json and report.html; return ``{name: summary}``: the
    report's headline numbers and ``"out"``, its folder. Needs Ray up (the audit's run).
    ``scored``: the audit's target rows (text and the Scorer's columns), which CopyCheck's
    baselines reuse rather than scoring the same snippets again.

    Every pipeline keeps its resumable parts under ``out/<name>``, inside the run's
    ``--out``, so the current storage workspace pushes and pulls them as the audit's own."""
    from mia_ray import registry
    from mia_ray.config import dump_yaml
    from mia_ray.reports.io import write_text

    summaries: dict[str, Any] = {}
    for name, sub_cfg in configs.items():
        sub = copy.deepcopy(sub_cfg)  # the pipelines resolve paths into their config
        d = Path(out) / name
        d.mkdir(parents=True, exist_ok=True)
        spec = registry.get("pipeline", name)
        if spec.resolve is not None:  # a pipeline runs its config as resolved (api.run_job)
            sub = spec.resolve(sub)
        run = spec.run
        log(f"audit.methods {name}: running into {d}")
        try:
            summary = _RUNNERS[name](cfg, sub, run, d, scored)
        except MiaError as e:
            raise MiaError(f"audit.methods {name}: {e}") from None
        write_text(d / "config.yaml", dump_yaml(sub, name))  # what ran, as the CLI keeps it
        summaries[name] = {**summary, "out": str(d)}
    return summaries


def _run_copycheck(cfg: AuditJobConfig, sub: Any, run, d: Path, scored) -> dict:
    """``files``: audit file id -> verdict (seen / unseen) and confidence, from the first
    detection method (GMM by default); ``summary`` (mean accuracy per method, with labels
    only) and ``diagnostics`` (did the fine-tunes learn beyond the base rate?)."""
    # The audit's rows hold for CopyCheck's snippets only under the very same model config.
    report = run(sub, d, scored=scored if sub.model == cfg.model else None)
    # CopyCheck's ids are suspected/<file id> (the audit's file ids, prefixed).
    files = {
        f["file_id"].removeprefix("suspected/"): {
            "verdict": f["verdict"],
            "confidence": f["confidence"],
        }
        for f in report["files"]
    }
    return {
        "method": sub.detect.methods[0],
        "files": files,
        "summary": report["summary"],
        "diagnostics": report["diagnostics"],
    }


def _run_memhunter(cfg: AuditJobConfig, sub: Any, run, d: Path, _scored) -> dict:
    """``extraction``: per method (memhunter, manual), split and budget, the mean share of the
    continuation recovered (``avg_lcss``) and the share recovered whole (``hit_rate``);
    ``dataset_test``: the audited model's tests by kind (the verdict is ``gap_vs_nonmember``)
    and the ``power_check``."""
    import json

    from mia_ray.pipelines.audit.inputs import read_inputs
    from mia_ray.reports.io import write_text

    files = read_inputs(cfg).sort_values("doc_id")
    docs = d / "documents.jsonl"
    write_text(
        docs,
        "".join(
            json.dumps({"id": i, "text": t, "label": int(g)}, ensure_ascii=False) + "\n"
            for i, t, g in zip(files["doc_id"], files["text"], files["side"], strict=True)
        ),
    )
    sub.data.path, sub.data.format = str(docs), "jsonl"
    sub.data.text_field, sub.data.id_field = "text", "id"
    sub.data.label_field, sub.data.date_field = "label", "date"
    report = run(sub, d)
    keys = ("method", "split", "trials", "avg_lcss", "hit_rate", "pairs")
    shown = ("test", "h0", "p_value", "alpha", "reject_h0", "verdict")
    dt = report["dataset_test"]
    return {
        "extraction": [{k: r[k] for k in keys} for r in report["extraction"]],
        "dataset_test": {
            r["kind"]: {k: r[k] for k in shown}
            for r in report["hypothesis"]
            if r["suspect"] == "@target"
        },
        "power_check": {k: dt["power_check"][k] for k in shown},
        "mean_lcss": dt["mean_lcss"],
        "mean_lcss_nonmember": dt["mean_lcss_nonmember"],
    }


def _run_leakage(cfg: AuditJobConfig, sub: Any, run, d: Path, _scored) -> dict:
    """``leakage_rate`` (share of suspected files with personal data, Wilson interval) and
    ``pii_without_names``; with the model side, the audited model's ``output_rate`` and
    ``detection_rate`` per category; else ``eval_skipped`` says why (the survey itself says
    when its scan found too few instances: ``eval.too_few = skip``)."""
    report = run(sub, d)
    skipped = report.get("eval_skipped", "")
    if not sub.eval.targets:
        skipped = (
            "eval.targets is empty (the local backend cannot load a model with "
            "model.revision, gguf_file or trust_remote_code as the audit does)"
        )
    if skipped:
        log(f"audit.methods leakage: scan only: {skipped}")
    scanned = ["pii"] + [c for c in ("copyright", "benchmark") if getattr(sub.scan, c)]
    summary: dict[str, Any] = {
        "documents": report["crawl"]["documents"],
        "leakage_rate": {c: report["leakage_rate"][c] for c in scanned},
        "pii_without_names": report["pii_without_names"],
    }
    for key in ("output_rate", "detection_rate"):
        if key in report:
            summary[key] = report[key]
    if skipped:
        summary["eval_skipped"] = skipped
    return summary


_RUNNERS = {"copycheck": _run_copycheck, "memhunter": _run_memhunter, "leakage": _run_leakage}
