"""Train a small GPT-2-style causal LM from scratch, and fine-tune a pretrained one (LoRA).

Plain functions, no Ray: the demo world calls them in-process or inside a Ray task. Both run
a fixed number of optimizer steps derived from the data and the settings (never a time
limit), so the weights are a function of the seed (on one machine, with a fixed number of
torch threads).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mia_ray.errors import MiaError


@dataclass(frozen=True)
class TinyLMSpec:
    """Architecture and training recipe of a from-scratch GPT-2-style model.

    ``epochs`` fixes the step count: ``steps = ceil(epochs * blocks / batch_size)``, where
    ``blocks`` is the number of ``n_positions``-token blocks in the training stream.
    """

    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 256
    epochs: float = 4.0
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * min_lr_ratio
    warmup_steps: int = 20
    weight_decay: float = 0.0  # memorisation is the point: no regularisation, no dropout
    grad_clip: float = 1.0


@dataclass(frozen=True)
class FinetuneSpec:
    """LoRA fine-tuning recipe for a pretrained causal LM (merged into the weights when saved).

    Each document is one sequence (cropped to ``max_tokens``); ``epochs`` whole passes.
    """

    epochs: float = 5.0
    batch_size: int = 4
    lr: float = 1e-3
    max_tokens: int = 192
    lora_r: int = 16
    lora_alpha: int = 32
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    warmup_steps: int = 5


def quiet_saves() -> None:
    """No "Writing model shards" bar per save: in a job log it is noise, not progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def token_stream(texts: list[str], tokenizer) -> np.ndarray:
    """All texts tokenised and concatenated, each followed by EOS: int64 array ``(n_tokens,)``."""
    if tokenizer.eos_token_id is None:
        raise MiaError("the tokenizer has no EOS token to separate documents")
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    out = []
    for row in ids:
        out.extend(row)
        out.append(tokenizer.eos_token_id)
    return np.asarray(out, dtype=np.int64)


def _blocks_per_epoch(n_tokens: int, block: int) -> int:
    return max(1, n_tokens // block)


def steps_for(n_tokens: int, spec: TinyLMSpec) -> int:
    return math.ceil(spec.epochs * _blocks_per_epoch(n_tokens, spec.n_positions) / spec.batch_size)


def _batches(
    stream: np.ndarray, block: int, batch: int, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """Endless ``(batch, block)`` batches. Each epoch cuts the stream into blocks from a random
    offset in ``[0, block)`` (so memorisation does not hinge on where a window starts) and
    shuffles them; the few tokens before the offset wait for another epoch."""
    if len(stream) < 2 * block:
        # Too little text for two blocks: repeat it (the test world's tiny pools).
        stream = np.tile(stream, math.ceil(2 * block / max(1, len(stream))))
    pending: list[np.ndarray] = []
    while True:
        offset = int(rng.integers(0, block))
        n = (len(stream) - offset) // block
        blocks = stream[offset : offset + n * block].reshape(n, block)
        for i in rng.permutation(n):
            pending.append(blocks[i])
            if len(pending) == batch:
                yield np.stack(pending)
                pending = []


def _lr_at(step: int, total: int, spec: TinyLMSpec) -> float:
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    frac = (step - spec.warmup_steps) / max(1, total - spec.warmup_steps)
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * cos)


class _Progress:
    """One stderr line at most every ``every_s`` seconds (and at the end)."""

    def __init__(self, name: str, total: int, every_s: float = 10.0):
        self.name, self.total, self.every_s = name, total, every_s
        self.t0 = self.last = time.monotonic()

    def __call__(self, step: int, loss: float, tokens: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        elapsed = max(now - self.t0, 1e-9)
        eta = elapsed / max(step, 1) * (self.total - step)
        print(
            f"[train {self.name}] step {step}/{self.total} loss {loss:.3f} "
            f"{tokens / elapsed:.0f} tok/s elapsed {elapsed:.0f}s eta {eta:.0f}s",
            file=sys.stderr,
            flush=True,
        )


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 over the folder's weight files (safetensors), in name order."""
    h = hashlib.sha256()
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise MiaError(f"no safetensors weights in {model_dir}")
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def train_causal_lm(
    texts: list[str],
    tokenizer,
    out_dir: str | Path,
    spec: TinyLMSpec = TinyLMSpec(),
    seed: int = 0,
    threads: int = 0,
    train: bool = True,
    name: str = "lm",
    progress_every_s: float = 10.0,
) -> dict[str, Any]:
    """Train a fresh GPT-2-style LM on ``texts`` and save it with ``tokenizer`` to ``out_dir``.

    The texts become one EOS-separated token stream cut into ``spec.n_positions``-token
    blocks; AdamW runs ``steps_for(n_tokens, spec)`` steps (0 with ``train=False``: the
    randomly initialised model is saved as is). Returns the training record (steps,
    tokens, losses, elapsed seconds, tokens/s, weights hash).
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if threads > 0:
        torch.set_num_threads(threads)
    seed_everything(seed)
    vocab = len(tokenizer)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=spec.n_positions,
        n_embd=spec.n_embd,
        n_layer=spec.n_layer,
        n_head=spec.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # the class name does not tell transformers which loss it is
    t0 = time.monotonic()
    stream = token_stream(texts, tokenizer) if texts else np.zeros(0, dtype=np.int64)
    total = steps_for(len(stream), spec) if train and len(stream) else 0
    record: dict[str, Any] = {
        "spec": asdict(spec),
        "seed": seed,
        "threads": torch.get_num_threads(),
        "n_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": vocab,
        "documents": len(texts),
        "tokens": int(len(stream)),
        "steps": total,
        "trained_tokens": total * spec.batch_size * spec.n_positions,
    }
    if total:
        model.train()
        opt = torch.optim.AdamW(
            model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=spec.weight_decay
        )
        rng = np.random.default_rng(seed)
        batches = _batches(stream, spec.n_positions, spec.batch_size, rng)
        show = _Progress(name, total, progress_every_s)
        losses = []
        for step in range(total):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, total, spec)
            x = torch.from_numpy(next(batches))
            loss = model(input_ids=x, attention_mask=torch.ones_like(x), labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            show(step + 1, losses[-1], (step + 1) * x.numel(), force=step + 1 == total)
        record["first_loss"] = losses[0]
        record["final_loss"] = float(np.mean(losses[-max(1, min(20, total // 10)) :]))
    model.eval()
    elapsed = time.monotonic() - t0
    record["elapsed_s"] = round(elapsed, 2)
    record["tokens_per_s"] = round(record["trained_tokens"] / elapsed, 1) if total else 0.0
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    quiet_saves()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record["weights_sha256"] = weights_sha256(out)
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def finetune_causal_lm(
    texts: list[str],
    base_dir: str | Path,
    out_dir: str | Path,
    spec: FinetuneSpec = FinetuneSpec(),
    seed: int = 0,
    threads: int = 0,
    name: str = "finetune",
    progress_every_s: float = 10.0,
) -> dict[str, Any]:
    """LoRA-fine-tune the causal LM in ``base_dir`` on ``texts``; save the merged model.

    One document per sequence (tokenised as the scorer will tokenise it, EOS appended,
    cropped to ``spec.max_tokens``), seeded shuffles, ``ceil(epochs * docs / batch_size)``
    AdamW steps. The saved folder is a plain HF model (LoRA merged) plus the tokenizer.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not texts:
        raise MiaError("nothing to fine-tune on: the member set is empty")
    if threads > 0:
        torch.set_num_threads(threads)
    seed_everything(seed)
    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ctx = getattr(model.config, "max_position_embeddings", None) or getattr(
        model.config, "n_positions", None
    )
    max_tokens = min(spec.max_tokens, ctx) if ctx else spec.max_tokens
    seqs = []
    for ids in tok(list(texts))["input_ids"]:
        if tok.eos_token_id is not None and (not ids or ids[-1] != tok.eos_token_id):
            ids = [*ids, tok.eos_token_id]
        seqs.append(ids[:max_tokens])
    lora = LoraConfig(
        r=spec.lora_r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=0.0,
        # No modules named: LoRA on every linear layer (peft's "all-linear"), any architecture.
        target_modules=list(spec.target_modules) or "all-linear",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.0)
    total = math.ceil(spec.epochs * len(seqs) / spec.batch_size)
    schedule = TinyLMSpec(lr=spec.lr, warmup_steps=spec.warmup_steps, min_lr_ratio=0.1)
    rng = np.random.default_rng(seed)
    order: list[int] = []
    show = _Progress(name, total, progress_every_s)
    losses, tokens = [], 0
    for step in range(total):
        while len(order) < spec.batch_size:
            order.extend(rng.permutation(len(seqs)).tolist())
        idx, order = order[: spec.batch_size], order[spec.batch_size :]
        width = max(len(seqs[i]) for i in idx)
        x = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            x[row, : len(seqs[i])] = torch.tensor(seqs[i])
            mask[row, : len(seqs[i])] = 1
        labels = x.masked_fill(mask == 0, -100)
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, total, schedule)
        loss = model(input_ids=x, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        tokens += int(mask.sum())
        show(step + 1, losses[-1], tokens, force=step + 1 == total)
    merged = model.merge_and_unload()
    merged.eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    quiet_saves()
    merged.save_pretrained(out)
    tok.save_pretrained(out)
    elapsed = time.monotonic() - t0
    record = {
        "spec": asdict(spec),
        "base": str(base_dir),
        "seed": seed,
        "threads": torch.get_num_threads(),
        "documents": len(seqs),
        "tokens": sum(len(s) for s in seqs),
        "steps": total,
        "trained_tokens": tokens,
        "first_loss": losses[0],
        "final_loss": float(np.mean(losses[-max(1, min(10, total // 5)) :])),
        "elapsed_s": round(elapsed, 2),
        "tokens_per_s": round(tokens / elapsed, 1),
        "weights_sha256": weights_sha256(out),
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record
