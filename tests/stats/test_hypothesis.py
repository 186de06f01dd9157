"""Dataset-level tests on LCSS values: hand-computed paired t, paired TOST, the member vs
nonmember gap test, and the paper's (unpaired, Welch) rule."""

import math

import numpy as np
import pytest
from scipy import stats

from mia_ray.errors import MiaError
from mia_ray.stats.hypothesis import gap_greater, paired_greater, paired_tost, paper_ttest

A = [0.9, 0.8, 1.0, 0.7]  # mean 0.85, var 1/60
R = [0.5, 0.6, 0.4, 0.6]  # d = A - R = [0.4, 0.2, 0.6, 0.1]: mean 0.325, sum of squares 0.1475
B = [0.1, 0.3, 0.2]  # mean 0.2, var 0.01


def test_paired_t_and_df_by_hand():
    t = 0.325 / math.sqrt(0.1475 / 3 / 4)
    res = paired_greater(A, R)
    assert res["statistic"] == pytest.approx(t, rel=1e-12)
    assert res["df"] == 3
    assert res["p_value"] == pytest.approx(stats.t.sf(t, 3), rel=1e-12)
    assert res["mean_diff"] == pytest.approx(0.325) and res["n_pairs"] == 4
    assert res["reject_h0"] and res["verdict"] == "recovers more than the reference"
    assert res["h0"].startswith("E[suspect LCSS - reference LCSS] <= 0 on the same pairs")
    # Same numbers as scipy's own paired test.
    ref = stats.ttest_rel(A, R, alternative="greater")
    assert res["statistic"] == pytest.approx(ref.statistic, rel=1e-12)
    assert res["p_value"] == pytest.approx(ref.pvalue, rel=1e-12)


def test_paired_test_sees_a_steady_gain_that_welch_drowns_in_pair_to_pair_spread():
    # Pairs differ a lot in how recoverable they are; the suspect is always ~0.05 above.
    r = np.array([0.1, 0.9, 0.3, 0.7, 0.5])
    s = r + np.array([0.05, 0.06, 0.04, 0.05, 0.05])
    welch = stats.ttest_ind(s, r, equal_var=False, alternative="greater").pvalue
    res = paired_greater(s, r)
    assert welch > 0.4 and res["p_value"] < 1e-4 and res["reject_h0"]
    below = paired_greater(r, s)
    assert below["p_value"] > 0.99 and below["verdict"] == "no evidence of memorization"


def test_paired_tost_by_hand():
    s = np.array([0.80, 0.82, 0.79, 0.85, 0.81, 0.78])
    p = np.array([0.81, 0.80, 0.80, 0.84, 0.83, 0.79])
    d = s - p
    se = d.std(ddof=1) / math.sqrt(6)
    want = max(stats.t.sf((d.mean() + 0.05) / se, 5), stats.t.cdf((d.mean() - 0.05) / se, 5))
    res = paired_tost(s, p, margin=0.05)
    assert res["p_value"] == pytest.approx(want, rel=1e-12) and res["df"] == 5
    # The two one-sided paired tests are scipy's, shifted by the margin.
    lo = stats.ttest_rel(s + 0.05, p, alternative="greater").pvalue
    hi = stats.ttest_rel(s - 0.05, p, alternative="less").pvalue
    assert res["p_value"] == pytest.approx(max(lo, hi), rel=1e-9)
    assert res["reject_h0"] and res["verdict"] == "equivalent to the proxy"
    assert res["h0"] == "|E[suspect LCSS - proxy LCSS]| >= 0.05 on the same pairs"


def test_paired_tost_does_not_call_different_means_equivalent():
    rng = np.random.default_rng(2)
    res = paired_tost(rng.normal(0.2, 0.05, 100), rng.normal(0.8, 0.05, 100), margin=0.05)
    assert res["p_value"] > 0.99 and not res["reject_h0"]
    # Few, noisy values: equivalence is not shown either, whatever the means.
    assert not paired_tost([0.5, 0.9], [0.6, 0.8], margin=0.05)["reject_h0"]


def test_gap_test_by_hand():
    dm = np.array(A) - np.array(R)  # mean 0.325, var 0.1475 / 3
    sn, rn = np.array([0.3, 0.2, 0.4]), np.array([0.2, 0.2, 0.2])  # d_n mean 0.1, var 0.01
    vm, vn = 0.1475 / 3 / 4, 0.01 / 3
    t = (0.325 - 0.1) / math.sqrt(vm + vn)
    df = (vm + vn) ** 2 / (vm**2 / 3 + vn**2 / 2)
    res = gap_greater(A, R, sn, rn)
    assert res["statistic"] == pytest.approx(t, rel=1e-12)
    assert res["df"] == pytest.approx(df, rel=1e-12)
    assert res["p_value"] == pytest.approx(stats.t.sf(t, df), rel=1e-12)
    ref = stats.ttest_ind(dm, sn - rn, equal_var=False, alternative="greater")
    assert res["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert res["mean_gap_member"] == pytest.approx(0.325)
    assert res["mean_gap_nonmember"] == pytest.approx(0.1)
    assert (res["n_pairs"], res["n_nonmember_pairs"]) == (4, 3)


def test_a_model_that_only_follows_prompts_better_is_not_flagged_by_the_gap_test():
    # The suspect beats the reference by ~0.2 everywhere, on the dataset and outside it.
    rng = np.random.default_rng(3)
    rm, rn = rng.uniform(0.1, 0.5, 40), rng.uniform(0.1, 0.5, 40)
    sm, sn = rm + 0.2 + rng.normal(0, 0.02, 40), rn + 0.2 + rng.normal(0, 0.02, 40)
    assert paired_greater(sm, rm)["reject_h0"]  # more than the reference, yes...
    res = gap_greater(sm, rm, sn, rn)
    assert not res["reject_h0"] and res["verdict"] == "no evidence of memorization"
    assert "nonmember" in res["h0"]
    # ...while a suspect whose gain is larger on the dataset is flagged.
    assert gap_greater(sm + 0.1, rm, sn, rn)["reject_h0"]


def test_paper_rule_is_welch_and_reads_a_large_p_as_memorized():
    rng = np.random.default_rng(0)
    same = rng.normal(0.8, 0.1, 50)
    res = paper_ttest(same + 0.001, same)
    assert res["p_value"] > 0.9 and res["verdict"].startswith("memorized (paper's rule")
    far = paper_ttest(B, A)
    assert far["p_value"] < 0.05 and far["verdict"].startswith("not memorized")
    va, vb = (1 / 60) / 4, 0.01 / 3
    t = (0.2 - 0.85) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 2)
    assert far["statistic"] == pytest.approx(t, rel=1e-12)
    assert far["df"] == pytest.approx(df, rel=1e-12)
    assert far["p_value"] == pytest.approx(stats.ttest_ind(B, A, equal_var=False).pvalue)


def test_errors_name_the_problem():
    with pytest.raises(MiaError, match="at least 2 values, got 1"):
        paired_greater([0.5], A)
    with pytest.raises(MiaError, match="one value of each per pair, got 4 and 3"):
        paired_greater(A, B)
    with pytest.raises(MiaError, match="differences have no variance at all"):
        paired_greater([0.5, 0.7], [0.4, 0.6])
    with pytest.raises(MiaError, match="margin must be positive, not 0"):
        paired_tost(A, R, margin=0)
    with pytest.raises(MiaError, match="values must be finite"):
        paper_ttest([0.1, float("nan")], A)
