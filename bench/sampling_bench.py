"""SaMIA's local sampling, side by side in one run: the former rule (transformers' `generate`,
one snippet's samples at a time, torch's global generator seeded per snippet) against the
local backend's batched sampler (left-padded rows with one KV cache, a generator per
request), each at 1 and 2 torch threads, on the same prompts, model and settings:

    python bench/sampling_bench.py --out BENCHMARKS.md

The prompts are SaMIA's, as its actor builds them (`Continuations`): snippets of the demo
world's books (128 words, the attack demo's), the first half of the words as the prompt, as
many new tokens as the true continuation has, 5 samples at top-k 50, in calls of 8 snippets
(the attack demo's `model.batch_size`). Each side runs in its own process, one after the
other, so the machine is the same for all and nothing else runs (run it alone).
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def requests(backend, n: int, words: int, samples: int):
    """SaMIA's requests for ``n`` snippets of ``words`` words of the demo world's books."""
    from mia_ray.actors.sampler import snippet_seed
    from mia_ray.backends import SampleRequest
    from mia_ray.demo.corpora import load_books
    from mia_ray.features.attacks import samia_split

    out = []
    for doc in load_books():
        ws = doc.text.split()
        for i in range(0, len(ws) - words, words):
            text = " ".join(ws[i : i + words])
            prompt, _ = samia_split(text, 0.5)
            rest = text[len(prompt) :]
            n_tok = len(backend.tokenizer(rest, add_special_tokens=False)["input_ids"])
            out.append(SampleRequest(prompt, samples, max(1, n_tok), snippet_seed(0, str(i))))
            if len(out) == n:
                return out
    return out


def demo_tiny() -> str:
    """The demo world's `tiny` (built on first use)."""
    from mia_ray.config import WorldConfig
    from mia_ray.demo.world import ensure_world

    return str(ensure_world(WorldConfig(target="tiny", scale="demo"))["model"])


def former(backend, reqs, top_k: int) -> list[list[str]]:
    """The former rule: one `generate` per request, torch's global generator seeded with it."""
    import torch

    from mia_ray.backends.base import sample_prompt_ids

    out = []
    for r in reqs:
        ids = sample_prompt_ids(backend.tokenizer, r.prompt, backend.bos_id,
                                backend.max_length, r.max_tokens)  # fmt: skip
        x = torch.tensor([ids])
        torch.manual_seed(r.seed)
        with torch.inference_mode():
            gen = backend.model.generate(
                input_ids=x, attention_mask=torch.ones_like(x), do_sample=True,
                temperature=1.0, top_k=top_k, top_p=1.0, max_new_tokens=r.max_tokens,
                num_return_sequences=r.n, pad_token_id=backend.pad_id,
            )  # fmt: skip
        out.append(backend.tokenizer.batch_decode(gen[:, len(ids) :], skip_special_tokens=True))
    return out


def side(how: str, model: str, threads: int, args) -> dict:
    from mia_ray.backends.local import LocalHFBackend

    backend = LocalHFBackend(model, device="cpu", torch_threads=threads, max_length=256)
    reqs = requests(backend, args.snippets, args.words, args.samples)
    warm = reqs[: args.batch]  # the first call pays one-off costs (kernels, allocations)
    (former(backend, warm, 50) if how == "generate" else backend.sample(warm, 1.0, 50))
    t0 = time.perf_counter()
    outs = []
    for b in range(0, len(reqs), args.batch):
        call = reqs[b : b + args.batch]
        outs += former(backend, call, 50) if how == "generate" else backend.sample(call, 1.0, 50)
    seconds = time.perf_counter() - t0
    tok = backend.tokenizer
    tokens = sum(len(tok(o, add_special_tokens=False)["input_ids"]) for s in outs for o in s)
    return {"seconds": seconds, "tokens": tokens, "snippets": len(reqs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="a folder (default: the demo world's tiny)")
    ap.add_argument("--snippets", type=int, default=160)
    ap.add_argument("--words", type=int, default=128)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8, help="snippets per call (model.batch_size)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--side", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help="BENCHMARKS.md to update")
    args = ap.parse_args()
    args.model = args.model or demo_tiny()
    if args.side:
        how, threads = args.side.split(":")
        print(json.dumps(side(how, args.model, int(threads), args)))
        return
    res = {}
    for threads in args.threads:
        for how in ("generate", "batched"):
            wait_idle()
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            cmd = [sys.executable, __file__, *sys.argv[1:], "--model", args.model,
                   "--side", f"{how}:{threads}"]  # fmt: skip
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if proc.returncode:
                sys.exit(f"{how} at {threads} threads failed:\n{proc.stderr[-3000:]}")
            res[how, threads] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(how, threads, res[how, threads], file=sys.stderr)
    n = res["batched", args.threads[0]]["snippets"]
    lines = [
        "## SaMIA's local sampling: batched against one `generate` per snippet",
        "",
        f"`python bench/sampling_bench.py`, {time.strftime('%Y-%m-%d')}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, each side started "
        "once other work used under 10 % of the machine. "
        f"Model `{Path(args.model).name}`; {n} snippets of {args.words} words of the demo "
        f"world's books, SaMIA's prompts (the first half of the words), {args.samples} samples "
        f"each of as many tokens as the true continuation, top-k 50, in calls of {args.batch} "
        "snippets as the actor makes them; after one warm-up call. `generate`: the former rule "
        "(one call per snippet); batched: `LocalHFBackend.sample` (one KV-cached loop per call, "
        "a generator per snippet, batch-independent).",
        "",
        "| threads | rule | seconds | snippets/s | sampled tokens/s | batched / generate |",
        "|---|---|---|---|---|---|",
    ]
    for threads in args.threads:
        g, b = res["generate", threads], res["batched", threads]
        for how, r in (("generate", g), ("batched", b)):
            ratio = f"{g['seconds'] / b['seconds']:.1f}x" if how == "batched" else ""
            lines.append(
                f"| {threads} | {how} | {r['seconds']:.1f} | {r['snippets'] / r['seconds']:.2f} "
                f"| {r['tokens'] / r['seconds']:,.0f} | {ratio} |"
            )
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
