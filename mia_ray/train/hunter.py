"""MemHunter's training (Wu et al., Algorithm 1 with Algorithm 3 and Appendix A).

Each iteration: (step 1) for every training pair (x, y), candidate prompts grow token by
token from the hunter's top-k with randomized beam search, each candidate scored by the
target (mu of its greedy continuation, and the loss of y); the best candidate of each pair
enters the prompt pool if rejection sampling accepts it; (step 2) the hunter is LoRA
fine-tuned to write the pool's prompts for their x. Every iteration is checkpointed in its
own folder; a rerun resumes after the last finished one, with the same results.

No Ray here: ``train_hunter`` takes the hunter (an object with ``topk``, ``allowed``,
``decode``, ``load_adapter``), a ``score(prompts, x_ids, y_ids) -> (mu, loss)`` callable and
a ``finetune(adapter_in, rows, out_dir, seed) -> dict`` callable; the pipeline backs them
with Ray actors and tasks (``finetune`` leaves the adapter in ``out_dir``). Within a run, each
checkpoint also goes to the run's storage (:mod:`mia_ray.storage`), so another driver or node
resumes from it.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.errors import MiaError
from mia_ray.train.config import HunterConfig

Score = Callable[[list[str], list[list[int]], list[list[int]]], tuple[np.ndarray, np.ndarray]]


def pair_seed(seed: int, *keys: Any) -> int:
    """A 32-bit seed from ``seed`` and string-able keys: stable across runs and batchings."""
    h = hashlib.sha256(json.dumps([seed, *keys], default=str).encode()).digest()
    return int.from_bytes(h[:4], "little")


def rank_key(mu: float, loss: float) -> tuple[float, float]:
    """Higher mu first, then lower loss: the order of "better" for a prompt (eqs. 5 and 8)."""
    return (-float(mu), float(loss))


def _select(scores: np.ndarray, b: int, temperature: float, rng: np.random.Generator):
    """``b`` distinct indices drawn from softmax(scores / temperature) (Algorithm 3, line 10),
    by the Gumbel-top-k trick: exact sampling without replacement, stable at any temperature."""
    keys = scores / max(temperature, 1e-9) + rng.gumbel(size=len(scores))
    return np.argsort(-keys, kind="stable")[: min(b, len(scores))]


def beam_search(
    hunter,
    score: Score,
    pairs: pd.DataFrame,
    spec: HunterConfig,
    iteration: int = 0,
) -> pd.DataFrame:
    """Algorithm 3 for every pair in lockstep (one ``score`` call per step for all pairs).

    ``pairs``: pair_id, x, x_ids, y_ids. Each pair starts from ``beams`` uniformly drawn
    tokens and grows ``prompt_tokens - 1`` times; every candidate [q, q'] for q' in the
    hunter's top-k after beam q is scored, and the next beams are drawn from the softmax of
    mu - loss_weight * loss. Returns, per pair, the best candidate ever scored (by mu, then
    loss): pair_id, prompt_ids, prompt, mu, loss, candidates (how many were scored).
    """
    if spec.prompt_tokens < 2 or spec.top_k < 1 or spec.beams < 1:
        raise MiaError("hunter: prompt_tokens must be at least 2, top_k and beams at least 1")
    ids = list(pairs["pair_id"])
    xs = [str(x) for x in pairs["x"]]
    x_ids = [list(map(int, v)) for v in pairs["x_ids"]]
    y_ids = [list(map(int, v)) for v in pairs["y_ids"]]
    rngs = [np.random.default_rng(pair_seed(spec.seed, "beam", iteration, p)) for p in ids]
    beams = [[[int(t)] for t in g.choice(hunter.allowed, size=spec.beams)] for g in rngs]
    best: list[dict | None] = [None] * len(ids)
    counts = [0] * len(ids)
    t0 = time.time()
    for step in range(spec.prompt_tokens - 1):
        owner, cands = [], []
        flat_x = [xs[i] for i, bs in enumerate(beams) for _ in bs]
        flat_q = [q for bs in beams for q in bs]
        top = hunter.topk(flat_x, flat_q, spec.top_k)
        j = 0
        for i, bs in enumerate(beams):
            seen: set[tuple[int, ...]] = set()
            for q in bs:
                for t in top[j]:
                    c = (*q, int(t))
                    if c not in seen:
                        seen.add(c)
                        owner.append(i)
                        cands.append(list(c))
                j += 1
        texts = [hunter.decode(c) for c in cands]
        mu, loss = score(texts, [x_ids[i] for i in owner], [y_ids[i] for i in owner])
        owner_arr = np.asarray(owner)
        for i in range(len(ids)):
            sel = np.flatnonzero(owner_arr == i)
            counts[i] += sel.size
            m, lo = mu[sel], loss[sel]
            k = min(range(sel.size), key=lambda a: rank_key(m[a], lo[a]))
            if best[i] is None or rank_key(m[k], lo[k]) < rank_key(best[i]["mu"], best[i]["loss"]):
                c = sel[k]
                best[i] = {"prompt_ids": cands[c], "prompt": texts[c], "mu": m[k], "loss": lo[k]}
            chosen = _select(m - spec.loss_weight * lo, spec.beams, spec.temperature, rngs[i])
            beams[i] = [cands[sel[a]] for a in chosen]
        _log(
            f"iteration {iteration + 1}: prompt token {step + 2}/{spec.prompt_tokens}, "
            f"{len(cands)} candidates scored, best mu {np.mean([b['mu'] for b in best]):.3f} "
            f"on average ({time.time() - t0:.0f} s)"
        )
    return pd.DataFrame(
        [
            {
                "pair_id": p,
                "prompt_ids": b["prompt_ids"],
                "prompt": b["prompt"],
                "mu": float(b["mu"]),
                "loss": float(b["loss"]),
                "candidates": n,
            }
            for p, b, n in zip(ids, best, counts, strict=True)
        ]
    )


def update_pool(
    pool: pd.DataFrame,
    found: pd.DataFrame,
    baseline: pd.DataFrame,
    capacity: int,
    rejection: bool = True,
    iteration: int = 0,
) -> pd.DataFrame:
    """The prompt pool after one search (Algorithm 1, line 7, with rejection sampling).

    A found prompt is accepted when it beats the pair's prefix alone (``baseline``: pair_id,
    mu, loss): a higher mu, or the same mu with a lower loss of y. (With ``rejection`` off,
    every found prompt is accepted.) The pool keeps the ``capacity`` best distinct
    (pair, prompt) entries by mu, then loss; ties go to the earlier entry.
    """
    found = found.assign(iteration=iteration)
    if rejection:
        base = baseline.set_index("pair_id").loc[found["pair_id"]]
        better = (found["mu"].to_numpy() > base["mu"].to_numpy()) | (
            (found["mu"].to_numpy() == base["mu"].to_numpy())
            & (found["loss"].to_numpy() < base["loss"].to_numpy())
        )
        found = found[better]
    cols = ["pair_id", "prompt_ids", "prompt", "mu", "loss", "iteration"]
    both = pd.concat([pool[cols] if len(pool) else None, found[cols]], ignore_index=True)
    both = both.drop_duplicates(subset=["pair_id", "prompt"], keep="first")
    both = both.sort_values(
        ["mu", "loss", "iteration", "pair_id", "prompt"],
        ascending=[False, True, True, True, True],
        kind="stable",
    )
    return both.head(capacity).reset_index(drop=True)


def empty_pool() -> pd.DataFrame:
    return pd.DataFrame(columns=["pair_id", "prompt_ids", "prompt", "mu", "loss", "iteration"])


def _log(msg: str) -> None:
    print(f"[hunter {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def train_hunter(
    hunter,
    score: Score,
    finetune: Callable[[str, pd.DataFrame, str, int], dict],
    pairs: pd.DataFrame,
    out: Path,
    spec: HunterConfig,
    stop_after: int | None = None,
    identity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Algorithm 1 over ``pairs`` (the training split), each step a stage under ``out``
    (``mia_ray.stages``): ``baseline`` (the pairs scored without a prompt), then per
    iteration ``search-XX`` (step 1) and ``iter-XX`` (``pool.parquet``, ``adapter/`` of step
    2, the iteration's record in its marker). Iteration i's key chains the keys before it, so
    a rerun reuses the finished iterations in order, and the finished search of an interrupted
    one; other settings, pairs or models (``identity``: the target's and the hunter's content
    keys) train afresh. ``stop_after`` ends the run after that iteration (as an interruption
    would). Returns the training record."""
    from mia_ray.keys import fingerprint
    from mia_ray.reports.io import write_parquet
    from mia_ray.stages import folder_stage, frame_stage

    # What shapes the training, not where it runs or how extraction samples later.
    skip = ("sample_top_k", "sample_temperature")
    recipe = {k: v for k, v in asdict(spec).items() if k not in skip}
    key = fingerprint(recipe, sorted(pairs["pair_id"]), identity)

    def score_baseline() -> pd.DataFrame:
        mu, loss = score([""] * len(pairs), list(pairs["x_ids"]), list(pairs["y_ids"]))
        return pd.DataFrame({"pair_id": list(pairs["pair_id"]), "mu": mu, "loss": loss})

    baseline = frame_stage(out, "baseline", key, score_baseline)
    pool, adapter, records = empty_pool(), "", []
    for i in range(spec.iterations):
        key = fingerprint(key, i)  # an iteration holds only after the ones before it
        state = {"pool": pool, "adapter": adapter}

        def iterate(d: Path, i=i, key=key, state=state) -> dict:
            hunter.load_adapter(state["adapter"])
            t0 = time.time()
            found = frame_stage(
                out, f"search-{i:02d}", key, lambda: beam_search(hunter, score, pairs, spec, i)
            )
            t_search = time.time() - t0
            pool = update_pool(state["pool"], found, baseline, spec.pool_size, spec.rejection, i)
            write_parquet(d / "pool.parquet", pool)
            t1 = time.time()
            record: dict[str, Any] = {"pool": len(pool)}
            adapter = state["adapter"]
            if len(pool):
                record.update(
                    finetune(adapter, pool, str(d / "adapter"), pair_seed(spec.seed, "ft", i))
                )
                adapter = str(d / "adapter")
            record.update(
                {
                    "iteration": i,
                    "adapter": str(Path(adapter).relative_to(out)) if adapter else "",
                    "search_s": round(t_search, 2),
                    "finetune_s": round(time.time() - t1, 2),
                    "search_mu_mean": float(found["mu"].mean()),
                    "pool_mu_mean": float(pool["mu"].mean()) if len(pool) else None,
                    "candidates": int(found["candidates"].sum()),
                }
            )
            _log(
                f"iteration {i + 1}/{spec.iterations}: search mu {record['search_mu_mean']:.3f}, "
                f"pool {len(pool)}, {t_search:.0f} s search + {record['finetune_s']:.0f} s fine-tune"
            )
            return {"record": record}

        reused = f"hunter: iteration {i + 1}/{spec.iterations}: reusing an earlier run's"
        d, marker = folder_stage(out, f"iter-{i:02d}", key, iterate, reused=reused)
        record = marker["record"]
        pool = pd.read_parquet(d / "pool.parquet")
        adapter = str(out / record["adapter"]) if record["adapter"] else ""
        records.append(record)
        if stop_after is not None and i >= stop_after:
            break
    return {
        "iterations": records,
        "adapter": adapter,
        "baseline_mu_mean": float(baseline["mu"].mean()),
        "finished": len(records) >= spec.iterations,
    }


def finetune_hunter(
    model: str,
    adapter_in: str,
    rows: pd.DataFrame,
    out_dir: str,
    spec: HunterConfig,
    seed: int,
    x_texts: dict[str, str],
    separator: str = "\n",
    max_x_tokens: int = 64,
    threads: int = 0,
    device: str = "auto",
) -> dict[str, Any]:
    """LoRA fine-tune the hunter to write each pool prompt after its x (eq. 6): loss on the
    prompt tokens only. Continues ``adapter_in`` (an earlier iteration's) or starts a fresh
    LoRA (r, alpha from ``spec``); ``spec.epochs`` passes, AdamW at ``spec.lr``. Saves the
    adapter to ``out_dir`` and returns a record (steps, losses)."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    from mia_ray.actors.hunter import hunter_context
    from mia_ray.data.pairs import bos_prefix
    from mia_ray.models.hf import load_causal_lm, set_torch_threads
    from mia_ray.storage import localize
    from mia_ray.train.lm import seed_everything

    set_torch_threads(threads)
    seed_everything(seed)
    base, tok, dev = load_causal_lm(model, device)
    if adapter_in:
        # An earlier iteration's adapter may be a folder in storage: a local copy of it.
        net = PeftModel.from_pretrained(base, localize(adapter_in), is_trainable=True)
    else:
        net = get_peft_model(
            base,
            LoraConfig(
                r=spec.lora_r,
                lora_alpha=spec.lora_alpha,
                lora_dropout=0.0,
                target_modules="all-linear",
                task_type="CAUSAL_LM",
            ),
        )
    sep = list(tok(separator, add_special_tokens=False)["input_ids"])
    seqs, starts = [], []
    bos = bos_prefix(tok)  # the context the hunter samples from: the same BOS, x and separator
    for pair_id, prompt in zip(rows["pair_id"], rows["prompt_ids"], strict=True):
        ctx = hunter_context(tok, x_texts[pair_id], sep, max_x_tokens, bos)
        seqs.append(ctx + [int(t) for t in prompt])
        starts.append(len(ctx))
    pad = tok.pad_token_id
    net.train()
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    losses = []
    steps = spec.epochs * math.ceil(len(seqs) / spec.batch_size)
    for _ in range(spec.epochs):
        order = rng.permutation(len(seqs))
        for b in range(0, len(order), spec.batch_size):
            idx = order[b : b + spec.batch_size]
            width = max(len(seqs[i]) for i in idx)
            x = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros_like(x)
            labels = torch.full_like(x, -100)
            for r, i in enumerate(idx):
                s = torch.tensor(seqs[i])
                x[r, : len(s)], mask[r, : len(s)] = s, 1
                labels[r, starts[i] : len(s)] = s[starts[i] :]
            loss = net(input_ids=x.to(dev), attention_mask=mask.to(dev), labels=labels.to(dev)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
    net.save_pretrained(out_dir)
    return {
        "steps": steps,
        "rows": len(seqs),
        "first_loss": losses[0],
        "final_loss": float(np.mean(losses[-max(1, len(losses) // 8) :])),
    }
