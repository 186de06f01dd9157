import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score, roc_curve

from mia_ray.errors import MiaError
from mia_ray.stats import metrics as M

# Members score 10, 8, 7, 5, 1; non-members 9, 6, 4, 3, 2, 0, -1, -2, -3, -4.
# Walking down the scores, (false positives, true positives) goes
# (0,0) (0,1) (1,1) (1,2) (1,3) (2,3) (2,4) (3,4) (4,4) (5,4) (5,5) ... (10,5).
HAND_S = np.array([10, 8, 7, 5, 1, 9, 6, 4, 3, 2, 0, -1, -2, -3, -4], dtype=float)
HAND_Y = np.array([1] * 5 + [0] * 10)


def test_auc_hand_cases():
    assert M.roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert M.roc_auc([1, 1, 1, 1], [0, 1, 0, 1]) == 0.5  # all tied
    # members {2, 1}, non-members {1, 0}: pairs 1 + 1 + 0.5 (tie) + 1 of 4
    assert M.roc_auc([2, 1, 1, 0], [1, 1, 0, 0]) == 0.875
    assert M.roc_auc(HAND_S, HAND_Y) == pytest.approx(1 - (0 + 1 + 1 + 2 + 5) / 50)


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(1)
    s = rng.integers(0, 6, 300).astype(float)
    y = rng.integers(0, 2, 300)
    assert M.roc_auc(s, y) == pytest.approx(roc_auc_score(y, s))
    fpr, tpr = M.roc_points(s, y)
    ref_fpr, ref_tpr, _ = roc_curve(y, s, drop_intermediate=False)
    np.testing.assert_allclose(fpr, ref_fpr)
    np.testing.assert_allclose(tpr, ref_tpr)


def test_auc_tied_infinities_stay_tied():
    assert M.roc_auc([-np.inf, -np.inf, 0.0], [1, 0, 1]) == 0.75


def test_roc_points_hand_case():
    fpr, tpr = M.roc_points([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    np.testing.assert_array_equal(fpr, [0, 0, 0.5, 0.5, 1])
    np.testing.assert_array_equal(tpr, [0, 0.5, 0.5, 1, 1])


def test_tpr_at_fpr_hand_case():
    assert M.tpr_at_fpr(HAND_S, HAND_Y, 0.0) == 0.2
    assert M.tpr_at_fpr(HAND_S, HAND_Y, 0.05) == 0.2
    assert M.tpr_at_fpr(HAND_S, HAND_Y, 0.1) == 0.6  # 1 FP of 10 is allowed at exactly 10 %
    assert M.tpr_at_fpr(HAND_S, HAND_Y, 0.15) == 0.6
    assert M.tpr_at_fpr(HAND_S, HAND_Y, 0.2) == 0.8
    assert M.tpr_at_fpr(HAND_S, HAND_Y, 0.5) == 1.0


def test_tpr_at_fpr_without_interpolation():
    assert M.tpr_at_fpr([3, 2, 1], [0, 1, 1], 0.05) == 0.0  # only "reject all" has FPR 0
    # A member tied with a non-member at the top: the tie jumps to FPR 0.5 in one step.
    assert M.tpr_at_fpr([5, 5, 1], [1, 0, 0], 0.1) == 0.0
    assert M.tpr_at_fpr([5, 5, 1], [1, 0, 0], 0.5) == 1.0


def test_single_class_and_nan_are_errors():
    with pytest.raises(ValueError, match="need both members and non-members"):
        M.roc_auc([0.1, 0.2], [1, 1])
    with pytest.raises(MiaError, match="need both members and non-members"):
        M.tpr_at_fpr([0.1, 0.2], [0, 0], 0.01)
    with pytest.raises(MiaError, match="2 of 4 scores are NaN"):
        M.evaluate_scores([np.nan, 1, np.nan, 2], [0, 1, 0, 1])
    with pytest.raises(MiaError, match="labels must be 1"):
        M.roc_auc([1, 2, 3], [0, 1, 2])
    with pytest.raises(MiaError, match="3 scores but 2 labels"):
        M.roc_auc([1, 2, 3], [0, 1])


def test_bootstrap_ci_contains_estimate_and_is_seeded():
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(60), np.zeros(60)]
    s = rng.normal(size=120) + y
    auc = M.roc_auc(s, y)
    lo, hi = M.bootstrap_ci(M.roc_auc, s, y, n=300, seed=3)
    assert lo < auc < hi and hi - lo < 0.4
    assert (lo, hi) == M.bootstrap_ci(M.roc_auc, s, y, n=300, seed=3)
    assert (lo, hi) != M.bootstrap_ci(M.roc_auc, s, y, n=300, seed=4)


def test_bootstrap_resamples_each_class_at_its_size():
    seen = []

    def counts(s, y):
        seen.append((int(y.sum()), int((y == 0).sum())))
        return 0.0

    M.bootstrap_ci(counts, np.arange(7.0), [1, 1, 0, 0, 0, 0, 0], n=50)
    assert set(seen) == {(2, 5)}


def test_bootstrap_vector_metric():
    s, y = HAND_S, HAND_Y
    lo, hi = M.bootstrap_ci(lambda a, b: [M.roc_auc(a, b), 1.0], s, y, n=100)
    assert lo.shape == (2,) and lo[1] == hi[1] == 1.0
    assert (lo[0], hi[0]) == M.bootstrap_ci(M.roc_auc, s, y, n=100)


def test_cv_threshold_never_uses_own_label():
    # Two documents, so two folds of one document each. In sample, "member iff score >= 3.5"
    # reaches balanced accuracy 0.75. Out of fold: trained on B (member 4, non-member 2)
    # t = 3 misclassifies both rows of A; trained on A the best is "reject all" (t = inf),
    # which gets B's non-member right only. 1 of 4 correct, TPR 0, TNR 0.5.
    scores = [1.0, 3.0, 4.0, 2.0]
    labels = [1, 0, 1, 0]
    out = M.cv_threshold_accuracy(scores, labels, folds=5, groups=["A", "A", "B", "B"])
    assert out["folds"] == 2
    assert sorted(out["thresholds"]) == [3.0, np.inf]
    assert out["balanced_accuracy"] == 0.25
    assert out["accuracy"] == 0.25
    assert M._best_threshold(np.array(scores), np.array(labels)) == 3.5


def test_cv_threshold_recovers_separable_signal():
    y = np.r_[np.ones(20), np.zeros(20)].astype(int)
    s = y + np.linspace(0, 0.5, 40)
    out = M.cv_threshold_accuracy(s, y, folds=5)
    assert out["balanced_accuracy"] == 1.0 and out["folds"] == 5
    assert all(0.5 < t < 1.0 for t in out["thresholds"])


def test_cv_threshold_is_honest_on_noise():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    s = rng.normal(size=400)
    t = M._best_threshold(s, y)
    in_sample = ((s[y == 1] >= t).mean() + (s[y == 0] < t).mean()) / 2
    cv = M.cv_threshold_accuracy(s, y, seed=0)["balanced_accuracy"]
    assert in_sample > cv and abs(cv - 0.5) < 0.06


def test_cv_folds_shrink_then_fail():
    y = [1, 1, 1] + [0] * 10
    assert M.cv_threshold_accuracy(np.arange(13.0), y, folds=5)["folds"] == 3
    with pytest.raises(MiaError, match="cannot cross-validate"):
        M.cv_threshold_accuracy(np.arange(5.0), [1, 0, 0, 0, 0])
    with pytest.raises(MiaError, match="members span 1 and non-members 2 groups"):
        M.cv_splits([1, 1, 0, 0], groups=["a", "a", "b", "c"])


def test_cv_groups_never_straddle():
    g = np.repeat(np.arange(12), 5)
    y = (g % 2).astype(int)
    for train, test in M.cv_splits(y, folds=4, seed=1, groups=g):
        assert not set(g[train]) & set(g[test])


def test_evaluate_scores_report():
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(1000), np.zeros(1000)].astype(int)
    s = rng.normal(size=2000) + 1.5 * y
    r = M.evaluate_scores(s, y, bootstrap=200)
    assert set(r) == {
        "auc",
        "auc_ci",
        "tpr_at_fpr",
        "tpr_at_fpr_ci",
        "balanced_accuracy",
        "accuracy",
        "n_members",
        "n_nonmembers",
        "roc",
    }
    assert list(r["tpr_at_fpr"]) == ["0.001", "0.01", "0.05"]
    assert r["auc"] == pytest.approx(roc_auc_score(y, s))
    assert r["auc_ci"][0] < r["auc"] < r["auc_ci"][1]
    for key, v in r["tpr_at_fpr"].items():
        assert v == M.tpr_at_fpr(s, y, float(key))
        lo, hi = r["tpr_at_fpr_ci"][key]
        assert lo <= v <= hi
    assert 0.7 < r["balanced_accuracy"] < 0.85
    assert r["n_members"] == r["n_nonmembers"] == 1000
    assert len(r["roc"]["fpr"]) <= 200 and r["roc"]["fpr"][0] == 0 and r["roc"]["tpr"][-1] == 1
    json.dumps(r, allow_nan=False)


def test_evaluate_scores_perfect_and_without_bootstrap():
    r = M.evaluate_scores([10, 11, 12, 0, 1, 2], [1, 1, 1, 0, 0, 0], bootstrap=50, fprs=[0.0])
    assert r["auc"] == 1.0 and r["auc_ci"] == [1.0, 1.0]
    assert r["tpr_at_fpr"] == {"0": 1.0} and r["balanced_accuracy"] == 1.0
    r = M.evaluate_scores([10, 11, 12, 0, 1, 2], [1, 1, 1, 0, 0, 0], bootstrap=0)
    assert r["auc_ci"] is None and r["tpr_at_fpr_ci"]["0.01"] is None


def test_wilson_interval_matches_the_formula_and_its_edges():
    from mia_ray.stats.metrics import wilson_interval

    # 5/10 at 95 %: centre 0.5, half-width 1.95996/(1+0.38415) * sqrt(0.025 + 0.0096036).
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.236593, abs=1e-6) and hi == pytest.approx(0.763407, abs=1e-6)
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.161125, abs=1e-6)  # z²/(n+z²)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    # Exact ends where the rate sits on them (floats gave 3.5e-18 at 0/100, 1 - 1e-16 at 10/10).
    assert wilson_interval(0, 100)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    with pytest.raises(MiaError, match="0 <= k <= n"):
        wilson_interval(3, 2)


def test_cluster_bootstrap_resamples_documents_not_snippets():
    """Each document repeated as 5 identical snippets carries no more information than the
    document once: the cluster bootstrap over documents gives exactly the interval of the
    deduplicated data (same seed, same draws); the row bootstrap is narrower."""
    rng = np.random.default_rng(3)
    y_doc = np.array([1] * 12 + [0] * 12)
    s_doc = rng.normal(size=24) + 0.8 * y_doc
    docs = np.arange(24)
    s, y, g = np.repeat(s_doc, 5), np.repeat(y_doc, 5), np.repeat(docs, 5)
    once = M.bootstrap_ci(M.roc_auc, s_doc, y_doc, n=300, seed=1)
    clustered = M.bootstrap_ci(M.roc_auc, s, y, n=300, seed=1, groups=g)
    rows = M.bootstrap_ci(M.roc_auc, s, y, n=300, seed=1)
    assert clustered == pytest.approx(once, abs=1e-12)
    assert rows[1] - rows[0] < 0.75 * (clustered[1] - clustered[0])
    # Singleton groups are the row bootstrap itself.
    assert M.bootstrap_ci(M.roc_auc, s_doc, y_doc, n=300, seed=1, groups=docs) == once
    ev = M.evaluate_scores(s, y, groups=g, bootstrap=300, seed=1)
    assert ev["auc_ci"] == pytest.approx(list(once), abs=1e-12)


def test_cluster_bootstrap_refuses_a_group_with_both_labels():
    with pytest.raises(ValueError, match="group 'd1' holds both members and non-members"):
        M.bootstrap_ci(
            M.roc_auc, [0.1, 0.2, 0.3, 0.4], [1, 0, 1, 0], groups=["d1", "d1", "d2", "d3"]
        )
