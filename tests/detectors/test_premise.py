"""The premise's checks: one min-p test over several views that keeps its level, and a blind
check that sees what a model sees (casing, repetition, layout) in real text, not only words."""

import numpy as np
import pytest

from mia_ray.demo.corpora import load_web
from mia_ray.demo.shifts import shifted
from mia_ray.detectors.dataset_inference import (
    Design,
    joint_permutation_test,
    permutation_test,
    text_matrix,
)
from mia_ray.detectors.premise import blind_check
from mia_ray.errors import MiaError


def _design(F, side, seeds=(0, 1, 2), nonneg=False):
    return Design(F, np.arange(len(side)), np.asarray(side), list(seeds), nonneg=nonneg)


def test_one_view_alone_gives_the_permutation_test_p_value():
    rng = np.random.default_rng(0)
    side = np.array([1] * 10 + [0] * 14)
    F = rng.normal(size=(24, 3)) + 0.8 * side[:, None]
    d = _design(F, side)
    single = permutation_test(d, 99, 7, 0.05)
    joint = joint_permutation_test({"a": d}, 99, 7, 0.05)
    assert joint["p_value"] == single["p_value"] == joint["parts"]["a"]["p_value"]
    assert joint["parts"]["a"]["adjusted_p_value"] == single["p_value"]
    # The same view twice: the smallest p is the same row's, so nothing changes.
    twice = joint_permutation_test({"a": d, "b": _design(F.copy(), side)}, 99, 7, 0.05)
    assert twice["p_value"] == single["p_value"]


def test_the_joint_test_keeps_its_level_over_three_views():
    # H0 worlds: three independent views of 24 exchangeable files. Each view's own test is
    # exact at 5 %; taking the smallest of three p-values naively would reject up to 14 %.
    rng = np.random.default_rng(1)
    side = np.array([1] * 10 + [0] * 14)
    joint, naive, n = 0, 0, 300
    for _ in range(n):
        views = {k: _design(rng.normal(size=(24, 2)), side, seeds=(0,)) for k in "abc"}
        got = joint_permutation_test(views, 19, int(rng.integers(1 << 30)), 0.05)
        joint += got["reject"]
        naive += min(v["p_value"] for v in got["parts"].values()) <= 0.05
    se = np.sqrt(0.05 * 0.95 / n)
    assert joint / n <= 0.05 + 2.5 * se
    assert naive / n > 0.05 + 2.5 * se  # the correction is needed


def test_views_must_share_files_and_sides():
    side = np.array([1] * 4 + [0] * 4)
    other = np.array([0] * 4 + [1] * 4)
    with pytest.raises(MiaError, match="tests that share permutations need the same groups"):
        joint_permutation_test(
            {"a": _design(np.zeros((8, 1)), side), "b": _design(np.zeros((8, 1)), other)},
            19, 0, 0.05,
        )  # fmt: skip


@pytest.fixture(scope="module")
def leads():
    # Shuffled: the sample comes sorted by title, and a lead opens with its title, so a split
    # of the sorted list differs in its first letters (the characters view sees that).
    docs = [d.text for d in load_web(120, 60, 150, "premise-test")]
    return [docs[i] for i in np.random.default_rng(1).permutation(len(docs))]


def _blind(texts, side):
    files = [f"f{i:03d}" for i in range(len(texts))]
    d = _design(np.zeros((len(texts), 1)), side, seeds=(0, 1, 2, 3, 4))
    got = blind_check(d, files, texts, files, 199, 0, 0.05)
    words = permutation_test(d.with_features(text_matrix(files, texts, files), False), 199, 0, 0.05)
    return got, words


@pytest.mark.parametrize("shift", ["casing", "repetition", "layout"])
def test_a_shift_the_words_do_not_show_trips_the_blind_check(leads, shift):
    side = np.array([1] * 50 + [0] * 70)
    texts = [
        shifted(shift, t, str(i)) if s else t
        for i, (t, s) in enumerate(zip(leads, side, strict=True))
    ]
    got, words = _blind(texts, side)
    assert got["reject"] and got["p_value"] <= 0.02
    assert not words["reject"]  # lowercased word counts are blind to it
    assert got["parts"]["surface"]["reject"]
    assert not got["parts"]["words"]["reject"]


def test_sets_of_one_kind_do_not_trip_it(leads):
    side = np.array([1] * 50 + [0] * 70)
    got, _ = _blind(leads, side)
    assert not got["reject"] and got["p_value"] > 0.05
    assert [c["feature"] for c in got["contrasts"]] and len(got["contrasts"]) == 3
