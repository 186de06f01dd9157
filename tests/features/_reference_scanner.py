"""The leakage scanner as it was before its prefilters (frozen): the slow, obvious reading of
the same rules, which the fast scanner must reproduce finding for finding.

It takes the rules themselves from the package (the PII type table with its patterns,
validators, context words and priorities; the name lists and token pattern; a store's
hashes), and applies them the plain way: every regex over every whole text, the name
pattern over every capitalised token, every word NFKC-normalised and hashed, every window
hash summed term by term, every sentence break found from the start of the text.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import unicodedata

import numpy as np

from mia_ray.features.pii import (
    HONORIFICS,
    NAME_TOKEN,
    PII_TYPES,
    PRIORITY,
    PiiMatch,
    match_key,
    name_lists,
    space_of,
)
from mia_ray.features.shingles import ShingleStore, SpanMatch

_CONTEXT_SLACK = 64
_WORD = re.compile(r"\w+(?:['’]\w+)*")
_BASE = np.uint64(0x9E3779B97F4A7C15)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


# ------------------------------------------------------------------------------ PII


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def context_ends(t, text: str, lower: str) -> list[int]:
    if len(lower) != len(text):
        return [m.end() for m in t.context_re.finditer(text)] if t.context_re else []
    ends = set()
    for word in t.context:
        w = word.lower()
        i = lower.find(w)
        while i >= 0:
            j = i + len(w)
            if not (w[0].isalnum() and i and _is_word(text[i - 1])) and not (
                w[-1].isalnum() and j < len(text) and _is_word(text[j])
            ):
                ends.add(j)
            i = lower.find(w, i + 1)
    return sorted(ends)


def find(t, text: str, lower: str):
    if t.hints and not any(h in text for h in t.hints):
        return
    if not t.context:
        starts = ((0, len(text)),)
    else:
        starts = (
            (e, min(len(text), e + t.window + _CONTEXT_SLACK)) for e in context_ends(t, text, lower)
        )
    seen: set[int] = set()
    for pos, endpos in starts:
        limit = pos + t.window if t.context else len(text)
        while (m := t.pattern.search(text, pos, endpos)) and m.start() <= limit:
            start, value = m.start(), m.group()
            if t.validator is not None and not t.validator(value):
                pos = start + 1
                continue
            pos = m.end()
            if start not in seen:
                seen.add(start)
                yield PiiMatch(t.name, start, m.end(), value)


def find_person_names(text: str) -> list[PiiMatch]:
    first, last = name_lists(1000, None)

    def surname(tok: str) -> bool:
        return tok[-1] != "." and all(match_key(p) in last for p in tok.split("-"))

    def full_name(i: int) -> int:
        if toks[i][2][-1] == "." or match_key(toks[i][2]) not in first:
            return -1
        if i + 2 < len(toks) and space_of(text[toks[i][1] : toks[i + 1][0]]):
            mid = toks[i + 1][2]
            if (mid[-1] == "." or match_key(mid) in first) and space_of(
                text[toks[i + 1][1] : toks[i + 2][0]]
            ):
                if surname(toks[i + 2][2]):
                    return i + 2
        if i + 1 < len(toks) and space_of(text[toks[i][1] : toks[i + 1][0]]):
            if surname(toks[i + 1][2]):
                return i + 1
        return -1

    toks = [(m.start(), m.end(), m.group()) for m in NAME_TOKEN.finditer(text)]
    out: list[PiiMatch] = []
    i = 0
    while i < len(toks):
        start, _, tok = toks[i]
        j = -1
        if tok in HONORIFICS and i + 1 < len(toks):
            gap = text[toks[i][1] : toks[i + 1][0]]
            if space_of(gap.removeprefix(".")):
                j = full_name(i + 1)
                if j < 0 and surname(toks[i + 1][2]):
                    j = i + 1
                elif (
                    j < 0
                    and toks[i + 1][2][-1] == "."
                    and i + 2 < len(toks)
                    and space_of(text[toks[i + 1][1] : toks[i + 2][0]])
                    and surname(toks[i + 2][2])
                ):
                    j = i + 2
        if j < 0:
            j = full_name(i)
        if j >= 0:
            end = toks[j][1]
            out.append(PiiMatch("person_name", start, end, text[start:end]))
            i = j + 1
        else:
            i += 1
    return out


def scan_pii(text: str, types=None, names: bool = True) -> list[PiiMatch]:
    chosen = PII_TYPES if types is None else tuple(t for t in PII_TYPES if t.name in set(types))
    lower = text.lower() if any(t.context for t in chosen) else text
    found = [m for t in chosen for m in find(t, text, lower)]
    if names:
        found.extend(find_person_names(text))
    found.sort(key=lambda m: (-PRIORITY.get(m.type, -1), -(m.end - m.start), m.start))
    starts: list[int] = []
    kept: list[PiiMatch] = []
    for m in found:
        k = bisect.bisect_right(starts, m.start)
        if k and kept[k - 1].end > m.start:
            continue
        if k < len(kept) and kept[k].start < m.end:
            continue
        starts.insert(k, m.start)
        kept.insert(k, m)
    return kept


# ------------------------------------------------------------------------------ stores


def words_with_offsets(text: str):
    words, starts, ends = [], [], []
    for m in _WORD.finditer(text):
        words.append(unicodedata.normalize("NFKC", m.group()).lower().replace("’", "'"))
        starts.append(m.start())
        ends.append(m.end())
    return words, np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)


def window_hashes(words: list[str], span: int) -> np.ndarray:
    n = len(words) - span + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
            for w in words
        ),
        dtype=np.uint64,
        count=len(words),
    )
    out = np.zeros(n, dtype=np.uint64)
    power = np.uint64(1)
    with np.errstate(over="ignore"):
        for t in range(span - 1, -1, -1):
            out += h[t : t + n] * power
            power = power * _BASE
    return out


def match(store: ShingleStore, text: str) -> list[SpanMatch]:
    words, starts, ends = words_with_offsets(text)
    queries = window_hashes(words, store.span)
    lo = np.searchsorted(store.hashes, queries, side="left")
    hi = np.searchsorted(store.hashes, queries, side="right")

    def span(alive, first, last):
        ref, ref_word = min(alive, key=lambda a: (store.ref_ids[a[0]], a[1]))
        end_word = last + store.span
        return SpanMatch(
            ref, ref_word, first, end_word, int(starts[first]), int(ends[end_word - 1])
        )

    out: list[SpanMatch] = []
    first = last = -1
    alive: set[tuple[int, int]] = set()
    for j in np.flatnonzero(hi > lo).tolist():
        cands = {(int(store.ref[k]), int(store.pos[k])) for k in range(lo[j], hi[j])}
        if alive and j == last + 1:
            kept = {(r, p - (j - first)) for r, p in cands} & alive
            if kept:
                alive, last = kept, j
                continue
        if alive:
            out.append(span(alive, first, last))
        alive, first, last = set(cands), j, j
    if alive:
        out.append(span(alive, first, last))
    return out


# ------------------------------------------------------------------------------ instances


def sentence_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    a, b = 0, len(text)
    for m in _SENTENCE_END.finditer(text):
        if m.end() <= start:
            a = m.end()
        elif m.start() >= end:
            b = m.start()
            break
    para = text.rfind("\n", 0, start)
    a = max(a, para + 1)
    nl = text.find("\n", end)
    b = min(b, nl) if nl >= 0 else b
    return a, b


def instance_span(text: str, start: int, end: int, category: str, max_words: int):
    if category == "pii":
        return sentence_bounds(text, start, end)
    _, starts, ends = words_with_offsets(text[start:end])
    if not len(starts):
        return start, end
    last = min(len(ends), max_words) - 1
    return start + int(starts[0]), start + int(ends[last])


def scan_document(
    text: str, stores: dict[str, ShingleStore], pii_types=None, names=True, instance_words=64
) -> tuple[str, int]:
    """(the findings JSON, the word count) ``LeakScanner`` writes for one document."""
    rows = [
        {"category": "pii", "type": m.type, "start": m.start, "end": m.end,
         "value": m.value, "ref": ""}
        for m in scan_pii(text, pii_types, names=names)
    ]  # fmt: skip
    for category, store in stores.items():
        for m in match(store, text):
            rows.append(
                {"category": category, "type": category, "start": m.char_start,
                 "end": m.char_end, "value": text[m.char_start : m.char_end],
                 "ref": store.ref_ids[m.ref]}
            )  # fmt: skip
    for r in rows:
        if r["type"] != "person_name":
            a, b = instance_span(text, r["start"], r["end"], r["category"], instance_words)
            r["instance_start"], r["instance"] = a, text[a:b]
    return json.dumps(rows, ensure_ascii=False), len(words_with_offsets(text)[0])
