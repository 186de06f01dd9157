"""LUMIA on Ray: the activations and the classic attacks from one target pass per sample vs
the three passes it took before (activations; the attack scorer's target pass; the reference),
and probe training for every layer as parallel Ray tasks vs one layer after another. Each pair
is measured side by side in one run, on the same samples, into fresh directories, and must
give the same numbers.

    python bench/lumia_bench.py --target smollm2 --scale test --out BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _markdown import update_section  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DATA_LOG_LEVEL", "WARNING")


def _three_pass_baselines(cfg, meta, splits, out: Path, docs, labels: dict) -> dict:
    """The classic attacks as LUMIA scored them before: the attack pipeline's own scorer, a
    second target pass (and the reference's) over the same samples."""
    from mia_ray.config import WorldConfig
    from mia_ray.pipelines.attack.config import AttackJobConfig
    from mia_ray.pipelines.lumia import baseline_attacks, fold_metrics
    from mia_ray.scoring.attacks import score_attacks
    from mia_ray.scoring.config import AttackConfig

    attacks = baseline_attacks(cfg)
    acfg = AttackJobConfig(
        data=copy.deepcopy(cfg.data),
        model=copy.deepcopy(cfg.model),
        resources=copy.deepcopy(cfg.resources),
        eval=copy.deepcopy(cfg.eval),
        world=WorldConfig(),
        attack=AttackConfig(
            attacks=attacks, min_k_ratios=[cfg.min_k_ratio], min_k_ratio=cfg.min_k_ratio,
            level="snippet",
        ),
    )  # fmt: skip
    snip, _, _ = score_attacks(acfg, out, docs=docs, labels=labels)
    snip = snip.set_index("snippet_id").loc[meta["snippet_id"]]
    y = meta["label"].to_numpy()
    return {a: fold_metrics(snip[a].to_numpy(dtype=float), y, splits) for a in attacks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2", choices=["tiny", "smollm2"])
    ap.add_argument("--scale", default="demo", choices=["demo", "test"])
    ap.add_argument("--n-samples", type=int, default=96)
    ap.add_argument("--work", default="", help="scratch folder (default: a temp dir)")
    ap.add_argument("--world-root", default="", help="the demo world's folder (default: its home)")
    ap.add_argument("--out", default="", help="a BENCHMARKS.md to update with this section")
    args = ap.parse_args()

    import pandas as pd

    from mia_ray.actors.activations import load_layer, parse_column
    from mia_ray.config import load_config
    from mia_ray.detectors.probes import grouped_holdout_splits
    from mia_ray.pipelines.common import resolve_world
    from mia_ray.pipelines.lumia.activations import extract_activations
    from mia_ray.pipelines.lumia.baselines import baselines_of
    from mia_ray.pipelines.lumia.config import LumiaJobConfig
    from mia_ray.pipelines.lumia.inputs import samples_of
    from mia_ray.pipelines.lumia.probes import train_probes
    from mia_ray.runtime import configure_data_context, connect

    cpus = os.cpu_count() or 2
    connect(address="", num_cpus=cpus)
    configure_data_context(no_progress_timeout_s=1800, progress=False)
    cfg = load_config(
        LumiaJobConfig,
        "jobs/lumia_demo.yaml",
        [f"world.scale={args.scale}", f"world.target={args.target}", "targets=[]"]
        + ([f"world.root={args.world_root}"] if args.world_root else []),
    )
    cfg = resolve_world(cfg)
    meta, all_docs = samples_of(cfg, multimodal=False)
    # An IID sample of whole documents, seeded: both classes, groups intact.
    docs = meta["doc_id"].drop_duplicates().sample(frac=1.0, random_state=0)
    keep, n = [], 0
    for d in docs:
        if n >= args.n_samples:
            break
        keep.append(d)
        n += int((meta["doc_id"] == d).sum())
    meta = meta[meta["doc_id"].isin(keep)].reset_index(drop=True)
    kept = set(keep)
    docs = all_docs.filter(lambda r: r["doc_id"] in kept).materialize()
    labels = dict(zip(meta["doc_id"], meta["label"].astype(int), strict=True))
    if "ref" in cfg.attacks and cfg.model.reference:
        # As the pipeline's run does: both models score the text both fit.
        from mia_ray.scoring.attacks import crop_to_scored_span

        meta, _ = crop_to_scored_span(meta, cfg.model, True)
    work = Path(args.work or tempfile.mkdtemp(prefix="lumia-bench-"))
    y, groups = meta["label"].to_numpy(), meta["doc_id"].to_numpy()
    p = cfg.probe
    splits = grouped_holdout_splits(y, groups, p.repeats, p.test_size, p.seed)

    # Both sides: one reader actor with every core's threads, as the demo job runs.
    cfg.resources.scorer.torch_threads = cpus
    cfg.resources.scorer.cpus = 1
    timings, baselines, parts_by = {}, {}, {}
    for mode in ("three", "one"):
        out = work / f"passes-{mode}"
        t0 = time.time()
        parts, _, _ = extract_activations(cfg, meta, out, token_stats=mode == "one")
        t1 = time.time()
        if mode == "one":
            baselines[mode] = baselines_of(cfg, meta, splits, out, parts)
        else:
            baselines[mode] = _three_pass_baselines(cfg, meta, splits, out, docs, labels)
        timings[mode] = (t1 - t0, time.time() - t1)
        parts_by[mode] = parts
        print(
            f"{mode} pass(es): extraction {t1 - t0:.1f} s, attacks {time.time() - t1:.1f} s",
            flush=True,
        )
    names = [c for c in pd.read_parquet(parts_by["one"][0]).columns if parse_column(c)]
    diff = 0.0
    for name in names:
        ids1, x1 = load_layer(parts_by["three"], name)
        ids2, x2 = load_layer(parts_by["one"], name)
        x2 = pd.DataFrame(x2, index=ids2).loc[ids1].to_numpy()
        diff = max(diff, float(np.abs(x1 - x2).max()))
    differ = {
        a: (baselines["three"][a]["auc_repeats"], baselines["one"][a]["auc_repeats"])
        for a in baselines["one"]
        if baselines["one"][a]["auc_repeats"] != baselines["three"][a]["auc_repeats"]
    }
    same_aucs = not differ
    for a, (three, one) in differ.items():
        print(f"{a}: AUCs by repeat, three passes {three}, one pass {one}", flush=True)

    probes = {}
    results = {}
    for mode in ("serial", "parallel"):
        c = copy.deepcopy(cfg)
        c.probe.parallel = mode == "parallel"
        t0 = time.time()
        results[mode], _ = train_probes(
            c, parts_by["one"], meta, splits, work / f"probes-{mode}", fp=mode
        )
        probes[mode] = time.time() - t0
        print(f"probes, {mode}: {len(names)} layers in {probes[mode]:.1f} s", flush=True)
    same = all(
        results["serial"][n][k]["auc"] == results["parallel"][n][k]["auc"]
        for n in names
        for k in p.kinds
    )

    (x3, a3), (x1, a1) = timings["three"], timings["one"]
    text = "\n".join(
        [
            "## LUMIA: one target pass per sample, and per-layer probes",
            "",
            f"`python bench/lumia_bench.py --target {args.target} --scale {args.scale} "
            f"--n-samples {args.n_samples}` on {platform.processor() or platform.machine()}, "
            f"{cpus} CPUs, {time.strftime('%Y-%m-%d')}. Target `{args.target}` "
            f"({len(names)} layers), reference `{Path(cfg.model.reference).name}`, {len(meta)} "
            f"samples of {cfg.data.snippet_size} words cropped to {cfg.model.max_length} tokens; "
            f"one reader actor with {cpus} threads; attacks {', '.join(baselines['one'])}.",
            "",
            "| activations and classic attacks | target passes | extraction (s) | attacks (s) | total (s) |",
            "|---|---|---|---|---|",
            f"| before: activations, then the attack scorer's target and reference passes | 2 | {x3:.1f} | {a3:.1f} | {x3 + a3:.1f} |",
            f"| now: token statistics from the activation pass, then the reference pass | 1 | {x1:.1f} | {a1:.1f} | {x1 + a1:.1f} |",
            "",
            f"One pass vs three: **{(x3 + a3) / (x1 + a1):.2f}×** faster in all. The activation pass "
            "now projects every position onto the vocabulary (before: only the last), which the "
            f"extraction column shows. Largest difference between the two runs' activations: {diff:.1e}; "
            f"identical attack AUCs on every repeat: {same_aucs}.",
            "",
            "| probe training, all layers | seconds |",
            "|---|---|",
            f"| one Ray task per layer, one at a time | {probes['serial']:.1f} |",
            f"| one Ray task per layer, all submitted at once | {probes['parallel']:.1f} |",
            "",
            f"Parallel vs serial: **{probes['serial'] / probes['parallel']:.2f}×** faster "
            f"({len(names)} layers × {len(p.kinds)} probe kinds × {p.repeats} repeats); "
            f"identical AUCs: {same}.",
        ]
    )
    print(text)
    if args.out:
        update_section(args.out, text)


if __name__ == "__main__":
    main()
