"""The marks' exact rank test: the p-value formula, and its level under H0 by simulation."""

from fractions import Fraction

import numpy as np

from mia_ray.stats.ranks import combined_pvalue, fisher_statistic, floor_marks, rank_pvalue


def test_rank_pvalue_counts_ties_against_the_mark():
    assert rank_pvalue(3.0, np.array([1.0, 2.0, 3.0, 4.0])) == 3 / 5
    assert rank_pvalue(9.0, np.array([1.0, 2.0])) == 1 / 3
    assert rank_pvalue(0.0, np.zeros(9)) == 1.0


def test_fisher_and_its_monte_carlo_null():
    assert fisher_statistic(np.array([0.5, 0.25])) == -2 * (np.log(0.5) + np.log(0.25))
    # One mark at the smallest p of K = 10: P(rank 1) = 1/10 under H0.
    stat, p = combined_pvalue(np.array([0.1]), 10, draws=19_999, seed=0)
    assert abs(p - 0.1) < 0.01
    # Every mark at the top of 1,000 candidates: beyond any of 9,999 draws.
    assert combined_pvalue(np.full(20, 0.001), 1000)[1] == 1 / 10_000


def test_under_h0_each_mark_and_the_combination_hold_their_level():
    """Scores i.i.d., the published candidate a uniform draw: P(p <= 0.05) <= 0.05 per mark
    and for the combined test (2,000 worlds, 8 marks of K = 40: 3-sigma bounds)."""
    rng = np.random.default_rng(3)
    per_mark, combined = [], []
    for _ in range(2000):
        ps = []
        for _ in range(8):
            s = rng.normal(size=40)
            chosen = rng.integers(40)
            ps.append(rank_pvalue(s[chosen], np.delete(s, chosen)))
        per_mark.extend(ps)
        combined.append(
            combined_pvalue(np.array(ps), 40, draws=199, seed=int(rng.integers(1 << 30)))[1]
        )
    per_mark, combined = np.array(per_mark), np.array(combined)
    # p = 2/40 is the largest attainable p <= 0.05: P = 2/40 exactly under H0.
    assert abs((per_mark <= 0.05).mean() - 0.05) < 3 * np.sqrt(0.05 * 0.95 / per_mark.size)
    assert (combined <= 0.05).mean() <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / combined.size)
    # And a shifted published candidate is found (power, not level).
    s = rng.normal(size=(8, 40))
    s[:, 0] += 3
    ps = np.array([rank_pvalue(r[0], r[1:]) for r in s])
    assert combined_pvalue(ps, 40, draws=999)[1] < 0.01


def test_the_floor_of_per_file_verdicts_is_how_many_marks_must_rank_first_together():
    # 160 marks of K = 1,000 at 5 % FDR: 1/K <= 0.05 k / 160 from k = 3.2, so 4 marks.
    assert floor_marks(160, 1000, 0.05) == 4
    # K >= n / fdr lets one mark be flagged alone; exactly at the bound too.
    assert floor_marks(50, 1000, 0.05) == 1 and floor_marks(100, 2000, 0.05) == 1
    assert floor_marks(101, 2000, 0.05) == 2
    # Checked against Benjamini-Hochberg itself: k marks at 1/K, the rest at 1.
    from mia_ray.stats.audit import benjamini_hochberg

    for n, k_cand in ((160, 1000), (12, 20), (500, 100)):
        need = floor_marks(n, k_cand, 0.05)
        for k in (need - 1, need):
            flagged, _ = benjamini_hochberg([Fraction(1, k_cand)] * k + [1] * (n - k), 0.05)
            assert sum(flagged) == (k if k == need else 0), (n, k_cand, k)
