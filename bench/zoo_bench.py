"""What each attack of the zoo costs, as the user gets it: `mia-ray attack` with every
attack (jobs/attack_demo.yaml) on a fresh output folder, timed from the command to
report.json, with each pass's seconds as the report records them; and, side by side in one
process, what the Scorer's vocabulary moments (Min-K%++'s mu and sigma) add to a forward
pass, which PAC's augmented copies no longer compute, and ReCaLL's pass run on from the
prefix's cache against each snippet read after the whole prefix.

    python bench/zoo_bench.py --target smollm2 [--out BENCHMARKS.md]
    python bench/zoo_bench.py --kernels-only   # the side-by-side parts, on a finished run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def moments_share(model_dir: Path, texts: list[str], batch: int, repeats: int = 5) -> dict:
    """Seconds (best of ``repeats``) of one batch's forward pass and of its row stats with
    and without the vocabulary moments, on one thread."""
    import torch

    from mia_ray.actors.scorer import row_stats
    from mia_ray.models.hf import load_causal_lm

    torch.set_num_threads(1)
    model, tok, _ = load_causal_lm(str(model_dir), "cpu", "float32", "", False, "")
    enc = tok(texts[:batch], return_tensors="pt", padding=True, truncation=True, max_length=256)
    enc = {k: enc[k] for k in ("input_ids", "attention_mask")}
    best = {"forward": 1e9, "with moments": 1e9, "log-probs only": 1e9}
    for _ in range(repeats):
        with torch.inference_mode():
            t = time.perf_counter()
            logits = model(**enc).logits
            best["forward"] = min(best["forward"], time.perf_counter() - t)
            for name, moments in (("with moments", True), ("log-probs only", False)):
                t = time.perf_counter()
                row_stats(logits, enc["input_ids"], enc["attention_mask"], texts, True, moments)
                best[name] = min(best[name], time.perf_counter() - t)
    best["tokens"] = int(enc["attention_mask"].sum())
    return best


def prefix_cache_speed(model_dir: Path, docs: list[str], repeats: int = 2) -> dict:
    """Seconds (best of ``repeats``) of ReCaLL's pass over one batch of 8 snippets after a
    10-snippet prefix: run on from the prefix's cache (computed once, before timing) and
    read whole, side by side in one process; also the largest loss difference."""
    from mia_ray.actors.scorer import Scorer

    cut = [" ".join(d.split()[:100]) for d in docs]
    context, texts = " ".join(cut[:10]), cut[10:18]
    cached = Scorer(str(model_dir), device="cpu", dtype="float32", torch_threads=1,
                    context=context)  # fmt: skip
    whole = Scorer(str(model_dir), device="cpu", dtype="float32", torch_threads=1,
                   context=context)  # fmt: skip
    whole._prefixes[()] = None  # no cache: every row read after the whole prefix
    first = cached._conditioned(texts)  # computes the prefix's cache
    best = {"cached": 1e9, "whole": 1e9}
    for _ in range(repeats):
        for name, scorer in (("cached", cached), ("whole", whole)):
            t = time.perf_counter()
            got = scorer._conditioned(texts)
            best[name] = min(best[name], time.perf_counter() - t)
    diff = max(abs(a["loss"] - b["loss"]) for a, b in zip(first, got, strict=True))
    return {**best, "prefix_tokens": len(cached.context), "max_diff": diff}


def run_zoo(target: str, out: Path, threads: int) -> tuple[dict, float]:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(Path(sys.executable).parent / "mia-ray"), "attack", "--config", str(ROOT / "jobs/attack_demo.yaml"),
           "--set", f"world.target={target}", "--set", f"resources.scorer.torch_threads={threads}",
           "--out", str(out)]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads((out / "report.json").read_text()), time.perf_counter() - t0


def kernels(run: Path) -> str:
    """The two side-by-side measurements, on the model and documents of the job's run."""
    report = json.loads((run / "report.json").read_text())
    model = Path(report["model"]["name_or_path"])
    docs = [json.loads(x)["text"] for x in open(report["data"]["path"])]
    share = moments_share(model, docs[:8], 8)
    cache = prefix_cache_speed(model, docs)
    moments_cost = share["with moments"] - share["log-probs only"]
    return (
        f"The vocabulary moments, side by side on one batch of 8 snippets ({share['tokens']} "
        f"tokens, one thread, best of 5): forward pass {share['forward']:.2f} s, row stats "
        f"with moments {share['with moments']:.3f} s, log-probs only "
        f"{share['log-probs only']:.3f} s. The moments are "
        f"{100 * moments_cost / (share['forward'] + share['with moments']):.1f} % of a full "
        "pass; PAC's augmented copies, which read log-probs only, no longer compute them.\n\n"
        f"ReCaLL's pass, side by side on one batch of 8 snippets after a "
        f"{cache['prefix_tokens']:,}-token prefix (one thread, best of 2): "
        f"{cache['cached']:.2f} s run on from the prefix's cache, {cache['whole']:.2f} s with "
        f"each snippet read after the whole prefix (**{cache['whole'] / cache['cached']:.1f}x**); "
        f"the losses differ by at most {cache['max_diff']:.1e}."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--run", default=str(ROOT / "runs/bench-zoo"), help="the job's output folder")
    ap.add_argument("--out", default="", help="the Markdown file whose section is replaced")
    ap.add_argument("--kernels-only", action="store_true",
                    help="print the two side-by-side measurements, without the job")  # fmt: skip
    args = ap.parse_args()
    if args.kernels_only:
        print(kernels(Path(args.run)))
        return

    load = os.getloadavg()[0]
    report, wall = run_zoo(args.target, Path(args.run), args.threads)
    n = report["timings"]["n_snippets"]
    rows = []
    for name, p in report["passes"].items():
        s = p["seconds"]
        per_k = "-" if s is None else f"{1000 * s / n:,.0f}"
        shown = "(in target)" if s is None else f"{s:,.1f}"
        attacks = ", ".join(f"`{a}`" for a in p["attacks"]) if len(p["attacks"]) < 13 else "all"
        rows.append(f"| {name} | {attacks} | {p['cost']} | {shown} | {per_k} |")
    t = report["timings"]
    text = "\n".join(
        [
            f"## The attack zoo on `{args.target}`: what each attack costs, in passes and seconds",
            "",
            f"`python bench/zoo_bench.py --target {args.target}` on {platform.machine()}, "
            f"{os.cpu_count()} CPU cores, {date.today()}, load average {load:.1f} at the start. "
            f"It runs `mia-ray attack --config jobs/attack_demo.yaml --set world.target="
            f"{args.target} --set resources.scorer.torch_threads={args.threads}` (all 13 attacks) on a "
            f"fresh output folder: {n} snippets, one Scorer actor, CPU float32. Seconds per pass "
            "as `report.json` (`passes`) records them; the lowercase pass runs inside the target's "
            "pool, so its seconds are the target's.",
            "",
            f"**From the command to the report: {wall:,.0f} s** (reading {t['data_s']:.1f} s, "
            f"scoring {t['score_s']:,.0f} s, evaluation {t.get('eval_s', 0):.1f} s; the rest is "
            "Ray's start, model loads and the report).",
            "",
            "| pass | attacks that read it | what it runs | s | s per 1k snippets |",
            "|---|---|---|---|---|",
            *rows,
            "",
            kernels(Path(args.run)),
        ]
    )
    print(text)
    if args.out:
        from _markdown import update_section

        update_section(ROOT / args.out, text)


if __name__ == "__main__":
    main()
