"""Our scorer (all attacks from one pass per input, batched, through Ray Data) vs a naive loop.

The naive loop is what a first script does: for every attack and every snippet, its own HF
forward pass at batch size 1 (LOSS, zlib, Min-K%, Min-K%++: one each; lowercase: original
and lowercased; ref: target and reference). Both sides score the same snippets with the same
models on this machine, in one run, and must agree on every score.

Also: our achieved FLOP/s (forward FLOPs of the passes we ran / our scoring time) against
this machine's fp32 matmul FLOP/s measured with torch at the same thread count.

    make bench   # both targets; needs the demo world with smollm2 (mia-ray demo --set targets=[tiny,smollm2])
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from mia_ray.features.attacks import score_table, stats_from_columns

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _markdown import update_section  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def forward_flops(model, n_tokens: int, seq_len: int) -> float:
    """2 FLOPs per multiply-add: every weight outside the embeddings, the LM head (vocab × d)
    and the attention scores and mixing (QK^T and AV over an average context of seq_len/2)."""
    cfg = model.config
    d = cfg.hidden_size
    emb = sum(
        p.numel() for n, p in model.named_parameters() if "wte" in n or "wpe" in n or "embed" in n
    )
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * d  # untied: counted in the params
    body = sum(p.numel() for p in model.parameters()) - emb + head
    attn = 2 * 2 * cfg.num_hidden_layers * (seq_len / 2) * d
    return float(n_tokens) * (2 * body + attn)


def matmul_flops(threads: int, n: int = 2048, reps: int = 5) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def naive(texts, model_dir, ref_dir, max_length, ratio):
    import torch

    from mia_ray.models.hf import load_causal_lm

    model, tok, _ = load_causal_lm(model_dir, "cpu", "float32")
    ref, _, _ = load_causal_lm(ref_dir, "cpu", "float32")

    def token_stats(m, text):
        ids = tok(text, return_tensors="pt", truncation=True, max_length=max_length)["input_ids"]
        with torch.inference_mode():
            logp = torch.log_softmax(m(ids).logits[0, :-1].float(), -1)
        lp = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
        p = logp.exp()
        mu = (p * logp).sum(-1)
        sigma = ((p * logp.square()).sum(-1) - mu.square()).clamp_min(0).sqrt()
        return lp.numpy(), mu.numpy(), sigma.numpy()

    out = {k: [] for k in ("loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "ref")}
    passes = 0
    for text in texts:
        lp, _, _ = token_stats(model, text)
        out["loss"].append(lp.mean())
        lp, _, _ = token_stats(model, text)
        out["zlib"].append(lp.mean() / len(zlib.compress(text.encode("utf-8"))))
        lp, _, _ = token_stats(model, text)
        k = max(1, int(ratio * len(lp)))
        out["min_k"].append(np.sort(lp)[:k].mean())
        lp, mu, sigma = token_stats(model, text)
        z = (lp - mu) / np.maximum(sigma, 1e-8)
        out["min_k_plus_plus"].append(np.sort(z)[:k].mean())
        lp, _, _ = token_stats(model, text)
        lower, _, _ = token_stats(model, text.lower())
        out["lowercase"].append(-(-lp.mean() / -lower.mean()))
        lp, _, _ = token_stats(model, text)
        rlp, _, _ = token_stats(ref, text)
        out["ref"].append(-rlp.mean() + lp.mean())
        passes += 8
    return {k: np.asarray(v) for k, v in out.items()}, passes, model


def _attack_table(m, ratio):
    stats = stats_from_columns(
        m["text"], m["token_logprobs"], m["mu"], m["sigma"], m["lower_loss"], m["ref_loss"]
    )
    return score_table(
        stats, ["loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "ref"], [ratio], ratio
    )


def in_process(texts, model_dir, ref_dir, max_length, ratio, batch_size, threads):
    """The same Scorer code as the actors, called directly: batching and one pass, no Ray."""
    import pandas as pd

    from mia_ray.actors.scorer import Scorer

    df = pd.DataFrame({"snippet_id": [f"s{i}" for i in range(len(texts))], "text": texts})
    tgt = Scorer(
        model_dir, device="cpu", dtype="float32", max_length=max_length, torch_threads=threads
    )
    ref = Scorer(
        ref_dir,
        device="cpu",
        dtype="float32",
        max_length=max_length,
        torch_threads=threads,
        lowercase=False,
        token_stats=False,
        prefix="ref_",
    )
    parts = []
    for i in range(0, len(df), batch_size):
        b = df.iloc[i : i + batch_size]
        parts.append(tgt(b).merge(ref(b)[["snippet_id", "ref_loss"]], on="snippet_id"))
    m = df.merge(pd.concat(parts), on="snippet_id")
    table = _attack_table(m, ratio)
    return {k: np.asarray(v) for k, v in table.items()}


def ours(texts, model_dir, ref_dir, max_length, ratio, batch_size, threads):
    import pandas as pd
    import ray

    from mia_ray.actors.scorer import Scorer

    df = pd.DataFrame({"snippet_id": [f"s{i}" for i in range(len(texts))], "text": texts})
    ds = ray.data.from_pandas(df).materialize()
    common = {
        "device": "cpu",
        "dtype": "float32",
        "max_length": max_length,
        "torch_threads": threads,
    }
    tgt = ds.map_batches(
        Scorer,
        fn_constructor_kwargs={"model": model_dir, **common},
        batch_size=batch_size,
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=1,
    ).to_pandas()
    ref = ds.map_batches(
        Scorer,
        fn_constructor_kwargs={
            "model": ref_dir,
            "lowercase": False,
            "token_stats": False,
            "prefix": "ref_",
            **common,
        },
        batch_size=batch_size,
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=1,
    ).to_pandas()
    m = df.merge(tgt, on="snippet_id").merge(ref[["snippet_id", "ref_loss"]], on="snippet_id")
    table = _attack_table(m, ratio)
    order = {s: i for i, s in enumerate(m["snippet_id"])}
    idx = [order[f"s{i}"] for i in range(len(texts))]
    return {k: np.asarray(v)[idx] for k, v in table.items()}, int(m["n_tokens"].sum())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--world-root",
        default=str(
            Path(os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")).expanduser() / "world-demo"
        ),
    )
    ap.add_argument("--target", default="tiny", choices=["tiny", "smollm2"])
    ap.add_argument("--n-snippets", type=int, default=192)
    ap.add_argument("--words", type=int, default=128)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import ray
    import torch

    from mia_ray.data.snippets import split_words

    root = Path(args.world_root)
    docs = [
        json.loads(line) for line in (root / "corpus" / "documents.jsonl").read_text().splitlines()
    ]
    texts = []
    for d in docs:
        texts.extend(split_words(d["text"], args.words, args.words))
        if len(texts) >= args.n_snippets:
            break
    texts = texts[: args.n_snippets]
    model_dir = str(root / "models" / args.target)
    if args.target == "tiny":
        ref_dir = str(root / "models" / "tiny-ref")
    else:  # smollm2's reference is its base model, converted once from the GGUF
        ref_dir = json.loads((root / "world.json").read_text())["steps"]["smollm2"].get(
            "base"
        ) or str(root.parent / "models" / "smollm2-135m-instruct")

    ray.init(address="local", num_cpus=args.threads, include_dashboard=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    t = time.perf_counter()
    ours_scores, n_tokens = ours(
        texts, model_dir, ref_dir, args.max_length, 0.2, args.batch_size, args.threads
    )
    t_ours = time.perf_counter() - t
    ray.shutdown()

    torch.set_num_threads(args.threads)
    t = time.perf_counter()
    inproc_scores = in_process(
        texts, model_dir, ref_dir, args.max_length, 0.2, args.batch_size, args.threads
    )
    t_inproc = time.perf_counter() - t
    t = time.perf_counter()
    naive_scores, passes, model = naive(texts, model_dir, ref_dir, args.max_length, 0.2)
    t_naive = time.perf_counter() - t
    for k in naive_scores:
        np.testing.assert_allclose(ours_scores[k], naive_scores[k], rtol=1e-3, atol=1e-4, err_msg=k)
        np.testing.assert_allclose(
            inproc_scores[k], naive_scores[k], rtol=1e-3, atol=1e-4, err_msg=k
        )

    seq = n_tokens / len(texts)
    flops_ours = 3 * forward_flops(model, n_tokens, int(seq))  # target, lowercase, reference passes
    achieved = flops_ours / t_ours
    peak = matmul_flops(args.threads)
    lines = [
        f"## Scorer on `{args.target}`: all attacks from one pass (Ray Data) vs a naive per-attack loop",
        "",
        f"Command: `python bench/scorer_bench.py --target {args.target} --n-snippets {args.n_snippets}`",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} threads; "
        f"model: demo `{args.target}` ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params) + its reference; "
        f"{len(texts)} snippets of {args.words} words ({seq:.0f} tokens on average). Times include model loading on both sides; "
        "all six attack scores agree between the two (rtol 1e-3).",
        "",
        "| | forward passes | wall time (s) | snippets/s |",
        "|---|---|---|---|",
        f"| naive loop (HF, batch 1, one pass per attack) | {passes} | {t_naive:.1f} | {len(texts) / t_naive:.2f} |",
        f"| mia-ray Scorer in-process (batch {args.batch_size}, no Ray) | {3 * len(texts)} | {t_inproc:.1f} | {len(texts) / t_inproc:.2f} |",
        f"| mia-ray scorer (Ray Data actor pool, batch {args.batch_size}) | {3 * len(texts)} | {t_ours:.1f} | {len(texts) / t_ours:.2f} |",
        "",
        f"**Speed-up (naive time / ours through Ray Data): {t_naive / t_ours:.2f}×**; "
        f"naive / Scorer in-process: {t_naive / t_inproc:.2f}× (the gap to Ray is actor start-up "
        "and scheduling, paid once per pool).",
        "",
        f"Achieved forward FLOP/s (ours, incl. start-up): {achieved / 1e9:.1f} GFLOP/s; "
        f"machine fp32 matmul (2048², {args.threads} threads): {peak / 1e9:.1f} GFLOP/s; "
        f"**share: {100 * achieved / peak:.1f} %**",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        update_section(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
