"""What each attack of the zoo costs, as the user gets it: `mia-ray attack` with every
attack (jobs/attack_demo.yaml) on a fresh output folder, timed from the command to
report.json, with each pass's seconds as the report records them; and, side by side in one
process, what the Scorer's vocabulary moments (Min-K%++'s mu and sigma) add to a forward
pass, which PAC's augmented copies no longer compute.

    python bench/zoo_bench.py --target smollm2 [--out BENCHMARKS.md]
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


def run_zoo(target: str, out: Path, threads: int) -> tuple[dict, float]:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(Path(sys.executable).parent / "mia-ray"), "attack", "--config", str(ROOT / "jobs/attack_demo.yaml"),
           "--set", f"world.target={target}", "--set", f"resources.torch_threads={threads}",
           "--out", str(out)]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads((out / "report.json").read_text()), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--run", default=str(ROOT / "runs/bench-zoo"), help="the job's output folder")
    ap.add_argument("--out", default="", help="the Markdown file whose section is replaced")
    args = ap.parse_args()

    load = os.getloadavg()[0]
    report, wall = run_zoo(args.target, Path(args.run), args.threads)
    n = report["timings"]["n_snippets"]
    texts = [json.loads(x)["text"] for x in open(report["data"]["path"])][:8]
    share = moments_share(Path(report["model"]["name_or_path"]), texts, 8)
    rows = []
    for name, p in report["passes"].items():
        s = p["seconds"]
        per_k = "-" if s is None else f"{1000 * s / n:,.0f}"
        shown = "(in target)" if s is None else f"{s:,.1f}"
        attacks = ", ".join(f"`{a}`" for a in p["attacks"]) if len(p["attacks"]) < 13 else "all"
        rows.append(f"| {name} | {attacks} | {p['cost']} | {shown} | {per_k} |")
    t = report["timings"]
    moments_cost = share["with moments"] - share["log-probs only"]
    text = "\n".join(
        [
            f"## The attack zoo on `{args.target}`: what each attack costs, in passes and seconds",
            "",
            f"`python bench/zoo_bench.py --target {args.target}` on {platform.machine()}, "
            f"{os.cpu_count()} CPU cores, {date.today()}, load average {load:.1f} at the start. "
            f"It runs `mia-ray attack --config jobs/attack_demo.yaml --set world.target="
            f"{args.target} --set resources.torch_threads={args.threads}` (all 13 attacks) on a "
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
            f"The vocabulary moments, side by side on one batch of 8 snippets ({share['tokens']} "
            f"tokens, one thread, best of 5): forward pass {share['forward']:.2f} s, row stats "
            f"with moments {share['with moments']:.3f} s, log-probs only "
            f"{share['log-probs only']:.3f} s. The moments are "
            f"{100 * moments_cost / (share['forward'] + share['with moments']):.1f} % of a full "
            "pass; PAC's augmented copies, which read log-probs only, no longer compute them.",
        ]
    )
    print(text)
    if args.out:
        from _markdown import update_section

        update_section(ROOT / args.out, text)


if __name__ == "__main__":
    main()
