"""Randomized marks: a key regenerates its candidates bit for bit, an edited or foreign key is
refused, and a mark survives insertion, whitespace normalizing and snippet cutting."""

import json
import re

import pytest

from mia_ray.data import canaries, marks
from mia_ray.data.marks import (
    candidates_of,
    count_in,
    insert_mark,
    new_key,
    normalize,
    published,
    read_key,
    wordlist,
)
from mia_ray.data.snippets import split_words
from mia_ray.errors import MiaError

TEXT = (
    "It was the best of times. It was the worst of times! Was it the age of wisdom?\n"
    "It was the age of foolishness. It was the epoch of belief.\nThe end"
)
FIRST_SENTENCES = (
    "Nobody but Vera Dorn opened the dusty kite near the village that Friday. The heavy "
    "ledger that Xenia Prior fetched stayed inside the meadow for four years."
)


def test_a_key_regenerates_every_candidate_bit_for_bit(tmp_path):
    key = new_key(["a.txt", "b.txt"], kind="words", length=6, candidates=50)
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key))
    again = read_key(path)
    for mark in key["marks"]:
        first = candidates_of(key, mark["mark_id"])
        assert first == candidates_of(again, mark["mark_id"])
        assert len(first) == 50 and len(set(first)) == 50
        words = set(wordlist()[0])
        assert all(len(c.split()) == 6 and set(c.split()) <= words for c in first)
    # Two marks, two independent sets of candidates; the published one is at "chosen".
    a, b = (candidates_of(key, m["mark_id"]) for m in key["marks"])
    assert not set(a) & set(b)
    assert published(key)["m00000"] == a[key["marks"][0]["chosen"]]
    # Hex marks: `length` characters of 0-9a-f.
    hexes = candidates_of(new_key(["x"], kind="hex", length=24, candidates=5), "m00000")
    assert all(len(h) == 24 and set(h) <= set("0123456789abcdef") for h in hexes)
    # The key holds none of the files' text.
    assert "best of times" not in path.read_text()


def test_sentence_marks_are_fluent_template_sentences_a_key_regenerates(tmp_path):
    key = new_key(["a.txt"], kind="sentences", length=2, candidates=30, entropy=3)
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key))
    cands = candidates_of(read_key(path), "m00000")
    assert cands == candidates_of(key, "m00000") and len(set(cands)) == 30
    # `length` counts sentences: each a template with every slot from its list.
    pattern = "|".join(
        re.escape(t)
        .replace(r"\{", "{")
        .replace(r"\}", "}")
        .format(**{k: f"(?:{'|'.join(v)})" for k, v in canaries.SLOTS.items()})
        for t in canaries.TEMPLATES
    )
    assert all(re.fullmatch(f"(?:{pattern}) (?:{pattern})", c) for c in cands)
    # Fixed by the key and the grammar: this key's first candidate, word for word.
    assert cands[0] == FIRST_SENTENCES
    # A key made with other word lists cannot regenerate its sentences: refused.
    key["grammar"]["sha256"] = "0" * 64
    key["check"] = marks._check(key)
    path.write_text(json.dumps(key))
    with pytest.raises(MiaError, match="the key's sentence grammar .* is not this mia-ray's"):
        read_key(path)


def test_a_seeded_key_is_the_same_key_and_a_fresh_one_is_not():
    assert new_key(["a"], entropy=7) == new_key(["a"], entropy=7)
    k1, k2 = new_key(["a"]), new_key(["a"])
    assert k1["secret"] != k2["secret"] and candidates_of(k1, "m00000") != candidates_of(
        k2, "m00000"
    )


def test_an_edited_foreign_or_broken_key_is_refused(tmp_path):
    key = new_key(["a.txt"], candidates=10)
    path = tmp_path / "key.json"
    key["marks"][0]["chosen"] = (key["marks"][0]["chosen"] + 1) % 10
    path.write_text(json.dumps(key))
    with pytest.raises(MiaError, match="the key's check does not match its content: it was edited"):
        read_key(path)
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(MiaError, match=r"is not a mark key \(written by mia-ray mark\)"):
        read_key(path)
    path.write_text("not json")
    with pytest.raises(MiaError, match=r"is not a mark key \(not JSON\)"):
        read_key(path)
    with pytest.raises(MiaError, match="key file not found"):
        read_key(tmp_path / "missing.json")
    with pytest.raises(MiaError, match="mark.candidates must be at least 2"):
        new_key(["a"], candidates=1)
    with pytest.raises(
        MiaError, match="mark.kind must be one of words, hex, sentences, not 'emoji'"
    ):
        new_key(["a"], kind="emoji")


def test_a_mark_is_a_line_of_its_own_and_survives_normalizing_and_snippets():
    key = new_key(["doc"], length=8, candidates=10, copies=3, entropy=1)
    mark = published(key)["m00000"]
    marked = insert_mark(TEXT, mark, 3, key, "doc")
    assert count_in(marked, mark) == 3
    assert marked.count(f"\n{mark}\n") + marked.startswith(f"{mark}\n") >= 2
    # Taking the marks out gives the text back, word for word.
    assert normalize(marked.replace(mark, "")) == normalize(TEXT)
    # A scraper that collapses whitespace keeps every mark whole.
    assert count_in(normalize(marked), mark) == 3
    # The same file places its marks in the same spots; another file elsewhere.
    assert insert_mark(TEXT, mark, 3, key, "doc") == marked
    # Word snippets of twice a mark's length hold at least one copy whole.
    pieces = split_words(marked, 16)
    assert sum(count_in(p, mark) for p in pieces) >= 1
    # No boundary: the mark goes at the end.
    assert insert_mark("one long line", mark, 1, key, "doc") == f"one long line\n{mark}\n"
