"""LCSS and mu = LCSS / |y| on hand-computed cases."""

import numpy as np
import pytest

from mia_ray.errors import MiaError
from mia_ray.features.lcss import lcss, memorization, memorization_many


@pytest.mark.parametrize(
    "a,b,want",
    [
        ("abcdef", "zcdez", 3),  # "cde"
        ("ABABC", "BABCA", 4),  # "BABC"
        ("abc", "abc", 3),
        ("abc", "xyz", 0),
        ("", "abc", 0),
        ("abc", "", 0),
        ("", "", 0),
        ("aaaa", "aa", 2),
        ("xabcyabcdz", "abcd", 4),  # the later, longer run wins
        ("héllo wörld", "wörld", 5),  # characters, not bytes
    ],
)
def test_lcss_characters(a, b, want):
    assert lcss(a, b) == want
    assert lcss(b, a) == want  # symmetric


def test_lcss_is_a_substring_not_a_subsequence():
    # "ace" is a common subsequence of both, but no two of its letters are adjacent in "axcxe".
    assert lcss("abcde", "axcxe") == 1


def test_lcss_tokens():
    assert lcss([5, 1, 2, 3, 9], [1, 2, 3, 4]) == 3
    assert lcss(np.array([7, 7, 7]), [7, 7]) == 2
    assert lcss([], [1]) == 0


def test_memorization_is_lcss_over_target_length():
    assert memorization("the cat sat", "cat sat on the mat") == pytest.approx(7 / 18)
    assert memorization([1, 2, 3], [1, 2, 3]) == 1.0  # identical
    assert memorization([], [1, 2, 3, 4]) == 0.0  # empty output recovers nothing
    assert memorization([9, 1, 2], [1, 2, 3, 4]) == 0.5
    # Output longer than the target that contains it: still 1, never above.
    assert memorization("xx" + "target" + "yy", "target") == 1.0


def test_errors_name_the_problem():
    with pytest.raises(MiaError, match="the target continuation y is empty"):
        memorization("abc", "")
    with pytest.raises(MiaError, match="two strings or two token sequences"):
        lcss("abc", [1, 2])
    with pytest.raises(MiaError, match="2 outputs but 1 targets"):
        memorization_many(["a", "b"], ["a"])


def test_thousands_of_token_pairs():
    rng = np.random.default_rng(0)
    ys = [rng.integers(0, 50, 64) for _ in range(2000)]
    # Noise from a disjoint alphabet, then y's first half: LCSS is exactly 32 of 64.
    outs = [np.concatenate([rng.integers(50, 100, 10), y[:32]]) for y in ys]
    mu = memorization_many(outs, ys)
    assert mu.shape == (2000,) and (mu == 0.5).all()


def test_best_of_k_takes_each_samples_best_trial_so_far():
    import pandas as pd

    from mia_ray.features.lcss import best_of_k

    trials = pd.DataFrame(
        {
            "pair_id": ["a"] * 3 + ["b"] * 3,
            "trial": [0, 1, 2] * 2,
            "mu": [0.25, 1.0, 0.5, 0.5, 0.25, 0.75],
        }
    )
    got = best_of_k(trials, [1, 2, 3]).set_index("k")
    # k=1: a 0.25, b 0.5; k=2: a 1.0, b 0.5; k=3: a 1.0, b 0.75.
    assert got.loc[1, "avg_lcss"] == pytest.approx(0.375) and got.loc[1, "hit_rate"] == 0.0
    assert got.loc[2, "avg_lcss"] == pytest.approx(0.75) and got.loc[2, "hit_rate"] == 0.5
    assert got.loc[3, "avg_lcss"] == pytest.approx(0.875) and got.loc[3, "hit_rate"] == 0.5
    with pytest.raises(MiaError, match="k = 4, but a sample has only 3 trials"):
        best_of_k(trials, [4])
