"""Attack scores for one snippet, all derived from one forward pass.

Each registered attack is ``fn(s: SnippetStats, **params) -> float`` with higher = more
likely a member. The actor computes a snippet's :class:`SnippetStats` once; every attack
and every Min-K ratio is then pure numpy over those arrays, never another forward pass.
"""

from __future__ import annotations

import inspect
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mia_ray.errors import MiaError
from mia_ray.registry import get, register


class SnippetError(MiaError, ValueError):
    """A snippet that cannot be scored: a ValueError to callers, one clear line in the CLI."""


@dataclass(eq=False)  # arrays make field-wise == ambiguous
class SnippetStats:
    """One forward pass over a snippet of T tokens; T-1 positions are scored.

    ``token_logprobs[t]`` is log p(x_{t+1} | x_<=t) of the observed next token, shape (T-1,).
    ``mu`` and ``sigma`` (T-1,) are the mean and std of log p(z | x_<=t) for z drawn from the
    model's own next-token distribution (the Min-K%++ normalisers).
    ``lower_loss``: mean NLL of the lowercased text; ``ref_loss``: mean NLL of this text under
    the reference model. Both are None when the run did not compute them.
    """

    text: str
    token_logprobs: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray
    lower_loss: float | None = None
    ref_loss: float | None = None

    def __post_init__(self) -> None:
        self.token_logprobs = np.asarray(self.token_logprobs, dtype=np.float64)
        self.mu = np.asarray(self.mu, dtype=np.float64)
        self.sigma = np.asarray(self.sigma, dtype=np.float64)
        if self.token_logprobs.ndim != 1:
            raise SnippetError(
                f"token_logprobs must be 1-D (T-1,), got shape {self.token_logprobs.shape}"
            )
        if self.token_logprobs.size == 0:
            raise SnippetError(
                f"snippet {self.text[:40]!r} has no scored tokens: attacks need at least 2 tokens"
            )
        if self.mu.shape != self.token_logprobs.shape or self.sigma.shape != self.mu.shape:
            raise SnippetError(
                f"mu {self.mu.shape} and sigma {self.sigma.shape} must match "
                f"token_logprobs {self.token_logprobs.shape}"
            )


def _mean_nll(s: SnippetStats) -> float:
    return -float(np.mean(s.token_logprobs))


def _lowest_k_mean(values: np.ndarray, ratio: float) -> float:
    """Mean of the k smallest of ``values`` (n,), k = max(1, floor(ratio * n))."""
    if not 0 < ratio <= 1:
        raise SnippetError(f"min-k ratio must lie in (0, 1], got {ratio}")
    # The tolerance keeps float error from flooring 0.29 * 100 = 28.999... down to 28.
    k = max(1, math.floor(ratio * values.size + 1e-9))
    return float(np.mean(np.partition(values, k - 1)[:k]))


@register("attack", "loss")
def loss(s: SnippetStats) -> float:
    """LOSS attack (Yeom et al. 2018): -mean NLL = mean(token_logprobs)."""
    return -_mean_nll(s)


@register("attack", "zlib")
def zlib_ratio(s: SnippetStats) -> float:
    """zlib ratio (Carlini et al. 2021): -(mean NLL) / zlib_entropy.

    zlib_entropy = len(zlib.compress(text.encode("utf-8"))) in bytes, default level (6);
    never 0, since the zlib header alone is 8 bytes. Equal to mean(token_logprobs) / zlib_len.
    """
    return -_mean_nll(s) / len(zlib.compress(s.text.encode("utf-8")))


@register("attack", "min_k")
def min_k(s: SnippetStats, ratio: float = 0.2) -> float:
    """Min-K% Prob (Shi et al. 2024): mean of the k lowest token log-probs.

    k = max(1, floor(ratio * (T-1))): 10 tokens at ratio 0.25 use the lowest 2.
    """
    return _lowest_k_mean(s.token_logprobs, ratio)


@register("attack", "min_k_plus_plus")
def min_k_plus_plus(s: SnippetStats, ratio: float = 0.2) -> float:
    """Min-K%++ (Zhang et al. 2024): mean of the k lowest z_t = (log p(x_t) - mu_t) / sigma_t.

    k as in :func:`min_k`. sigma is clipped below at 1e-8: a near one-hot next-token
    distribution has sigma -> 0 and would give inf or 0/0.
    """
    z = (s.token_logprobs - s.mu) / np.maximum(s.sigma, 1e-8)
    return _lowest_k_mean(z, ratio)


@register("attack", "lowercase")
def lowercase(s: SnippetStats) -> float:
    """Lowercase ratio (Carlini et al. 2021): -(mean NLL of text) / (mean NLL of lowercased text).

    A ratio of log-perplexities: a member's original casing is much likelier than its
    lowercased form, so the ratio is small and the score high.
    """
    if s.lower_loss is None:
        raise SnippetError("attack 'lowercase' needs lower_loss (the lowercased text's mean NLL)")
    if not s.lower_loss > 0:
        raise SnippetError(f"attack 'lowercase' needs lower_loss > 0, got {s.lower_loss}")
    return -_mean_nll(s) / s.lower_loss


@register("attack", "ref")
def ref(s: SnippetStats) -> float:
    """Reference-model attack (Carlini et al. 2021), difference form: ref_loss - mean NLL.

    The paper's ratio of target to reference log-perplexity, taken as a difference so the
    score stays monotone when either loss is near 0: a member is easier for the target
    than for a reference model that never saw it.
    """
    if s.ref_loss is None:
        raise SnippetError("attack 'ref' needs ref_loss (the text's mean NLL under the reference)")
    return s.ref_loss - _mean_nll(s)


def stats_from_columns(
    texts: Sequence[str],
    token_logprobs: Sequence[Sequence[float]],
    mu: Sequence[Sequence[float]],
    sigma: Sequence[Sequence[float]],
    lower_loss: Sequence[float] | None = None,
    ref_loss: Sequence[float] | None = None,
) -> list[SnippetStats]:
    """Row-aligned columns (as a Scorer writes them) -> one SnippetStats per snippet."""
    n = len(texts)
    lower = [None] * n if lower_loss is None else [float(v) for v in lower_loss]
    ref = [None] * n if ref_loss is None else [float(v) for v in ref_loss]
    return [
        SnippetStats(
            t,
            np.asarray(lp, np.float64),
            np.asarray(m, np.float64),
            np.asarray(sd, np.float64),
            lo,
            rf,
        )
        for t, lp, m, sd, lo, rf in zip(texts, token_logprobs, mu, sigma, lower, ref, strict=True)
    ]


def score_table(
    stats: Sequence[SnippetStats],
    attacks: Sequence[str],
    min_k_ratios: Sequence[float],
    min_k_ratio: float,
) -> dict[str, np.ndarray]:
    """One score column (n,) per attack, for n snippets.

    An attack that takes ``ratio`` (min_k, min_k_plus_plus) also gets a column
    ``f"{name}@{r:g}"`` per ratio in ``min_k_ratios``; its plain column is the one at
    ``min_k_ratio``.
    """
    # Resolve every name first: a typo fails before any scoring.
    fns = {name: get("attack", name) for name in attacks}

    def column(fn, **params) -> np.ndarray:
        return np.fromiter((fn(s, **params) for s in stats), dtype=np.float64, count=len(stats))

    table: dict[str, np.ndarray] = {}
    for name, fn in fns.items():
        # An attack declares a Min-K ratio by its signature; no list of such names to keep in step.
        if "ratio" in inspect.signature(fn).parameters:
            for r in min_k_ratios:
                table[f"{name}@{r:g}"] = column(fn, ratio=r)
            key = f"{name}@{min_k_ratio:g}"
            table[name] = table[key] if key in table else column(fn, ratio=min_k_ratio)
        else:
            table[name] = column(fn)
    return table


def vocab_moments_np(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of log p(z) under p = softmax(logits), over the vocabulary axis.

    logits (..., V) -> mu (...), sigma (...). The numpy reference for the actor's torch
    version; computed in float64, so keep T*V modest. Logits of -inf (masked tokens) have
    p = 0 and contribute nothing.
    """
    x = np.asarray(logits, dtype=np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    p = np.exp(logp)
    logp = np.where(p > 0, logp, 0.0)  # avoids 0 * -inf = nan for masked tokens
    mu = (p * logp).sum(axis=-1)
    # Centred second moment: equal to E[log p^2] - mu^2 but without its cancellation.
    var = (p * (logp - mu[..., None]) ** 2).sum(axis=-1)
    return mu, np.sqrt(var)
