"""Scoring every classic attack: mia-ray's scorer (in-process and through Ray Data) against the
fair peer (plain Hugging Face, batched, sorted by length, every attack from one forward pass per
model and input) and against the naive loop (batch 1, one pass per attack).

Side by side in one run, on the same snippets and models; every side's six attack scores must
agree. Model loading and actor start-up are timed apart from the steady state (the rows after
the first block), and the steady state's forward FLOP/s is set against this machine's fp32
matmul FLOP/s at the same thread count.

    python bench/scorer_bench.py --target smollm2 --out BENCHMARKS.md
    python bench/scorer_bench.py --target tiny --out BENCHMARKS.md   # needs the demo world
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _markdown import update_section  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DATA_LOG_LEVEL", "WARNING")

ATTACKS = ("loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "ref")
RATIO = 0.2
MIN_BLOCKS = 4  # blocks per pool in each side's half run (see by_difference)


def forward_flops(model, n_tokens: int, seq_len: float) -> float:
    """2 FLOPs per multiply-add: every weight outside the embeddings, the LM head (vocab × d)
    and the attention scores and mixing (QK^T and AV over an average context of seq_len/2)."""
    cfg = model.config
    d = cfg.hidden_size
    emb = sum(
        p.numel() for n, p in model.named_parameters() if "wte" in n or "wpe" in n or "embed" in n
    )
    # A tied LM head shares the input embedding's weights (counted once, as embedding).
    head = cfg.vocab_size * d if cfg.tie_word_embeddings else 0
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


def attack_scores(lp, mu, sigma, text, lower_loss, ref_loss) -> dict[str, float]:
    """The six attacks from one snippet's statistics, by the papers' definitions (numpy)."""
    lp, mu, sigma = (np.asarray(v, np.float64) for v in (lp, mu, sigma))
    loss = -lp.mean()
    k = max(1, int(RATIO * len(lp)))
    z = (lp - mu) / np.maximum(sigma, 1e-8)
    return {
        "loss": -loss,
        "zlib": -loss / len(zlib.compress(text.encode("utf-8"))),
        "min_k": np.sort(lp)[:k].mean(),
        "min_k_plus_plus": np.sort(z)[:k].mean(),
        "lowercase": -(loss / lower_loss),
        "ref": -(loss - ref_loss),
    }


# ----------------------------------------------------------------------------- the peers


def _hf(model_dir: str, threads: int, max_length: int):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ctx = getattr(model.config, "max_position_embeddings", None) or model.config.n_positions
    return model, tok, min(max_length, ctx)


def _stats(logits_row, ids_row, n: int, moments: bool):
    import torch

    logp = torch.log_softmax(logits_row[: n - 1].float(), -1)
    lp = logp.gather(-1, ids_row[1:n, None]).squeeze(-1)
    if not moments:
        return lp.numpy(), None, None
    p = logp.exp()
    safe = logp.clamp_min(-200.0)
    mu = (p * safe).sum(-1)
    sigma = ((p * safe.square()).sum(-1) - mu.square()).clamp_min(0).sqrt()
    return lp.numpy(), mu.numpy(), sigma.numpy()


def naive(texts, model_dir, ref_dir, max_length, threads):
    """A first script: per attack and snippet its own forward pass, batch 1."""
    import torch

    t0 = time.perf_counter()
    model, tok, max_length = _hf(model_dir, threads, max_length)
    ref, _, _ = _hf(ref_dir, threads, max_length)
    t_load = time.perf_counter() - t0

    def stats(m, text, moments=False):
        ids = tok(text, return_tensors="pt", truncation=True, max_length=max_length)["input_ids"]
        with torch.inference_mode():
            logits = m(ids).logits[0]
        return _stats(logits, ids[0], ids.shape[1], moments)

    t0 = time.perf_counter()
    rows = []
    for text in texts:
        per = {}
        for attack in ATTACKS:  # each attack computes what it needs from scratch
            lp, mu, sigma = stats(model, text, moments=attack == "min_k_plus_plus")
            lower = -stats(model, text.lower())[0].mean() if attack == "lowercase" else 1.0
            ref_loss = -stats(ref, text)[0].mean() if attack == "ref" else 0.0
            if mu is None:
                mu, sigma = np.zeros_like(lp), np.ones_like(lp)
            per[attack] = attack_scores(lp, mu, sigma, text, lower, ref_loss)[attack]
        rows.append(per)
    return pd.DataFrame(rows), t_load, time.perf_counter() - t0, 8 * len(texts)


def fair_peer(texts, model_dir, ref_dir, max_length, batch, threads):
    """What a competent user writes with plain HF: sort by length, batch, right-pad, and take
    every attack from one pass per model and input (target, lowercased target, reference)."""
    import torch

    t0 = time.perf_counter()
    model, tok, max_length = _hf(model_dir, threads, max_length)
    ref, _, _ = _hf(ref_dir, threads, max_length)
    t_load = time.perf_counter() - t0
    tok.padding_side = "right"

    def passes(m, batch_texts, moments):
        enc = tok(
            batch_texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length
        )
        with torch.inference_mode():
            logits = m(**enc).logits
        lens = enc["attention_mask"].sum(1).tolist()
        return [_stats(logits[i], enc["input_ids"][i], n, moments) for i, n in enumerate(lens)]

    t0 = time.perf_counter()
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    rows = {}
    for s in range(0, len(order), batch):
        idx = order[s : s + batch]
        bt = [texts[i] for i in idx]
        tgt = passes(model, bt, True)
        low = passes(model, [t.lower() for t in bt], False)
        rf = passes(ref, bt, False)
        for j, i in enumerate(idx):
            lp, mu, sigma = tgt[j]
            rows[i] = attack_scores(lp, mu, sigma, texts[i], -low[j][0].mean(), -rf[j][0].mean())
    wall = time.perf_counter() - t0
    return pd.DataFrame([rows[i] for i in range(len(texts))]), t_load, [wall]


def _mia_scores(frame: pd.DataFrame, texts) -> pd.DataFrame:
    """mia-ray's own attack code over the Scorer's columns, in the input order."""
    from mia_ray.features.attacks import score_table, stats_from_columns

    frame = frame.set_index("snippet_id").loc[[f"s{i}" for i in range(len(texts))]]
    stats = stats_from_columns(
        list(texts),
        frame["token_logprobs"],
        frame["mu"],
        frame["sigma"],
        frame["lower_loss"],
        frame["ref_loss"],
    )
    table = score_table(stats, list(ATTACKS), [RATIO], RATIO)
    return pd.DataFrame({a: np.asarray(table[a]) for a in ATTACKS})


def in_process(texts, model_dir, ref_dir, max_length, batch, threads, block_rows):
    """The Scorer actors' own code called directly, on the pipeline's batches, no Ray."""
    from mia_ray.actors import BATCH
    from mia_ray.actors.scorer import Scorer
    from mia_ray.stages import draw_batches

    df = pd.DataFrame({"snippet_id": [f"s{i}" for i in range(len(texts))], "text": texts})
    t0 = time.perf_counter()
    kw = {"device": "cpu", "dtype": "float32", "max_length": max_length, "torch_threads": threads}
    tgt = Scorer(model_dir, **kw)
    ref = Scorer(ref_dir, lowercase=False, token_stats=False, prefix="ref_", **kw)
    t_load = time.perf_counter() - t0
    rows = draw_batches(df, batch)
    per_block = batch * max(1, block_rows // batch)
    outs, walls = {}, []
    for name, scorer in (("target", tgt), ("reference", ref)):
        t0, parts = time.perf_counter(), []
        for s in range(0, len(rows), per_block):
            parts.append(scorer(rows.iloc[s : s + per_block]))
        walls.append(time.perf_counter() - t0)
        outs[name] = pd.concat(parts).drop(columns=BATCH)
    m = outs["target"].merge(outs["reference"][["snippet_id", "ref_loss"]], on="snippet_id")
    return _mia_scores(m, texts), t_load, walls


def through_ray(texts, model_dir, ref_dir, max_length, batch, threads, block_rows):
    """The pipeline's path: model_blocks -> a Scorer actor pool (scorer_mapper), target then
    reference, on a local Ray instance. Returns the scores, no load time (the actors load
    inside their pools' wall time) and each pool's wall time (actor start, model load and
    every row back at the driver)."""
    from mia_ray.actors import BATCH
    from mia_ray.config import ModelConfig, PoolResources, ResourcesConfig
    from mia_ray.scoring.pools import scorer_mapper
    from mia_ray.stages import model_blocks

    df = pd.DataFrame({"snippet_id": [f"s{i}" for i in range(len(texts))], "text": texts})
    mc = ModelConfig(device="cpu", dtype="float32", max_length=max_length, batch_size=batch)
    rc = ResourcesConfig(scorer=PoolResources(actors=1, cpus=1, torch_threads=threads))
    outs, walls = {}, []
    for name, model, prefix, lower, full in (
        ("target", model_dir, "", True, True),
        ("reference", ref_dir, "ref_", False, False),
    ):
        t0, parts = time.perf_counter(), []
        ds = scorer_mapper(mc, rc, model, prefix, lower, full)(model_blocks(df, batch, block_rows))
        for b in ds.iter_batches(batch_format="pandas", batch_size=None):
            parts.append(b.drop(columns=BATCH, errors="ignore"))
        walls.append(time.perf_counter() - t0)
        outs[name] = pd.concat(parts)
    m = outs["target"].merge(outs["reference"][["snippet_id", "ref_loss"]], on="snippet_id")
    return _mia_scores(m, texts), 0.0, walls


# Ray Data's own helper actors (stats, autoscaling, actor locations), by process title.
_RAY_DATA_HELPERS = ("_StatsActor", "_AutoscalingCoordinatorActor", "ActorLocationTracker")


class CpuSampler:
    """CPU seconds (user + system) of every process on the machine, read every ``every``
    seconds while it runs, so a process that ends (an actor pool's workers) keeps what it
    spent until its last reading. ``used()``: pid -> (process title, CPU s since start)."""

    def __init__(self, every: float = 0.5):
        import threading

        self.every, self.first, self.last = every, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> None:
        import psutil

        started = bool(self.last)  # a process first seen later started since
        for p in psutil.process_iter(["cmdline", "name"]):
            try:
                c = p.cpu_times()
                title = " ".join(p.info["cmdline"] or [p.info["name"] or ""])
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self.first.setdefault(p.pid, (title, 0.0 if started else c.user + c.system))
            self.last[p.pid] = (title, c.user + c.system)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._read()

    def __enter__(self) -> CpuSampler:
        self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def used(self) -> dict[int, tuple[str, float]]:
        return {pid: (t, c - self.first[pid][1]) for pid, (t, c) in self.last.items()}


def cpu_split(used: dict[int, tuple[str, float]]) -> dict[str, float]:
    """:meth:`CpuSampler.used` by who spent it: the Scorer actors, this driver, Ray Data's
    helper actors, the rest of Ray (raylet, GCS, agents, idle workers) and everything else."""
    split = dict.fromkeys(
        ("scorer actors", "driver", "Ray Data helpers", "rest of Ray", "other"), 0.0
    )
    for pid, (title, cpu) in used.items():
        if pid == os.getpid():
            split["driver"] += cpu
        elif "Scorer" in title:
            split["scorer actors"] += cpu
        elif any(h in title for h in _RAY_DATA_HELPERS):
            split["Ray Data helpers"] += cpu
        elif "ray" in title.lower():
            split["rest of Ray"] += cpu
        else:
            split["other"] += cpu
    return split


def by_difference(side, texts, *args) -> tuple[pd.DataFrame, float, list, float, dict]:
    """One side's steady state, measured the same way for every batched side: run it on
    every other snippet (half of them, of the same mix of lengths), then on all; each pool's
    steady rows/s is the extra rows over its extra wall time, and its start-up (warm-up, and
    through Ray actor start and model load: the intercept) cancels out. ``side(texts, *args)
    -> (scores, load s, wall s per pool)``. Returns the full run's scores, its load time,
    each pool's (start-up s, rows/s), the full run's wall time and who spent the machine's
    CPU during it (:func:`cpu_split`). Ray Data hands rows back in bursts, so arrival times
    would not show the rate; and the snippets are scored longest first, so the rows after a
    first batch would flatter a side."""
    half = len(texts[::2])
    _, _, walls_half = side(texts[::2], *args)
    with CpuSampler() as cpu:
        scores, load, walls = side(texts, *args)
    rates = []
    for w_half, w in zip(walls_half, walls, strict=True):
        rate = (len(texts) - half) / (w - w_half)
        rates.append((w_half - half / rate, rate))
    return scores, load, rates, sum(walls), cpu_split(cpu.used())


def _combined(rates) -> float:
    """Snippets/s through all passes, from each pool's steady rows/s (they run in turn)."""
    return 1.0 / sum(1.0 / r for _, r in rates)


def _texts(n: int, words: int) -> list[str]:
    """Snippets of the offline web corpus as the pipelines cut them: ``words`` words, the last
    of each page shorter (at least a quarter)."""
    from mia_ray.data.snippets import split_words
    from mia_ray.demo.corpora import web_pool

    texts = []
    for _, page in web_pool():
        texts.extend(split_words(page, words, max(1, words // 4)))
        if len(texts) >= n:
            break
    return texts[:n]


def _models(target: str, world_root: Path) -> tuple[str, str, str]:
    """(target dir, reference dir, description)."""
    if target == "tiny":
        return (
            str(world_root / "models" / "tiny"),
            str(world_root / "models" / "tiny-ref"),
            "demo `tiny` + `tiny-ref`",
        )
    from mia_ray.demo.world import ensure_smollm2_base

    base = str(ensure_smollm2_base())
    tuned = world_root / "models" / "smollm2"
    if tuned.is_dir():
        return str(tuned), base, "demo `smollm2` + its base SmolLM2-135M-Instruct as reference"
    return base, base, "SmolLM2-135M-Instruct (target and reference)"


def main() -> int:
    ap = argparse.ArgumentParser()
    home = Path(os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")).expanduser()
    ap.add_argument("--world-root", default=str(home / "world-demo"))
    ap.add_argument("--target", default="smollm2", choices=["tiny", "smollm2"])
    ap.add_argument("--n-snippets", type=int, default=64)
    ap.add_argument("--n-naive", type=int, default=4, help="snippets the naive loop scores")
    ap.add_argument("--words", type=int, default=128)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--block-rows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    blocks = args.n_snippets // 2 // max(args.block_rows, args.batch_size)
    if blocks < MIN_BLOCKS:
        raise SystemExit(
            f"--n-snippets {args.n_snippets} gives the half run {blocks} blocks of "
            f"{args.block_rows} rows per pool; the steady state needs at least {MIN_BLOCKS}"
        )

    import ray
    import torch
    import transformers  # noqa: F401  (imported before any clock starts)

    import mia_ray.actors.scorer  # noqa: F401

    texts = _texts(args.n_snippets, args.words)
    model_dir, ref_dir, what = _models(args.target, Path(args.world_root))
    common = (model_dir, ref_dir, args.max_length)

    ray.init(
        address="local", num_cpus=args.threads, include_dashboard=False, logging_level="ERROR",
        _node_ip_address="127.0.0.1",
    )  # fmt: skip
    ray.data.DataContext.get_current().enable_progress_bars = False
    mia_args = (*common, args.batch_size, args.threads, args.block_rows)
    ray_scores, _, ray_rates, ray_wall, ray_cpu = by_difference(through_ray, texts, *mia_args)
    ray.shutdown()

    torch.set_num_threads(args.threads)
    ip_scores, ip_load, ip_rates, _, _ = by_difference(in_process, texts, *mia_args)
    peer_scores, peer_load, peer_rates, _, _ = by_difference(
        fair_peer, texts, *common, args.batch_size, args.threads
    )
    nv = texts[: args.n_naive]
    naive_scores, naive_load, naive_s, naive_passes = naive(nv, *common, args.threads)
    for a in ATTACKS:
        for name, got in (("Ray", ray_scores), ("in-process", ip_scores)):
            np.testing.assert_allclose(
                got[a], peer_scores[a], rtol=1e-3, atol=1e-4, err_msg=f"{name} {a}"
            )
        np.testing.assert_allclose(
            naive_scores[a], peer_scores[a][: len(nv)], rtol=1e-3, atol=1e-4, err_msg=f"naive {a}"
        )

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ref = AutoModelForCausalLM.from_pretrained(ref_dir)

    def tokens(path: str, batch_texts) -> list[int]:
        ctx = getattr(model.config, "max_position_embeddings", None) or model.config.n_positions
        tok = AutoTokenizer.from_pretrained(path)
        enc = tok(list(batch_texts), truncation=True, max_length=min(args.max_length, ctx))
        return [len(ids) for ids in enc["input_ids"]]

    passes = [  # (model, tokens per snippet) of the three passes
        (model, tokens(model_dir, texts)),
        (model, tokens(model_dir, [t.lower() for t in texts])),
        (ref, tokens(ref_dir, texts)),
    ]
    n_tok = sum(passes[0][1])
    seq = n_tok / len(texts)
    per_snippet = sum(forward_flops(m, sum(n), sum(n) / len(n)) for m, n in passes) / len(texts)
    peak = matmul_flops(args.threads)
    ip_rate, ray_rate, peer_rate = _combined(ip_rates), _combined(ray_rates), _combined(peer_rates)
    naive_rate = len(nv) / naive_s
    share = lambda r: 100 * r * per_snippet / peak  # noqa: E731
    ip_first = sum(f for f, _ in ip_rates)
    peer_first = sum(f for f, _ in peer_rates)
    ray_first = sum(f for f, _ in ray_rates)
    date = time.strftime("%Y-%m-%d")
    machine_cpu = ray_wall * (os.cpu_count() or 1)
    cpu_use = "; ".join(f"{k} {100 * v / machine_cpu:.1f} %" for k, v in ray_cpu.items())
    lines = [
        f"## Scoring on `{args.target}`: mia-ray against the fair peer and the naive loop",
        "",
        f"`python bench/scorer_bench.py --target {args.target}` on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, {args.threads} threads, {date}. Models: {what} "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params); {len(texts)} snippets of up to "
        f"{args.words} words of the offline web corpus ({seq:.0f} tokens on average), fp32, batch {args.batch_size}; "
        "all six attacks (LOSS, zlib, Min-K% and Min-K%++ at 20 %, lowercase, reference). Every side's scores "
        f"agree (rtol 1e-3); the naive loop scores the first {len(nv)} snippets only.",
        "",
        "| | forward passes per snippet | load / start-up (s) | steady snippets/s | vs fair peer | FLOP share |",
        "|---|---|---|---|---|---|",
        f"| naive loop (HF, batch 1, one pass per attack) | {naive_passes // len(nv)} | {naive_load:.1f} | {naive_rate:.2f} | {naive_rate / peer_rate:.2f}× | {share(naive_rate):.1f} % |",
        f"| fair peer (HF, batched, sorted by length, one pass per model and input) | 3 | {peer_load:.1f} | {peer_rate:.2f} | 1.00× | {share(peer_rate):.1f} % |",
        f"| mia-ray Scorer in-process (no Ray) | 3 | {ip_load:.1f} | {ip_rate:.2f} | {ip_rate / peer_rate:.2f}× | **{share(ip_rate):.1f} %** |",
        f"| mia-ray through Ray Data (1 Scorer actor per model) | 3 | {ray_first:.1f} | {ray_rate:.2f} | {ray_rate / peer_rate:.2f}× | {share(ray_rate):.1f} % |",
        "",
        f"**Ray Data / in-process at steady state: {100 * ray_rate / ip_rate:.0f} %**; mia-ray / naive loop: "
        f"{ip_rate / naive_rate:.1f}×. Steady state, the same for the three batched sides: each "
        f"runs on every other snippet, then on all, and each pool's steady rate is its "
        f"extra rows over its extra wall time (rows reach Ray's driver in bursts, and the "
        f"snippets go longest first, so the rows after a first batch would flatter a side). "
        f"Start-up, the intercept (warm-up; through Ray also actor start and model load): "
        f"in-process {ip_first:.1f} s, fair peer {peer_first:.1f} s, Ray {ray_first:.1f} s "
        f"(both pools), after loading the models (the load column; in Ray's start-up). "
        f"In-process and the fair peer have next to no start-up, so their intercepts show the "
        f"method's noise (they can come out below zero). The whole "
        f"Ray run {ray_wall:.1f} s. FLOP share: forward FLOPs of the three "
        f"passes ({per_snippet / 1e9:.1f} GFLOP per snippet: weights, LM head, attention) × snippets/s over "
        f"this machine's fp32 matmul ({peak / 1e9:.0f} GFLOP/s, 2048², {args.threads} threads); the naive "
        "loop's share counts only the three passes that any method needs.",
        "",
        f"Where the machine's CPU went during the whole Ray run ({ray_wall:.0f} s × {os.cpu_count()} "
        f"CPUs): {cpu_use}. What the Scorer actors do not get is what Ray's own processes "
        "take on the same cores: the driver's executor loop and iterator, Ray Data's helper "
        "actors, the raylet, GCS and agents. A forward on all the cores waits for its slowest "
        "thread, so every slice taken from one thread stalls the others too; on nodes whose "
        "accelerators do the forward these processes take CPU the model does not use.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        update_section(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
