import pytest

from mia_ray.data.ngram import ngram_overlap, ngram_overlap_ds, ngrams
from mia_ray.errors import MiaError


def test_ngrams_are_lowercased_words():
    assert ngrams("The cat, the HAT.", 2) == [("the", "cat"), ("cat", "the"), ("the", "hat")]
    assert ngrams("one", 2) == []


def test_bigram_overlap_hand_computed():
    # non-member bigrams: (a b) (b c) (c x); the first two occur in the member set -> 2/3
    out = ngram_overlap(["A b c d"], ["a B c x"], n=2, p=0.5)
    assert out["mean"] == pytest.approx(2 / 3) and out["median"] == pytest.approx(2 / 3)
    assert out["share_at_least_p"] == 1.0 and out["n_texts"] == 1
    out = ngram_overlap(["a b c d"], ["a b c x", "x y z", "short"], n=2, p=0.5)
    # overlaps 2/3 and 0; "short" has no bigram and is left out
    assert out == {
        "n": 2,
        "p": 0.5,
        "mean": pytest.approx(1 / 3),
        "median": pytest.approx(1 / 3),
        "share_at_least_p": 0.5,
        "n_texts": 2,
        "n_too_short": 1,
        "reference_set": "members",
    }


def test_repeated_ngrams_count_each_time():
    # (a b) (b a) (a b) (b z): 3 of 4 occur in the members
    assert ngram_overlap(["a b a"], ["a b a b z"], n=2, p=0.8)["mean"] == pytest.approx(3 / 4)


def test_no_scorable_text_and_bad_arguments():
    out = ngram_overlap(["a b c"], ["a"], n=2, p=0.5)
    assert out["mean"] is None and out["n_texts"] == 0 and out["n_too_short"] == 1
    with pytest.raises(MiaError, match="n-gram length"):
        ngram_overlap([], [], n=0, p=0.5)
    with pytest.raises(MiaError, match="threshold"):
        ngram_overlap([], [], n=2, p=1.5)


@pytest.mark.ray
def test_ngram_overlap_ds_equals_pure(ray_local):
    import random

    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(30)]
    members = [" ".join(rng.choices(vocab, k=rng.randint(5, 40))) for _ in range(60)]
    nonmembers = [" ".join(rng.choices(vocab, k=rng.randint(1, 40))) for _ in range(50)]
    mds = ray_local.data.from_items([{"text": t} for t in members], override_num_blocks=3)
    nds = ray_local.data.from_items([{"text": t} for t in nonmembers], override_num_blocks=3)
    for n in (2, 3):
        assert ngram_overlap_ds(mds, nds, n=n, p=0.5) == ngram_overlap(
            members, nonmembers, n=n, p=0.5
        )
