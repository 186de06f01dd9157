"""Hunter: MemHunter's prompt writer, a small causal LM that writes a prompt p for a prefix x.

The hunter reads ``x`` (text, in its own tokenizer), a separator, and the prompt so far; its
next-token distribution p_theta(. | x, p) proposes the prompt's next token (MemHunter eq. 7).
Prompts are token ids of the hunter's vocabulary; the target model reads their decoded text,
so hunter and target may use different tokenizers (GPT-2 hunter, Pythia target in the paper).
Special tokens are never proposed: their text would vanish on decoding.
"""

from __future__ import annotations

import numpy as np

from mia_ray.data.pairs import bos_prefix


def hunter_context(
    tok, x: str, sep: list[int], max_x_tokens: int, bos: list[int] | None = None
) -> list[int]:
    """The hunter's reading of a prefix x: the BOS its tokenizer adds by default (if any),
    x's last ``max_x_tokens`` tokens, then ``sep``. Sampling, beam search and fine-tuning
    all read this one context (``bos``: ``bos_prefix(tok)``, given to save its lookup)."""
    ids = list(tok(x, add_special_tokens=False)["input_ids"])
    return list(bos_prefix(tok) if bos is None else bos) + ids[-max_x_tokens:] + list(sep)


class Hunter:
    """``topk(xs, prompts, k)`` and ``sample(xs, n_tokens, ...)`` over the hunter LM, with an
    optional LoRA adapter (``load_adapter``) from an earlier training iteration."""

    def __init__(
        self,
        model: str,
        adapter: str = "",
        device: str = "auto",
        dtype: str = "auto",
        revision: str = "",
        trust_remote_code: bool = False,
        torch_threads: int = 0,
        separator: str = "\n",
        max_x_tokens: int = 64,
    ):
        from mia_ray.models.hf import load_causal_lm, set_torch_threads

        set_torch_threads(torch_threads)
        self.base, self.tok, self.device = load_causal_lm(
            model, device, dtype, revision, trust_remote_code
        )
        self.model = self.base
        self.pad = self.tok.pad_token_id
        self.sep = list(self.tok(separator, add_special_tokens=False)["input_ids"])
        self.max_x_tokens = max_x_tokens
        self.bos = bos_prefix(self.tok)
        special = set(self.tok.all_special_ids)
        self.allowed = np.array(
            [i for i in range(len(self.tok)) if i not in special], dtype=np.int64
        )
        self.adapter = ""
        if adapter:
            self.load_adapter(adapter)

    def load_adapter(self, path: str) -> None:
        """Use the LoRA adapter saved at ``path`` ("" = the base model alone): a folder, or
        the URL of one in storage (:func:`mia_ray.storage.localize`: copied once per node)."""
        if path == self.adapter:
            return
        if self.adapter:
            # PeftModel injects its layers into the base in place: take them out again.
            self.base = self.model.unload()
            self.model, self.adapter = self.base, ""
        if path:
            from peft import PeftModel

            from mia_ray.storage import localize

            local = localize(path)
            self.model = PeftModel.from_pretrained(self.base, local).to(self.device).eval()
            self.adapter = path

    def context(self, x: str) -> list[int]:
        return hunter_context(self.tok, x, self.sep, self.max_x_tokens, self.bos)

    def decode(self, prompt: list[int]) -> str:
        return self.tok.decode(list(prompt), skip_special_tokens=True)

    def _next_logits(self, xs: list[str], prompts: list[list[int]]):
        """(n, vocab) float32 next-token logits, special tokens at -inf; one left-padded pass."""
        import torch

        from mia_ray.models.hf import left_pad

        seqs = [self.context(x) + list(p) for x, p in zip(xs, prompts, strict=True)]
        ids, mask, pos = left_pad(seqs, self.pad, self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        out = logits[:, -1].float()
        banned = torch.ones(out.shape[-1], dtype=torch.bool, device=out.device)
        banned[torch.from_numpy(self.allowed[self.allowed < out.shape[-1]]).to(out.device)] = False
        return out.masked_fill(banned, float("-inf"))

    def topk(self, xs: list[str], prompts: list[list[int]], k: int) -> np.ndarray:
        """(n, k) token ids: the k most likely next prompt tokens for each (x, prompt so far)."""
        import torch

        logits = self._next_logits(xs, prompts)
        return torch.topk(logits, k, dim=-1).indices.cpu().numpy()

    def sample(
        self,
        xs: list[str],
        n_tokens: int,
        top_k: int,
        temperature: float,
        seeds: list[int],
    ) -> list[list[int]]:
        """One prompt of ``n_tokens`` per x, sampled token by token from the top-k of the
        hunter's distribution at ``temperature``; row i draws from its own ``seeds[i]``, so a
        row's prompt does not depend on which other rows share its batch."""
        import torch

        gens = [np.random.default_rng(s) for s in seeds]
        prompts: list[list[int]] = [[] for _ in xs]
        for _ in range(n_tokens):
            logits = self._next_logits(xs, prompts) / max(temperature, 1e-6)
            top = torch.topk(logits, top_k, dim=-1)
            probs = torch.softmax(top.values, dim=-1).cpu().numpy().astype(np.float64)
            idx = top.indices.cpu().numpy()
            for i, g in enumerate(gens):
                p = probs[i] / probs[i].sum()
                prompts[i].append(int(idx[i, g.choice(top_k, p=p)]))
        return prompts
