"""The fine-tuning recipes train/ runs, as their YAML sections: CopyCheck's LoRA members
(``finetune:``) and MemHunter's hunter (``hunter:``). The pipelines' job configs hold them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mia_ray.config import check_at_least_1
from mia_ray.errors import MiaError
from mia_ray.models.prompt import DEFAULT_TEMPLATE


@dataclass
class FinetuneConfig:
    """CopyCheck's fine-tuning recipe, shared by MC dropout, BLoB and the ensemble members.

    Defaults are those of the BLoB reference code that CopyCheck builds on (LoRA r 8,
    alpha 16, dropout 0.1, lr 1e-4, batch 4, 300 tokens) and CopyCheck's one epoch (§III-B3:
    more epochs blur seen vs unseen).
    """

    epochs: float = 1.0
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.06  # linear warmup share of the steps, as in CopyCheck's scripts
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.1
    target_modules: list[str] = field(default_factory=list)  # empty = by architecture
    max_length: int = 300  # prompt tokens; the snippet is cropped to fit
    template: str = DEFAULT_TEMPLATE
    blob_prior_std: float = 0.2
    blob_init_std: float = 0.0025  # BLoB: G ~ U[eps/sqrt2, eps], eps 0.05; sigma = G^2
    # multiplies pi = 1 / optimizer steps per epoch (BLoB's KL reweighting): the KL step runs
    # once per optimizer step, so grad_accum and the Ray Train workers count
    blob_kl_weight: float = 1.0
    blob_kl_lr: float = 0.01  # BLoB steps pi * KL with its own SGD after each CE step
    deepspeed: str = (
        ""  # a DeepSpeed JSON config for the HF Trainer (GPUs; ZeRO also runs on CPU with gloo)
    )
    seed: int = 0

    def validate(self) -> None:
        if self.epochs <= 0 or self.batch_size < 1 or self.lr <= 0:
            raise MiaError("finetune.epochs, finetune.batch_size and finetune.lr must be positive")
        if not 0 <= self.lora_dropout < 1:
            raise MiaError(f"finetune.lora_dropout must lie in [0, 1), not {self.lora_dropout}")
        if self.template.count("{text}") != 1:
            raise MiaError("finetune.template must contain {text} exactly once")
        if self.deepspeed and not Path(self.deepspeed).is_file():
            raise MiaError(f"finetune.deepspeed: no such DeepSpeed config file: {self.deepspeed}")


@dataclass
class HunterConfig:
    """The prompt-writing hunter and its training (Algorithm 1; Appendix A's defaults)."""

    model: str = ""  # hub name or folder; demo: the world's tiny-ref (trained on non-members)
    prompt_tokens: int = 8
    top_k: int = 48
    beams: int = 4
    temperature: float = 0.1  # beam selection: softmax((mu - loss_weight * loss) / temperature)
    loss_weight: float = 0.1
    pool_size: int = 256
    rejection: bool = True
    iterations: int = 10
    lora_r: int = 8
    lora_alpha: int = 16
    epochs: int = 8
    lr: float = 5e-4
    batch_size: int = 8
    separator: str = "\n"
    max_x_tokens: int = 64
    sample_top_k: int = 48  # extraction: prompts sampled from the hunter's top-k ...
    sample_temperature: float = 1.0  # ... at this temperature, one per trial
    # (resources.trainer: the LoRA fine-tune of each iteration, a Ray task.)
    seed: int = 0

    def validate(self) -> None:
        if self.prompt_tokens < 2 or self.top_k < 1 or self.beams < 1 or self.iterations < 1:
            raise MiaError(
                "hunter.prompt_tokens must be at least 2; hunter.top_k, hunter.beams and "
                "hunter.iterations at least 1"
            )
        if self.pool_size < 1 or self.epochs < 1 or self.lr <= 0 or self.sample_top_k < 1:
            raise MiaError("hunter.pool_size, epochs, lr and sample_top_k must be positive")
        check_at_least_1({"hunter.batch_size": self.batch_size})
