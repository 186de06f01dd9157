"""The audit's statistics against hand-computed cases and their definitions."""

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from mia_ray.errors import MiaError
from mia_ray.stats.audit import (
    benjamini_hochberg,
    cohens_d,
    conformal_pvalues,
    min_calibration_files,
    two_times_median,
    welch_greater,
)


def test_conformal_pvalues_count_calibration_scores_at_least_as_high():
    cal = [4.0, 1.0, 3.0, 2.0]
    # (1 + #{c >= s}) / (n + 1): 2.5 -> (1+2)/5; 5 -> 1/5; a tie counts against: 2 -> (1+3)/5
    got = conformal_pvalues([2.5, 5.0, 2.0, 0.0], cal)
    assert got.tolist() == [Fraction(3, 5), Fraction(1, 5), Fraction(4, 5), Fraction(1)]


def test_conformal_pvalue_is_never_below_one_over_n_plus_one():
    assert conformal_pvalues([1e9], np.arange(19.0))[0] == Fraction(1, 20)


def test_conformal_pvalues_into_benjamini_hochberg_are_exact_at_the_boundary():
    # m suspected files above all n calibration files: p = 1/(n+1) each, and BH at 5 % flags
    # all m exactly when m/(n+1) <= m/20 * ... i.e. when k = m passes p_(m) <= q m / m. Over
    # n in 19..33 and m in 1..15 (225 cases) the float path missed 195 of the boundary ones.
    for n in range(19, 34):
        for m in range(1, 16):
            p = conformal_pvalues([1e9] * m, np.arange(float(n)))
            flagged = benjamini_hochberg(p, 0.05)[0]
            assert flagged.all() == (Fraction(1, n + 1) <= Fraction(1, 20)), (n, m)
            # a file tied with the top calibration file: p = 2/(n+1), flagged with m - 1 others
            p = conformal_pvalues([1e9] * (m - 1) + [float(n - 1)], np.arange(float(n)))
            k = max((j for j in range(1, m + 1)
                     if sorted(p)[j - 1] <= Fraction(1, 20) * j / m), default=0)  # fmt: skip
            assert int(benjamini_hochberg(p, 0.05)[0].sum()) == k, (n, m)


def test_conformal_pvalues_errors():
    with pytest.raises(MiaError, match="at least one calibration score"):
        conformal_pvalues([1.0], [])
    with pytest.raises(MiaError, match="finite"):
        conformal_pvalues([np.nan], [1.0])


def test_benjamini_hochberg_hand_computed():
    # sorted: 0.01 (k=1), 0.03, 0.04, 0.2 against q k / m = 0.0125, 0.025, 0.0375, 0.05:
    # only k = 1 passes. Adjusted: p m / k = 0.04, 0.06, 0.0533, 0.2, then running minimum
    # from the largest: 0.04, 0.0533, 0.0533, 0.2.
    rej, adj = benjamini_hochberg([0.01, 0.04, 0.03, 0.2], 0.05)
    assert rej.tolist() == [True, False, False, False]
    np.testing.assert_allclose(adj, [0.04, 0.16 / 3, 0.16 / 3, 0.2])


def test_benjamini_hochberg_steps_up():
    # Each p = 0.045 fails q k / m for k < 4, but p_(4) <= q: the step-up rule rejects all 4.
    rej, adj = benjamini_hochberg([0.045] * 4, 0.05)
    assert rej.all()
    np.testing.assert_allclose(adj, [0.045] * 4)
    rej, _ = benjamini_hochberg([0.2, 0.3], 0.05)
    assert not rej.any()
    with pytest.raises(MiaError, match=r"FDR level must lie in \(0, 1\)"):
        benjamini_hochberg([0.1], 0.0)


def test_benjamini_hochberg_is_exact_at_the_boundary():
    # 19 unseen files, 3 suspected at p = 1/20: p_(3) = q 3 / 3 exactly; in floats
    # 0.05 * 3 / 3 = 0.05000000000000001 > 0.05 and none was flagged.
    rej, adj = benjamini_hochberg([Fraction(1, 20)] * 3, 0.05)
    assert rej.all()
    np.testing.assert_allclose(adj, [0.05] * 3)
    # every such case for n in 19..99 unseen and m <= 29 suspected at the smallest p-value
    for n in range(19, 100):
        for m in range(1, 30):
            k = math.ceil(Fraction(m, n + 1) / Fraction(1, 20))  # BH needs k >= m (n+1)^-1 / q
            if k <= m:
                assert benjamini_hochberg([Fraction(1, n + 1)] * m, 0.05)[0].all()
            else:
                assert not benjamini_hochberg([Fraction(1, n + 1)] * m, 0.05)[0].any()


def test_benjamini_yekutieli_divides_the_level_by_the_harmonic_sum():
    # m = 3: 1 + 1/2 + 1/3 = 11/6, so p_(1) must be <= 0.05 / (11/6) / 3 = 0.00909...
    p = [Fraction(9, 1000), Fraction(1, 5), Fraction(1, 2)]
    assert benjamini_hochberg(p, 0.05, "by")[0].tolist() == [True, False, False]
    assert not benjamini_hochberg([Fraction(1, 100)] + p[1:], 0.05, "by")[0].any()
    _, adj = benjamini_hochberg(p, 0.05, "by")
    assert adj[0] == pytest.approx(0.009 * 3 * 11 / 6)
    with pytest.raises(MiaError, match="unknown FDR method 'holm'"):
        benjamini_hochberg(p, 0.05, "holm")


def test_welch_greater_matches_scipy_one_sided():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.5, 1, 12), rng.normal(0, 2, 20)
    got = welch_greater(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
    assert got["statistic"] == pytest.approx(ref.statistic)
    assert got["p_value"] == pytest.approx(ref.pvalue)
    assert welch_greater(b, a)["p_value"] == pytest.approx(1 - ref.pvalue)


def test_cohens_d_hand_computed():
    # means 2 and 1, both variances 1: d = 1
    assert cohens_d([1, 2, 3], [0, 1, 2]) == pytest.approx(1.0)
    assert cohens_d([1, 1], [1, 1]) == 0.0


def test_two_times_median():
    assert two_times_median([0.01, 0.02, 0.5]) == pytest.approx(0.04)
    assert two_times_median([0.6, 0.7]) == 1.0
    with pytest.raises(MiaError, match=r"lie in \[0, 1\]"):
        two_times_median([1.5])


@pytest.mark.parametrize(("q", "n"), [(0.05, 19), (0.1, 9), (0.2, 4), (0.01, 99)])
def test_min_calibration_files(q, n):
    assert min_calibration_files(q) == n
    assert 1 / (n + 1) <= q < 1 / n


def test_welch_needs_two_values_each():
    with pytest.raises(MiaError, match="at least 2 values, got 1"):
        welch_greater([1.0], [1.0, 2.0])
