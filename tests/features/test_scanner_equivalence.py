"""The fast leakage scanner (one Hyperscan pass and numpy over a batch, exact regexes only where
they can match) against the frozen slow one in ``_reference_scanner.py``: the same findings
JSON and word counts, document for document, on corpus pages with every PII type, person names
and copied spans planted, and on random text built to trip the prefilters (Unicode digits and
case folds, apostrophes, lookbehind edges, near-miss values)."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pandas as pd
import pytest

from mia_ray.actors.scanner import LeakScanner
from mia_ray.demo.corpora import load_books, web_pool
from mia_ray.demo.crawl import PII_KINDS, PLANTED_NAMES, TEMPLATES, pii_value
from mia_ray.features import pii
from mia_ray.features.leaks import sentence_bounds
from mia_ray.features.shingles import ShingleStore, vocabulary, window_hashes, words_with_offsets
from mia_ray.features.textbatch import TextBatch

# Pieces that sit on the edges of the prefilters: characters the view maps (Unicode digits and
# spaces, case folds of ASCII letters, ’), lookbehind and word-boundary edges, near misses.
TRICKY = [
    "e:", "::", "a::b", "fe80::1", "2001:db8::1", "::ffff:192.0.2.128", "10:30:45", "Note: ",
    "O'Brien", "D’Angelo", "O’Connor", "J'Ames Miller", "M’Ary Johnson", "Dr. O'Brien", "MaryAnn", "JaMes", "Mary-Jones", "Smith-Mary", "St.Mary",
    "Dr.", "Dr. J. Nguyen", "Mr", "Mrs.", "Prof", "J.", "Mary\nJohnson", "Mary  Johnson",
    "born", "BORN", "Born:", "b.", "(b. 14 Aug 1948)", "DOB", "D.O.B.", "passport", "paſſport",
    "bİrthday", "birthdaY", "\u212a", "ſ", "İ", "ı", "٣", "١٢٣-٤٥-٦٧٨٩", "\u00a0", "\x1c", "\x0b",
    "\u2028", "’", "é", "ﬁ", "½", "ΟΔΟΣ", "Σ", "e\u0301", "_x", "@", "x@y", "a@b.co",
    "icon@2x.png", "+1", "+44 20 7946 0958", "+12 degrees", "4111 1111 1111 1111",
    "4111 1111 1111 1112", "AT91 4398 2597 9190 7482", "DE89 3704 0044 0532 0130 00",
    "192.168.1.10", "1.2.3.4.5", "00:1A:2B:3C:4D:5E", "0023.04ab.cdef", "1600 Pennsylvania Avenue NW",
    "the 12 Main St", "42 Maple Street", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.", "eyJ", "AKIAIOSFODNN7EXAMPLE",
    "-----BEGIN RSA PRIVATE KEY-----", "------BEGIN PRIVATE KEY-----", "1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa",
    "1HGCM82633A004352", "K1234567", "12 March 1984", "March 5, 1962", "03/14/1978", "536-22-8890",
    "130 692 544", "AB 12 34 56 C", "(212) 555-0147", "415-555-0199", "https://a:b@c.de",
    "postgres://admin:s3cr3t@db.internal:5432/app", ". ", "! ", "? ", ".\n", "\n", "  ", "-", "(",
    ")", "'", '"', ",", "Mary Johnson", "James Miller", "Karen Smith-Jones", "Mr. John Q. Smith",
]  # fmt: skip
WORDS = "the of and in a to was is for on as with by he at from his an were are".split()


def _random_text(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.35:
            out.append(rng.choice(TRICKY))
        elif r < 0.45:
            kind = rng.choice(PII_KINDS)
            out.append(
                TEMPLATES[kind].format(name=rng.choice(PLANTED_NAMES), value=pii_value(kind, rng))
            )
        elif r < 0.55:
            out.append(
                "".join(
                    rng.choice("0123456789 -.:/ABCDEFabcdef") for _ in range(rng.randint(3, 24))
                )
            )
        else:
            out.append(rng.choice(WORDS).capitalize() if rng.random() < 0.2 else rng.choice(WORDS))
        out.append(rng.choice([" ", " ", " ", "", "\n", ". ", ", ", "  "]))
    return "".join(out)


def _copy_of(rng: random.Random, text: str, words: int) -> str:
    """``words`` words of ``text`` from a random place, re-cased and re-punctuated at times."""
    toks = text.split()
    first = rng.randint(0, max(0, len(toks) - words))
    piece = " ".join(toks[first : first + words])
    if rng.random() < 0.5:
        piece = piece.upper() if rng.random() < 0.5 else piece.replace(" ", "\n")
    return piece


@pytest.fixture(scope="module")
def world():
    rng = random.Random(17)
    leads = [t for _, t in web_pool()]
    books = load_books(min_words=200)
    copyright_refs = [(b.id, b.text) for b in rng.sample(books, 6)]
    bench_refs = [(f"item-{i}#passage", t) for i, t in enumerate(rng.sample(leads, 30))]
    stores = {
        "copyright": ShingleStore.build(copyright_refs, 40),
        "benchmark": ShingleStore.build(bench_refs, 12),
    }
    pages = []
    for _ in range(360):
        paras = rng.sample(leads, rng.randint(1, 4))
        for kind in rng.sample(PII_KINDS, rng.choice((0, 1, 3))):
            rec = TEMPLATES[kind].format(name=rng.choice(PLANTED_NAMES), value=pii_value(kind, rng))
            k = rng.randrange(len(paras))
            paras[k] = paras[k].rstrip() + " " + rec
        if rng.random() < 0.15:
            paras.insert(0, _copy_of(rng, rng.choice(copyright_refs)[1], rng.randint(30, 90)))
        if rng.random() < 0.15:
            paras.append(_copy_of(rng, rng.choice(bench_refs)[1], rng.randint(10, 40)))
        if rng.random() < 0.1:
            paras.append(rng.choice(books).text[:3000])
        if rng.random() < 0.3:
            paras.insert(rng.randint(0, len(paras)), _random_text(rng, rng.randint(5, 120)))
        pages.append("\n\n".join(paras) if rng.random() < 0.9 else _random_text(rng, 200))
    pages += ["", " ", "\n", "a", "Mary Johnson", "’", "٣٣٣-٤٤-٥٥٥٥"]
    return pages, stores


def _scanner(tmp_path, stores, pii_types=(), names=True) -> LeakScanner:
    paths = {}
    for category, store in stores.items():
        paths[category] = str(tmp_path / f"{category}.npz")
        store.save(paths[category])
    return LeakScanner(paths, list(pii_types), names, 64)


def _check(ref, scanner, pages, stores, pii_types=None, names=True, batch=64) -> set[str]:
    """Scan ``pages`` in batches of 1 to ``batch`` texts; returns the finding types seen."""
    rng = random.Random(batch)
    kinds: set[str] = set()
    i = 0
    while i < len(pages):
        n = rng.randint(1, batch)
        texts = pages[i : i + n]
        df = pd.DataFrame({"doc_id": [str(i + k) for k in range(len(texts))], "shard": "s",
                           "text": texts})  # fmt: skip
        got = scanner(df)
        for k, text in enumerate(texts):
            want_json, want_words = ref.scan_document(text, stores, pii_types, names)
            assert got["findings"][k] == want_json, (i + k, text[:200])
            assert got["words"][k] == want_words, (i + k, text[:200])
            kinds.update(f["type"] for f in json.loads(want_json))
        i += n
    return kinds


def test_same_findings_as_the_reference_scanner(world, tmp_path, ref):
    pages, stores = world
    kinds = _check(ref, _scanner(tmp_path, stores), pages, stores)
    # Every PII type, names and both stores are exercised, not only agreed on.
    assert kinds >= {*pii.PII_TYPE_NAMES, "person_name", "copyright", "benchmark"}, kinds


def test_same_findings_for_a_subset_of_types_and_without_names(world, tmp_path, ref):
    pages, stores = world
    types = ["email", "ipv6", "date_of_birth", "passport_number", "street_address"]
    scanner = _scanner(tmp_path, {"copyright": stores["copyright"]}, types, names=False)
    _check(ref, scanner, pages[:150], {"copyright": stores["copyright"]}, types, names=False)


def test_same_findings_without_hyperscan_or_a_store_vocabulary(world, tmp_path, monkeypatch, ref):
    pages, stores = world
    monkeypatch.setattr(pii, "_prefilter", lambda types, names: None)
    scanner = _scanner(tmp_path, stores)
    for store in scanner.stores.values():
        store.vocab = None  # a store saved before it kept one
    _check(ref, scanner, pages[:120], stores)


def test_same_findings_on_random_text(tmp_path, ref):
    rng = random.Random(5)
    stores = {
        "copyright": ShingleStore.build([("r", " ".join(rng.choice(TRICKY) for _ in range(80)))], 8)
    }
    pages = [_random_text(rng, rng.randint(1, 300)) for _ in range(250)]
    _check(ref, _scanner(tmp_path, stores), pages, stores, batch=16)


ALPHABET = "aZ09_ '’-.\n\t\u00a0\u2028\x1c\x0b٣é\u0301ﬁ½ΣΟςİıſ\u212a@:"


def test_words_counts_and_offsets_match_the_regex(ref):
    rng = random.Random(3)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 60))) for _ in range(3000)]
    batch = TextBatch(texts)
    counts = batch.word_counts()
    starts, ends, first = batch.words
    fp, ascii_ = batch.fingerprints_of(np.arange(len(starts)))
    for i, text in enumerate(texts):
        words, s, e = ref.words_with_offsets(text)
        got = words_with_offsets(text)
        assert got[0] == words and got[1].tolist() == s.tolist() and got[2].tolist() == e.tolist()
        assert counts[i] == len(words)
        at = batch.offsets[i]
        assert (starts[first[i] : first[i + 1]] - at).tolist() == s.tolist()
        assert (ends[first[i] : first[i + 1]] - at).tolist() == e.tolist()
        for k, w in zip(range(first[i], first[i + 1]), words, strict=True):
            # An ASCII word's fingerprint is its normal form's, as the store's vocabulary has it.
            assert ascii_[k] == text[starts[k] - at : ends[k] - at].isascii()
            if ascii_[k]:
                assert vocabulary([w]).tolist() == [fp[k]]


def test_window_hashes_equal_the_term_by_term_sum(ref):
    rng = random.Random(4)
    words = [rng.choice(WORDS) for _ in range(500)]
    for span in (1, 2, 7, 300, 500, 501):
        assert np.array_equal(window_hashes(words, span), ref.window_hashes(words, span))


def test_sentence_bounds_equal_the_scan_from_the_start(ref):
    rng = random.Random(6)
    pieces = ["Word", "word", ".", "!", "?", " ", "  ", "\n", " \n ", "(", '"', "'", "x", "Q"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        start = rng.randint(0, len(text) - 1)
        end = rng.randint(start + 1, len(text))
        assert sentence_bounds(text, start, end) == ref.sentence_bounds(text, start, end), text


def test_prefilter_patterns_accept_every_match_and_cores_are_prefixes(world):
    pages, stores = world
    for t in pii.PII_TYPES:
        stripped = pii._without_lookarounds(t.pattern.pattern)
        core = pii._core(stripped)
        assert not re.search(r"\(\?<?[=!]", stripped), (t.name, stripped)
        for text in pages:
            for m in t.pattern.finditer(text):
                assert re.fullmatch(stripped, m.group(), t.pattern.flags), (t.name, m.group())
                c = re.match(core, m.group(), t.pattern.flags)
                assert c, (t.name, m.group())
                if t.name in ("email", "url_credentials", "jwt"):
                    # The prefilter starts their search after the last whitespace before a
                    # core's end: their core matches hold none, and it locates that end with
                    # the core from its first literal on, which matches there too.
                    assert not re.search(r"\s", c.group()), (t.name, c.group())
                    tail = pii._from_literal(core)
                    assert re.fullmatch(f"(?s:.*)(?:{tail})", c.group(), t.pattern.flags)
                    continue
                if t.name == "street_address":
                    continue  # an unbounded core: no geometry to check
                cmin, cmax, reads = pii._geometry(t.pattern, core)
                assert cmin <= c.end() <= cmax and len(m.group()) <= reads


def test_whitespace_analysis_of_cores():
    def holds(pattern: str) -> bool:
        return pii._may_hold_space(pii._sre_parse.parse(pattern))

    assert [holds(p) for p in (r"a\sb", "a b", r"[^x]", r"[^\S]", "a.b", "(?:x|\u00a0)", r"\D")] == [
        True, True, True, True, True, True, True
    ]  # fmt: skip
    assert [holds(p) for p in (r"[^\s:]+@x", r"\w+", r"(?i:ab){2,}", r"[a-z0-9._%+-]*", r"\d+\b")] == [
        False, False, False, False, False
    ]  # fmt: skip
    solid = pii._prefilter(pii.PII_TYPE_NAMES, True).solid
    assert sorted(pii.PII_TYPES[k].name for k in solid) == ["email", "jwt", "url_credentials"]


def test_a_solid_core_is_located_from_its_first_literal():
    core = pii._core(pii._without_lookarounds(pii._BY_NAME["email"].pattern.pattern))
    assert core.startswith("[A-Za-z0-9][A-Za-z0-9._%+-]*@")
    assert pii._from_literal(core) == core[core.index("@") :]
    assert pii._from_literal(r"ab[0-9]+") == r"ab[0-9]+"  # a literal first: the whole core
    assert pii._from_literal(r"[a-z]+\.x") == "x"  # an escape is not read as a literal
    assert pii._from_literal(r"[a-z]+x|y") == r"[a-z]+x|y"  # top-level branches: whole
    assert pii._from_literal(r"[a-z]+") == r"[a-z]+"  # no literal: whole


def test_names_read_at_candidates_equal_the_whole_text_reading_for_every_gap():
    gaps = [" ", "  ", "   ", "\u00a0", " \u00a0", "\t", "\x0b", "\u2028", "\n", " \n", ".", ". ",
            ".  ", ".   ", " .", "", "-"]  # fmt: skip
    words = [
        (a, b, c)
        for a in ("Mary", "Dr", "Mr.", "J.")
        for b in ("Johnson", "J.", "Mary", "Ann")
        for c in ("Smith", "x", "")
    ]
    # Every pair of gaps, each with 4 of the 48 word triples (seeded): every triple meets
    # ~24 gap pairs, in a fifth of the time of all 13,872 texts.
    rng = random.Random(0)
    texts = [f"{a}{g}{b}{h}{c}" for g in gaps for h in gaps for a, b, c in rng.sample(words, 4)]
    got = pii.scan_pii_many(texts, types=[], names=True)
    assert sum(map(len, got)) > 150  # names are found, at many gaps
    for text, found in zip(texts, got, strict=True):
        assert found == pii.find_person_names(text), repr(text)


def test_text_sizes_in_characters_and_utf8_bytes():
    rng = random.Random(7)
    alphabet = "ab \n.é’ﬁ€😀\u0800\u07ff\U00010000"
    texts = ["", "plain ascii", *("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
                                  for _ in range(200))]  # fmt: skip
    laid = TextBatch(texts)
    assert laid.sizes().tolist() == [len(t) for t in texts]
    assert laid.utf8_sizes().tolist() == [len(t.encode()) for t in texts]
    ascii_only = TextBatch(["abc", "", "de"])
    assert ascii_only.utf8_sizes().tolist() == [3, 0, 2]


def test_the_prefilter_database_and_view_table_read_back_from_their_files(tmp_path, monkeypatch):
    hyperscan = pytest.importorskip("hyperscan")
    from mia_ray.features import textbatch

    monkeypatch.setenv("MIA_RAY_HOME", str(tmp_path))
    rng = random.Random(11)
    texts = [_random_text(rng, 60) for _ in range(20)]
    want = pii._Prefilter(hyperscan, pii.PII_TYPES, True).scan(TextBatch(texts))
    (db,) = (tmp_path / "hyperscan").glob("prefilter-*.hsdb")
    assert pii._Prefilter(hyperscan, pii.PII_TYPES, True).scan(TextBatch(texts)) == want
    db.write_bytes(b"not a database")  # unreadable: compiled again, and written again
    assert pii._Prefilter(hyperscan, pii.PII_TYPES, True).scan(TextBatch(texts)) == want
    assert db.read_bytes() != b"not a database"
    textbatch.view_table.cache_clear()
    try:
        assert np.array_equal(textbatch.view_table(), textbatch._view_table())  # written
        textbatch.view_table.cache_clear()
        assert np.array_equal(textbatch.view_table(), textbatch._view_table())  # read back
        assert len(list((tmp_path / "hyperscan").glob("view-*.npy"))) == 1
    finally:
        textbatch.view_table.cache_clear()
