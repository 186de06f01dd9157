"""The attacks beyond one forward pass, each against a case computed by hand from its
paper's definition, and the pieces their passes are made of."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mia_ray.errors import MiaError
from mia_ray.features import attacks as A
from mia_ray.features.augment import random_swaps
from mia_ray.scoring.passes import held_out, prefix_of, smoothed_frequencies


def stats(lp, **kw):
    lp = np.asarray(lp, dtype=float)
    return A.SnippetStats("the cat sat", lp, np.zeros_like(lp), np.ones_like(lp), **kw)


def test_recall_is_the_conditional_over_the_plain_nll():
    # NLL(x) = mean(1, 3) = 2; NLL(x | P) = 3: a ratio of 1.5.
    assert A.recall(stats([-1.0, -3.0], recall_loss=3.0)) == 1.5
    with pytest.raises(A.SnippetError, match=r"attack 'recall' needs recall_loss"):
        A.recall(stats([-1.0, -3.0]))


def test_con_recall_weighs_the_member_prefix_by_gamma():
    s = stats([-1.0, -3.0], recall_loss=3.0, member_loss=2.0)
    assert A.con_recall(s) == (3.0 - 0.5 * 2.0) / 2.0
    assert A.con_recall(s, gamma=1.0) == 0.5
    assert A.con_recall(s, gamma=0.0) == A.recall(s)
    with pytest.raises(A.SnippetError, match=r"attack 'con_recall' needs member_loss"):
        A.con_recall(stats([-1.0, -3.0], recall_loss=3.0))


def test_dc_pdd_scores_first_occurrences_with_a_bound():
    # Tokens 5, 7, 5, 9: the second 5 is left out. alpha = p * -log f.
    p = np.array([0.5, 0.1, 0.2, 0.02])
    f = np.array([0.001, 0.5, 0.001, 1e-6])
    s = stats(np.log(p), token_ids=np.array([5, 7, 5, 9]), token_freq=f)
    want = (min(0.5 * math.log(1000), 1.0) + 0.1 * math.log(2) + 0.02 * math.log(1e6)) / 3
    assert A.dc_pdd(s, a=1.0) == pytest.approx(want, abs=1e-12)
    assert want == pytest.approx(0.448541643, abs=1e-9)
    assert A.dc_pdd(s) == pytest.approx(0.01)  # every alpha above the paper's a = 0.01
    with pytest.raises(A.SnippetError, match="one token id and frequency per scored token"):
        A.dc_pdd(stats(np.log(p), token_ids=np.array([5, 7]), token_freq=f))


def test_polarized_distance_and_pac():
    lp = [-0.1, -0.5, -1, -2, -3, -4, -5, -6, -7, -8]
    # n = 10: k_low = int(3) = 3 lowest (-8, -7, -6), k_high = max(1, int(0.5)) = 1 highest.
    assert A.polarized_distance(np.array(lp)) == pytest.approx(-0.1 - (-7.0))
    # Copies: n = 3 gives k = 1 each side: -1 - (-3) = 2; n = 2 of equal values: 0.
    copies = (np.array([-1.0, -2.0, -3.0]), np.array([-1.0, -1.0]))
    assert A.pac(stats(lp, augment_logprobs=copies)) == pytest.approx(-(6.9 - 1.0))
    with pytest.raises(A.SnippetError, match="at least one augmented copy"):
        A.pac(stats(lp, augment_logprobs=()))


def test_neighbourhood_and_gradient_norm():
    s = stats([-1.0, -3.0], neighbour_losses=np.array([2.5, 3.5]), grad_norm=0.25)
    assert A.neighbourhood(s) == 1.0  # mean neighbour NLL 3 minus own 2
    assert A.grad_norm(s) == -0.25


def test_each_attack_names_the_passes_it_costs():
    need = A.passes_of(["loss", "con_recall", "recall", "dc_pdd", "grad_norm", "lowercase"])
    assert list(need) == [
        "target",
        "lowercase",
        "recall",
        "recall_member",
        "token_counts",
        "gradient",
    ]
    assert need["recall"] == ["con_recall", "recall"] and need["recall_member"] == ["con_recall"]
    assert len(need["target"]) == 6


def test_random_swaps_are_seeded_swaps_of_the_words():
    text = "one two three four five six seven eight nine ten"
    copies = random_swaps(text, copies=5, share=0.3, seed="s:1")
    assert copies == random_swaps(text, copies=5, share=0.3, seed="s:1")
    assert copies != random_swaps(text, copies=5, share=0.3, seed="s:2")
    for c in copies:
        assert sorted(c.split(" ")) == sorted(text.split(" "))
        # int(0.3 * 10) = 3 swaps move at most 6 words.
        moved = sum(a != b for a, b in zip(c.split(" "), text.split(" "), strict=True))
        assert 2 <= moved <= 6
    assert random_swaps("alone", copies=3) == ["alone"] * 3
    with pytest.raises(MiaError, match=r"copies .* must be >= 1, got 0"):
        random_swaps(text, copies=0)


def test_laplace_smoothed_frequencies():
    counts = pd.DataFrame({"token_id": [0, 2], "count": [3, 1]})
    # total 4, vocabulary 4: (c + 1) / 8.
    assert smoothed_frequencies(counts, 4).tolist() == [0.5, 0.125, 0.25, 0.125]
    with pytest.raises(MiaError, match="id 2, outside the vocabulary of 2"):
        smoothed_frequencies(counts, 2)


def test_held_out_prefix_documents_and_the_prefix():
    import hashlib

    labels = {f"d{i}": i % 2 for i in range(10)}
    ids = held_out(labels, 0, 2, seed=3)
    rank = sorted((d for d in labels if labels[d] == 0),
                  key=lambda d: hashlib.sha256(f"3\x1f{d}".encode()).digest())  # fmt: skip
    assert ids == sorted(rank[:2])
    with pytest.raises(MiaError, match="5 non-members cannot give 4 prefix documents"):
        held_out(labels, 0, 4, seed=3)
    snips = pd.DataFrame({"snippet_id": ["a#1", "a#0", "b#0"], "doc_id": ["a", "a", "b"],
                          "text": ["second", " first ", "other"]})  # fmt: skip
    assert prefix_of(snips, ["b", "a"]) == "other\n\nfirst\n\n"


def test_samia_is_the_mean_rouge1_recall_of_the_true_continuation():
    text = "the cat  sat on\nthe mat the end"
    prompt, ref = A.samia_split(text)
    assert prompt == "the cat  sat on" and ref == ["the", "mat", "the", "end"]
    # "the the mat": the clipped overlap is 2 of "the" + 1 "mat" = 3 of 4 reference words.
    assert A.rouge1_recall("the the mat", ref) == 0.75
    assert A.rouge1_recall("The Mat", ref) == 0.0  # case-sensitive, as the authors'
    s = A.SnippetStats(text, np.array([-1.0]), np.zeros(1), np.ones(1),
                       samples=("the the mat", "end", "nothing"))  # fmt: skip
    assert A.samia(s) == pytest.approx((0.75 + 0.25 + 0.0) / 3)
    assert A.samia_split("one two three", 0.34) == ("one", ["two", "three"])
    with pytest.raises(A.SnippetError, match="attack 'samia' needs samples"):
        A.samia(A.SnippetStats(text, np.array([-1.0]), np.zeros(1), np.ones(1)))
