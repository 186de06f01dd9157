"""Dataset-level tests on LCSS values: hand-computed Welch t, the paper's rule, TOST."""

import math

import numpy as np
import pytest
from scipy import stats

from mia_ray.errors import MiaError
from mia_ray.stats.hypothesis import paper_ttest, tost, welch_greater

A = [0.9, 0.8, 1.0, 0.7]  # mean 0.85, var 1/60
B = [0.1, 0.3, 0.2]  # mean 0.2, var 0.01


def test_welch_t_and_df_by_hand():
    va, vb = (1 / 60) / 4, 0.01 / 3
    t = (0.85 - 0.2) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 2)
    res = welch_greater(A, B)
    assert res["statistic"] == pytest.approx(t, rel=1e-12)
    assert res["df"] == pytest.approx(df, rel=1e-12)
    assert res["p_value"] == pytest.approx(stats.t.sf(t, df), rel=1e-12)
    assert res["reject_h0"] and res["verdict"] == "memorized"
    # Same numbers as scipy's own Welch test.
    ref = stats.ttest_ind(A, B, equal_var=False, alternative="greater")
    assert res["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)


def test_welch_does_not_flag_a_suspect_below_the_reference():
    res = welch_greater(B, A)
    assert res["p_value"] > 0.99 and not res["reject_h0"]
    assert res["verdict"] == "no evidence of memorization"
    assert res["h0"].startswith("E[suspect LCSS] <= E[reference LCSS]")


def test_paper_rule_reads_a_large_p_as_memorized():
    rng = np.random.default_rng(0)
    same = rng.normal(0.8, 0.1, 50)
    res = paper_ttest(same + 0.001, same)
    assert res["p_value"] > 0.9 and res["verdict"].startswith("memorized (paper's rule")
    far = paper_ttest(B, A)
    assert far["p_value"] < 0.05 and far["verdict"].startswith("not memorized")
    # Two-sided p of the same t as the one-sided test.
    assert far["p_value"] == pytest.approx(2 * welch_greater(A, B)["p_value"], rel=1e-9)


def test_tost_p_value_by_hand():
    rng = np.random.default_rng(1)
    s, p = rng.normal(0.80, 0.05, 200), rng.normal(0.81, 0.05, 200)
    res = tost(s, p, margin=0.05)
    va, vb = s.var(ddof=1) / 200, p.var(ddof=1) / 200
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / 199 + vb**2 / 199)
    d = s.mean() - p.mean()
    want = max(stats.t.sf((d + 0.05) / se, df), stats.t.cdf((d - 0.05) / se, df))
    assert res["p_value"] == pytest.approx(want, rel=1e-12)
    assert res["reject_h0"] and res["verdict"] == "equivalent to the proxy"


def test_tost_does_not_call_different_means_equivalent():
    rng = np.random.default_rng(2)
    res = tost(rng.normal(0.2, 0.05, 100), rng.normal(0.8, 0.05, 100), margin=0.05)
    assert res["p_value"] > 0.99 and not res["reject_h0"]
    # Few, noisy values: equivalence is not shown either, whatever the means.
    small = tost([0.5, 0.9], [0.6, 0.8], margin=0.05)
    assert not small["reject_h0"]


def test_errors_name_the_problem():
    with pytest.raises(MiaError, match="at least 2 values, got 1"):
        welch_greater([0.5], A)
    with pytest.raises(MiaError, match="no variance at all"):
        welch_greater([0.5, 0.5], [0.5, 0.5])
    with pytest.raises(MiaError, match="margin must be positive, not 0"):
        tost(A, B, margin=0)
    with pytest.raises(MiaError, match="values must be finite"):
        paper_ttest([0.1, float("nan")], A)
