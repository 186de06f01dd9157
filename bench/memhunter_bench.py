"""MemHunter on Ray: extraction trials per second and hunter-training time per iteration, with
1 and 2 TargetLM actors, side by side in one run on the same pairs (which must give the same
mu values and the same prompt pool).

    python bench/memhunter_bench.py --target smollm2 --pairs 12 --trials 5
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _markdown import update_section  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DATA_LOG_LEVEL", "WARNING")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2", choices=["tiny", "smollm2"])
    ap.add_argument("--scale", default="demo", choices=["demo", "test"])
    ap.add_argument("--pairs", type=int, default=12, help="test pairs for the trials")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--train-pairs", type=int, default=6)
    ap.add_argument("--out", default="", help="a BENCHMARKS.md to update with this section")
    args = ap.parse_args()

    import pandas as pd

    from mia_ray.actors.hunter import Hunter
    from mia_ray.actors.target import TargetPool
    from mia_ray.config import load_config
    from mia_ray.models.hf import load_tokenizer
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
    from mia_ray.pipelines.memhunter.inputs import read_pairs, resolve_inputs
    from mia_ray.runtime import configure_data_context, connect
    from mia_ray.train.hunter import pair_seed, train_hunter

    cpus = os.cpu_count() or 2
    connect(address="", num_cpus=cpus)
    configure_data_context(no_progress_timeout_s=1800, progress=False)
    cfg = load_config(
        MemHunterJobConfig,
        "jobs/memhunter_demo.yaml",
        [f"world.scale={args.scale}", f"world.target={args.target}", "pairs.max_per_split=0"],
    )
    cfg = resolve_inputs(cfg)
    tok = load_tokenizer(cfg.model.name_or_path)
    pairs, _ = read_pairs(cfg, tok)
    test = pairs[pairs["split"] == "test"].head(args.pairs)
    train = pairs[pairs["split"] == "train"].head(args.train_pairs)
    h = cfg.hunter
    hunter = Hunter(h.model, torch_threads=cpus, separator=h.separator)
    # The same prompts for both pools: trials differ only in who scores them.
    rows = []
    for j in range(args.trials):
        seeds = [pair_seed(0, "trial", p, j) for p in test["pair_id"]]
        prompts = hunter.sample(list(test["x"]), h.prompt_tokens, h.sample_top_k, 1.0, seeds)
        rows.append(test.assign(prompt=[hunter.decode(p) for p in prompts], trial=j))
    probes = pd.concat(rows, ignore_index=True)[["pair_id", "trial", "prompt", "x_ids", "y_ids"]]
    spec = dataclasses.replace(h, iterations=1)
    work = Path(tempfile.mkdtemp(prefix="memhunter-bench-"))
    runs = []
    for actors in (1, 2):
        c = copy.deepcopy(cfg)
        # Ray's logical CPUs: the actors share the machine with the fine-tune task.
        c.resources.scorer.actors = actors
        c.resources.scorer.cpus = (cpus - 1) / actors
        c.resources.scorer.torch_threads = max(1, cpus // actors)
        c.resources.trainer.cpus = 1
        pool = TargetPool(c.model.name_or_path, c.model, c.resources)
        try:
            pool.frame(probes.head(2))  # load the models before the clock starts
            t0 = time.perf_counter()
            res = pool.frame(probes)
            t_trials = time.perf_counter() - t0
            xs = dict(zip(train["pair_id"], train["x"], strict=True))

            def finetune(adapter_in, rows, out_dir, seed, xs=xs):
                from mia_ray.train.hunter import finetune_hunter

                return finetune_hunter(h.model, adapter_in, rows, out_dir, spec, seed, xs)

            hunter.load_adapter("")
            t1 = time.perf_counter()
            rec = train_hunter(hunter, pool.score, finetune, train, work / f"a{actors}", spec)
            t_iter = time.perf_counter() - t1
        finally:
            pool.close()
        pool_df = pd.read_parquet(work / f"a{actors}" / "iter-00" / "pool.parquet")
        runs.append(
            {
                "actors": actors,
                "threads": c.resources.scorer.torch_threads,
                "trials_s": t_trials,
                "rate": len(probes) / t_trials,
                "iter_s": t_iter,
                "search_s": rec["iterations"][0]["search_s"],
                "mu": res.sort_values(["pair_id", "trial"])["mu"].tolist(),
                "pool": pool_df[["pair_id", "prompt"]].values.tolist(),
            }
        )
        print(f"{actors} actor(s): {runs[-1]['rate']:.2f} trials/s, iteration {t_iter:.1f} s")
    a, b = runs
    same = a["mu"] == b["mu"] and a["pool"] == b["pool"]
    text = "\n".join(
        [
            "## MemHunter: extraction trials and hunter training with 1 and 2 target actors",
            "",
            f"`python bench/memhunter_bench.py --target {args.target} --pairs {args.pairs} "
            f"--trials {args.trials}` on {platform.processor() or platform.machine()}, {cpus} "
            f"CPUs, {time.strftime('%Y-%m-%d')}. Target `{args.target}`, hunter "
            f"`{Path(h.model).name}`; {len(probes)} trials ({len(test)} test pairs × "
            f"{args.trials} hunter prompts, {cfg.pairs.prefix_tokens} + "
            f"{cfg.pairs.target_tokens} tokens); one training iteration on {len(train)} pairs "
            f"(top-{spec.top_k}, {spec.beams} beams, {spec.prompt_tokens}-token prompts, "
            "then the LoRA fine-tune). Models are loaded before the clock starts.",
            "",
            "| TargetLM actors × threads | trials / s | training iteration (s) | of which search (s) |",
            "|---|---|---|---|",
            *(
                f"| {r['actors']} × {r['threads']} | {r['rate']:.2f} | {r['iter_s']:.1f} | "
                f"{r['search_s']:.1f} |"
                for r in runs
            ),
            "",
            f"2 actors vs 1: **{b['rate'] / a['rate']:.2f}×** trials per second, "
            f"**{a['iter_s'] / b['iter_s']:.2f}×** faster per training iteration. Same mu for "
            f"every trial and the same prompt pool: {same}. On one machine the two actors split "
            "its cores; the pool pays off with one actor per GPU or node.",
        ]
    )
    print(text)
    if args.out:
        update_section(args.out, text)


if __name__ == "__main__":
    main()
