import numpy as np
import pytest

from mia_ray.detectors.meeus import MeeusClassifier, meeus_features
from mia_ray.errors import MiaError


def test_histogram_and_statistics_by_hand():
    snippets = [
        np.array([-0.1, -0.6]),  # b
        np.array([-1.5, -1.0]),  # a: 1.0 opens bin 1 (bins are [lo, hi))
        np.array([-0.6, -2.5, -30.0]),  # b: 30 nats lies beyond max_nll, in the last bin
        np.array([-4.0, 0.0]),  # c: max_nll itself closes the last bin
    ]
    files, F = meeus_features(snippets, ["b", "a", "b", "c"], n_bins=4, max_nll=4.0)
    assert files == ["a", "b", "c"]
    assert F.shape == (3, 4 + 13)
    assert F[:, :4].tolist() == [[0, 1, 0, 0], [0.6, 0, 0.2, 0.2], [0.5, 0, 0, 0.5]]
    # b's nll sorted: 0.1, 0.6, 0.6, 2.5, 30.0 (statistics use the unclipped values)
    mean, std, lo, hi = F[1, 4:8]
    assert mean == pytest.approx(33.8 / 5)
    assert std == pytest.approx(np.sqrt(np.mean((np.array([0.1, 0.6, 0.6, 2.5, 30]) - 6.76) ** 2)))
    assert (lo, hi) == (pytest.approx(0.1), pytest.approx(30.0))
    p1, p5, p10, p25, p50, p75, p90, p95, p99 = F[1, 8:]
    assert p1 == pytest.approx(0.1 + 0.04 * 0.5)  # position 0.04 between 0.1 and 0.6
    assert (p25, p50, p75) == (pytest.approx(0.6), pytest.approx(0.6), pytest.approx(2.5))
    assert p90 == pytest.approx(2.5 + 0.6 * 27.5)  # position 3.6 between 2.5 and 30
    assert F[0, 4:8] == pytest.approx([1.25, 0.25, 1.0, 1.5])


def test_fixed_bins_give_a_file_the_same_features_in_any_company():
    rng = np.random.default_rng(0)
    snippets = [-rng.gamma(2.0, 1.0 + i % 3, size=50) for i in range(12)]
    ids = [f"f{i % 4}" for i in range(12)]
    files, F = meeus_features(snippets, ids)
    keep = [i for i in range(12) if ids[i] in ("f1", "f3")]
    sub_files, F_sub = meeus_features([snippets[i] for i in keep], [ids[i] for i in keep])
    assert sub_files == ["f1", "f3"]
    assert np.array_equal(F_sub, F[[1, 3]])
    assert np.allclose(F[:, :100].sum(axis=1), 1.0)


def test_features_reject_bad_log_probabilities():
    with pytest.raises(MiaError, match="2 token log-probabilities are > 0"):
        meeus_features([np.array([-1.0, 0.5]), np.array([2.0])], ["a", "b"])
    with pytest.raises(MiaError, match="1 token log-probabilities are NaN or inf"):
        meeus_features([np.array([-1.0, np.nan])], ["a"])
    with pytest.raises(MiaError, match="1 file ids for 2 snippets"):
        meeus_features([np.array([-1.0]), np.array([-2.0])], ["a"])
    with pytest.raises(MiaError, match="file 'a' has no tokens"):
        meeus_features([np.array([])], ["a"])


def files(rng, n, scale, start):
    """n files of 3 snippets x 200 tokens; nll ~ Gamma(2, scale): a smaller scale = a better fit."""
    snippets, ids = [], []
    for i in range(n):
        for _ in range(3):
            snippets.append(-rng.gamma(2.0, scale, size=200))
            ids.append(f"doc{start + i:04d}")
    return meeus_features(snippets, ids)[1]


def labelled(rng, n_per_class, member_scale, nonmember_scale, start=0):
    F = np.vstack(
        [
            files(rng, n_per_class, member_scale, start),
            files(rng, n_per_class, nonmember_scale, start + n_per_class),
        ]
    )
    return F, np.r_[np.ones(n_per_class), np.zeros(n_per_class)].astype(int)


def test_classifier_separates_members_on_held_out_files():
    rng = np.random.default_rng(0)
    F_train, y_train = labelled(rng, 30, 1.2, 1.5)
    F_test, y_test = labelled(rng, 25, 1.2, 1.5, start=1000)
    clf = MeeusClassifier(n_estimators=200, seed=0).fit(F_train, y_train)
    proba = clf.predict_proba(F_test)
    assert proba.shape == (50, 2) and np.allclose(proba.sum(axis=1), 1)
    assert (clf.predict(F_test) == y_test).mean() >= 0.9


def test_classifier_invents_no_signal():
    # Members and non-members from one distribution: held-out accuracy ~ Binomial(100, 0.5)
    # / 100, sd 0.05; the band 0.5 +- 0.2 is 4 sd.
    rng = np.random.default_rng(1)
    F_train, y_train = labelled(rng, 30, 1.3, 1.3)
    F_test, y_test = labelled(rng, 50, 1.3, 1.3, start=1000)
    clf = MeeusClassifier(n_estimators=200, seed=0).fit(F_train, y_train)
    assert 0.3 <= (clf.predict(F_test) == y_test).mean() <= 0.7


def test_classifier_errors():
    F = np.random.default_rng(0).normal(size=(6, 5))
    with pytest.raises(MiaError, match="0 non-members"):
        MeeusClassifier().fit(F, [1] * 6)
    with pytest.raises(MiaError, match="at least 2 labelled files per class, got 5 members and 1"):
        MeeusClassifier().fit(F, [1, 1, 1, 1, 1, 0])
    with pytest.raises(MiaError, match="labels must be 1"):
        MeeusClassifier().fit(F, [1, 1, 1, 0, 0, 2])
    with pytest.raises(MiaError, match="call fit before"):
        MeeusClassifier().predict(F)
    clf = MeeusClassifier(n_estimators=10).fit(F, [1, 1, 1, 0, 0, 0])
    with pytest.raises(MiaError, match="fitted on 5 features, got 4"):
        clf.predict(F[:, :4])
