"""Dataset-level memorization tests on per-sample LCSS values (MemHunter §4.3, done soundly).

The paper compares a suspect model's LCSS values with those of a proxy fine-tuned on the
data by a t-test (its eq. 11) and declares memorization when p > alpha (its eq. 12). A large
p-value is absence of evidence of a difference, not evidence of sameness, so that rule is
reported only as the paper's. The verdicts we stand behind:

- ``welch_greater``: H0 "the suspect recovers no more of the data than a reference model
  that surely never saw it" vs H1 "more"; a one-sided Welch t-test. Rejecting H0 flags
  memorization.
- ``tost``: H0 "the suspect and the proxy differ by at least ``margin``" vs H1 "they are
  within the margin"; two one-sided Welch tests (Schuirmann's TOST), p = the larger one.
  Rejecting H0 shows the suspect memorized about as much as a model trained on the data.

Each test returns ``{test, h0, statistic, p_value, alpha, reject_h0, verdict, ...}``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from mia_ray.errors import MiaError


def _values(x, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size < 2:
        raise MiaError(f"{what}: a test needs at least 2 values, got {a.size}")
    if not np.isfinite(a).all():
        raise MiaError(f"{what}: values must be finite")
    return a


def _welch(a: np.ndarray, b: np.ndarray, shift: float = 0.0) -> tuple[float, float, float]:
    """Welch's t for mean(a) - mean(b) - shift, its standard error and its degrees of freedom."""
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0:
        raise MiaError("the two samples have no variance at all: a t-test is undefined")
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return (a.mean() - b.mean() - shift) / se, se, df


def paper_ttest(suspect, proxy, alpha: float = 0.05) -> dict:
    """The paper's eq. 11 t (unequal variances) and two-sided p, with its eq. 12 rule:
    "memorized" when p > alpha. Reported for comparison only: the rule is not a valid test."""
    s, p = _values(suspect, "suspect LCSS"), _values(proxy, "proxy LCSS")
    t, _, df = _welch(s, p)
    pval = float(2 * stats.t.sf(abs(t), df))
    return {
        "test": "paper t-test (eq. 11-12)",
        "h0": "E[suspect LCSS] = E[proxy LCSS]",
        "statistic": float(t),
        "df": float(df),
        "p_value": pval,
        "alpha": alpha,
        "reject_h0": pval < alpha,
        "verdict": "memorized (paper's rule: p > alpha)"
        if pval > alpha
        else "not memorized (paper's rule: p <= alpha)",
    }


def welch_greater(suspect, reference, alpha: float = 0.05) -> dict:
    """One-sided Welch test that the suspect recovers more than the reference model."""
    s, r = _values(suspect, "suspect LCSS"), _values(reference, "reference LCSS")
    t, _, df = _welch(s, r)
    pval = float(stats.t.sf(t, df))
    reject = pval < alpha
    return {
        "test": "one-sided Welch t-test vs reference",
        "h0": "E[suspect LCSS] <= E[reference LCSS] (the suspect recovers no more than a model "
        "that never saw the data)",
        "statistic": float(t),
        "df": float(df),
        "p_value": pval,
        "alpha": alpha,
        "reject_h0": reject,
        "verdict": "memorized" if reject else "no evidence of memorization",
        "mean_suspect": float(s.mean()),
        "mean_reference": float(r.mean()),
    }


def tost(suspect, proxy, margin: float, alpha: float = 0.05) -> dict:
    """Equivalence of the suspect's mean LCSS to the proxy's within +-margin (TOST, Welch)."""
    if not margin > 0:
        raise MiaError(f"the equivalence margin must be positive, not {margin}")
    s, p = _values(suspect, "suspect LCSS"), _values(proxy, "proxy LCSS")
    t_low, _, df = _welch(s, p, -margin)  # H0a: diff <= -margin
    t_high, _, _ = _welch(s, p, margin)  # H0b: diff >= +margin
    p_low, p_high = float(stats.t.sf(t_low, df)), float(stats.t.cdf(t_high, df))
    pval = max(p_low, p_high)
    reject = pval < alpha
    return {
        "test": f"TOST equivalence vs proxy (margin {margin:g})",
        "h0": f"|E[suspect LCSS] - E[proxy LCSS]| >= {margin:g}",
        "statistic": float(t_low if p_low >= p_high else t_high),
        "df": float(df),
        "p_value": pval,
        "alpha": alpha,
        "reject_h0": reject,
        "verdict": "equivalent to the proxy" if reject else "not shown equivalent to the proxy",
        "mean_suspect": float(s.mean()),
        "mean_proxy": float(p.mean()),
    }
