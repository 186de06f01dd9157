import hashlib

import numpy as np
import pytest

from mia_ray.errors import MiaError
from mia_ray.features.shingles import (
    ShingleStore,
    window_hashes,
    word_hashes,
    words_with_offsets,
)

WORDS = [f"w{i}" for i in range(40)]
REF = " ".join(WORDS)


def test_words_are_normalised_and_keep_their_offsets():
    text = "It’s  the\nEND, isn't it? ﬁn"
    words, starts, ends = words_with_offsets(text)
    assert words == ["it's", "the", "end", "isn't", "it", "fin"]
    assert [text[s:e] for s, e in zip(starts, ends, strict=True)] == [
        "It’s",
        "the",
        "END",
        "isn't",
        "it",
        "ﬁn",
    ]


def test_window_hash_is_the_polynomial_mod_2_64():
    words = ["a", "b", "c", "d"]
    h = [
        int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little") for w in words
    ]
    assert word_hashes(words).tolist() == h
    base, mod = 0x9E3779B97F4A7C15, 2**64
    want = [(h[j] * base**2 + h[j + 1] * base + h[j + 2]) % mod for j in range(2)]
    assert window_hashes(words, 3).tolist() == want
    assert len(window_hashes(words, 5)) == 0
    with pytest.raises(MiaError, match="at least 1 word"):
        window_hashes(words, 0)


def test_a_copy_inside_a_document_is_found_at_its_offsets():
    store = ShingleStore.build([("other", "x " * 30), ("ref", REF)], span=10)
    copied = " ".join(WORDS[5:25])
    doc = "Some prose first. " + copied.upper().replace(" ", "\n") + ". And after."
    (m,) = store.match(doc)
    assert store.ref_ids[m.ref] == "ref" and m.ref_word == 5
    assert (m.word_start, m.word_end) == (3, 23)
    assert doc[m.char_start : m.char_end] == copied.upper().replace(" ", "\n")


def test_shorter_copies_and_unrelated_text_do_not_match():
    store = ShingleStore.build([("ref", REF)], span=10)
    assert store.match(" ".join(WORDS[:9]) + " and then something else entirely") == []
    # Every other word of the reference: the same words, but no 10 of them in a row.
    assert store.match(" ".join(WORDS[::2])) == []
    assert store.lookup(np.array([1, 2], dtype=np.uint64)).tolist() == [-1, -1]


def test_two_references_back_to_back_are_two_matches():
    a, b = " ".join(f"a{i}" for i in range(15)), " ".join(f"b{i}" for i in range(15))
    store = ShingleStore.build([("A", a), ("B", b)], span=5)
    ms = store.match(a + " " + b)
    assert [(store.ref_ids[m.ref], m.word_start, m.word_end) for m in ms] == [
        ("A", 0, 15),
        ("B", 15, 30),
    ]


def test_short_texts_are_skipped_and_an_empty_store_is_an_error():
    store = ShingleStore.build([("short", "too short"), ("ref", REF)], span=10)
    assert store.skipped == 1 and store.ref_ids == ["ref"] and len(store) == 31
    with pytest.raises(MiaError, match="no reference text has 10 words or more"):
        ShingleStore.build([("short", "too short")], span=10)


def test_merge_and_save_load_keep_every_window(tmp_path):
    one = ShingleStore.build([("A", REF)], span=10)
    two = ShingleStore.build([("B", " ".join(f"b{i}" for i in range(20)))], span=10)
    merged = ShingleStore.merge([one, two])
    assert merged.ref_ids == ["A", "B"] and len(merged) == 31 + 11
    assert np.all(np.diff(merged.hashes.astype(np.float64)) >= 0)
    merged.save(tmp_path / "store.npz")
    back = ShingleStore.load(tmp_path / "store.npz")
    assert back.ref_ids == merged.ref_ids and back.span == 10
    assert np.array_equal(back.hashes, merged.hashes) and np.array_equal(back.pos, merged.pos)
    (m,) = back.match(" ".join(f"b{i}" for i in range(3, 18)))
    assert back.ref_ids[m.ref] == "B" and m.ref_word == 3
    with pytest.raises(MiaError, match="share one span"):
        ShingleStore.merge([one, ShingleStore.build([("C", REF)], span=5)])


def test_a_window_two_references_share_gives_one_run_whatever_the_build_order():
    passage = " ".join(f"p{i}" for i in range(30))
    question = " ".join(f"p{i}" for i in range(20)) + " ____"  # quotes the passage's start
    doc = "intro words here " + passage + " Question: " + question
    for items in ([("item#passage", passage), ("item#question", question)],
                  [("item#question", question), ("item#passage", passage)]):  # fmt: skip
        store = ShingleStore.build(items, span=10)
        ms = [(store.ref_ids[m.ref], m.word_start, m.word_end) for m in store.match(doc)]
        # The passage's whole copy is one run (not cut where the question's windows end),
        # and the question's own copy after it is another.
        assert ms == [("item#passage", 3, 33), ("item#question", 34, 55)], ms


def test_match_many_hashes_only_runs_of_known_words_and_never_joins_two_runs():
    from mia_ray.features.textbatch import TextBatch

    store = ShingleStore.build([("ref", REF)], span=10)
    # Two runs of known words with a word the store does not know between them: joined, the
    # runs would make windows that are not in the text (w2..w11 + w12 ...), and one match.
    split = " ".join(WORDS[:12]) + " zzz " + " ".join(WORDS[12:26])
    # Known words on both sides of a run of twelve: only the run's windows match.
    copied = "w3 zzz " + " ".join(WORDS[20:32]) + " zzz w1 w2"
    batch = TextBatch([split, copied, REF])
    got = store.match_many(batch)
    assert got[0] == store.match(split)
    assert [(m.word_start, m.word_end, m.ref_word) for m in got[0]] == [(0, 12, 0), (13, 27, 12)]
    assert got[1] == store.match(copied)
    assert [(m.word_start, m.word_end, m.ref_word) for m in got[1]] == [(2, 14, 20)]
    assert got[2] == store.match(REF) and [(m.word_start, m.word_end) for m in got[2]] == [(0, 40)]


def test_match_many_finds_a_run_of_exactly_span_words_wherever_it_starts(monkeypatch):
    from mia_ray.features import shingles
    from mia_ray.features.textbatch import TextBatch

    span = 20
    store = ShingleStore.build([("ref", REF)], span=span)
    # A copy of exactly `span` words after 0..8 unknown words (each offset against the
    # batch's every-8th-word lookup), and texts of known words with no run of `span`.
    copies = [" ".join(["zzz"] * k + WORDS[5 : 5 + span] + ["zzz"]) for k in range(9)]
    near = [" ".join(WORDS[: span - 1] + ["zzz"] + WORDS[span : 2 * span - 1])]
    batch = TextBatch([near[0], *copies, near[0]])
    hashed = []
    plain = ShingleStore._match
    monkeypatch.setattr(
        shingles.ShingleStore,
        "_match",
        lambda self, text, *a: hashed.append(text) or plain(self, text, *a),
    )
    got = store.match_many(batch)
    assert got[0] == got[-1] == []
    for k, m in enumerate(got[1:-1]):
        assert [(x.word_start, x.word_end, x.ref_word) for x in m] == [(k, k + span, 5)]
    # Only the copies are hashed: `near` has 38 known words but no 20 in a row.
    assert hashed == copies
