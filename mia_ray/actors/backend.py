"""BackendActor: the model role of the prompt-based methods (leakage survey, black-box CopyCheck).

It holds one prompting backend (:mod:`mia_ray.backends`), built inside the actor so a local
model loads where Ray placed it, and answers log-likelihood requests in batches.
"""

from __future__ import annotations

import json
from typing import Any


class BackendActor:
    """``loglikelihood([(context, continuation), ...])`` -> per-token log-probs per pair."""

    def __init__(self, spec: dict[str, Any]):
        from mia_ray.backends import from_spec

        self.backend = from_spec(spec)

    def loglikelihood(self, pairs: list[tuple[str, str]]) -> list[list[float]]:
        from mia_ray.backends import LoglikRequest

        res = self.backend.loglikelihood([LoglikRequest(c, t) for c, t in pairs])
        return [r.logprobs for r in res]

    def stats(self) -> dict[str, int]:
        """HTTP attempts sent and prompts answered from the cache (API backend; else zeros)."""
        return {
            "requests_sent": int(getattr(self.backend, "requests_sent", 0)),
            "cache_hits": int(getattr(self.backend, "cache_hits", 0)),
        }


class Continuations:
    """``Dataset.map_batches(Continuations, ...)``: per row (``snippet_id``, ``text``) the
    ``n`` continuations SaMIA compares (``samples``, a JSON list) that one backend samples after the
    text's first ``ratio`` of words (:func:`~mia_ray.features.attacks.samia_split`), seeded
    by the run's seed and the snippet id. ``max_tokens`` 0: as many tokens as the true
    continuation has under the model's tokenizer (``tokenizer``: a served model's)."""

    def __init__(self, spec: dict[str, Any], n: int, ratio: float, temperature: float,
                 top_k: int, max_tokens: int, seed: int, tokenizer: str = ""):  # fmt: skip
        from mia_ray.backends import from_spec

        self.backend = from_spec(spec)
        # Counts the true continuation's tokens: the local model's, or a served model's.
        self.tokenizer = getattr(self.backend, "tokenizer", None)
        if self.tokenizer is None and tokenizer:
            from mia_ray.models.hf import load_tokenizer

            self.tokenizer = load_tokenizer(tokenizer, "", False, "")
        self.n, self.ratio, self.temperature, self.top_k = n, ratio, temperature, top_k
        self.max_tokens, self.seed = max_tokens, seed

    def __call__(self, batch):
        from mia_ray.actors import in_model_batches

        return in_model_batches(batch, self._sample)

    def _sample(self, batch):
        import pandas as pd

        from mia_ray.actors.sampler import snippet_seed
        from mia_ray.backends import SampleRequest
        from mia_ray.features.attacks import samia_split

        asks = []
        for sid, text in zip(batch["snippet_id"], batch["text"], strict=True):
            prompt, _ = samia_split(str(text), self.ratio)
            rest = str(text)[len(prompt) :]
            n_tokens = self.max_tokens or len(
                self.tokenizer(rest, add_special_tokens=False)["input_ids"]
            )
            asks.append(
                SampleRequest(prompt, self.n, max(1, n_tokens), snippet_seed(self.seed, sid))
            )
        texts = self.backend.sample(asks, self.temperature, self.top_k)
        # One JSON list per row: a list-of-strings column does not survive pandas' Parquet
        # round trip here (its Arrow dtype is not read back).
        samples = [json.dumps(t, ensure_ascii=False) for t in texts]
        return pd.DataFrame({"snippet_id": batch["snippet_id"].to_numpy(), "samples": samples})
