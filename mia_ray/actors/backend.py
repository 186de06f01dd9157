"""BackendActor: the model role of the prompt-based methods (leakage survey, black-box CopyCheck).

It holds one prompting backend (:mod:`mia_ray.backends`), built inside the actor so a local
model loads where Ray placed it, and answers log-likelihood requests in batches.
"""

from __future__ import annotations

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
