"""The 13 snippet-level uncertainty metrics of CopyCheck (§IV-B of copycheck-paper.txt).

An uncertainty estimation LLM (MC dropout, BLoB or a LoRA ensemble) gives n stochastic
predictions per snippet; prediction i is p_i = p("1"), the softmax over the logits of the
tokens "0" and "1". Each registered metric is ``fn(p, y, eps) -> (n_snippets,)`` with

- ``p`` (n_snippets, n_samples): p_i for every snippet (row) and prediction (column);
- ``y`` (n_snippets,): the snippet's (pseudo-)label, 0 or 1;
- ``eps``: where a formula takes the log of a probability, it is clipped to [eps, 1 - eps].

These are clustering features, not attack scores: they are not oriented towards
"member"; the file-level detector orients its clusters by rule. Every metric is computed
in float64 and vectorised over rows; rows never interact.
"""

from __future__ import annotations

import numpy as np

from mia_ray.errors import MiaError
from mia_ray.registry import get, register

# Paper order (§IV-B); the column order of :func:`uncertainty_features`.
METRICS: tuple[str, ...] = (
    "aleatoric",
    "epistemic",
    "entropy",
    "std",
    "kl_mean",
    "delta_max",
    "delta_min",
    "mean_median",
    "manhattan",
    "euclidean",
    "nll",
    "chebyshev",
    "kl_label",
)


def _validate(p, y, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Check the inputs of a metric; return p (n_snippets, n_samples) and y (n_snippets,) as float64."""
    try:
        p = np.asarray(p, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise MiaError(f"uncertainty inputs must be numeric arrays: {e}") from None
    if p.ndim != 2:
        raise MiaError(
            f"p must be 2-D (n_snippets, n_samples), got shape {p.shape}; "
            "for a single snippet pass p[None, :]"
        )
    if p.shape[1] < 1:
        raise MiaError(f"p must hold at least one prediction per snippet, got shape {p.shape}")
    bad = np.argwhere(~np.isfinite(p))
    if bad.size:
        r, c = bad[0]
        raise MiaError(f"p must be finite; found {p[r, c]} at row {r}, column {c}")
    bad = np.argwhere((p < 0) | (p > 1))
    if bad.size:
        r, c = bad[0]
        raise MiaError(
            f"p must lie within [0, 1] (probabilities of token '1'); "
            f"found {p[r, c]} at row {r}, column {c}"
        )
    if y.ndim != 1:
        raise MiaError(f"y must be 1-D (n_snippets,), got shape {y.shape}")
    if y.shape[0] != p.shape[0]:
        raise MiaError(
            f"y has {y.shape[0]} labels but p has {p.shape[0]} rows (snippets); "
            f"p shape {p.shape}, y shape {y.shape}"
        )
    bad = np.flatnonzero((y != 0) & (y != 1))
    if bad.size:
        raise MiaError(f"y must hold labels 0 or 1; found {y[bad[0]]} at index {bad[0]}")
    if not 0 < eps < 0.5:
        raise MiaError(f"eps must lie in (0, 0.5), got {eps}")
    return p, y


def _sorted_rows(p, y, eps: float, metric: str) -> np.ndarray:
    p, _ = _validate(p, y, eps)
    if p.shape[1] < 2:
        raise MiaError(
            f"{metric} needs at least 2 predictions per snippet, got shape {p.shape} "
            f"(n_samples = {p.shape[1]})"
        )
    return np.sort(p, axis=1)


@register("uncertainty", "aleatoric")
def aleatoric(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Aleatoric uncertainty (§IV-B): mean_i [diag(p̂_i) - p̂_i p̂_iᵀ], p̂_i = [1 - p_i, p_i].

    For two classes that matrix is p_i (1 - p_i) [[1, -1], [-1, 1]]; its (1, 1) entry is
    reported: mean_i p_i (1 - p_i), in [0, 0.25].
    """
    p, _ = _validate(p, y, eps)
    return np.mean(p * (1 - p), axis=1)


@register("uncertainty", "epistemic")
def epistemic(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Epistemic uncertainty (§IV-B): mean_i (p̂_i - p̄)(p̂_i - p̄)ᵀ.

    Its (1, 1) entry: mean_i (p_i - p̄)², the population variance of the p_i (ddof = 0).
    aleatoric + epistemic = p̄ (1 - p̄).
    """
    p, _ = _validate(p, y, eps)
    return np.var(p, axis=1)


@register("uncertainty", "entropy")
def entropy(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Predictive entropy (§IV-B): H(P) = -Σ_i p_i log p_i, natural log.

    The paper's definition, summed over the n predictions; it is not the Bernoulli entropy
    of each prediction. p is clipped to [eps, 1 - eps] inside the log only, so p_i = 0
    contributes exactly 0.
    """
    p, _ = _validate(p, y, eps)
    return -np.sum(p * np.log(np.clip(p, eps, 1 - eps)), axis=1)


@register("uncertainty", "std")
def std(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Standard deviation (§IV-B): sqrt(mean_i (p_i - P̄)²), the population std (ddof = 0)."""
    p, _ = _validate(p, y, eps)
    return np.std(p, axis=1)


@register("uncertainty", "kl_mean")
def kl_mean(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """KL divergence to the mean (§IV-B, D_EU-KL): Σ_i p_i log(p_i / P̄).

    p is clipped to [eps, 1 - eps] first (a p_i = 0 would give log 0) and P̄ is the mean
    of the clipped p.
    """
    p, _ = _validate(p, y, eps)
    q = np.clip(p, eps, 1 - eps)
    return np.sum(q * np.log(q / q.mean(axis=1, keepdims=True)), axis=1)


@register("uncertainty", "delta_max")
def delta_max(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """ΔMax (§IV-B): max(P) - second_max(P); 0 when the largest value is tied. Needs n >= 2."""
    s = _sorted_rows(p, y, eps, "delta_max")
    return s[:, -1] - s[:, -2]


@register("uncertainty", "delta_min")
def delta_min(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """ΔMin (§IV-B): second_min(P) - min(P); 0 when the smallest value is tied. Needs n >= 2."""
    s = _sorted_rows(p, y, eps, "delta_min")
    return s[:, 1] - s[:, 0]


@register("uncertainty", "mean_median")
def mean_median(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """ΔMM (§IV-B): mean(P) - median(P); median of an even n is the mean of the middle two."""
    p, _ = _validate(p, y, eps)
    return np.mean(p, axis=1) - np.median(p, axis=1)


@register("uncertainty", "manhattan")
def manhattan(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Factual Manhattan distance (§IV-B): Σ_i |p_i - y|."""
    p, y = _validate(p, y, eps)
    return np.sum(np.abs(p - y[:, None]), axis=1)


@register("uncertainty", "euclidean")
def euclidean(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Factual Euclidean distance (§IV-B): sqrt(Σ_i (p_i - y)²)."""
    p, y = _validate(p, y, eps)
    return np.sqrt(np.sum((p - y[:, None]) ** 2, axis=1))


@register("uncertainty", "nll")
def nll(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Factual negative log-likelihood (§IV-B): -Σ_i y log p_i.

    p is clipped to [eps, 1 - eps] (p_i = 0 would give log 0); the value is 0 when y = 0.
    """
    p, y = _validate(p, y, eps)
    return y * -np.sum(np.log(np.clip(p, eps, 1 - eps)), axis=1)


@register("uncertainty", "chebyshev")
def chebyshev(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Factual Chebyshev distance (§IV-B): max_i |p_i - y|."""
    p, y = _validate(p, y, eps)
    return np.max(np.abs(p - y[:, None]), axis=1)


@register("uncertainty", "kl_label")
def kl_label(p: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Factual KL divergence to the label (§IV-B, D_FU-KL): Σ_i p_i log(p_i / y).

    Both p and y are clipped to [eps, 1 - eps]: y = 0 would divide by zero and p_i = 0
    would take log 0. As in the paper the terms are not those of a proper KL between
    distributions, so the value can be negative (for y = 1 it is about Σ_i p_i log p_i).
    """
    p, y = _validate(p, y, eps)
    q = np.clip(p, eps, 1 - eps)
    return np.sum(q * np.log(q / np.clip(y, eps, 1 - eps)[:, None]), axis=1)


def uncertainty_features(p: np.ndarray, y: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """All 13 metrics (§IV-B): p (n_snippets, n_samples), y (n_snippets,) -> (n_snippets, 13).

    Columns in :data:`METRICS` order; name them with :func:`feature_names`.
    """
    # Validate once up front so bad input fails with one message before any metric runs.
    p, y = _validate(p, y, eps)
    return np.column_stack([get("uncertainty", m)(p, y, eps) for m in METRICS])


def feature_names(prefix: str) -> list[str]:
    """Column names of :func:`uncertainty_features`: ``f"{prefix}.{metric}"``, e.g. "mcd.aleatoric"."""
    return [f"{prefix}.{m}" for m in METRICS]
