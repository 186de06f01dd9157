"""Samplers: the model roles that turn a snippet into n predictions p("1") (CopyCheck §IV-A2).

``Dataset.map_batches(Sampler, fn_constructor_kwargs=..., batch_format="pandas")``. Input rows
carry ``snippet_id`` and ``text``; output rows are the input rows plus ``column`` (a list of
n probabilities, or one with ``scalar``). Every prediction is the softmax over the logits of the "0" and "1" tokens
only. Results do not depend on batching, actor restarts or order:

- ``mcd``: dropout stays on, every dropout of the model (``mc_dropout="all"``: the model in
  train mode, as the CopyCheck and BLoB reference code sample) or only the LoRA layers'
  (``"lora"``); the n passes of a snippet are one batch of n copies under a generator seeded
  from (seed, snippet_id), so a snippet's masks are the same on every run;
- ``blob``: n weight draws, draw i seeded with (seed, i) and shared by every snippet;
- ``ensemble``: one base model, the member adapters switched in turn (placement
  "adapters"), or a single member per actor (placement "members", ``adapters`` of length 1).

``base`` and ``adapters`` are local folders, hub names, or folders in storage by URL (a
staged model, an adapter a trial committed): :func:`mia_ray.storage.localize` copies those
to this node once, keyed by content.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from mia_ray.errors import MiaError


def snippet_seed(seed: int, snippet_id: str) -> int:
    digest = hashlib.sha256(f"{seed}:{snippet_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class Sampler:
    def __init__(
        self,
        base: str,
        kind: str,
        adapters: list[str],
        column: str,
        n_samples: int = 10,
        seed: int = 0,
        template: str = "",
        max_length: int = 300,
        device: str = "auto",
        dtype: str = "auto",
        torch_threads: int = 0,
        scalar: bool = False,
        mc_dropout: str = "all",
    ):
        import torch

        from mia_ray.models.hf import load_causal_lm, set_torch_threads
        from mia_ray.models.prompt import DEFAULT_TEMPLATE, PromptEncoder
        from mia_ray.storage import localize

        if kind not in ("mcd", "blob", "ensemble"):
            raise MiaError(f"unknown sampler kind {kind!r}")
        if not adapters:
            raise MiaError(f"sampler {column}: no adapters given")
        # Adapters committed to storage come as URLs: a local copy on this node, by content.
        adapters = [localize(a) for a in adapters]
        set_torch_threads(torch_threads)
        self.torch = torch
        model, tok, self.device = load_causal_lm(base, device, dtype)
        self.enc = PromptEncoder(tok, template or DEFAULT_TEMPLATE, max_length)
        self.kind, self.column, self.n, self.seed, self.scalar = (
            kind,
            column,
            n_samples,
            seed,
            scalar,
        )
        if kind == "blob":
            from mia_ray.models.blob import load_blob, set_blob_mode

            load_blob(model, adapters[0])
            model.to(self.device)
            set_blob_mode(model, "fixed")
            self.model = model.eval()
        else:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapters[0], adapter_name="m0")
            for j, path in enumerate(adapters[1:], start=1):
                model.load_adapter(path, adapter_name=f"m{j}")
            self.names = [f"m{j}" for j in range(len(adapters))]
            model.to(self.device).eval()
            if kind == "mcd":
                self._mc_dropout(model, mc_dropout, adapters[0])
            self.model = model

    def _mc_dropout(self, model, mode: str, adapter: str) -> None:
        """Switch the sampling dropout on: ``all`` = ``model.train()`` (every nn.Dropout, and
        attention dropout that models apply by their own ``training`` flag); ``lora`` = only
        the LoRA dropout layers, the rest of the model stays in eval mode."""
        nn = self.torch.nn
        if mode not in ("all", "lora"):
            raise MiaError(f"uncertainty.mc_dropout must be all or lora, not {mode!r}")
        lora = [m for n, m in model.named_modules() if "lora_dropout" in n]
        drops = [m for m in model.modules() if isinstance(m, nn.Dropout)] if mode == "all" else lora
        conf = getattr(model, "config", None)
        attn_p = float(getattr(conf, "attention_dropout", 0) or 0) if mode == "all" else 0.0
        if not any(isinstance(m, nn.Dropout) and m.p > 0 for m in drops) and attn_p <= 0:
            where = "no LoRA dropout" if mode == "lora" else "no dropout, in the model or its LoRA,"
            raise MiaError(
                f"{adapter} has {where} to sample: train MC dropout with finetune.lora_dropout > 0"
            )
        if mode == "all":
            model.train()
        else:
            for m in lora:
                m.train()

    def _p1(self, seqs: list[list[int]]) -> np.ndarray:
        from mia_ray.models.prompt import answer_logits

        batch = {k: v.to(self.device) for k, v in self.enc.collate(seqs).items()}
        z = answer_logits(self.model, batch, self.enc.answer_ids)
        return self.torch.softmax(z, dim=-1)[:, 1].double().cpu().numpy()

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        from mia_ray.actors import in_model_batches

        return in_model_batches(batch, self._sample)

    def _sample(self, batch: pd.DataFrame) -> pd.DataFrame:
        ids = batch["snippet_id"].astype(str).tolist()
        seqs = self.enc.encode(batch["text"].tolist())
        with self.torch.inference_mode():
            if self.kind == "mcd":
                rows = []
                for sid, seq in zip(ids, seqs, strict=True):
                    self.torch.manual_seed(snippet_seed(self.seed, sid))
                    rows.append(self._p1([seq] * self.n))
                p = np.stack(rows)
            elif self.kind == "blob":
                from mia_ray.models.blob import resample_blob

                cols = []
                for i in range(self.n):
                    resample_blob(self.model, snippet_seed(self.seed, f"draw-{i}"))
                    cols.append(self._p1(seqs))
                p = np.stack(cols, axis=1)
            else:
                cols = []
                for name in self.names:
                    self.model.set_adapter(name)
                    cols.append(self._p1(seqs))
                p = np.stack(cols, axis=1)
        out = batch.copy()  # input columns pass through, so samplers can be chained
        out[self.column] = p[:, 0] if self.scalar else list(p)
        return out
