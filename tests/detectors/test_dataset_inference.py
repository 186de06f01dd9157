"""Cross-fitted dataset inference: no label leaks, valid p-values under the null, power."""

import numpy as np
import pytest
from scipy import stats

from mia_ray.detectors.dataset_inference import (
    LinearFeatureScorer,
    cross_fit,
    dataset_test,
    file_pvalues,
    halves,
    null_check,
)
from mia_ray.errors import MiaError
from mia_ray.stats.audit import benjamini_hochberg


def _world(rng, n_sus, n_uns, shift=0.0, n_members=None, snippets=3, d=4):
    """Files with ``snippets`` rows of ``d`` features each; members' features shift by ``shift``."""
    files = {f"s{i}": 1 for i in range(n_sus)} | {f"u{i}": 0 for i in range(n_uns)}
    members = {f"s{i}" for i in range(n_sus if n_members is None else n_members)}
    units, X = [], []
    for f in files:
        centre = rng.normal(0, 1, d) * 0.5 + (shift if f in members else 0.0)
        for _ in range(snippets):
            units.append(f)
            X.append(centre + rng.normal(0, 1, d))
    return np.array(units), np.array(X), files


def test_halves_are_stratified_and_seeded():
    files = {f"s{i}": 1 for i in range(7)} | {f"u{i}": 0 for i in range(10)}
    h = halves(files, 3)
    assert h == halves(files, 3) and h != halves(files, 4)
    assert sorted(h[f] for f in files if files[f] == 1).count(0) in (3, 4)
    assert [h[f] for f in files if files[f] == 0].count(0) == 5


class _Spy(LinearFeatureScorer):
    seen: list = []

    def fit(self, X, y, groups):
        self.fit_files_ = set(groups)
        return super().fit(X, y, groups)

    def score_samples(self, X):
        _Spy.seen.append((self.fit_files_, X))
        return super().score_samples(X)


def test_cross_fitting_never_scores_a_file_with_a_model_that_saw_it():
    rng = np.random.default_rng(1)
    units, X, files = _world(rng, 10, 12, shift=1.0)
    _Spy.seen = []
    cross_fit(units, X, files, _Spy, seeds=[0, 1])
    assert len(_Spy.seen) == 4
    row_file = {X[i].tobytes(): units[i] for i in range(len(units))}
    for fitted_on, scored in _Spy.seen:
        scored_files = {row_file[x.tobytes()] for x in scored}
        assert fitted_on and scored_files and not fitted_on & scored_files
        assert fitted_on | scored_files == set(files)


def test_a_memorised_file_identity_gives_no_signal_out_of_fold():
    # One-hot file ids let an in-sample model recall every file's label; out of fold the
    # column of a scored file was all zero in training, so it adds nothing.
    rng = np.random.default_rng(2)
    units, X, files = _world(rng, 12, 12, shift=0.0)
    names = sorted(files)
    onehot = np.array([[float(u == f) for f in names] for u in units])
    X = np.hstack([X, onehot * 10])
    in_sample = LinearFeatureScorer(C=100).fit(X, [files[u] for u in units], units)
    from sklearn.metrics import roc_auc_score

    y = [files[u] for u in units]
    assert roc_auc_score(y, in_sample.score_samples(X)) == 1.0
    rounds = cross_fit(units, X, files, lambda: LinearFeatureScorer(C=100), seeds=[0])
    s = rounds[0].score
    assert roc_auc_score([files[f] for f in names], [s[f] for f in names]) < 0.8


def test_planted_signal_is_found_and_members_flagged():
    rng = np.random.default_rng(3)
    units, X, files = _world(rng, 30, 40, shift=1.5, n_members=20)
    rounds = cross_fit(units, X, files, LinearFeatureScorer, seeds=[0, 1, 2])
    t = dataset_test(rounds, files, 0.05)
    assert t["reject"] and t["p_value"] < 0.01 and t["effect_size"] > 0.8
    assert len(t["halves"]) == 6
    pv = file_pvalues(rounds, files, "cross")
    sus = sorted(pv)
    rej, _ = benjamini_hochberg([pv[f][1] for f in sus], 0.1)
    flagged = {f for f, r in zip(sus, rej, strict=True) if r}
    members = {f"s{i}" for i in range(20)}
    assert len(flagged & members) >= 10
    assert len(flagged - members) <= 2
    assert {n for _, _, n in pv.values()} == {40}


def test_split_calibration_uses_the_unseen_files_of_the_same_half():
    rng = np.random.default_rng(4)
    units, X, files = _world(rng, 8, 21, shift=1.0)
    rounds = cross_fit(units, X, files, LinearFeatureScorer, seeds=[0])
    pv = file_pvalues(rounds, files, "split")
    half = rounds[0].half
    n_by_half = {h: sum(1 for f, v in files.items() if v == 0 and half[f] == h) for h in (0, 1)}
    assert sorted(n_by_half.values()) == [10, 11]
    for f, (_, p, n_cal) in pv.items():
        assert n_cal == n_by_half[half[f]]
        assert p >= 1 / (n_cal + 1)
    with pytest.raises(MiaError, match="unknown calibration scheme"):
        file_pvalues(rounds, files, "full")


def test_pvalues_are_valid_under_the_null_simulation():
    """No file trained on: the per-half Welch p-values are uniform, the merged dataset-level
    p-value rejects at most at its level, and the per-file conformal p-values of both
    schemes are (close to) uniform, so BH flags a file in at most ~q of the worlds."""
    rng = np.random.default_rng(5)
    halves_p, merged, conf_cross, conf_split, any_flag = [], [], [], [], 0
    n_sims = 150
    for _ in range(n_sims):
        units, X, files = _world(rng, 12, 20, shift=0.0, snippets=2, d=3)
        rounds = cross_fit(units, X, files, LinearFeatureScorer, seeds=[0, 1])
        t = dataset_test(rounds, files, 0.05)
        halves_p.extend(h["p_value"] for h in t["halves"][::2])  # one half per round-pair
        merged.append(t["p_value"])
        cross = file_pvalues(rounds, files, "cross")
        conf_cross.append(next(iter(cross.values()))[1])  # one file per world: independent
        conf_split.append(next(iter(file_pvalues(rounds, files, "split").values()))[1])
        rej, _ = benjamini_hochberg([p for _, p, _ in cross.values()], 0.1)
        any_flag += bool(rej.any())
    assert stats.kstest(halves_p, "uniform").pvalue > 0.01
    merged = np.array(merged)
    # Monte Carlo slack: 3 standard errors of a rate at the level.
    for level in (0.05, 0.1, 0.2):
        slack = 3 * np.sqrt(level * (1 - level) / n_sims)
        assert (merged <= level).mean() <= level + slack
        for conf in (conf_cross, conf_split):
            assert (np.array(conf) <= level).mean() <= level + slack
    assert stats.kstest(conf_cross, "uniform").pvalue > 0.01
    # Under the global null every flag is false: P(any flag) = FDR <= q.
    assert any_flag / n_sims <= 0.1 + 3 * np.sqrt(0.09 / n_sims)


def test_too_few_files_is_an_error_that_says_the_minimum():
    rng = np.random.default_rng(6)
    units, X, files = _world(rng, 3, 10)
    with pytest.raises(
        MiaError, match=r"suspected has 3 file\(s\): the dataset test needs at least 4"
    ):
        cross_fit(units, X, files, LinearFeatureScorer, seeds=[0])


def test_null_check_is_the_dataset_test_on_seeded_halves_of_the_unseen_files():
    rng = np.random.default_rng(3)
    units, X, files = _world(rng, 6, 16, shift=2.0)  # suspected files play no part
    unseen = sorted(f for f, v in files.items() if v == 0)
    got = null_check(units, X, unseen, LinearFeatureScorer, [4, 5], 7, 0.05)
    h = halves(dict.fromkeys(unseen, 0), 7)
    pseudo = {f: int(h[f] == 0) for f in unseen}
    assert sorted(pseudo.values()) == [0] * 8 + [1] * 8
    want = dataset_test(cross_fit(units, X, pseudo, LinearFeatureScorer, [4, 5]), pseudo, 0.05)
    # The same numbers (summed in another file order: equal to rounding).
    assert got["p_value"] == pytest.approx(want["p_value"], rel=1e-9)
    for a, b in zip(got["halves"], want["halves"], strict=True):
        assert a == pytest.approx(b, rel=1e-9)
    assert (got["n_suspected"], got["n_unseen"], got["reject"]) == (8, 8, want["reject"])
    assert (
        got["p_value"]
        != null_check(units, X, unseen, LinearFeatureScorer, [4, 5], 8, 0.05)["p_value"]
    )


def test_null_check_rejects_at_most_at_its_level_on_one_world():
    """The unseen files are one fixed world; only the split changes: it rejects at most at
    its level (3 standard errors of slack)."""
    units, X, files = _world(np.random.default_rng(9), 2, 40, snippets=2, d=3)
    unseen = sorted(f for f, v in files.items() if v == 0)
    n = 100
    p = np.array(
        [
            null_check(units, X, unseen, LinearFeatureScorer, [k, k + 1], k, 0.05)["p_value"]
            for k in range(n)
        ]
    )
    for level in (0.05, 0.1, 0.2):
        assert (p <= level).mean() <= level + 3 * np.sqrt(level * (1 - level) / n)
