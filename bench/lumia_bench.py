"""LUMIA on Ray: activation extraction with 1 vs 2 reader actors, and probe training for every
layer as parallel Ray tasks vs one layer after another. Each pair is measured side by side in
one run, on the same samples, into fresh directories, and must give the same numbers.

    python bench/lumia_bench.py --target smollm2 --n-samples 96
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2", choices=["tiny", "smollm2"])
    ap.add_argument("--scale", default="demo", choices=["demo", "test"])
    ap.add_argument("--n-samples", type=int, default=96)
    ap.add_argument("--work", default="", help="scratch folder (default: a temp dir)")
    ap.add_argument("--out", default="", help="a BENCHMARKS.md to update with this section")
    args = ap.parse_args()

    import pandas as pd
    import ray

    from mia_ray.actors.activations import load_layer, parse_column
    from mia_ray.config import load_config
    from mia_ray.detectors.probes import grouped_holdout_splits
    from mia_ray.pipelines import lumia
    from mia_ray.pipelines.common import resolve_world
    from mia_ray.runtime import configure_data_context, connect

    cpus = os.cpu_count() or 2
    connect(address="", num_cpus=cpus)
    configure_data_context(no_progress_timeout_s=1800, progress=False)
    cfg = load_config(
        lumia.LumiaJobConfig,
        "jobs/lumia_demo.yaml",
        [f"world.scale={args.scale}", f"world.target={args.target}", "targets=[]"],
    )
    resolve_world(cfg)
    _, meta, _ = lumia._samples(cfg, multimodal=False)
    # An IID sample of whole documents, seeded: both classes, groups intact.
    docs = meta["doc_id"].drop_duplicates().sample(frac=1.0, random_state=0)
    keep, n = [], 0
    for d in docs:
        if n >= args.n_samples:
            break
        keep.append(d)
        n += int((meta["doc_id"] == d).sum())
    meta = meta[meta["doc_id"].isin(keep)].reset_index(drop=True)
    ds = ray.data.from_pandas(meta[["snippet_id", "doc_id", "text"]])
    work = Path(args.work or tempfile.mkdtemp(prefix="lumia-bench-"))

    extraction = []
    parts_by = {}
    for actors in (1, 2):
        c = copy.deepcopy(cfg)
        c.resources.scorer_actors = actors
        # Fractional CPUs: on a 2-CPU machine two whole-CPU actors would leave Ray Data no
        # CPU for its repartition task (a deadlock); threads set the real compute share.
        c.resources.cpus_per_actor = 0.5
        c.resources.torch_threads = max(1, cpus // actors)
        t0 = time.time()
        parts, _, _ = lumia._extract(c, ds, meta, work / f"extract-{actors}")
        dt = time.time() - t0
        parts_by[actors] = parts
        extraction.append(
            {
                "actors": actors,
                "threads": c.resources.torch_threads,
                "s": dt,
                "rate": len(meta) / dt,
            }
        )
        print(f"extraction, {actors} actor(s): {len(meta)} samples in {dt:.1f} s", flush=True)
    names = [c for c in pd.read_parquet(parts_by[1][0]).columns if parse_column(c)]
    diff = 0.0
    for name in names:
        ids1, x1 = load_layer(parts_by[1], name)
        ids2, x2 = load_layer(parts_by[2], name)
        x2 = pd.DataFrame(x2, index=ids2).loc[ids1].to_numpy()
        diff = max(diff, float(np.abs(x1 - x2).max()))

    y, groups = meta["label"].to_numpy(), meta["doc_id"].to_numpy()
    p = cfg.probe
    splits = grouped_holdout_splits(y, groups, p.repeats, p.test_size, p.seed)
    probes = {}
    results = {}
    for mode in ("serial", "parallel"):
        c = copy.deepcopy(cfg)
        c.probe.parallel = mode == "parallel"
        t0 = time.time()
        results[mode], _ = lumia._train_probes(
            c, parts_by[1], meta, splits, work / f"probes-{mode}", fp=mode
        )
        probes[mode] = time.time() - t0
        print(f"probes, {mode}: {len(names)} layers in {probes[mode]:.1f} s", flush=True)
    same = all(
        results["serial"][n][k]["auc"] == results["parallel"][n][k]["auc"]
        for n in names
        for k in p.kinds
    )

    e1, e2 = extraction
    text = "\n".join(
        [
            "## LUMIA: activation extraction and per-layer probes",
            "",
            f"`python bench/lumia_bench.py --target {args.target} --scale {args.scale} "
            f"--n-samples {args.n_samples}` on {platform.processor() or platform.machine()}, "
            f"{cpus} CPUs, {time.strftime('%Y-%m-%d')}. Target `{args.target}` "
            f"({len(names)} layers), {len(meta)} samples of {cfg.data.snippet_size} words "
            f"cropped to {cfg.model.max_length} tokens.",
            "",
            "| extraction | actors × threads | seconds | samples / s |",
            "|---|---|---|---|",
            *(
                f"| ActivationReader pool | {e['actors']} × {e['threads']} | {e['s']:.1f} | "
                f"{e['rate']:.2f} |"
                for e in extraction
            ),
            "",
            f"2 actors vs 1: **{e2['rate'] / e1['rate']:.2f}×** samples per second. Largest "
            f"difference between the two runs' activations: {diff:.1e}. Both use all {cpus} "
            "CPUs: a second model copy pays off with a second GPU or node, not by splitting one "
            "machine's cores between copies.",
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
