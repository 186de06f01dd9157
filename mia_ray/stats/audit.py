"""The audit's statistics: a dataset-level test and per-file p-values with false-discovery control.

- ``welch_greater``: one-sided Welch t-test that scores of ``a`` exceed scores of ``b``, the
  test of LLM Dataset Inference (Maini et al. 2024, §4); the audit now uses a permutation
  test (``detectors.dataset_inference``), the validity suite keeps this as the former test.
- ``two_times_median``: merges p-values computed from the same data (cross-fitting halves,
  repeated over seeds), whatever their dependence: P(2 * median <= alpha) <= alpha for any
  joint law (Rüschendorf 1982; the quantile aggregation of Meinshausen, Meier & Bühlmann 2009
  with gamma = 1/2; Vovk & Wang 2020).
- ``conformal_pvalues``: p = (1 + #{calibration scores >= s}) / (n + 1), as exact fractions;
  exactly valid when the test file and the n calibration files are exchangeable, so never
  below 1 / (n + 1).
- ``benjamini_hochberg``: the step-up rule at level q, in exact arithmetic; conformal
  p-values that share one calibration set and one model are PRDS, so it controls the FDR at
  q for them (Bates et al. 2023); ``by`` controls it under any dependence.

Pure numpy/scipy: no model, no Ray.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy import stats

from mia_ray.errors import MiaError
from mia_ray.stats.hypothesis import finite_values, welch_t


def welch_greater(a, b) -> dict:
    """One-sided Welch t-test of H0 E[a] <= E[b] against E[a] > E[b] for two samples (n_a,),
    (n_b,), each of at least 2 values: ``{statistic, df, p_value, effect_size}``, where the
    effect size is Cohen's d with the pooled standard deviation."""
    x, y = finite_values(a, "first sample"), finite_values(b, "second sample")
    t, _, df = welch_t(x, y)
    return {
        "statistic": float(t),
        "df": float(df),
        "p_value": float(stats.t.sf(t, df)),
        "effect_size": cohens_d(x, y),
    }


def cohens_d(a, b) -> float:
    """(mean(a) - mean(b)) / pooled standard deviation (ddof=1); 0 when both are constant."""
    x, y = finite_values(a, "first sample"), finite_values(b, "second sample")
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
    the test file, so the p-value stays valid). Exact: an object array of Fractions
    (1 + k) / (n + 1), so :func:`benjamini_hochberg` decides p = q k / m exactly (a float
    (1 + k) / (n + 1) lies a rounding error above or below it)."""
    s = np.asarray(test_scores, dtype=np.float64).reshape(-1)
    c = np.sort(np.asarray(calibration_scores, dtype=np.float64).reshape(-1))
    if c.size == 0:
        raise MiaError("conformal p-values need at least one calibration score")
    if not (np.isfinite(s).all() and np.isfinite(c).all()):
        raise MiaError("conformal p-values need finite scores")
    at_least = c.size - np.searchsorted(c, s, side="left")
    return np.array([Fraction(1 + int(k), c.size + 1) for k in at_least], dtype=object)


def benjamini_hochberg(pvalues, q: float, method: str = "bh") -> tuple[np.ndarray, np.ndarray]:
    """The step-up rule at level ``q`` for (m,) p-values: (rejected (m,) bool, adjusted (m,)).

    Rejects the k smallest p-values for the largest k with p_(k) <= q k / m (``bh``); ``by``
    (Benjamini & Yekutieli 2001) uses q / (1 + 1/2 + ... + 1/m), valid under any dependence.
    The rule runs in exact arithmetic: p-values given as Fractions (conformal p-values are
    (1 + k) / (n + 1)) stay exact, floats are taken at their exact binary value, and ``q`` at
    its decimal value (0.05 is 1/20), so p = q k / m is a rejection, never a rounding error.
    The adjusted p-value of p_(i) is min over j >= i of min(1, p_(j) m / j) (times the BY
    factor), as a float; "adjusted <= q" is the same rule.
    """
    if not 0 < q < 1:
        raise MiaError(f"the FDR level must lie in (0, 1), not {q}")
    if method not in ("bh", "by"):
        raise MiaError(f"unknown FDR method {method!r} (bh or by)")
    p = [x if isinstance(x, Fraction) else Fraction(float(x)) for x in np.ravel(pvalues)]
    m = len(p)
    if m == 0:
        return np.zeros(0, dtype=bool), np.zeros(0)
    level = Fraction(str(q)) if isinstance(q, float) else Fraction(q)
    factor = sum(Fraction(1, i) for i in range(1, m + 1)) if method == "by" else Fraction(1)
    order = sorted(range(m), key=lambda i: p[i])
    k = max((i + 1 for i in range(m) if p[order[i]] * m * factor <= level * (i + 1)), default=0)
    rejected = np.zeros(m, dtype=bool)
    rejected[order[:k]] = True
    adjusted = np.empty(m)
    running = Fraction(1)
    for i in range(m - 1, -1, -1):
        running = min(running, p[order[i]] * m * factor / (i + 1))
        adjusted[order[i]] = float(running)
    return rejected, adjusted


def min_calibration_files(q: float) -> int:
    """The fewest calibration files n for which a conformal p-value can reach q: 1/(n+1) <= q."""
    return max(1, math.ceil(1.0 / q - 1.0 - 1e-12))
