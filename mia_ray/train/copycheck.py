"""CopyCheck fine-tuning (§IV-A): teach the target to answer "1" (suspected) or "0" (unseen).

One function trains one uncertainty model ("member"): ``mcd`` (LoRA with dropout, kept on
at sampling time), ``blob`` (Bayesian LoRA, :mod:`mia_ray.models.blob`) or ``ens-<i>`` (one
of the deep ensemble's LoRA fine-tunes, seed ``seed + 1 + i``). The loss is the cross-entropy of
the two answer logits. BLoB trains as its reference code does: the optimizer steps the
cross-entropy, and after each optimizer step a separate SGD step (lr ``blob_kl_lr``) descends
``pi * KL``, pi = 1 / (optimizer steps per epoch) (Wang et al. 2024, Wang-ML-Lab/bayesian-peft,
whose 1 / len(train_loader) is that count with one worker and no gradient accumulation).
Training runs in the HF ``Trainer``, so a DeepSpeed config passes straight through and Ray
Train's ``TorchTrainer`` can run a member on several GPUs.

No Ray here: :func:`mia_ray.train.launch.train_members` runs members as Ray Tune trials.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mia_ray.errors import MiaError
from mia_ray.stages import commit_at, done_at
from mia_ray.stages import record as stage_record


def member_seed(name: str, seed: int) -> int:
    """MC dropout and BLoB train with ``seed``; ensemble member i with ``seed + 1 + i``, so no
    member repeats the MC-dropout fine-tune (same LoRA, same data order) under another name."""
    return seed + 1 + int(name.split("-")[1]) if name.startswith("ens-") else seed


def steps_per_epoch(n_train: int, batch_size: int, grad_accum: int = 1, world_size: int = 1) -> int:
    """Optimizer steps in one pass over ``n_train`` snippets: each step consumes
    ``batch_size * grad_accum`` snippets on every one of ``world_size`` data-parallel workers."""
    return max(1, math.ceil(n_train / (batch_size * grad_accum * max(1, world_size))))


def blob_kl_pi(n_train: int, spec, world_size: int = 1) -> float:
    """BLoB's KL weight pi = ``blob_kl_weight`` / optimizer steps per epoch. The KL step runs
    once per optimizer step, so over an epoch it adds up to ``blob_kl_weight * KL`` however
    the batches are accumulated or spread over workers."""
    return spec.blob_kl_weight / steps_per_epoch(
        n_train, spec.batch_size, spec.grad_accum, world_size
    )


def default_targets(model) -> list[str]:
    """LoRA targets by architecture: GPT-2's fused attention ``c_attn``, else q and v."""
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    for option in (["c_attn"], ["q_proj", "v_proj"], ["query_key_value"], ["qkv_proj"]):
        if set(option) <= names:
            return option
    raise MiaError(
        "cannot guess LoRA target modules for this architecture; set finetune.target_modules"
    )


class _Snippets:
    """A torch-style dataset of (prompt ids, pseudo-label) with the encoder's left-padding."""

    def __init__(self, seqs: list[list[int]], labels: list[int]):
        self.seqs, self.labels = seqs, labels

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"ids": self.seqs[i], "label": self.labels[i]}


def _make_trainer_cls():
    import torch
    from transformers import Trainer

    from mia_ray.models.prompt import answer_logits

    class AnswerTrainer(Trainer):
        """HF Trainer whose loss is the cross-entropy over the two answer logits."""

        answer_ids: list[int] = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            z = answer_logits(model, inputs, self.answer_ids)
            loss = torch.nn.functional.cross_entropy(z, labels)
            return (loss, z) if return_outputs else loss

    return AnswerTrainer


def _blob_kl_callback(model, pi: float, lr: float):
    """BLoB's KL step: after each optimizer step, SGD on ``pi * KL`` over A's means and stds."""
    import torch
    from transformers import TrainerCallback

    from mia_ray.models.blob import blob_kl

    kl_params = [p for n, p in model.named_parameters() if "lora_A_" in n and p.requires_grad]
    sgd = torch.optim.SGD(kl_params, lr=lr)

    class KLStep(TrainerCallback):
        last_kl: float | None = None

        def on_step_end(self, args, state, control, **kwargs):
            sgd.zero_grad(set_to_none=True)
            kl = blob_kl(model)
            (pi * kl).backward()
            sgd.step()
            sgd.zero_grad(set_to_none=True)  # no KL gradient left for the next CE step
            self.last_kl = float(kl.detach())

    return KLStep()


def build_model(base: str, kind: str, spec, device: str, dtype: str, seed: int):
    """The base model with fresh adapters of ``kind`` ("mcd"/"ens-*": LoRA; "blob": BLoB)."""
    import torch

    from mia_ray.models.hf import load_causal_lm

    torch.manual_seed(seed)  # adapter initialisation
    model, tok, dev = load_causal_lm(base, device, dtype)
    targets = list(spec.target_modules) or default_targets(model)
    if kind == "blob":
        from mia_ray.models.blob import BlobConfig, add_blob_adapters

        cfg = BlobConfig(
            r=spec.lora_r,
            alpha=spec.lora_alpha,
            target_modules=tuple(targets),
            prior_std=spec.blob_prior_std,
            init_std=spec.blob_init_std,
        )
        add_blob_adapters(model, cfg)
        return model, tok, dev, cfg
    from peft import LoraConfig, get_peft_model
    from transformers.pytorch_utils import Conv1D

    # GPT-2-style Conv1D layers store their weights transposed (in, out).
    conv1d = any(
        isinstance(m, Conv1D) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in targets
    )
    cfg = LoraConfig(
        r=spec.lora_r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        fan_in_fan_out=conv1d,
    )
    return get_peft_model(model, cfg), tok, dev, cfg


def train_member(
    name: str,
    base: str,
    texts: list[str],
    labels: list[int],
    out_dir: str | Path,
    spec,
    device: str = "auto",
    dtype: str = "auto",
    threads: int = 0,
    fingerprint: str = "",
    prepare=None,
    save: bool = True,
    world_size: int = 1,
    deepspeed: dict | None = None,
) -> dict[str, Any]:
    """Fine-tune one member on (snippet, pseudo-label) pairs; save its adapter to ``out_dir``.

    Skips (and returns the saved record) when the member folder's stage marker holds the
    same fingerprint: the adapter of a finished member is never retrained. ``prepare(trainer)``
    wraps the HF Trainer (Ray Train's data-parallel preparation); ``save=False`` on all but
    one of several workers. ``deepspeed``: the DeepSpeed config itself, in place of the file
    ``spec.deepspeed`` names (a node without the driver's disk gets the config, not its path).
    """
    import torch
    from transformers import TrainingArguments

    from mia_ray.models.hf import set_torch_threads
    from mia_ray.models.prompt import PromptEncoder

    out = Path(out_dir)
    record = done_at(out, fingerprint)  # the member folder is a stage keyed by ``fingerprint``
    if record is not None:
        record["skipped"] = True
        return record
    if not texts or len(set(labels)) < 2:
        raise MiaError(f"member {name}: fine-tuning needs snippets with both pseudo-labels 0 and 1")
    set_torch_threads(threads)
    # transformers' own deprecation notices, once per trial, say nothing to a user.
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    seed = member_seed(name, spec.seed)
    kind = "blob" if name == "blob" else "lora"
    t0 = time.monotonic()
    model, tok, dev, adapter_cfg = build_model(base, name, spec, device, dtype, seed)
    enc = PromptEncoder(tok, spec.template, spec.max_length)
    data = _Snippets(enc.encode(texts), [int(y) for y in labels])

    def collate(rows):
        batch = enc.collate([r["ids"] for r in rows])
        batch["labels"] = torch.tensor([r["label"] for r in rows], dtype=torch.long)
        return batch

    # Data parallel (Ray Train): each step consumes a batch on every worker.
    per_step = spec.batch_size * spec.grad_accum * max(1, world_size)
    steps = math.ceil(spec.epochs * len(data) / per_step)
    kl_pi = blob_kl_pi(len(data), spec, world_size) if kind == "blob" else None
    warmup = math.ceil(spec.warmup_ratio * steps)
    args = TrainingArguments(
        output_dir=str(out / "checkpoints"),
        per_device_train_batch_size=spec.batch_size,
        gradient_accumulation_steps=spec.grad_accum,
        max_steps=steps,
        learning_rate=spec.lr,
        weight_decay=spec.weight_decay,
        warmup_steps=warmup,
        lr_scheduler_type="linear",
        seed=seed,
        data_seed=seed,
        logging_steps=max(1, steps // 10),
        save_strategy="no",
        report_to=[],
        remove_unused_columns=False,
        dataloader_num_workers=0,
        use_cpu=dev == "cpu",
        bf16=dev == "cuda" and dtype in ("auto", "bfloat16"),
        deepspeed=deepspeed or spec.deepspeed or None,
        disable_tqdm=True,
    )
    trainer_cls = _make_trainer_cls()
    trainer = trainer_cls(model=model, args=args, train_dataset=data, data_collator=collate)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # one summary line per member instead (below)
    trainer.answer_ids = enc.answer_ids
    kl_step = None
    if kind == "blob":
        kl_step = _blob_kl_callback(model, kl_pi, spec.blob_kl_lr)
        trainer.add_callback(kl_step)
    if prepare is not None:
        trainer = prepare(trainer)
    result = trainer.train()
    losses = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
    engine = getattr(trainer, "deepspeed", None)  # the DeepSpeed engine that trained, if any
    if not save:
        return {"member": name, "saved": False}
    adapter = out / "adapter"
    tmp = out / "adapter.tmp"
    if kind == "blob":
        from mia_ray.models.blob import save_blob

        save_blob(model, tmp, adapter_cfg)
    else:
        from mia_ray.train.lm import quiet_saves

        quiet_saves()
        model.save_pretrained(tmp)
    if adapter.exists():
        import shutil

        shutil.rmtree(adapter)
    tmp.rename(adapter)
    record = {
        "member": name,
        "kind": kind,
        "seed": seed,
        "base": base,
        "spec": asdict(spec),
        "n_train": len(data),
        "n_label1": int(sum(data.labels)),
        "steps": steps,
        "warmup_steps": warmup,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "train_loss": float(result.training_loss),
        "final_kl": kl_step.last_kl if kl_step else None,
        "kl_pi": kl_pi,
        "world_size": max(1, world_size),
        "zero_stage": engine.zero_optimization_stage() if engine is not None else None,
        "elapsed_s": round(time.monotonic() - t0, 2),
        "threads": torch.get_num_threads(),
        "device": dev,
    }
    record = stage_record(name, fingerprint, "folder", record)
    print(
        f"[train {out.parent.name}/{name}] {steps} steps on {len(data)} snippets, loss "
        f"{record['first_loss'] or 0:.3f} -> {record['final_loss'] or 0:.3f}, "
        f"{record['elapsed_s']:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return commit_at(out, record)
