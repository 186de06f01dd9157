"""TargetLM: the target model role of MemHunter: greedy continuations and the loss of y.

Given a prompt p (text, from the hunter or a baseline) and a pair (x, y) in the target's
token ids, the context is ``tokens(p) + x_ids``. ``__call__`` returns, per row, the greedy
continuation of ``len(y_ids)`` tokens, its memorization value mu = LCSS / |y| on tokens
(MemHunter eq. 3) and the teacher-forced mean NLL of y after the context (the loss L(p, x, y)
that ranks candidate prompts, eq. 5).
"""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd

from mia_ray.features.lcss import memorization


class TargetLM:
    """``__call__(batch)``: rows with ``prompt`` (str), ``x_ids`` and ``y_ids`` (int lists)
    -> the same rows plus ``out_ids``, ``mu`` and ``loss``. Serves Ray Data or an ActorPool."""

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        revision: str = "",
        trust_remote_code: bool = False,
        torch_threads: int = 0,
    ):
        from mia_ray.models.hf import load_causal_lm, set_torch_threads

        set_torch_threads(torch_threads)
        self.model, self.tok, self.device = load_causal_lm(
            model, device, dtype, revision, trust_remote_code
        )
        self.pad = self.tok.pad_token_id

    def contexts(self, prompts: list[str], x_ids: list[list[int]]) -> list[list[int]]:
        return [
            list(self.tok(p, add_special_tokens=False)["input_ids"]) + list(x)
            for p, x in zip(prompts, x_ids, strict=True)
        ]

    def _left_padded(self, seqs: list[list[int]]):
        import torch

        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            if s:
                ids[i, width - len(s) :] = torch.tensor(s)
                mask[i, width - len(s) :] = 1
        # Positions count real tokens only, so a left-padded row sees what it would alone.
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        return ids.to(self.device), mask.to(self.device), pos.to(self.device)

    def generate(self, contexts: list[list[int]], new_tokens: int) -> list[list[int]]:
        """Greedy continuations, ``new_tokens`` each (no early stop at EOS: |output| = |y|)."""
        import torch

        ids, mask, pos = self._left_padded(contexts)
        out = []
        past = None
        # transformers 5 renamed the KV cache argument and output field to `cache`.
        key = (
            "cache"
            if "cache" in inspect.signature(self.model.forward).parameters
            else "past_key_values"
        )
        with torch.inference_mode():
            step_ids, step_pos = ids, pos
            for _ in range(new_tokens):
                res = self.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=step_pos,
                    use_cache=True,
                    logits_to_keep=1,
                    **{key: past},
                )
                past = getattr(res, key)
                nxt = res.logits[:, -1].argmax(-1, keepdim=True)
                out.append(nxt)
                step_ids = nxt
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
        return torch.cat(out, dim=1).cpu().tolist() if out else [[] for _ in contexts]

    def loss(self, contexts: list[list[int]], y_ids: list[list[int]]) -> list[float]:
        """Mean NLL of each y after its context (teacher forcing), one padded pass."""
        import torch

        seqs = [list(c) + list(y) for c, y in zip(contexts, y_ids, strict=True)]
        ids, mask, pos = self._left_padded(seqs)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        tok_lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        out = []
        for i, y in enumerate(y_ids):
            n = len(y)
            out.append(float(-tok_lp[i, -n:].mean()))
        return out

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        x_ids = [list(map(int, x)) for x in batch["x_ids"]]
        y_ids = [list(map(int, y)) for y in batch["y_ids"]]
        ctx = self.contexts([str(p) for p in batch["prompt"]], x_ids)
        n = max(len(y) for y in y_ids)
        outs = [o[: len(y)] for o, y in zip(self.generate(ctx, n), y_ids, strict=True)]
        res = batch.copy()
        res["out_ids"] = outs
        res["mu"] = np.array([memorization(o, y) for o, y in zip(outs, y_ids, strict=True)])
        res["loss"] = self.loss(ctx, y_ids)
        return res
