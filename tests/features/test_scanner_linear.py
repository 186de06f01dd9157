"""The leakage scanner's helpers that once read a long record from its start (or to its end)
once per finding or report: the same answers as before, and their work counted (characters
read, pieces marked), never timed, to grow with the record and not with its square."""

from __future__ import annotations

import bisect
import dataclasses
import random
import re
import sys

import pytest

from mia_ray.features import leaks, pii
from mia_ray.features.leaks import sentence_bounds_many
from mia_ray.features.pii import PiiMatch


class _Reads:
    """A compiled pattern whose searches count the characters they read: from where each
    starts to where its match ends, or to the end of what it may read when none is found."""

    def __init__(self, pattern: re.Pattern[str]):
        self.pattern, self.read = pattern, 0

    def search(self, text: str, pos: int = 0, endpos: int = sys.maxsize):
        m = self.pattern.search(text, pos, endpos)
        self.read += (m.end() if m else min(endpos, len(text))) - pos
        return m

    def finditer(self, text: str, pos: int = 0, endpos: int = sys.maxsize):
        at = pos
        for m in self.pattern.finditer(text, pos, endpos):
            self.read += m.end() - at
            at = m.end()
            yield m
        self.read += min(endpos, len(text)) - at


class _CountedStr(str):
    """A text whose ``find`` and ``rfind`` count the characters they read: from where each
    starts to what it finds, or over their whole range."""

    read = 0

    def find(self, sub, start=0, end=sys.maxsize):  # type: ignore[override]
        at = str.find(self, sub, start, end)
        type(self).read += (at if at >= 0 else min(end, len(self))) - start
        return at

    def rfind(self, sub, start=0, end=sys.maxsize):  # type: ignore[override]
        at = str.rfind(self, sub, start, end)
        type(self).read += min(end, len(self)) - (at if at >= 0 else start)
        return at


class _CountedBytes(bytes):
    read = 0

    def rfind(self, sub, start=0, end=sys.maxsize):  # type: ignore[override]
        at = bytes.rfind(self, sub, start, end)
        type(self).read += min(end, len(self)) - (at if at >= 0 else start)
        return at


def test_sentence_bounds_of_many_spans_equal_the_scan_from_the_start(ref):
    rng = random.Random(8)
    pieces = ["Word", "word", ".", "!", "?", " ", "  ", "\n", " \n ", "(", '"', "'", "x", "Q"]
    for _ in range(600):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
        spans = []
        for _ in range(rng.randint(1, 8)):  # in any order, overlapping or not
            start = rng.randint(0, len(text) - 1)
            spans.append((start, rng.randint(start + 1, len(text))))
        want = [ref.sentence_bounds(text, a, b) for a, b in spans]
        assert sentence_bounds_many(text, spans) == want, (text, spans)


@pytest.mark.parametrize("sep", [" ", ". ", ".\n", "; "])
def test_sentence_bounds_read_a_record_about_once_for_any_number_of_findings(sep, monkeypatch, ref):
    """A long record and a value every 40 characters: the breaks, paragraphs and values are
    each found by readings that never cover a stretch twice (searching from each value read
    the record's paragraph, or the rest of it, once per value)."""
    counted = _Reads(leaks._AFTER_PUNCT)
    monkeypatch.setattr(leaks, "_AFTER_PUNCT", counted)
    for n in (500, 2000):
        plain = sep.join(f"Call 555-{i:04d} now" for i in range(n))
        spans = [(m.start(), m.end()) for m in re.finditer(r"555-\d{4}", plain)]
        counted.read = _CountedStr.read = 0
        got = sentence_bounds_many(_CountedStr(plain), spans)
        assert counted.read <= 2 * len(plain) + 10 * len(spans)
        assert _CountedStr.read <= 3 * len(plain)
        assert got[::50] == [ref.sentence_bounds(plain, a, b) for a, b in spans[::50]]


def _resolve_by_insertion(found: list[PiiMatch]) -> list[PiiMatch]:
    """The overlap rule as the scanner first applied it: sorted lists kept by insertion."""
    found = sorted(
        found, key=lambda m: (-pii.PRIORITY.get(m.type, -1), -(m.end - m.start), m.start)
    )
    starts: list[int] = []
    kept: list[PiiMatch] = []
    for m in found:
        k = bisect.bisect_right(starts, m.start)
        if (k and kept[k - 1].end > m.start) or (k < len(kept) and kept[k].start < m.end):
            continue
        starts.insert(k, m.start)
        kept.insert(k, m)
    return kept


def test_the_overlap_rule_keeps_what_insertion_into_sorted_lists_kept():
    rng = random.Random(4)
    types = [*pii.PII_TYPE_NAMES, pii.PERSON_NAME]
    for _ in range(400):
        found = []
        for _ in range(rng.randint(2, 40)):
            a = rng.randint(0, 120)
            b = a + rng.randint(1, 25)  # never empty, as no pattern matches nothing
            found.append(PiiMatch(rng.choice(types), a, b, "x" * (b - a)))
        assert pii._resolve(list(found)) == _resolve_by_insertion(found)


def test_the_overlap_rule_marks_each_piece_about_once(monkeypatch):
    """Many findings, each overlapping its neighbours: the pieces read and marked grow with
    their number (inserting into sorted lists moved the lists' tails once per finding)."""

    class Marks(bytearray):
        work = 0

        def find(self, sub, start=0, end=sys.maxsize):  # type: ignore[override]
            type(self).work += min(end, len(self)) - start
            return bytearray.find(self, sub, start, end)

        def __setitem__(self, key, value):
            type(self).work += len(value) if isinstance(key, slice) else 1
            bytearray.__setitem__(self, key, value)

    monkeypatch.setattr(pii, "bytearray", Marks, raising=False)
    for n in (1000, 4000):
        Marks.work = 0
        found = [PiiMatch("email", 10 * i, 10 * i + 15, "") for i in range(n)]
        found += [PiiMatch("ipv4", 10 * i + 5, 10 * i + 12, "") for i in range(n)]
        kept = pii._resolve(list(found))
        assert kept == _resolve_by_insertion(found)
        assert Marks.work <= 8 * len(found)


def test_solid_starts_read_each_stretch_of_the_view_once():
    """Reports in one long stretch without whitespace: each start is found reading back to
    the last report, not to the text's start."""
    for n in (500, 2000):
        body = "".join(f"a{i}@b.co," for i in range(n))
        plain = f"one text\n{body} end".encode()
        first = plain.index(b"\n") + 1
        ends = [m.end() for m in re.finditer(rb"@b\.co", plain)]
        _CountedBytes.read = 0
        got = pii._after_last_space(_CountedBytes(plain), ends, [first] * len(ends))
        assert _CountedBytes.read <= 5 * len(plain)
        assert got == dict.fromkeys(ends, first)  # no whitespace between the text's start and any


def test_unbounded_searches_read_on_once_for_many_reports():
    """Reports where no email is (handles like @user.name), then one address at the end:
    one search finds the address and serves every report before it."""
    email = pii._BY_NAME["email"]
    for n in (500, 2000):
        text = "".join(f"follow @user{i}.name now " for i in range(n)) + "mail bo@example.org"
        # Where a match may start, as the prefilter says: after the space before each "@".
        spans = [(text.rfind(" ", 0, m.start()) + 1, m.start()) for m in re.finditer("@", text)]
        counted = _Reads(email.pattern)
        out: list[PiiMatch] = []
        pii._find_near(
            dataclasses.replace(email, pattern=counted), text, spans, pii._UNBOUNDED, out
        )
        assert [m.value for m in out] == ["bo@example.org"]
        assert counted.read <= 2 * len(text)


def test_sentence_bounds_of_a_batch_equal_the_scan_from_the_start(ref):
    import numpy as np

    from mia_ray.features.leaks import sentence_bounds_batch
    from mia_ray.features.textbatch import TextBatch

    rng = random.Random(5)
    pieces = ["a", "B", ".", "!", "?", " ", "  ", "\n", "\n\n", "’", "'", '"', "(", "\u00a0",
              "\x1c", "\x0b", "x", "Q", "é", "İ", ". ", ".\n", "?  ", " " * 12, "\n" * 9,
              ". " + " " * 15 + "\n"]  # fmt: skip
    for _ in range(1500):
        texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
                 for _ in range(rng.randint(1, 6))]  # fmt: skip
        spans = [(i, a, rng.randint(a + 1, len(t)))
                 for i, t in enumerate(texts) if t for a in [rng.randrange(len(t))]]  # fmt: skip
        if not spans:
            continue
        d, a, b = (np.array(x, dtype=np.int64) for x in zip(*spans, strict=True))
        got_a, got_b = sentence_bounds_batch(TextBatch(texts), d, a, b)
        want = [ref.sentence_bounds(texts[i], x, y) for i, x, y in spans]
        assert list(zip(got_a.tolist(), got_b.tolist(), strict=True)) == want, texts
