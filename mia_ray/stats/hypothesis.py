"""Dataset-level memorization tests on per-sample LCSS values (MemHunter §4.3, done soundly).

The paper compares a suspect model's LCSS values with those of a proxy fine-tuned on the
data by a t-test (its eq. 11) and declares memorization when p > alpha (its eq. 12). A large
p-value is absence of evidence of a difference, not evidence of sameness, so that rule is
reported only as the paper's (with the paper's unpaired, unequal-variance t). Every model is
scored on the same pairs with the same hunter prompts, so the values are paired: the
verdicts we stand behind test the per-pair differences d_i = suspect_i - other_i.

- ``paired_greater``: H0 "on the same pairs, the suspect recovers no more of the data than a
  reference model that surely never saw it" (E[d] <= 0) vs H1 "more"; a one-sided paired
  t-test (df = n - 1). Rejecting H0 shows the suspect recovers more than the reference.
- ``paired_tost``: H0 "the suspect and the proxy differ by at least ``margin``" (|E[d]| >=
  margin) vs H1 "within the margin"; two one-sided paired t-tests (Schuirmann's TOST), p =
  the larger one. Rejecting H0 shows the suspect memorized about as much as a model trained
  on the data.
- ``gap_greater``: a model that merely follows the hunter's prompts better than the reference
  beats it on any text. H0 "the suspect's per-pair gain over the reference on the dataset's
  pairs is no larger than on pairs of text outside it" (E[d | member] <= E[d | nonmember]);
  the two gap samples come from different pairs, so the test is one-sided Welch on them.
  Rejecting H0 flags memorization of *this* dataset.

Each test returns ``{test, h0, statistic, df, p_value, alpha, reject_h0, verdict, ...}``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from mia_ray.errors import MiaError


def finite_values(x, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size < 2:
        raise MiaError(f"{what}: a test needs at least 2 values, got {a.size}")
    if not np.isfinite(a).all():
        raise MiaError(f"{what}: values must be finite")
    return a


def _differences(a, b, what_a: str, what_b: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, a - b) for two samples matched by position (the same pairs, in the same order)."""
    x, y = finite_values(a, what_a), finite_values(b, what_b)
    if x.size != y.size:
        raise MiaError(
            f"{what_a} and {what_b}: a paired test needs one value of each per pair, got "
            f"{x.size} and {y.size}"
        )
    return x, y, x - y


def _one_sample(d: np.ndarray, shift: float = 0.0) -> tuple[float, float]:
    """Student's t for mean(d) - shift with its df (n - 1): the paired t on differences d."""
    se = d.std(ddof=1) / math.sqrt(d.size)
    if se == 0:
        raise MiaError(
            "the per-pair differences have no variance at all: a paired t-test is undefined"
        )
    return (d.mean() - shift) / se, d.size - 1.0


def welch_t(a: np.ndarray, b: np.ndarray, shift: float = 0.0) -> tuple[float, float, float]:
    """Welch's t for mean(a) - mean(b) - shift, its standard error and its degrees of freedom."""
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0:
        raise MiaError("the two samples have no variance at all: a t-test is undefined")
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return (a.mean() - b.mean() - shift) / se, se, df


def paper_ttest(suspect, proxy, alpha: float = 0.05) -> dict:
    """The paper's eq. 11 t (unequal variances, unpaired) and two-sided p, with its eq. 12
    rule: "memorized" when p > alpha. Reported for comparison only: the rule is not a valid
    test."""
    s, p = finite_values(suspect, "suspect LCSS"), finite_values(proxy, "proxy LCSS")
    t, _, df = welch_t(s, p)
    pval = float(2 * stats.t.sf(abs(t), df))
    return {
        "test": "paper t-test (eq. 11-12, Welch)",
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


def paired_greater(suspect, reference, alpha: float = 0.05) -> dict:
    """One-sided paired t-test that the suspect recovers more than the reference on the same
    pairs: t = mean(d) / (sd(d) / sqrt(n)), d = suspect - reference, df = n - 1."""
    s, r, d = _differences(suspect, reference, "suspect LCSS", "reference LCSS")
    t, df = _one_sample(d)
    pval = float(stats.t.sf(t, df))
    reject = pval < alpha
    return {
        "test": "one-sided paired t-test vs reference",
        "h0": "E[suspect LCSS - reference LCSS] <= 0 on the same pairs (the suspect recovers "
        "no more than a model that never saw the data)",
        "statistic": float(t),
        "df": float(df),
        "p_value": pval,
        "alpha": alpha,
        "reject_h0": reject,
        "verdict": "recovers more than the reference" if reject else "no evidence of memorization",
        "n_pairs": int(d.size),
        "mean_diff": float(d.mean()),
        "mean_suspect": float(s.mean()),
        "mean_reference": float(r.mean()),
    }


def paired_tost(suspect, proxy, margin: float, alpha: float = 0.05) -> dict:
    """Equivalence of the suspect's LCSS to the proxy's within +-margin, paired by pair (TOST
    on d = suspect - proxy: H0a mean(d) <= -margin, H0b mean(d) >= +margin, df = n - 1)."""
    if not margin > 0:
        raise MiaError(f"the equivalence margin must be positive, not {margin}")
    s, p, d = _differences(suspect, proxy, "suspect LCSS", "proxy LCSS")
    t_low, df = _one_sample(d, -margin)
    t_high, _ = _one_sample(d, margin)
    p_low, p_high = float(stats.t.sf(t_low, df)), float(stats.t.cdf(t_high, df))
    pval = max(p_low, p_high)
    reject = pval < alpha
    return {
        "test": f"paired TOST equivalence vs proxy (margin {margin:g})",
        "h0": f"|E[suspect LCSS - proxy LCSS]| >= {margin:g} on the same pairs",
        "statistic": float(t_low if p_low >= p_high else t_high),
        "df": float(df),
        "p_value": pval,
        "alpha": alpha,
        "reject_h0": reject,
        "verdict": "equivalent to the proxy" if reject else "not shown equivalent to the proxy",
        "n_pairs": int(d.size),
        "mean_diff": float(d.mean()),
        "mean_suspect": float(s.mean()),
        "mean_proxy": float(p.mean()),
    }


def gap_greater(
    member_suspect, member_reference, nonmember_suspect, nonmember_reference, alpha: float = 0.05
) -> dict:
    """One-sided Welch test that the suspect's per-pair gain over the reference is larger on
    the dataset's pairs (d_m = suspect - reference, member pairs) than on pairs outside it
    (d_n, the ``nonmember`` split): t = (mean d_m - mean d_n) / sqrt(var d_m / n_m + var d_n /
    n_n). Welch, not paired: d_m and d_n come from different pairs."""
    _, _, dm = _differences(member_suspect, member_reference, "suspect LCSS", "reference LCSS")
    _, _, dn = _differences(
        nonmember_suspect, nonmember_reference, "suspect LCSS (nonmember)", "reference LCSS "
        "(nonmember)"
    )  # fmt: skip
    t, _, df = welch_t(dm, dn)
    pval = float(stats.t.sf(t, df))
    reject = pval < alpha
    return {
        "test": "one-sided Welch test of the gap over the reference, members vs nonmembers",
        "h0": "E[suspect - reference | member pairs] <= E[suspect - reference | nonmember "
        "pairs] (the suspect's gain over the reference is no larger on the dataset than on "
        "text outside it, e.g. it only follows the hunter's prompts better)",
        "statistic": float(t),
        "df": float(df),
        "p_value": pval,
        "alpha": alpha,
        "reject_h0": reject,
        "verdict": "memorized" if reject else "no evidence of memorization",
        "n_pairs": int(dm.size),
        "n_nonmember_pairs": int(dn.size),
        "mean_gap_member": float(dm.mean()),
        "mean_gap_nonmember": float(dn.mean()),
    }
