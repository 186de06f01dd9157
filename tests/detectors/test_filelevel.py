import json

import numpy as np
import pytest

from mia_ray.detectors.filelevel import (
    RULE,
    RULE_SINGLE,
    RULE_TIE,
    DBSCANFiles,
    GMMFiles,
    HierarchicalFiles,
    IsolationForestFiles,
    KMeansFiles,
    OneClassSVMFiles,
    confusion,
    detect_files,
    pool_files,
)
from mia_ray.errors import MiaError
from mia_ray.registry import get, names

CLUSTERERS = ["gmm", "kmeans", "hierarchical"]


def world(seed, n_seen=30, n_unseen=20, per_file=8, d=13, n_uncertain=7, shift=1.0):
    """Snippet features (n, d), file ids (n,), snippet unseen scores (n,), truth per sorted file.

    The first ``n_uncertain`` columns are uncertainty metrics, raised by ``shift`` on every
    snippet of an unseen file; the rest are noise. The unseen score is their mean.
    """
    rng = np.random.default_rng(seed)
    n_files = n_seen + n_unseen
    unseen = rng.permutation(np.r_[np.zeros(n_seen), np.ones(n_unseen)]).astype(bool)
    X = rng.normal(size=(n_files * per_file, d))
    file_of = np.repeat(np.arange(n_files), per_file)
    X[:, :n_uncertain] += shift * unseen[file_of, None]
    ids = np.array([f"file{i:03d}" for i in file_of])
    order = rng.permutation(X.shape[0])  # snippets arrive in no particular order
    X, ids, file_of = X[order], ids[order], file_of[order]
    truth = (~unseen).astype(int)  # file{i:03d} sorts in index order
    return X, ids, X[:, :n_uncertain].mean(axis=1), truth


def pooled(seed, **kw):
    X, ids, s, truth = world(seed, **kw)
    files, F = pool_files(X, ids)
    u = np.array([s[ids == f].mean() for f in files])
    return F, u, truth


# --- pool_files --------------------------------------------------------------------------


def test_pool_files_max_pools_the_single_component_per_file():
    # Column 1 is constant, so the one component is the standardised column 0 up to a sign.
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    X = np.c_[x, np.full(6, 7.0)]
    ids = ["b", "a", "b", "c", "a", "c"]
    files, F = pool_files(X, ids, n_components=1)
    assert files == ["a", "b", "c"]
    assert F.shape == (3, 1) and np.isfinite(F).all()
    z = (x - x.mean()) / x.std()
    rows = {"a": [1, 4], "b": [0, 2], "c": [3, 5]}
    plus = [z[rows[f]].max() for f in files]  # PC1 = +z
    minus = [(-z[rows[f]]).max() for f in files]  # PC1 = -z
    assert np.allclose(F[:, 0], plus) or np.allclose(F[:, 0], minus)
    # The two signs pick different snippets, so this pins max-pooling (not a mean or min).
    assert not np.allclose(plus, minus)


def test_pool_files_caps_components_and_rejects_bad_rows():
    rng = np.random.default_rng(0)
    files, F = pool_files(rng.normal(size=(3, 5)), ["x", "y", "y"], n_components=10)
    assert files == ["x", "y"] and F.shape == (2, 3)
    X = rng.normal(size=(6, 4))
    X[1, 2], X[4, 0] = np.nan, np.inf
    with pytest.raises(MiaError, match="2 of 6 snippet feature rows"):
        pool_files(X, list("aabbcc"))
    with pytest.raises(MiaError, match="5 file ids for 6 snippets"):
        pool_files(rng.normal(size=(6, 4)), list("aabbc"))
    with pytest.raises(MiaError, match="constant"):
        pool_files(np.ones((6, 4)), list("aabbcc"))


# --- planted signal, orientation ---------------------------------------------------------


@pytest.mark.parametrize("method", CLUSTERERS)
def test_clusterers_recover_planted_unseen_files(method):
    X, ids, s, truth = world(0)
    r = detect_files(X, ids, s, method=method)
    assert r["file_ids"] == sorted(set(ids))
    c = confusion(r["verdict"], truth)
    assert c["bacc"] >= 0.9, c
    o = r["orientation"]
    assert o["rule"] == RULE
    means = o["group_mean_unseen_score"]
    assert means[o["unseen_group"]] > means[1 - o["unseen_group"]]
    conf = r["confidence"]
    assert conf.shape == truth.shape and ((0 <= conf) & (conf <= 1)).all()
    json.dumps(o, allow_nan=False)


@pytest.mark.parametrize("method", CLUSTERERS)
def test_verdicts_follow_the_unseen_score_not_signs_indices_or_order(method):
    F, u, truth = pooled(1)
    det = get("detector", method)
    v = det().fit(F, u).verdict_
    assert confusion(v, truth)["bacc"] >= 0.9
    # PCA signs are arbitrary: flipping every input leaves the split and its orientation.
    assert np.array_equal(det().fit(-F, u).verdict_, v)
    # The orientation score alone decides which group is seen.
    assert np.array_equal(det().fit(F, -u).verdict_, 1 - v)


@pytest.mark.parametrize("method", [*CLUSTERERS, "isolation_forest", "one_class_svm", "dbscan"])
def test_file_order_changes_nothing(method):
    # Seeded initialisations pick files by position; results are joined on ids, never order.
    F, u, _ = pooled(2)
    det = get("detector", method)
    ref = det().fit(F, u)
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(u.size)
        got = det().fit(F[perm], u[perm])
        assert np.array_equal(got.verdict_, ref.verdict_[perm])
        assert np.allclose(got.confidence_, ref.confidence_[perm])


@pytest.mark.parametrize("method", CLUSTERERS)
def test_negated_snippet_features_still_oriented_by_the_unseen_score(method):
    # Negating X changes the pooled features (max becomes -min), not what the caller's
    # unseen score says; a verdict oriented by cluster index or feature sign would flip.
    X, ids, s, truth = world(3)
    r = detect_files(-X, ids, s, method=method)
    assert confusion(r["verdict"], truth)["bacc"] >= 0.9


def test_gmm_invents_no_signal_on_noise():
    # Verdicts on pure noise are independent of a random truth (30 seen, 20 unseen), so
    # each seed's bacc has mean 0.5 and sd <= sqrt(0.25 * (1/30 + 1/20)) / 2 = 0.072; the
    # mean of 8 seeds has sd <= 0.026, and the band +-0.1 is about 4 sd.
    baccs = []
    for seed in range(8):
        X, ids, s, _ = world(100 + seed, shift=0.0)
        truth = np.random.default_rng(seed).permutation(np.r_[np.ones(30), np.zeros(20)])
        r = detect_files(X, ids, s, method="gmm")
        c = confusion(r["verdict"], truth)
        assert abs(c["acc"] - c["bacc"]) < 0.5  # both defined and finite
        baccs.append(c["bacc"])
    assert 0.4 <= np.mean(baccs) <= 0.6, baccs


def test_detect_files_scores_a_file_by_the_mean_of_its_snippets():
    X, ids, s, _ = world(4)
    r = detect_files(X, ids, s, method="kmeans")
    for f, score in zip(r["file_ids"], r["unseen_score"], strict=True):
        assert score == pytest.approx(s[ids == f].mean())
    assert r["features"].shape == (50, 10)
    with pytest.raises(MiaError, match="unknown detector 'kmean'; did you mean 'kmeans'"):
        detect_files(X, ids, s, method="kmean")
    with pytest.raises(MiaError, match="detector 'dbscan' has no setting epsilon"):
        detect_files(X, ids, s, method="dbscan", epsilon=1.0)
    assert detect_files(X, ids, s, method="dbscan", eps=100.0)["orientation"]["rule"] == RULE_SINGLE
    with pytest.raises(MiaError, match="3 unseen scores for 400 snippets"):
        detect_files(X, ids, s[:3])


def test_every_method_is_registered_and_seeded_where_random():
    assert {"gmm", "hierarchical", "kmeans", "isolation_forest", "one_class_svm", "dbscan"} <= set(
        names("detector")
    )
    X, ids, s, _ = world(5)
    r = detect_files(X, ids, s, method="isolation_forest", seed=7)
    again = detect_files(X, ids, s, method="isolation_forest", seed=7)
    assert np.array_equal(r["confidence"], again["confidence"])


# --- anomaly detectors -------------------------------------------------------------------


def anomaly_files(seed=0, n_seen=40, n_unseen=10, k=10):
    # Seen files sit in one tight cloud; unseen files (high uncertainty) are scattered far.
    rng = np.random.default_rng(seed)
    seen = rng.normal(scale=0.2, size=(n_seen, k))
    unseen = rng.normal(loc=4.0, scale=2.0, size=(n_unseen, k))
    F = np.vstack([seen, unseen])
    u = np.r_[rng.normal(0, 0.1, n_seen), rng.normal(1, 0.1, n_unseen)]
    return F, u, np.r_[np.ones(n_seen), np.zeros(n_unseen)].astype(int)


@pytest.mark.parametrize(
    "det", [IsolationForestFiles(), DBSCANFiles(eps=2.0), OneClassSVMFiles()], ids=repr
)
def test_anomaly_detectors_call_the_anomalous_group_unseen(det):
    F, u, truth = anomaly_files()
    det.fit(F, u)
    assert (det.groups_[truth == 0] == 1).all()  # every scattered file is anomalous
    assert (det.verdict_[truth == 0] == 0).all()
    assert det.orientation_["unseen_group"] == 1
    assert ((0.5 <= det.confidence_) & (det.confidence_ <= 1)).all()
    if not isinstance(det, OneClassSVMFiles):  # nu = 0.5 calls half the normal files anomalous
        assert confusion(det.verdict_, truth)["bacc"] >= 0.9


def test_dbscan_confidence_is_distance_to_the_nearest_core_point():
    F = np.array([[0.0], [0.1], [0.2], [0.3], [0.4], [0.9], [3.0]])
    det = DBSCANFiles(eps=0.5, min_samples=5).fit(F, np.r_[np.zeros(6), 1.0])
    assert det.groups_.tolist() == [0, 0, 0, 0, 0, 0, 1]
    # Cores are 0.0..0.4; 0.9 lies 0.5 from the nearest core, 3.0 lies 2.6 from it.
    assert det.confidence_[:5] == pytest.approx(np.ones(5))
    assert det.confidence_[5] == pytest.approx(1 - 0.5 / (2 * 0.5))
    assert det.confidence_[6] == pytest.approx(1 - 0.5 / (2 * 2.6))
    assert det.verdict_.tolist() == [1, 1, 1, 1, 1, 1, 0]


def test_dbscan_single_group_calls_every_file_unseen():
    F, u, _ = pooled(6)  # 10 pooled dimensions: eps = 0.5 leaves every file as noise
    det = DBSCANFiles().fit(F, u)
    assert det.groups_.tolist() == [1] * u.size
    assert det.verdict_.tolist() == [0] * u.size
    assert det.confidence_.tolist() == [0.5] * u.size
    o = det.orientation_
    assert o["rule"] == RULE_SINGLE and o["unseen_group"] is None
    assert o["group_sizes"] == [0, u.size] and o["group_mean_unseen_score"][0] is None
    json.dumps(o, allow_nan=False)
    # One dense cluster, no noise: one group again.
    tight = np.random.default_rng(0).normal(scale=0.01, size=(20, 3))
    det = DBSCANFiles().fit(tight, np.arange(20.0))
    assert det.orientation_["rule"] == RULE_SINGLE and not det.verdict_.any()


def test_tied_group_means_call_every_file_unseen():
    F = np.r_[np.zeros((5, 2)), np.full((5, 2), 10.0)]
    for det in (KMeansFiles(), HierarchicalFiles(), GMMFiles()):
        det.fit(F, np.full(10, 0.1))
        assert sorted(det.orientation_["group_sizes"]) == [5, 5]
        assert det.orientation_["rule"] == RULE_TIE
        assert not det.verdict_.any() and (det.confidence_ == 0.5).all()


def test_fit_rejects_bad_input():
    with pytest.raises(MiaError, match="at least 2 files"):
        KMeansFiles().fit(np.zeros((1, 3)), [0.0])
    with pytest.raises(MiaError, match="3 unseen scores for 4 files"):
        GMMFiles().fit(np.zeros((4, 3)), [0.0, 1.0, 2.0])
    F = np.ones((4, 3))
    F[2, 1] = np.nan
    with pytest.raises(MiaError, match="1 of 4 file feature rows"):
        GMMFiles().fit(F, np.zeros(4))


# --- confusion ---------------------------------------------------------------------------


def test_confusion_counts_and_accuracies():
    c = confusion([1, 1, 0, 0, 1, 0, 0], [1, 0, 1, 0, 1, 0, 0])
    assert (c["tp"], c["fp"], c["fn"], c["tn"]) == (2, 1, 1, 3)
    assert c["acc"] == pytest.approx(5 / 7)
    assert c["tpr"] == pytest.approx(2 / 3) and c["tnr"] == pytest.approx(3 / 4)
    assert c["bacc"] == pytest.approx(17 / 24)
    assert c["note"] is None


def test_confusion_with_one_class_in_truth_uses_that_rate_and_says_so():
    c = confusion([1, 0, 0, 0], [0, 0, 0, 0])
    assert (c["tp"], c["fp"], c["fn"], c["tn"]) == (0, 1, 0, 3)
    assert c["tpr"] is None and c["bacc"] == c["tnr"] == 0.75
    assert "no seen file" in c["note"]
    c = confusion([1, 0], [1, 1])
    assert c["tnr"] is None and c["bacc"] == 0.5 and "no unseen file" in c["note"]
    json.dumps(c, allow_nan=False)


def test_confusion_rejects_bad_input():
    with pytest.raises(MiaError, match="one length"):
        confusion([1, 0], [1, 0, 1])
    with pytest.raises(MiaError, match="truth must be 1"):
        confusion([1, 0], [2, 0])
    with pytest.raises(MiaError, match="at least one file"):
        confusion([], [])
