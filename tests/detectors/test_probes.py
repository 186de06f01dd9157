import json

import numpy as np
import pytest

from mia_ray.detectors.probes import (
    LogisticProbe,
    MLPProbe,
    adam_step,
    grouped_holdout_splits,
    loss_and_grads,
    probe_layer,
    summarize_layer,
    validation_split,
)
from mia_ray.errors import MiaError
from mia_ray.stats.metrics import roc_auc


def planted(seed, shift, n_groups=100, per=4, d=32):
    """Rows (n_groups * per, d), labels and groups; members shifted by ``shift`` along a
    random unit direction. Labels are per group (document), as in real audits."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_groups), per)
    doc_label = rng.permutation([1] * (n_groups // 2) + [0] * (n_groups - n_groups // 2))
    y = doc_label[groups]
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    X = rng.standard_normal((groups.size, d)) + shift * y[:, None] * u
    return X, y, groups


def uneven_groups(seed, n_groups=60):
    """Labels and groups with 1 to 6 rows per group, so the test share is not exact."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 7, n_groups)
    groups = np.repeat(np.arange(n_groups), sizes)
    y = np.repeat(rng.permutation([1, 0] * (n_groups // 2)), sizes)
    return y, groups


# --- splits ---------------------------------------------------------------------------


def test_holdout_splits_are_grouped_stratified_and_about_80_20():
    y, g = uneven_groups(0)
    splits = grouped_holdout_splits(y, g, n_repeats=3, seed=5)
    assert len(splits) == 3
    for train, test in splits:
        assert np.array_equal(train, np.sort(train)) and np.array_equal(test, np.sort(test))
        assert np.array_equal(np.sort(np.r_[train, test]), np.arange(y.size))
        assert not set(g[train]) & set(g[test])
        assert abs(test.size / y.size - 0.2) < 0.2 * 0.2
        assert set(y[train]) == set(y[test]) == {0, 1}
    tests = [tuple(t) for _, t in splits]
    assert len(set(tests)) == 3


def test_holdout_splits_are_seeded():
    y, g = uneven_groups(1)
    a = grouped_holdout_splits(y, g, seed=3)
    b = grouped_holdout_splits(y, g, seed=3)
    c = grouped_holdout_splits(y, g, seed=4)
    for (tr_a, te_a), (tr_b, te_b) in zip(a, b, strict=True):
        assert np.array_equal(tr_a, tr_b) and np.array_equal(te_a, te_b)
    assert any(not np.array_equal(ta, tc) for (_, ta), (_, tc) in zip(a, c, strict=True))


def test_holdout_refuses_too_few_groups():
    # 20 % test needs 5 folds; 2 groups per side per class means 10 groups per class.
    g = np.arange(19)
    y = np.r_[np.ones(9, int), np.zeros(10, int)]
    with pytest.raises(
        MiaError,
        match=r"members span 9 groups and non-members 10; each class needs at least 10 groups",
    ):
        grouped_holdout_splits(y, g)
    grouped_holdout_splits(np.r_[y, 1], np.r_[g, 19])  # one more member group suffices


def test_holdout_refuses_mismatched_shapes_and_bad_settings():
    y, g = uneven_groups(2)
    with pytest.raises(
        MiaError, match=rf"grouped holdout: {g.size - 1} groups but {y.size} labels"
    ):
        grouped_holdout_splits(y, g[:-1])
    with pytest.raises(MiaError, match=r"held-out share must lie in \(0, 0.5\], got 0.7"):
        grouped_holdout_splits(y, g, test_size=0.7)
    with pytest.raises(MiaError, match="n_repeats must be at least 1, got 0"):
        grouped_holdout_splits(y, g, n_repeats=0)


def test_validation_split_is_grouped_and_covers_the_training_part():
    y, g = uneven_groups(3, n_groups=80)
    train, _ = grouped_holdout_splits(y, g, n_repeats=1)[0]
    fit, val = validation_split(y[train], g[train], val_fraction=0.2, seed=1)
    assert np.array_equal(np.sort(np.r_[fit, val]), np.arange(train.size))
    assert not set(fit) & set(val)
    assert not set(g[train][fit]) & set(g[train][val])
    assert set(y[train][fit]) == set(y[train][val]) == {0, 1}
    with pytest.raises(MiaError, match="validation split: members span 4 groups"):
        validation_split([1] * 4 + [0] * 8, np.arange(12))


# --- MLP internals ----------------------------------------------------------------------


def tiny_params(rng, d=3, h=4):
    return {
        "W1": rng.standard_normal((d, h)),
        "b1": rng.standard_normal(h) * 0.1,
        "W2": rng.standard_normal(h),
        "b2": np.array([0.3]),
    }


@pytest.mark.parametrize("dropout", [False, True])
def test_backprop_matches_finite_differences(dropout):
    rng = np.random.default_rng(0)
    params = tiny_params(rng)
    X, y = rng.standard_normal((5, 3)), np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    # A fixed mask makes the dropout net a deterministic function to differentiate.
    mask = (rng.random((5, 4)) >= 0.5) / 0.5 if dropout else None
    _, grads = loss_and_grads(params, X, y, mask)
    eps = 1e-6
    for name, p in params.items():
        numeric = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            up = loss_and_grads(params, X, y, mask)[0]
            p[i] = old - eps
            down = loss_and_grads(params, X, y, mask)[0]
            p[i] = old
            numeric[i] = (up - down) / (2 * eps)
        assert np.abs(numeric).max() > 1e-3  # a real gradient, not all zeros
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-6, atol=1e-9)


def test_bce_is_stable_for_huge_logits():
    params = {"W1": np.eye(1), "b1": np.zeros(1), "W2": np.ones(1), "b2": np.zeros(1)}
    X = np.array([[800.0], [800.0]])
    loss, grads = loss_and_grads(params, X, np.array([1.0, 0.0]))
    assert loss == pytest.approx(400.0)  # (0 + 800) / 2, no overflow
    assert np.isfinite(grads["W1"]).all()


def test_adam_first_steps_match_the_hand_computed_update():
    params = {"w": np.array([1.0, -2.0, 0.5])}
    g1, g2 = np.array([0.5, -4.0, 1e-3]), np.array([1.0, 2.0, -1.0])
    m = {"w": np.zeros(3)}
    v = {"w": np.zeros(3)}
    adam_step(params, {"w": g1}, m, v, t=1, lr=1e-3)
    # Step 1: bias correction makes m_hat = g, v_hat = g^2, so the step is lr * g / (|g| + eps).
    after1 = np.array([1.0, -2.0, 0.5]) - 1e-3 * g1 / (np.abs(g1) + 1e-8)
    np.testing.assert_allclose(params["w"], after1, rtol=1e-14)
    adam_step(params, {"w": g2}, m, v, t=2, lr=1e-3)
    m2 = 0.9 * 0.1 * g1 + 0.1 * g2
    v2 = 0.999 * 0.001 * g1**2 + 0.001 * g2**2
    after2 = after1 - 1e-3 * (m2 / (1 - 0.9**2)) / (np.sqrt(v2 / (1 - 0.999**2)) + 1e-8)
    np.testing.assert_allclose(params["w"], after2, rtol=1e-14)


def bce(p, y):
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def test_early_stopping_keeps_the_best_epoch():
    X, y, g = planted(4, shift=0.5, n_groups=60, d=16)
    train, val = validation_split(y, g, seed=0)
    probe = MLPProbe(hidden=64, patience=3, seed=1)
    probe.fit(X[train], y[train], X[val], y[val])
    losses = probe.val_loss_
    assert probe.best_epoch_ == int(np.argmin(losses)) + 1  # 1-based
    assert len(losses) == len(probe.train_loss_) == probe.epochs_run_
    assert probe.best_epoch_ < probe.epochs_run_ < probe.max_epochs  # it did stop early
    assert probe.epochs_run_ == probe.best_epoch_ + probe.patience
    # The returned weights are the best epoch's, not the last one's.
    assert bce(probe.score_samples(X[val]), y[val]) == pytest.approx(min(losses), rel=1e-12)
    assert losses[-1] > min(losses)


def test_mlp_is_deterministic_and_seeded():
    X, y, g = planted(5, shift=1.0, n_groups=40, d=8)
    train, val = validation_split(y, g, seed=0)

    def scores(seed):
        probe = MLPProbe(hidden=16, max_epochs=5, seed=seed)
        return probe.fit(X[train], y[train], X[val], y[val]).score_samples(X)

    assert np.array_equal(scores(0), scores(0))
    assert not np.array_equal(scores(0), scores(1))


def test_logistic_probe_selects_c_on_validation_only():
    X, y, g = planted(6, shift=1.0, n_groups=40, d=8)
    train, val = validation_split(y, g, seed=0)
    probe = LogisticProbe().fit(X[train], y[train], X[val], y[val])
    assert len(probe.val_loss_) == 4
    assert probe.C_ == (0.01, 0.1, 1.0, 10.0)[int(np.argmin(probe.val_loss_))]
    assert bce(probe.score_samples(X[val]), y[val]) == pytest.approx(min(probe.val_loss_))


def test_probes_refuse_bad_input():
    X, y = np.zeros((4, 2)), np.array([1, 0, 1, 0])
    with pytest.raises(MiaError, match=r"dropout must lie in \[0, 1\), got 1.0"):
        MLPProbe(dropout=1.0).fit(X, y, X, y)
    with pytest.raises(MiaError, match="2 training but 3 validation features"):
        LogisticProbe().fit(X, y, np.zeros((4, 3)), y)
    with pytest.raises(MiaError, match="call fit before score_samples"):
        MLPProbe().score_samples(X)


# --- probe_layer --------------------------------------------------------------------------


def test_probes_recover_a_planted_shift():
    X, y, g = planted(0, shift=3.0)
    result = probe_layer(X, y, g, grouped_holdout_splits(y, g, seed=0))
    json.dumps(result, allow_nan=False)
    summary = summarize_layer(result)
    for kind in ("mlp", "logreg"):
        assert summary[kind]["auc_mean"] > 0.9
        assert summary[kind]["n_repeats"] == 3
        assert len(result[kind]["test_scores"][0]) == len(result[kind]["test_index"][0]) == 80
    assert all(isinstance(e, int) for e in result["mlp"]["epochs"])
    assert result["logreg"]["epochs"] == [None] * 3


def test_probes_invent_no_signal_in_noise():
    X, y, g = planted(1, shift=0.0)
    summary = summarize_layer(probe_layer(X, y, g, grouped_holdout_splits(y, g, seed=0)))
    for kind in ("mlp", "logreg"):
        assert abs(summary[kind]["auc_mean"] - 0.5) < 0.12


@pytest.mark.parametrize("repeat", [0, 1])
def test_test_labels_never_reach_training_or_selection(repeat):
    X, y, g = planted(2, shift=3.0)
    split = grouped_holdout_splits(y, g, seed=0)[repeat]
    test = split[1]
    flipped, shuffled = y.copy(), y.copy()
    flipped[test] = 1 - y[test]
    shuffled[test] = np.random.default_rng(0).permutation(y[test])
    base = probe_layer(X, y, g, [split], seed=repeat)
    flip = probe_layer(X, flipped, g, [split], seed=repeat)
    shuf = probe_layer(X, shuffled, g, [split], seed=repeat)
    for kind in ("mlp", "logreg"):
        # Bit-identical scores and stopping epochs: the test labels reached neither.
        for run in (flip, shuf):
            assert run[kind]["test_scores"] == base[kind]["test_scores"]
            assert run[kind]["epochs"] == base[kind]["epochs"]
        # Same scores, other labels: only the metrics move.
        assert base[kind]["auc"][0] > 0.9
        assert flip[kind]["auc"][0] == pytest.approx(1 - base[kind]["auc"][0], abs=1e-12)
        assert shuf[kind]["auc"][0] == roc_auc(base[kind]["test_scores"][0], shuffled[test])
        assert abs(shuf[kind]["auc"][0] - 0.5) < 0.2
    assert flip["logreg"]["C"] == shuf["logreg"]["C"] == base["logreg"]["C"]


def test_probe_layer_is_deterministic():
    X, y, g = planted(3, shift=1.0, n_groups=60, d=16)
    splits = grouped_holdout_splits(y, g, n_repeats=2, seed=1)
    a = probe_layer(X, y, g, splits, seed=7, mlp_params={"hidden": 32})
    b = probe_layer(X, y, g, splits, seed=7, mlp_params={"hidden": 32})
    c = probe_layer(X, y, g, splits, seed=8, mlp_params={"hidden": 32})
    assert a == b
    assert a["mlp"]["test_scores"] != c["mlp"]["test_scores"]


def test_probe_layer_refuses_leaky_splits_and_unknown_kinds():
    X, y, g = planted(3, shift=1.0, n_groups=60, d=4)
    train, test = grouped_holdout_splits(y, g, n_repeats=1)[0]
    leaky = (train, np.r_[test, train[:1]])
    with pytest.raises(MiaError, match="split 0 has groups on both sides"):
        probe_layer(X, y, g, [leaky])
    with pytest.raises(MiaError, match=r"unknown probe kinds \['svm'\]"):
        probe_layer(X, y, g, [(train, test)], kinds=("svm",))


# --- summarize_layer ----------------------------------------------------------------------


def test_summary_means_and_sample_stds():
    result = {
        "mlp": {
            "auc": [0.6, 0.8, 0.7],
            "tpr_at_fpr": {"0.01": [0.1, 0.3, 0.2]},
            "epochs": [4, 6, 8],
            "val_auc": [0.5, 0.6, 0.85],
        },
        "logreg": {
            "auc": [0.75],
            "tpr_at_fpr": {"0.01": [0.25]},
            "epochs": [None],
            "val_auc": [0.9],
        },
    }
    s = summarize_layer(result)
    assert s["mlp"] == {
        "auc_mean": pytest.approx(0.7),
        "auc_std": pytest.approx(0.1),  # ddof=1: sqrt((0.01 + 0.01) / 2)
        "val_auc_mean": pytest.approx(0.65),
        "tpr_at_1pct_fpr": pytest.approx(0.2),
        "tpr_std": pytest.approx(0.1),
        "n_repeats": 3,
        "epochs_mean": 6.0,
    }
    assert s["logreg"] == {
        "auc_mean": 0.75,
        "auc_std": 0.0,
        "val_auc_mean": 0.9,
        "tpr_at_1pct_fpr": 0.25,
        "tpr_std": 0.0,
        "n_repeats": 1,
        "epochs_mean": None,
    }
    with pytest.raises(MiaError, match="no TPR at FPR 0.05 for mlp"):
        summarize_layer(result, fpr=0.05)
    assert (
        "tpr_at_0.1pct_fpr"
        in summarize_layer(
            {
                "m": {
                    "auc": [0.5],
                    "tpr_at_fpr": {"0.001": [0.0]},
                    "epochs": [None],
                    "val_auc": [0.5],
                }
            },
            fpr=0.001,
        )["m"]
    )
