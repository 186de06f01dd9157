"""Demo corpora and split: pure Python, seconds (no model, no Ray)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mia_ray.demo.corpora import (
    clean_play_markdown,
    load_books,
    load_web,
    slugify,
    split_ids,
    split_scenes,
)
from mia_ray.demo.world import SCALES, build_corpora
from mia_ray.errors import MiaError

PLAY = """# A Play

## PROLOGUE

_Enter Chorus_

**CHORUS**  
Two households, both alike in dignity,

## ACT I

### SCENE I. A street.

_Enter SAMPSON_

**SAMPSON**  
Gregory, o' my word, we'll not carry coals.  
__\\[Aside]_ No, for then we should be colliers\\--

### SCENE I. The same.

**GREGORY**  
Ay.

## ACT II

**ROMEO**  
He jests at scars that never felt a wound.

## ACT III

### SCENE II. A hall.

**JULIET**  
Gallop apace.

# EPILOGUE

**PUCK**  
Give me your hands.
"""


def test_split_scenes_assigns_prologue_epilogue_and_bare_acts():
    scenes = split_scenes(PLAY)
    assert [(a, s) for a, s, _ in scenes] == [(1, 1), (1, 2), (2, 1), (3, 2)]
    first = scenes[0][2]
    assert "PROLOGUE" in first and "ACT I" in first and "Two households" in first
    assert "He jests at scars" in scenes[2][2]
    assert "Give me your hands" in scenes[3][2]
    assert "A Play" not in "".join(body for _, _, body in scenes)


def test_clean_play_markdown_keeps_speakers_and_verse():
    text = clean_play_markdown(split_scenes(PLAY)[0][2])
    assert "**" not in text and "_" not in text and "\\" not in text and "#" not in text
    assert "SAMPSON\nGregory, o' my word, we'll not carry coals.\n" in text
    assert "[Aside] No, for then we should be colliers--" in text
    assert "SCENE I. A street." in text
    assert "\n\n\n" not in text and not any(line.endswith(" ") for line in text.splitlines())


def test_split_ids_is_seeded_disjoint_and_complete():
    ids = [f"d{i}" for i in range(100)]
    a = split_ids(ids, (0.4, 0.4, 0.2), seed=3)
    assert a == split_ids(list(reversed(ids)), (0.4, 0.4, 0.2), seed=3)
    assert a != split_ids(ids, (0.4, 0.4, 0.2), seed=4)
    counts = {
        side: sum(v == side for v in a.values()) for side in ("member", "nonmember", "reference")
    }
    assert counts == {"member": 40, "nonmember": 40, "reference": 20}
    with pytest.raises(MiaError, match="too few files"):
        split_ids(ids[:4], (0.4, 0.4, 0.2), seed=0)
    with pytest.raises(MiaError, match="sum to 1"):
        split_ids(ids, (0.5, 0.5, 0.5), seed=0)


def test_web_sample_is_seeded_with_unique_slugs():
    docs = load_web(50, 60, 0, seed=7)
    assert [d.id for d in docs] == [d.id for d in load_web(50, 60, 0, seed=7)]
    assert len({d.id for d in docs}) == 50
    assert all(d.id.startswith("web/") and len(d.text.split()) >= 60 for d in docs)
    assert slugify("2001: A Space Odyssey") == "2001-a-space-odyssey"
    with pytest.raises(MiaError, match="Wikipedia leads"):
        load_web(100_000, 60, 0, seed=0)


def test_demo_scale_corpora_meet_the_copycheck_constraints():
    c = build_corpora("demo", seed=0)
    books = [d for d in c.evaluated + c.reference if d.source == "books"]
    side = lambda d: c.split[d.id]  # noqa: E731
    assert len(books) >= 140
    assert sum(side(d) == "member" for d in books) >= 40
    assert sum(side(d) == "nonmember" for d in books) >= 90
    assert all(d.id.startswith("books/") and d.id.endswith(".txt") for d in books)
    s = SCALES["demo"]
    marked = {d.id for d in c.evaluated if d.source == "books"}
    extra = lambda d: s.marks.copies * s.marks.length * (d.id in marked)  # noqa: E731
    assert all(
        s.book_min_words <= len(d.text.split()) - extra(d) <= s.book_max_words for d in books
    )
    web = [d for d in c.evaluated + c.reference if d.source == "web"]
    assert len(web) == s.n_web and all(len(d.text.split()) >= s.web_min_words for d in web)
    # Reference pool, members and non-members are disjoint; manifests cover exactly the evaluated docs.
    evaluated = {d.id for d in c.evaluated}
    reference = {d.id for d in c.reference}
    assert not evaluated & reference and len(evaluated) == len(c.evaluated)
    assert set(c.manifests["tiny"]) == evaluated == set(c.manifests["tiny-random"])
    assert {c.split[i] for i in reference} == {"reference"}
    assert all(c.manifests["tiny"][i] == (c.split[i] == "member") for i in evaluated)
    smol = c.manifests["smollm2"]
    assert sum(smol.values()) == s.smollm2_docs == len(smol) - sum(smol.values())
    assert all(c.manifests["tiny"][i] == y for i, y in smol.items())  # drawn from the tiny split


def test_demo_world_marks_every_shown_book_and_holds_two_order_benchmarks():
    from mia_ray.data.marks import count_in, normalize, published

    c, s = build_corpora("demo", seed=0), SCALES["demo"]
    shown = [d for d in c.evaluated if d.source == "books"]
    pub = published(c.key)
    assert len(c.key["marks"]) == len(shown) == 160 and c.key["copies"] == s.marks.copies
    source = {d.id: d.text for d in load_books(s.book_min_words, s.book_max_words)}
    for mk in c.key["marks"]:
        (f,) = mk["files"]
        text = next(d.text for d in shown if d.id == f)
        # Each shown book carries its own mark, copies times; without it, the scene itself.
        assert count_in(text, pub[mk["mark_id"]]) == s.marks.copies
        assert normalize(text.replace(pub[mk["mark_id"]], "")) == normalize(source[f])
    # The reference pool's books are the scenes as they are.
    assert all(d.text == source[d.id] for d in c.reference if d.source == "books")
    # Two benchmarks of distinct one-line cloze items, none from a lead the world uses.
    pub_b, held = c.benchmarks["published"], c.benchmarks["held-out"]
    assert len(pub_b) == len(held) == s.benchmark.items
    texts = [r["text"] for r in pub_b + held]
    assert len(set(texts)) == len(texts) and all("____" in t and "\n" not in t for t in texts)
    assert all(re.fullmatch(r".+ Answer: \S+", t) for t in texts)
    assert build_corpora("demo", seed=0).benchmarks == c.benchmarks
    # The test world stays unmarked, without a benchmark: its snapshot numbers hold.
    t = build_corpora("test", seed=0)
    assert t.key is None and t.benchmarks == {}


def test_demo_corpora_are_deterministic_from_the_seed():
    a, b = build_corpora("test", seed=0), build_corpora("test", seed=0)
    assert a.manifests == b.manifests and a.split == b.split
    assert build_corpora("test", seed=1).split != a.split


def test_corpora_module_imports_neither_torch_nor_ray():
    code = (
        "import sys, mia_ray.demo.corpora, mia_ray.demo.world; "
        "print(any(m in sys.modules for m in ('torch', 'ray', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
