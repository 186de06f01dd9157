"""Cross-fitted dataset inference: no label leaks, a monotone statistic, an exact permutation
test, per-source p-values against every unseen source, sources kept together. The levels themselves are
measured over many worlds in tests/stats/test_validity.py."""

from fractions import Fraction

import numpy as np
import pytest
from scipy.optimize import nnls

from mia_ray.detectors.dataset_inference import (
    Design,
    audit,
    cross_fit,
    file_matrix,
    file_pvalues,
    nonneg_quadratic,
    null_side,
    permutation_test,
    pooled_pvalues,
    text_matrix,
)
from mia_ray.errors import MiaError


def _world(rng, n_sus, n_uns, shift=0.0, n_members=None, snippets=3, d=4):
    """Snippet rows of ``d`` features per file; members' features shift by ``shift``."""
    files = [f"s{i}" for i in range(n_sus)] + [f"u{i}" for i in range(n_uns)]
    members = {f"s{i}" for i in range(n_sus if n_members is None else n_members)}
    units, X = [], []
    for f in files:
        centre = rng.normal(0, 1, d) * 0.5 + (shift if f in members else 0.0)
        for _ in range(snippets):
            units.append(f)
            X.append(centre + rng.normal(0, 1, d))
    side = np.array([int(f.startswith("s")) for f in files])
    F = file_matrix(units, np.array(X), files)
    return files, F, side


def _design(F, side, seeds=(0, 1, 2), group=None, nonneg=True):
    group = np.arange(len(side)) if group is None else np.asarray(group)
    g_side = np.zeros(group.max() + 1, dtype=int)
    g_side[group] = side
    return Design(F, group, g_side, list(seeds), nonneg=nonneg)


def test_file_matrix_imputes_averages_and_standardizes():
    X = np.array([[1.0, np.nan], [3.0, 4.0], [5.0, 8.0], [7.0, np.nan]])
    F = file_matrix(["a", "a", "b", "b"], X, ["b", "a"])
    # medians 4 and 6 fill the gaps: a = (2, 5), b = (6, 7); standardized over the two files
    np.testing.assert_allclose(F, [[1.0, 1.0], [-1.0, -1.0]])
    with pytest.raises(MiaError, match=r"1 file\(s\) have no snippet, e.g. c"):
        file_matrix(["a"], X[:1], ["a", "c"])


def test_nonneg_quadratic_matches_scipy_nnls_and_the_kkt_conditions():
    rng = np.random.default_rng(0)
    for d in (1, 3, 8, 14):
        M = rng.normal(size=(40, d, d))
        # highly correlated columns, as Min-K% at five ratios are
        A = M @ M.transpose(0, 2, 1) / d + 0.9 + np.eye(d) * 1e-3
        b = rng.normal(size=(40, d))
        x = nonneg_quadratic(A, b)
        for i in range(40):
            L = np.linalg.cholesky(A[i])
            want = nnls(L.T, np.linalg.solve(L, b[i]))[0]
            np.testing.assert_allclose(x[i], want, atol=1e-9)
            g = A[i] @ x[i] - b[i]
            assert (x[i] >= 0).all() and (g >= -1e-9).all()
            assert np.abs(x[i] * g).max() < 1e-9


def test_a_file_never_reaches_the_fit_that_scores_it():
    rng = np.random.default_rng(1)
    _, F, side = _world(rng, 10, 12, shift=1.0)
    design = _design(F, side, seeds=[0])
    r = cross_fit(design)[0]
    moved = np.flatnonzero(r.half == 0)[0]
    F2 = F.copy()
    F2[moved] += 50.0
    r2 = cross_fit(_design(F2, side, seeds=[0]))[0]
    np.testing.assert_array_equal(r.half, r2.half)
    # coefs[h] is the fit that scores half h: trained on the other half, it cannot change.
    np.testing.assert_allclose(r.coefs[0], r2.coefs[0])
    assert not np.allclose(r.coefs[1], r2.coefs[1])


def test_a_memorised_file_identity_gives_no_signal_out_of_fold():
    # One-hot file ids would let an in-sample fit recall every label; out of fold the column
    # of a scored file is constant over the files it was fitted on, so it adds nothing.
    rng = np.random.default_rng(2)
    _, F, side = _world(rng, 12, 12)
    onehot = (np.eye(len(side)) - 1 / len(side)) * 10
    design = _design(np.hstack([F, onehot]), side, seeds=[0], nonneg=False)
    r = cross_fit(design)[0]
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(side, r.score) < 0.8


def test_halves_are_stratified_seeded_and_keep_sources_together():
    rng = np.random.default_rng(3)
    group = np.repeat(np.arange(14), 3)  # 14 sources of 3 files
    side = (group < 6).astype(int)
    F = rng.normal(size=(42, 3))
    rounds = cross_fit(_design(F, side, seeds=[5, 6], group=group))
    again = cross_fit(_design(F, side, seeds=[5, 6], group=group))
    assert all((a.half == b.half).all() for a, b in zip(rounds, again, strict=True))
    assert not (rounds[0].half == rounds[1].half).all()
    for r in rounds:
        for g in range(14):
            assert len(set(r.half[group == g])) == 1
        assert sorted(np.bincount(r.half[::3][:6])) == [3, 3]
        assert sorted(np.bincount(r.half[::3][6:])) == [4, 4]


def test_planted_signal_is_found_and_members_flagged():
    rng = np.random.default_rng(4)
    _, F, side = _world(rng, 30, 40, shift=1.5, n_members=20)
    got = audit(_design(F, side), 199, 0, 0.05, 0.1)
    t = got["test"]
    assert t["reject"] and t["p_value"] == 1 / 200 and t["statistic"] > 0.7
    assert t["null_mean"] == pytest.approx(0.5, abs=0.02)
    sus = got["suspected"]
    flagged = {int(i) for i, f in zip(sus, got["flagged"], strict=True) if f}
    assert len(flagged & set(range(20))) >= 10
    assert len(flagged - set(range(20))) <= 2


def test_files_less_member_like_than_unseen_cannot_make_it_reject():
    """Harder text: suspected files lower on every feature. The weights are >= 0, so they
    are all 0, every score ties (AUC 1/2); the per-file score ranks them below the unseen
    files, so none comes near a flag."""
    rng = np.random.default_rng(5)
    _, F, side = _world(rng, 30, 40, shift=-1.0)
    design = _design(F, side)
    got = audit(design, 199, 0, 0.05, 0.2)
    assert got["test"]["statistic"] == 0.5 and not got["test"]["reject"]
    assert got["test"]["p_value"] > 0.3
    assert all((c == 0).all() for r in got["rounds"] for c in r.coefs)
    assert min(got["pvalues"][i][0] for i in got["suspected"]) > Fraction(1, 2)
    assert not got["flagged"].any()
    # Free weights turn the same difference into "separation": the blind check's setting.
    free = permutation_test(_design(F, side, nonneg=False), 199, 0, 0.05)
    assert free["reject"] and free["statistic"] > 0.75


def test_the_permutation_p_value_counts_ties_against_and_has_its_floor():
    side = np.array([1] * 6 + [0] * 8)
    flat = permutation_test(_design(np.zeros((14, 3)), side), 99, 0, 0.05)
    assert flat["statistic"] == 0.5 and flat["p_value"] == 1.0  # every permutation ties
    assert flat["null_sd"] == 0.0
    rng = np.random.default_rng(6)
    F = rng.normal(size=(14, 3)) + side[:, None] * 5
    strong = permutation_test(_design(F, side), 99, 0, 0.05)
    assert strong["p_value"] == 1 / 100 and strong["reject"]
    assert strong["mc_error"] == pytest.approx(np.sqrt(0.01 * 0.99 / 99))
    with pytest.raises(MiaError, match="at least 1 permutation"):
        permutation_test(_design(F, side), 0, 0, 0.05)


def test_permutations_drawn_a_chunk_at_a_time_give_the_statistics_of_one_draw(monkeypatch):
    """Chunks of 256 rows, the observed sides first (memory bounded for any count), change no
    number: the statistics are those of all permutations drawn at once from the same
    generator, and progress is logged when the test is slow."""
    import mia_ray.detectors.dataset_inference as di

    side = np.array([1] * 6 + [0] * 8)
    F = np.random.default_rng(3).normal(size=(14, 3)) + side[:, None] * 0.4
    design = _design(F, side)
    rng = np.random.default_rng([0x9E57, 0])
    rows = np.array([side] + [rng.permutation(side) for _ in range(600)])
    T = di._statistics(design, rows)[0]
    want = (1 + int((T[1:] >= T[0] - 1e-12).sum())) / 601
    said = []
    monkeypatch.setattr(di, "PROGRESS_EVERY_S", -1.0)
    monkeypatch.setattr(di, "log", said.append)
    got = permutation_test(design, 600, 0, 0.05)
    assert got["statistic"] == T[0] and got["p_value"] == want
    assert got["null_mean"] == pytest.approx(T[1:].mean(), abs=1e-12)
    assert [s.split(" permutations")[0] for s in said] == [
        "permutation test: 255 of 600", "permutation test: 511 of 600"]  # fmt: skip


def test_permutation_counts_that_cannot_reject_or_would_not_end_are_refused():
    from mia_ray.detectors.dataset_inference import check_permutations

    check_permutations("k", 19, 0.05)  # 1/20 = 0.05: can reject
    with pytest.raises(
        MiaError,
        match=r"^k = 18 cannot reject at level 0.05: .* 1/\(18 \+ 1\) "
        r"= 0.0526; give at least 19",
    ):
        check_permutations("k", 18, 0.05)
    check_permutations("k", 99, 0.01)
    with pytest.raises(MiaError, match="give at least 99"):
        check_permutations("k", 98, 0.01)
    check_permutations("k", 100_000, 0.05)
    with pytest.raises(MiaError, match="^k = 100001 is more than 100000"):
        check_permutations("k", 100_001, 0.05)


def test_per_file_pvalues_are_split_conformal_within_the_half_and_the_largest_over_rounds():
    rng = np.random.default_rng(7)
    _, F, side = _world(rng, 8, 21, shift=1.0)
    design = _design(F, side, seeds=[0, 1, 2])
    rounds = cross_fit(design)
    pv = file_pvalues(design, rounds, 0)
    for i in np.flatnonzero(side == 1):
        want = []
        for r in rounds:
            cal = r.score[(r.half == r.half[i]) & (side == 0)]
            want.append((Fraction(1 + int((cal >= r.score[i]).sum()), cal.size + 1), cal.size))
        p, n = max(want)
        assert pv[i] == (p, n) and isinstance(pv[i][0], Fraction)
        assert n in (10, 11)
    assert all(pv[i] == (1, 0) for i in np.flatnonzero(side == 0))


def test_a_source_is_calibrated_by_one_file_only():
    rng = np.random.default_rng(8)
    group = np.concatenate([np.arange(6), np.repeat(np.arange(6, 16), 4)])  # 6 + 10 sources
    side = (group < 6).astype(int)
    design = _design(rng.normal(size=(46, 3)) + side[:, None], side, group=group)
    rounds = cross_fit(design)
    pv = file_pvalues(design, rounds, 0)
    for i in range(6):
        # 10 unseen sources of 4 files: 5 per half, one file each
        assert pv[i][1] == 5
    assert file_pvalues(design, rounds, 0) == pv


def test_null_side_halves_the_unseen_sources_with_a_seed():
    side = np.array([1] * 5 + [0] * 9)
    a = null_side(side, 0)
    assert a.shape == (9,) and a.sum() == 4
    assert (a == null_side(side, 0)).all() and not (a == null_side(side, 1)).all()


def test_too_few_sources_is_an_error_that_says_the_minimum():
    with pytest.raises(
        MiaError, match=r"suspected has 3 independent group\(s\) of files: the dataset test needs"
    ):
        _design(np.zeros((13, 2)), np.array([1] * 3 + [0] * 10))


def test_the_blind_check_sees_words_that_differ_and_not_words_that_do_not():
    rng = np.random.default_rng(9)
    vocab = [f"w{i}" for i in range(400)]

    def texts(n_files, lo, hi):
        return [" ".join(rng.choice(vocab[lo:hi], 60)) for _ in range(n_files) for _ in range(2)]

    files = [f"f{i}" for i in range(40)]
    units = [f for f in files for _ in range(2)]
    side = np.array([1] * 16 + [0] * 24)
    same = text_matrix(units, texts(40, 0, 400), files)
    differ = text_matrix(units, texts(16, 0, 300) + texts(24, 100, 400), files)
    assert same.shape[0] == 40 and same.shape[1] <= 39
    got_same = permutation_test(_design(same, side, nonneg=False), 99, 0, 0.05)
    got_differ = permutation_test(_design(differ, side, nonneg=False), 99, 0, 0.05)
    assert not got_same["reject"] and got_differ["reject"] and got_differ["p_value"] == 0.01


def test_pooled_pvalues_rank_each_suspected_source_against_every_unseen_one():
    """Sources 0-3 suspected, 4-8 unseen; two files in source 0. Each source's row is its
    files' mean, standardized over all 9 sources whatever their side, and its score is the
    row's mean; a suspected source is ranked against the 5 unseen ones, each source counting
    its files."""
    F = np.array([[2.0, 0.0], [0.0, 2.0], [3.0, 1.0], [-1.0, 0.0], [0.0, 0.0], [0.5, 0.5],
                  [0.0, 0.0], [1.0, 0.0], [2.0, 2.0], [0.0, -1.0]])  # fmt: skip
    group = np.array([0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
    side = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0])
    design = Design(F, group, side, [0])
    U = np.array([[1.0, 1.0], [3.0, 1.0], [-1.0, 0.0], [0.0, 0.0], [0.5, 0.5], [0.0, 0.0],
                  [1.0, 0.0], [2.0, 2.0], [0.0, -1.0]])  # fmt: skip
    s = ((U - U.mean(0)) / U.std(0)).mean(1)
    p, scores = pooled_pvalues(design)
    np.testing.assert_allclose(scores, s)
    # Source 0 weighs its 2 files: (1, 1) is beaten by (2, 2) alone, (2 + 1) / (2 + 5);
    # (3, 1) by (2, 2) alone too: 2/6; (-1, 0) by four (y's sd is the smaller, so (0, -1)
    # scores lower): 5/6; (0, 0) ties with the unseen (0, 0), which counts against it.
    assert s[7] > s[1] > s[0] and s[3] == s[5] and s[2] > s[8]
    assert list(p) == [Fraction(3, 7), Fraction(2, 6), Fraction(5, 6),
                       Fraction(1 + int((s[4:] >= s[3]).sum()), 6)] + [1] * 5  # fmt: skip


def test_a_source_weighs_its_files_in_calibration_and_its_files_share_its_p_value():
    """Suspected: sources 0-3 of 5 files and 4 single files; unseen: 56 single files and 2
    sources of 5 (66 unseen files). A source of n files is ranked with every unseen file
    counted: p = (n + files of unseen sources scoring at least as high) / (n + 66)."""
    rng = np.random.default_rng(10)
    group = np.concatenate([np.repeat(np.arange(4), 5), np.arange(4, 64),
                            np.repeat([64, 65], 5)])  # fmt: skip
    side = (np.arange(66) < 8).astype(int)
    F = rng.normal(size=(group.size, 3)) + 2.5 * (group < 2)[:, None]
    design = Design(F, group, side, [0, 1])
    got = audit(design, 19, 0, 0.05, 0.2)
    p, s = got["group_pvalues"], got["group_scores"]
    sizes = np.bincount(group)
    for g in range(8):
        above = sum(int(sizes[u]) for u in range(8, 66) if s[u] >= s[g])
        assert p[g] == Fraction(int(sizes[g]) + above, int(sizes[g]) + 66)
    sus = got["suspected"]
    assert sus.size == 24 and {got["pvalues"][i][1] for i in sus} == {66}
    assert all(got["pvalues"][i][0] == p[group[i]] for i in sus)
    # The two shifted sources lead every unseen one: 5 / 71 each, and their 10 files are
    # flagged together at q = 0.2 (the 10th smallest of 24 p-values <= 0.2 x 10 / 24),
    # nothing else.
    assert p[0] == p[1] == Fraction(5, 71)
    assert [bool(f) for f in got["flagged"]] == [g < 2 for g in group[sus]]
