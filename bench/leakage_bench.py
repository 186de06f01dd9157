"""Leakage scanners on Ray: documents and MB per second with 1 and 2 scanner actors over the
demo crawl's shards (side by side, same findings required), and the shingle store's lookup
rate (hashes per second, in-process).

    python bench/leakage_bench.py --scale demo --out BENCHMARKS.md
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _markdown import update_section  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DATA_LOG_LEVEL", "WARNING")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="demo", choices=["demo", "test"])
    ap.add_argument("--lookups", type=int, default=2_000_000)
    ap.add_argument("--out", default="", help="a BENCHMARKS.md to update with this section")
    args = ap.parse_args()

    import numpy as np
    import pandas as pd

    from mia_ray.config import LeakageJobConfig, load_config
    from mia_ray.features.shingles import ShingleStore
    from mia_ray.pipelines import leakage
    from mia_ray.runtime import configure_data_context, connect

    cpus = os.cpu_count() or 2
    connect(address="", num_cpus=cpus)
    configure_data_context(no_progress_timeout_s=1800, progress=False)
    cfg = load_config(LeakageJobConfig, "jobs/leakage_demo.yaml", [f"world.scale={args.scale}"])
    leakage._resolve(cfg)
    work = Path(tempfile.mkdtemp(prefix="leakage-bench-"))
    t0 = time.perf_counter()
    stores = leakage._stores(cfg, work)
    t_store = time.perf_counter() - t0
    runs = []
    for workers in (1, 2):
        c = copy.deepcopy(cfg)
        c.scan.workers = workers
        out = work / f"w{workers}"
        t0 = time.perf_counter()
        docs = leakage._scan(c, stores, out)
        secs = time.perf_counter() - t0
        found = leakage._findings(docs)
        runs.append(
            {
                "workers": workers,
                "s": secs,
                "docs": len(docs),
                "mb": docs["bytes"].sum() / 1e6,
                # What a finding is (names have no instance: NaN, which never equals itself).
                "found": found[["shard", "doc_id", "category", "type", "start", "end", "ref"]]
                .sort_values(["shard", "doc_id", "start", "type"])
                .to_dict("records"),
            }
        )
        print(f"{workers} worker(s): {len(docs) / secs:.1f} docs/s in {secs:.1f} s")
    store = ShingleStore.load(stores["copyright"])
    rng = np.random.default_rng(0)
    present = store.hashes[rng.integers(0, len(store), args.lookups // 2)]
    queries = np.concatenate([present, rng.integers(0, 2**63, args.lookups // 2, dtype=np.uint64)])
    t0 = time.perf_counter()
    hit = store.lookup(queries)
    t_lookup = time.perf_counter() - t0
    assert (hit[: len(present)] >= 0).all()
    a, b = runs
    same = a["found"] == b["found"]
    text = "\n".join(
        [
            "## Leakage scanners: documents and MB per second with 1 and 2 workers",
            "",
            f"`python bench/leakage_bench.py --scale {args.scale}` on "
            f"{platform.processor() or platform.machine()}, {cpus} CPUs, "
            f"{time.strftime('%Y-%m-%d')}. The demo crawl: {a['docs']} pages, {a['mb']:.2f} MB in "
            f"{len(cfg.crawl.shards)} shards (jsonl, parquet, text files), each read with Ray "
            "Data and streamed through a pool of scanner actors (20 PII regex types with their "
            "checks, person names, the copyright and benchmark stores). Wall time per run: "
            "all shards in one Ray Data pass (`scan.shards_per_pass` 8), including the "
            "actors' start-up and the per-shard result files.",
            "",
            "| scanner actors | seconds | documents / s | MB / s |",
            "|---|---|---|---|",
            *(
                f"| {r['workers']} | {r['s']:.1f} | {r['docs'] / r['s']:.1f} | "
                f"{r['mb'] / r['s']:.3f} |"
                for r in runs
            ),
            "",
            f"2 workers vs 1: **{a['s'] / b['s']:.2f}×**. Same findings: {same}. On 2 cores "
            "the actors share the CPUs with Ray Data's readers, and at 0.8 MB the pass is "
            "mostly start-up (loading the stores into each actor), so a second actor only "
            "adds its own start-up. This sample is too small to show scaling; more workers pay "
            "off only when scanning, not start-up, dominates.",
            "",
            f"Stores built in {t_store:.1f} s (Ray Data hashing, merged on the driver). Lookup: "
            f"{len(queries):,} hashes (half present) against the copyright store's "
            f"{len(store):,} windows in {t_lookup:.3f} s = "
            f"**{len(queries) / t_lookup / 1e6:.1f} M lookups / s** (one `searchsorted`).",
        ]
    )
    print(text)
    if args.out:
        update_section(Path(args.out), text)
    pd.DataFrame(runs).drop(columns="found").to_csv(work / "runs.csv", index=False)


if __name__ == "__main__":
    main()
