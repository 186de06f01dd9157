"""One MemHunter run: pairs, the hunter's training, extraction, the dataset test, the report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from mia_ray.actors.target import TargetPool
from mia_ray.config import to_dict
from mia_ray.errors import MiaError
from mia_ray.pipelines.common import (
    fingerprint,
    log,
)
from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
from mia_ray.pipelines.memhunter.dataset_test import run_dataset_test
from mia_ray.pipelines.memhunter.extraction import (
    cached_rows,
    example_rows,
    extract_all,
    lcss_by_method,
    manual_rows,
    memhunter_rows,
    miniprompt_rows,
    plugin_rows,
)
from mia_ray.pipelines.memhunter.inputs import check_models, check_resources, read_pairs
from mia_ray.pipelines.memhunter.keys import SCORING, adapter_key, hunter_key, pairs_key, target_key
from mia_ray.pipelines.memhunter.report import notes
from mia_ray.pipelines.memhunter.training import train_the_hunter
from mia_ray.runtime import describe


def run_one(
    cfg: MemHunterJobConfig, out: Path, named: dict[str, str] | None = None
) -> dict[str, Any]:
    """One MemHunter run into ``out``; ``named``: dataset-test model names already resolved to
    folders (a sweep cell's copies on its node; see :func:`model_paths`)."""

    from mia_ray.actors.hunter import Hunter
    from mia_ray.data.pairs import bos_prefix
    from mia_ray.reports.io import write_json, write_parquet

    check_models(cfg)
    h = cfg.hunter
    from mia_ray.models.hf import load_tokenizer

    tok = load_tokenizer(cfg.model.name_or_path, cfg.model.revision, cfg.model.trust_remote_code)
    # Read the documents before the target actors take their CPUs: Ray Data needs one.
    pairs, docs_by_label = read_pairs(cfg, tok)
    counts = pairs["split"].value_counts().to_dict()
    log(f"pairs: {counts}")
    if counts.get("train", 0) < 1 or counts.get("test", 0) < 1:
        raise MiaError(f"pairs: need train and test pairs of members, got {counts}")
    write_parquet(out / "pairs.parquet", pairs)
    check_resources(cfg)
    target = TargetPool(cfg.model.name_or_path, cfg.model, cfg.resources)
    try:
        threads = cfg.resources.scorer.torch_threads or 1  # the hunter, in this process
        hunter = Hunter(
            h.model,
            device=cfg.model.device,
            torch_threads=threads,
            separator=h.separator,
            max_x_tokens=h.max_x_tokens,
        )
        training = train_the_hunter(cfg, hunter, target, pairs, out)
        hunter.load_adapter(training["adapter"])
        runs = extract_all(cfg, hunter, target, pairs, out, training["adapter"])
        extraction = memhunter_rows(runs)
        # The largest budget's prompts (a superset of the others') serve everything after.
        trials = runs[runs["budget"] == runs["budget"].max()].drop(columns="budget")
        outputs = [trials.assign(method="memhunter")]
        methods = cfg.extraction.methods
        # Wall-clock-budgeted results cannot be recomputed identically: a rerun reads them back.
        # MiniPrompt's budgets and the plug-in's pre-search come from MemHunter's timed rows.
        fp = fingerprint(to_dict(cfg.extraction), to_dict(cfg.pairs), target_key(cfg),
                         hunter_key(cfg), pairs_key(pairs), adapter_key(training["adapter"]),
                         extraction, SCORING)  # fmt: skip
        if "manual" in methods:
            rows, frame = cached_rows(out, "manual", fp, lambda: manual_rows(cfg, target, pairs))
            extraction += rows
            outputs.append(frame)
        if "miniprompt" in methods:
            n = len(target.actors)
            rows, frame = cached_rows(
                out, "miniprompt", fp, lambda: miniprompt_rows(cfg, target, pairs, extraction, n)
            )
            extraction += rows
            outputs.append(frame)
        plugin: list[dict] = []
        if "plugin" in methods:
            rows, per_pair = cached_rows(
                out, "plugin", fp, lambda: plugin_rows(cfg, target, pairs, trials)
            )
            extraction += rows
            plugin = per_pair.to_dict("records")
    finally:
        target.close()
    hypothesis, dtest = run_dataset_test(cfg, hunter, pairs, trials, docs_by_label, out, named)
    write_parquet(out / "extraction.parquet", pd.DataFrame(extraction))
    cols = ["method", "split", "pair_id", "mu"]
    write_parquet(
        out / "outputs.parquet",
        pd.concat([f[[c for c in cols if c in f]] for f in outputs], ignore_index=True),
    )
    report = {
        "pipeline": "memhunter",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {
            "target": cfg.model.name_or_path,
            "hunter": h.model,
            # What the caches are keyed on: the weights by content, with dtype and device.
            "keys": {"target": target_key(cfg), "hunter": hunter_key(cfg)},
        },
        "pairs": {
            "prefix_tokens": cfg.pairs.prefix_tokens,
            "target_tokens": cfg.pairs.target_tokens,
            "context_bos": bos_prefix(tok),
            "counts": {k: int(v) for k, v in counts.items()},
        },
        "training": training,
        "extraction": extraction,
        "plugin": plugin,
        "hypothesis": hypothesis,
        "dataset_test": {
            "split": cfg.dataset_test.split,
            "trials": cfg.dataset_test.trials,
            "models": {
                "suspects": list(cfg.dataset_test.suspects),
                "reference": cfg.dataset_test.reference,
                "proxy": cfg.dataset_test.proxy,
            },
            **dtest,
        },
        "lcss_by_method": lcss_by_method(outputs),
        "examples": example_rows(trials, pairs, outputs, tok),
        "notes": notes(cfg, dtest, bos_prefix(tok)),
        "runtime": describe(),
    }
    write_json(out / "report.json", report)
    from mia_ray.reports.memhunter import render_memhunter_report

    render_memhunter_report(report, out / "report.html")
    return report
