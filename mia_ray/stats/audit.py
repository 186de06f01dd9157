"""The audit's statistics: a dataset-level test and per-file p-values with false-discovery control.

- ``welch_greater``: one-sided Welch t-test that scores of ``a`` exceed scores of ``b``, the
  test of LLM Dataset Inference (Maini et al. 2024, §4), run here on file-level scores.
- ``two_times_median``: merges p-values computed from the same data (cross-fitting halves,
  repeated over seeds), whatever their dependence: P(2 * median <= alpha) <= alpha for any
  joint law (Rüschendorf 1982; the quantile aggregation of Meinshausen, Meier & Bühlmann 2009
  with gamma = 1/2; Vovk & Wang 2020).
- ``conformal_pvalues``: p = (1 + #{calibration scores >= s}) / (n + 1); exactly valid when
  the test file and the n calibration files are exchangeable, so never below 1 / (n + 1).
- ``benjamini_hochberg``: the step-up rule at level q; conformal p-values that share their
  calibration set are PRDS, so it controls the FDR at q (Bates et al. 2023).

Pure numpy/scipy: no model, no Ray.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from mia_ray.errors import MiaError
from mia_ray.stats.hypothesis import _values, _welch


def welch_greater(a, b) -> dict:
    """One-sided Welch t-test of H0 E[a] <= E[b] against E[a] > E[b] for two samples (n_a,),
    (n_b,), each of at least 2 values: ``{statistic, df, p_value, effect_size}``, where the
    effect size is Cohen's d with the pooled standard deviation."""
    x, y = _values(a, "first sample"), _values(b, "second sample")
    t, _, df = _welch(x, y)
    return {
        "statistic": float(t),
        "df": float(df),
        "p_value": float(stats.t.sf(t, df)),
        "effect_size": cohens_d(x, y),
    }


def cohens_d(a, b) -> float:
    """(mean(a) - mean(b)) / pooled standard deviation (ddof=1); 0 when both are constant."""
    x, y = _values(a, "first sample"), _values(b, "second sample")
    pooled = ((x.size - 1) * x.var(ddof=1) + (y.size - 1) * y.var(ddof=1)) / (x.size + y.size - 2)
    if pooled == 0:
        return 0.0
    return float((x.mean() - y.mean()) / math.sqrt(pooled))


def two_times_median(pvalues) -> float:
    """min(1, 2 * median(p)): a valid p-value for any dependence among the p-values."""
    p = np.asarray(pvalues, dtype=np.float64).reshape(-1)
    if p.size == 0:
        raise MiaError("no p-values to combine")
    if not ((p >= 0) & (p <= 1)).all():
        raise MiaError("p-values must lie in [0, 1]")
    return float(min(1.0, 2.0 * np.median(p)))


def conformal_pvalues(test_scores, calibration_scores) -> np.ndarray:
    """(m,) p-values of ``test_scores`` (m,) against ``calibration_scores`` (n,): the share of
    calibration scores at least as high, counting the test score itself (ties go against
    the test file, so the p-value stays valid)."""
    s = np.asarray(test_scores, dtype=np.float64).reshape(-1)
    c = np.sort(np.asarray(calibration_scores, dtype=np.float64).reshape(-1))
    if c.size == 0:
        raise MiaError("conformal p-values need at least one calibration score")
    if not (np.isfinite(s).all() and np.isfinite(c).all()):
        raise MiaError("conformal p-values need finite scores")
    at_least = c.size - np.searchsorted(c, s, side="left")
    return (1.0 + at_least) / (c.size + 1.0)


def benjamini_hochberg(pvalues, q: float) -> tuple[np.ndarray, np.ndarray]:
    """BH at level ``q`` for (m,) p-values: (rejected (m,) bool, adjusted p-values (m,)).

    Rejects the k smallest p-values for the largest k with p_(k) <= q k / m; the adjusted
    p-value of p_(i) is min over j >= i of min(1, p_(j) m / j), so "adjusted <= q" is the
    same rule.
    """
    p = np.asarray(pvalues, dtype=np.float64).reshape(-1)
    if not 0 < q < 1:
        raise MiaError(f"the FDR level must lie in (0, 1), not {q}")
    m = p.size
    if m == 0:
        return np.zeros(0, dtype=bool), np.zeros(0)
    order = np.argsort(p, kind="stable")
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted_sorted = np.minimum(1.0, np.minimum.accumulate(ranked[::-1])[::-1])
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return adjusted <= q, adjusted


def min_calibration_files(q: float) -> int:
    """The fewest calibration files n for which a conformal p-value can reach q: 1/(n+1) <= q."""
    return max(1, math.ceil(1.0 / q - 1.0 - 1e-12))
