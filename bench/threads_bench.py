"""Torch threads per actor on this machine: 1 against 2, idle and busy, for the three kinds of
model pass (scoring: the Scorer's plain forward; sampling: SaMIA's batched samples; the
gradient pass: one backward per snippet), on the demo world's tiny model:

    python bench/threads_bench.py --out BENCHMARKS.md

"Busy" is what a shared laptop or a second actor on the node does: another process keeps
every core at work (torch matmuls, as many threads as cores) for the whole measurement. Each
measurement runs in its own process, after a warm-up batch; the snippets and settings are
those of the attack demo (128 words, batches of 8, SaMIA's 5 samples).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import wait_idle  # noqa: E402
from _markdown import publish  # noqa: E402
from sampling_bench import demo_tiny  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PASSES = ("scoring", "sampling", "gradient")


def texts(n: int, words: int) -> list[str]:
    from mia_ray.demo.corpora import load_books

    out = []
    for doc in load_books():
        ws = doc.text.split()
        out += [" ".join(ws[i : i + words]) for i in range(0, len(ws) - words, words)]
        if len(out) >= n:
            return out[:n]
    return out


def measure(kind: str, model: str, threads: int, n: int, words: int, fit: bool) -> float:
    """Rows per second of one pass, after a warm-up batch, in this process; ``fit``: as an
    actor given 1 CPU that asked for ``threads`` (``models.hf.fit_threads`` before each
    batch, as the actors call it)."""
    import numpy as np
    import pandas as pd

    from mia_ray.actors import BATCH
    from mia_ray.models import hf

    if fit:
        hf.ray_cpus = lambda: 1

    rows = texts(n + 8, words)
    if kind == "sampling":
        from sampling_bench import requests

        from mia_ray.backends.local import LocalHFBackend

        backend = LocalHFBackend(model, device="cpu", torch_threads=threads, max_length=256)
        reqs = requests(backend, n + 8, words, 5)
        backend.sample(reqs[:8], 1.0, 50)
        t0 = time.perf_counter()
        for b in range(8, len(reqs), 8):
            hf.fit_threads()
            backend.sample(reqs[b : b + 8], 1.0, 50)
        return (len(reqs) - 8) / (time.perf_counter() - t0)
    from mia_ray.actors.scorer import Scorer

    s = Scorer(model, torch_threads=threads, max_length=256, lowercase=False,
               grad_norm=kind == "gradient")  # fmt: skip
    df = pd.DataFrame({"snippet_id": [str(i) for i in range(len(rows))], "text": rows,
                       BATCH: np.arange(len(rows)) // 8})  # fmt: skip
    s(df.iloc[:8])
    t0 = time.perf_counter()
    s(df.iloc[8:])
    return n / (time.perf_counter() - t0)


def busy(threads: int) -> subprocess.Popen:
    code = (f"import torch; torch.set_num_threads({threads}); a = torch.randn(1024, 1024)\n"
            "while True: a @ a")  # fmt: skip
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="a folder (default: the demo world's tiny)")
    ap.add_argument("--snippets", type=int, default=64)
    ap.add_argument("--words", type=int, default=128)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--side", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help="BENCHMARKS.md to update")
    args = ap.parse_args()
    args.model = args.model or demo_tiny()
    if args.side:
        kind, threads = args.side.split(":")
        fit = threads.endswith("fit")
        got = measure(kind, args.model, int(threads.removesuffix("fit")), args.snippets,
                      args.words, fit)  # fmt: skip
        print(json.dumps(got))
        return
    cores, res = os.cpu_count() or 1, {}
    # The last cell: an actor given 1 CPU that asked for the most threads, fitted to the machine.
    cells = [str(t) for t in args.threads] + [f"{max(args.threads)}fit"]
    for load in ("idle", "busy"):
        for kind in PASSES:
            for threads in cells:
                other = busy(cores) if load == "busy" else None
                if other is None:
                    wait_idle()
                try:
                    cmd = [sys.executable, __file__, *sys.argv[1:], "--model", args.model,
                           "--side", f"{kind}:{threads}"]  # fmt: skip
                    env = {**os.environ, "OMP_NUM_THREADS": threads.removesuffix("fit")}
                    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                finally:
                    if other is not None:
                        other.kill()
                        other.wait()
                if proc.returncode:
                    sys.exit(f"{kind} at {threads} threads failed:\n{proc.stderr[-3000:]}")
                res[load, kind, threads] = float(proc.stdout.strip().splitlines()[-1])
                print(load, kind, threads, res[load, kind, threads], file=sys.stderr)
    head = " | ".join(f"{t} thread{'s' * (t > 1)}" for t in args.threads)
    head += f" | {max(args.threads)} asked, 1 CPU given, fitted"
    lines = [
        "## Torch threads per actor: 1 against 2, idle and busy",
        "",
        f"`python bench/threads_bench.py`, {time.strftime('%Y-%m-%d')}, "
        f"{platform.processor() or platform.machine()}, {cores} cores. Rows (snippets of "
        f"{args.words} words) per second of each pass on `{Path(args.model).name}`, "
        f"{args.snippets} snippets after a warm-up batch of 8, one process per cell; idle: "
        f"each cell started once other work used under 10 % of the machine for 2 s; busy: "
        f"another process keeps all {cores} cores at torch matmuls meanwhile. Fitted: "
        f"`models.hf.fit_threads` before each batch, as an actor given 1 CPU that asked for "
        f"{max(args.threads)} threads calls it (the demo configs' `cpus: 1`, "
        f"`torch_threads: 2`).",
        "",
        f"| machine | pass | {head} | {args.threads[-1]} / {args.threads[0]} |",
        "|---|---|" + "---|" * (len(cells) + 1),
    ]
    for load in ("idle", "busy"):
        for kind in PASSES:
            v = [res[load, kind, c] for c in cells]
            row = " | ".join(f"{x:.2f}" for x in v)
            lines.append(f"| {load} | {kind} | {row} | {v[-2] / v[0]:.2f} |")
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
