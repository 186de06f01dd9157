import zlib

import numpy as np
import pytest

from mia_ray.errors import MiaError
from mia_ray.features import attacks as A
from mia_ray.registry import get, names


def stats(lp, text="the cat sat on the mat", mu=None, sigma=None, **kw):
    lp = np.asarray(lp, dtype=float)
    mu = np.zeros_like(lp) if mu is None else mu
    sigma = np.ones_like(lp) if sigma is None else sigma
    return A.SnippetStats(text, lp, mu, sigma, **kw)


S = stats([-1.0, -2.0, -3.0, -4.0])


def test_registered_under_their_names():
    assert {"loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "ref"} <= set(names("attack"))
    assert get("attack", "min_k") is A.min_k


def test_loss_is_mean_logprob():
    assert A.loss(S) == -2.5


def test_zlib_divides_by_compressed_length():
    text = "aaaa aaaa aaaa aaaa"
    n = len(zlib.compress(text.encode("utf-8")))
    assert A.zlib_ratio(stats([-1.0, -2.0, -3.0, -4.0], text=text)) == pytest.approx(-2.5 / n)
    # Same loss: the more compressible (less surprising) text gets the more negative score.
    hard = stats([-1.0, -2.0, -3.0, -4.0], text="q9$Zx!vR&e2^Lp#Ok7@wM")
    assert A.zlib_ratio(hard) > A.zlib_ratio(stats([-1.0, -2.0, -3.0, -4.0], text=text))


def test_min_k_takes_floor_of_ratio_times_n():
    assert A.min_k(S, ratio=0.5) == -3.5  # lowest 2 of 4
    assert A.min_k(S, ratio=0.2) == -4.0  # floor(0.8) = 0 -> at least 1
    assert A.min_k(S, ratio=1.0) == -2.5
    assert A.min_k(S, ratio=0.74) == -3.5  # floor(2.96) = 2, not round() = 3
    lp = -np.arange(1.0, 101.0)
    # 0.29 * 100 is 28.999... in floats; k must still be 29: mean of -72..-100.
    assert A.min_k(stats(lp), ratio=0.29) == pytest.approx(-86.0)


def test_min_k_order_does_not_matter():
    assert A.min_k(stats([-4.0, -1.0, -3.0, -2.0]), ratio=0.5) == -3.5


def test_min_k_plus_plus_standardises_by_vocab_moments():
    lp = np.array([-1.0, -2.0, -3.0, -4.0])
    mu = np.array([-2.0, -2.0, -1.0, -5.0])
    sigma = np.array([0.5, 1.0, 2.0, 0.5])
    # z = [2, 0, -1, 2]; lowest 2 -> (-1 + 0) / 2
    s = stats(lp, mu=mu, sigma=sigma)
    assert A.min_k_plus_plus(s, ratio=0.5) == -0.5
    assert A.min_k_plus_plus(s, ratio=1.0) == 0.75


def test_min_k_plus_plus_clips_zero_sigma():
    s = stats([-1.0, -1.0], mu=np.array([-1.0, -2.0]), sigma=np.array([0.0, 0.0]))
    assert A.min_k_plus_plus(s, ratio=0.5) == 0.0  # 0/1e-8, not nan
    assert np.isfinite(A.min_k_plus_plus(s, ratio=1.0))


def test_lowercase_ratio():
    assert A.lowercase(stats([-1.0, -3.0], lower_loss=4.0)) == -0.5
    with pytest.raises(ValueError, match="needs lower_loss"):
        A.lowercase(stats([-1.0, -3.0]))
    with pytest.raises(ValueError, match="lower_loss > 0"):
        A.lowercase(stats([-1.0, -3.0], lower_loss=0.0))


def test_ref_is_difference_of_losses():
    assert A.ref(stats([-1.0, -3.0], ref_loss=3.5)) == 1.5
    with pytest.raises(MiaError, match="needs ref_loss"):
        A.ref(stats([-1.0, -3.0]))


def test_one_token_snippet_is_rejected():
    with pytest.raises(ValueError, match="no scored tokens"):
        stats([])


def test_mismatched_moments_are_rejected():
    with pytest.raises(ValueError, match="must match"):
        A.SnippetStats("x", np.array([-1.0, -2.0]), np.zeros(3), np.ones(3))


def test_bad_ratio_is_rejected():
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        A.min_k(S, ratio=0.0)


def test_score_table_columns():
    rows = [S, stats([-0.5, -0.5, -0.5, -6.0], ref_loss=1.0, lower_loss=2.0)]
    table = A.score_table(rows, ["loss", "min_k", "min_k_plus_plus"], [0.25, 0.5], 0.5)
    assert set(table) == {
        "loss",
        "min_k",
        "min_k@0.25",
        "min_k@0.5",
        "min_k_plus_plus",
        "min_k_plus_plus@0.25",
        "min_k_plus_plus@0.5",
    }
    np.testing.assert_array_equal(table["loss"], [-2.5, -1.875])
    np.testing.assert_array_equal(table["min_k@0.25"], [-4.0, -6.0])
    np.testing.assert_array_equal(table["min_k"], table["min_k@0.5"])
    np.testing.assert_array_equal(table["min_k"], [-3.5, -3.25])
    # mu = 0, sigma = 1: Min-K%++ reduces to Min-K%
    np.testing.assert_array_equal(table["min_k_plus_plus"], table["min_k"])


def test_score_table_ratio_outside_the_list():
    table = A.score_table([S], ["min_k"], [0.25], 1.0)
    assert table["min_k"][0] == -2.5 and table["min_k@0.25"][0] == -4.0


def test_score_table_unknown_attack_names_nearest():
    with pytest.raises(MiaError, match="did you mean 'min_k'"):
        A.score_table([S], ["loss", "min_kk"], [], 0.2)


def test_vocab_moments_match_definition():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7)) * 3
    mu, sigma = A.vocab_moments_np(logits)
    for t in range(3):
        p = np.exp(logits[t]) / np.exp(logits[t]).sum()
        m = np.sum(p * np.log(p))
        assert mu[t] == pytest.approx(m)
        assert sigma[t] == pytest.approx(np.sqrt(np.sum(p * np.log(p) ** 2) - m**2))


def test_vocab_moments_uniform_and_masked():
    mu, sigma = A.vocab_moments_np(np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -np.inf, -np.inf]]))
    np.testing.assert_allclose(mu, [-np.log(4), -np.log(2)])
    np.testing.assert_allclose(sigma, [0.0, 0.0], atol=1e-12)
