"""Exact matches of long word spans against a reference store (the leakage survey's
copyright and benchmark scans: a document leaks a reference text when ``span`` consecutive
words of it, about 300 in the paper, occur in the document).

Words are normalised before hashing (NFKC, lower case, runs of letters/digits with inner
apostrophes), so a copy that only changes line breaks, case or punctuation still matches.
Each word gets a 64-bit BLAKE2b hash; a window of ``span`` words hashes to the polynomial
``sum_t h[j+t] * B**(span-1-t) mod 2**64``, computed for every window at once with numpy.
The store is a sorted uint64 array with, per hash, the reference text and word position it
came from; a lookup is one ``searchsorted`` per batch of query hashes.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mia_ray.errors import MiaError

_WORD = re.compile(r"\w+(?:['’]\w+)*")
# An odd 64-bit multiplier: windows that differ anywhere hash apart except with probability
# about 2**-64 per pair (word hashes are independent uniform 64-bit values).
_BASE = np.uint64(0x9E3779B97F4A7C15)


def words_with_offsets(text: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Normalised words of ``text`` and each word's character [start, end) in ``text``."""
    words, starts, ends = [], [], []
    for m in _WORD.finditer(text):  # NFKC per word, so offsets stay those of ``text``
        words.append(unicodedata.normalize("NFKC", m.group()).lower().replace("’", "'"))
        starts.append(m.start())
        ends.append(m.end())
    return words, np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)


def word_hashes(words: list[str]) -> np.ndarray:
    """(n,) uint64: BLAKE2b-64 of each word."""
    return np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
            for w in words
        ),
        dtype=np.uint64,
        count=len(words),
    )


def window_hashes(words: list[str], span: int) -> np.ndarray:
    """(max(0, n - span + 1),) uint64: the hash of every window of ``span`` words."""
    if span < 1:
        raise MiaError(f"the shingle span must be at least 1 word, not {span}")
    n = len(words) - span + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = word_hashes(words)
    out = np.zeros(n, dtype=np.uint64)
    power = np.uint64(1)
    with np.errstate(over="ignore"):  # arithmetic mod 2**64 is the point
        for t in range(span - 1, -1, -1):
            out += h[t : t + n] * power
            power = power * _BASE
    return out


@dataclass(frozen=True)
class SpanMatch:
    """A run of matching windows in a document: words [word_start, word_end), characters
    [char_start, char_end), and where its first window sits in the reference text."""

    ref: int
    ref_word: int
    word_start: int
    word_end: int
    char_start: int
    char_end: int


class ShingleStore:
    """Hashes of every ``span``-word window of the reference texts.

    ``hashes`` (m,) sorted uint64; ``ref`` (m,) int32 index into ``ref_ids``; ``pos`` (m,)
    int32 word position of the window in its reference text. Texts shorter than ``span``
    words are left out (the paper drops them too) and counted in ``skipped``.
    """

    def __init__(
        self,
        span: int,
        ref_ids: list[str],
        hashes: np.ndarray,
        ref: np.ndarray,
        pos: np.ndarray,
        skipped: int = 0,
    ):
        order = np.argsort(hashes, kind="stable")
        self.span = int(span)
        self.ref_ids = list(ref_ids)
        self.hashes = np.asarray(hashes, dtype=np.uint64)[order]
        self.ref = np.asarray(ref, dtype=np.int32)[order]
        self.pos = np.asarray(pos, dtype=np.int32)[order]
        self.skipped = int(skipped)

    @classmethod
    def build(cls, texts: Iterable[tuple[str, str]], span: int) -> ShingleStore:
        """From ``(ref_id, text)`` pairs."""
        return cls.from_hashes(
            ((ref_id, window_hashes(words_with_offsets(text)[0], span)) for ref_id, text in texts),
            span,
        )

    @classmethod
    def from_hashes(cls, items: Iterable[tuple[str, np.ndarray]], span: int) -> ShingleStore:
        """From ``(ref_id, window hashes)`` pairs hashed elsewhere (e.g. by Ray Data workers);
        a text with no window (shorter than ``span``) is counted in ``skipped``."""
        ids, hs, refs, poss, skipped = [], [], [], [], 0
        for ref_id, h in items:
            h = np.asarray(h, dtype=np.uint64)
            if not len(h):
                skipped += 1
                continue
            refs.append(np.full(len(h), len(ids), dtype=np.int32))
            poss.append(np.arange(len(h), dtype=np.int32))
            hs.append(h)
            ids.append(str(ref_id))
        if not ids:
            raise MiaError(f"no reference text has {span} words or more: nothing to match against")
        return cls(
            span, ids, np.concatenate(hs), np.concatenate(refs), np.concatenate(poss), skipped
        )

    @classmethod
    def merge(cls, parts: list[ShingleStore]) -> ShingleStore:
        """One store from stores built apart (e.g. by parallel workers) with the same span."""
        if not parts or len({p.span for p in parts}) != 1:
            raise MiaError("stores to merge must exist and share one span")
        ids, hs, refs, poss, offset = [], [], [], [], 0
        for p in parts:
            ids += p.ref_ids
            hs.append(p.hashes)
            refs.append(p.ref + offset)
            poss.append(p.pos)
            offset += len(p.ref_ids)
        return cls(
            parts[0].span,
            ids,
            np.concatenate(hs),
            np.concatenate(refs),
            np.concatenate(poss),
            sum(p.skipped for p in parts),
        )

    def __len__(self) -> int:
        return len(self.hashes)

    def lookup(self, queries: np.ndarray) -> np.ndarray:
        """(q,) int64: for each query hash an index into the store, or -1 when absent."""
        queries = np.asarray(queries, dtype=np.uint64)
        at = np.searchsorted(self.hashes, queries)
        at_c = np.minimum(at, max(len(self.hashes) - 1, 0))
        hit = (at < len(self.hashes)) & (self.hashes[at_c] == queries)
        return np.where(hit, at_c, -1).astype(np.int64)

    def match(self, text: str) -> list[SpanMatch]:
        """Maximal runs of consecutive windows of ``text`` found in the store that continue
        one reference text in order (at consecutive reference positions). A window that
        several references share (a question quoting its passage) keeps every alignment
        alive; a run names the first reference id, by id, of those it follows to its end, so
        the result does not depend on the order the store was built in."""
        words, starts, ends = words_with_offsets(text)
        queries = window_hashes(words, self.span)
        lo = np.searchsorted(self.hashes, queries, side="left")
        hi = np.searchsorted(self.hashes, queries, side="right")
        out: list[SpanMatch] = []
        first = last = -1
        alive: set[tuple[int, int]] = set()  # (ref, its position at the run's first window)
        for j in np.flatnonzero(hi > lo).tolist():
            cands = {(int(self.ref[k]), int(self.pos[k])) for k in range(lo[j], hi[j])}
            if alive and j == last + 1:
                kept = {(r, p - (j - first)) for r, p in cands} & alive
                if kept:
                    alive, last = kept, j
                    continue
            if alive:
                out.append(self._span(alive, first, last, starts, ends))
            alive, first, last = set(cands), j, j
        if alive:
            out.append(self._span(alive, first, last, starts, ends))
        return out

    def _span(self, alive, first: int, last: int, starts: np.ndarray, ends: np.ndarray):
        ref, ref_word = min(alive, key=lambda a: (self.ref_ids[a[0]], a[1]))
        end_word = last + self.span
        return SpanMatch(
            ref, ref_word, first, end_word, int(starts[first]), int(ends[end_word - 1])
        )

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(
            tmp,
            span=self.span,
            ref_ids=np.asarray(self.ref_ids, dtype=object),
            hashes=self.hashes,
            ref=self.ref,
            pos=self.pos,
            skipped=self.skipped,
        )
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> ShingleStore:
        with np.load(path, allow_pickle=True) as z:
            return cls(
                int(z["span"]),
                [str(x) for x in z["ref_ids"]],
                z["hashes"],
                z["ref"],
                z["pos"],
                int(z["skipped"]),
            )
