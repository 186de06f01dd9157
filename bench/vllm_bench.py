"""vLLM against transformers, side by side in one run: scoring (prompt log-probs) and SaMIA's
sampling, on the same snippets and model, each engine in its own process with the same
threads. Run it in the vLLM environment (`make setup-vllm`):

    .venv-vllm/bin/python bench/vllm_bench.py --out BENCHMARKS.md          # this CPU, smollm2
    python bench/vllm_bench.py --device cuda --model EleutherAI/pythia-1.4b  # a GPU machine

Each side: load time apart, then the steady state over every snippet (tokens/s); scoring's
largest per-token difference between the engines; the forward FLOP/s set against the
device's peak (``--peak-tflops``; on a CPU, measured: this machine's fp32 matmul at the same
threads). On a GPU it finishes in a few minutes on a 1-2B model (``--snippets`` sets it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def snippets(n: int, words: int) -> list[str]:
    """``n`` passages of ``words`` words from the demo corpus's books (Shakespeare, public)."""
    from mia_ray.demo.corpora import load_books

    out = []
    for doc in load_books():
        ws = doc.text.split()
        for i in range(0, len(ws) - words, words):
            out.append(" ".join(ws[i : i + words]))
            if len(out) == n:
                return out
    return out


def side(engine: str, model: str, texts: list[str], samples: int, max_tokens: int,
         threads: int, device: str) -> dict:  # fmt: skip
    """One engine's numbers (runs in its own process)."""
    from mia_ray.backends import LoglikRequest, SampleRequest, from_spec

    t0 = time.perf_counter()
    spec = {"kind": engine, "model": model, "dtype": "auto", "device": device,
            "batch_size": 8, "torch_threads": threads, "seed": 0}  # fmt: skip
    backend = from_spec(spec)
    load_s = time.perf_counter() - t0
    reqs = [LoglikRequest("", t) for t in texts]
    t1 = time.perf_counter()
    got = backend.loglikelihood(reqs)
    score_s = time.perf_counter() - t1
    n_tokens = sum(len(r.logprobs) for r in got)
    asks = [SampleRequest(" ".join(t.split()[: len(t.split()) // 2]), samples, max_tokens, i)
            for i, t in enumerate(texts)]  # fmt: skip
    t2 = time.perf_counter()
    outs = backend.sample(asks, temperature=1.0)
    sample_s = time.perf_counter() - t2
    tok = backend.tokenizer
    n_sampled = sum(len(tok(o, add_special_tokens=False)["input_ids"]) for s in outs for o in s)
    return {
        "engine": engine, "load_s": load_s, "score_s": score_s, "score_tokens": n_tokens,
        "sample_s": sample_s, "sampled_tokens": n_sampled,
        "logprobs": [r.logprobs for r in got],
    }  # fmt: skip


def matmul_tflops(threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    t = time.perf_counter()
    for _ in range(5):
        a @ b
    return 5 * 2 * 2048**3 / (time.perf_counter() - t) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="", help="folder or hub name (default: SmolLM2-135M)")
    ap.add_argument("--snippets", type=int, default=200)
    ap.add_argument("--words", type=int, default=64)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="device peak (GPU: bf16 dense)")
    ap.add_argument("--side", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help="BENCHMARKS.md to update")
    args = ap.parse_args()
    if not args.model:
        from mia_ray.demo.world import ensure_smollm2_base

        args.model = str(ensure_smollm2_base())
    texts = snippets(args.snippets, args.words)
    if args.side:  # one engine, in this process: its numbers as JSON on stdout
        got = side(args.side, args.model, texts, args.samples, args.max_tokens, args.threads,
                   args.device)  # fmt: skip
        print(json.dumps(got))
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    res = {}
    for engine in ("local", "vllm"):
        cmd = [sys.executable, __file__, "--side", engine, *sys.argv[1:]]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode:
            sys.exit(f"{engine} failed:\n{proc.stderr[-3000:]}")
        res[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
    import numpy as np

    diff = max(float(np.max(np.abs(np.subtract(a, b))))
               for a, b in zip(res["local"]["logprobs"], res["vllm"]["logprobs"], strict=True))  # fmt: skip
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(args.model)
    params = _params(cfg)
    peak = args.peak_tflops or (matmul_tflops(args.threads) if args.device == "cpu" else 0)
    rows = []
    for engine, r in res.items():
        score_tps = r["score_tokens"] / r["score_s"]
        sample_tps = r["sampled_tokens"] / r["sample_s"]
        share = 2 * params * score_tps / 1e12 / peak if peak else float("nan")
        rows.append(
            f"| {'transformers' if engine == 'local' else 'vLLM'} | {r['load_s']:.1f} | "
            f"{r['score_s']:.1f} | {score_tps:,.0f} | {share:.0%} | {r['sample_s']:.1f} | "
            f"{sample_tps:,.0f} |"
        )
    ratio_score = res["local"]["score_s"] / res["vllm"]["score_s"]
    ratio_sample = res["local"]["sample_s"] / res["vllm"]["sample_s"]
    text = "\n".join([
        f"`{' '.join(['python', 'bench/vllm_bench.py', *sys.argv[1:]])}` on "
        f"{os.uname().machine}, {args.threads} threads, {args.device}, "
        f"{time.strftime('%Y-%m-%d')}: {len(texts)} snippets of {args.words} words, "
        f"{args.samples} samples of {args.max_tokens} tokens each; model "
        f"{Path(args.model).name} ({params / 1e6:.0f} M weights multiplied per token: layers "
        f"and LM head); peak "
        f"{peak:.2f} TFLOP/s ({'measured fp32 matmul' if not args.peak_tflops else 'given'}).",
        "",
        "| engine | load s | scoring s | scored tokens/s | share of peak | sampling s | sampled tokens/s |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"vLLM / transformers: scoring {ratio_score:.2f}x, sampling {ratio_sample:.2f}x; "
        f"largest per-token log-prob difference {diff:.1e}.",
    ])  # fmt: skip
    print(text)
    if args.out:
        from _markdown import update_section

        update_section(Path(args.out), f"## vLLM vs transformers ({args.device})\n\n{text}")


def _params(cfg) -> int:
    """Weights a token's forward pass multiplies by (layers and LM head), from the config."""
    c = cfg.get_text_config()
    d, n, f = c.hidden_size, c.num_hidden_layers, getattr(c, "intermediate_size", 4 * c.hidden_size)
    heads, kv = c.num_attention_heads, getattr(c, "num_key_value_heads", c.num_attention_heads)
    attn = d * d * 2 + 2 * d * (d // heads) * kv
    mlp = 3 * d * f if getattr(c, "hidden_act", "") in ("silu", "swiglu") else 2 * d * f
    return n * (attn + mlp) + d * c.vocab_size


if __name__ == "__main__":
    main()
