"""Exact matches of long word spans against a reference store (the leakage survey's
copyright and benchmark scans: a document leaks a reference text when ``span`` consecutive
words of it, about 300 in the paper, occur in the document).

Words are normalised before hashing (NFKC, lower case, runs of letters/digits with inner
apostrophes), so a copy that only changes line breaks, case or punctuation still matches.
Each word gets a 64-bit BLAKE2b hash; a window of ``span`` words hashes to the polynomial
``sum_t h[j+t] * B**(span-1-t) mod 2**64``, computed for every window at once with numpy.
The store is a sorted uint64 array with, per hash, the reference text and word position it
came from; a lookup is one ``searchsorted`` per batch of query hashes. It also keeps the
fingerprints of its texts' ASCII words (its vocabulary): :meth:`ShingleStore.match_many`
hashes only the texts of a batch that hold ``span`` consecutive words it may know (a word
outside its vocabulary cannot be in a matching window), which is few of them.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mia_ray.errors import MiaError
from mia_ray.features.textbatch import TextBatch, docs_with_runs, fingerprints

# The words: the matches of this pattern (located with numpy by ``TextBatch.words``).
_WORD = re.compile(r"\w+(?:['’]\w+)*")
# An odd 64-bit multiplier: windows that differ anywhere hash apart except with probability
# about 2**-64 per pair (word hashes are independent uniform 64-bit values).
_BASE = np.uint64(0x9E3779B97F4A7C15)
_BASE_INV = np.uint64(pow(0x9E3779B97F4A7C15, -1, 2**64))
_VOCAB_BITS = 22  # a store's vocabulary filter: 4 M bits, so ~0.1 % false hits per 4 k words
_VOCAB_STRIDE = 8  # match_many looks up every 8th word of a batch first


def words_with_offsets(text: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Normalised words of ``text`` and each word's character [start, end) in ``text``."""
    starts, ends, _ = TextBatch([text]).words  # the matches of _WORD, located with numpy
    return _normalised(text, starts, ends), starts, ends


def _normalised(text: str, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    if not len(starts):
        return []
    # NFKC per word, so offsets stay those of ``text``: all words at once, newline-separated
    # (a newline never composes with a neighbour, nor stops ``lower`` seeing a word's end).
    joined = "\n".join([text[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)])
    if not joined.isascii():
        joined = unicodedata.normalize("NFKC", joined).replace("’", "'")
    return joined.lower().split("\n")


def _run_words(
    text: str, starts: np.ndarray, ends: np.ndarray, first: np.ndarray, stop: np.ndarray,
    idx: np.ndarray,
) -> list[str]:  # fmt: skip
    """The normalised words ``idx`` of ``text`` (:func:`_normalised`): the runs of
    consecutive words ``[first[k], stop[k])``. An ASCII text's are its lower-cased words, read
    run by run with the word pattern (a run starts and ends at a word's edges)."""
    if text.isascii():
        lower, out = text.lower(), []
        for a, b in zip(starts[first].tolist(), ends[stop - 1].tolist(), strict=True):
            out += _WORD.findall(lower, a, b)
        if len(out) == len(idx):
            return out
    return _normalised(text, starts[idx], ends[idx])


_HASH_CACHE: dict[str, int] = {}
_HASH_CACHE_SIZE = 1 << 17  # words; about 15 MB


def word_hashes(words: list[str]) -> np.ndarray:
    """(n,) uint64: BLAKE2b-64 of each word (cached: text repeats its words)."""
    cache = _HASH_CACHE
    new = set(words).difference(cache)
    if len(cache) + len(new) > _HASH_CACHE_SIZE:
        cache.clear()
        new = set(words)
    for w in new:
        cache[w] = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
    return np.fromiter(map(cache.__getitem__, words), dtype=np.uint64, count=len(words))


def window_hashes(words: list[str], span: int) -> np.ndarray:
    """(max(0, n - span + 1),) uint64: the hash of every window of ``span`` words."""
    if span < 1:
        raise MiaError(f"the shingle span must be at least 1 word, not {span}")
    n = len(words) - span + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    # sum_t h[j+t] B**(span-1-t) = B**(span-1+j) * (P[j+span] - P[j]), P[i] = sum_{k<i} h[k] B**-k:
    # B is odd, so it has an inverse mod 2**64, and every window costs O(1).
    h = word_hashes(words)
    m = len(words)
    power = np.full(m + span, _BASE, dtype=np.uint64)
    inverse = np.full(m, _BASE_INV, dtype=np.uint64)
    power[0] = inverse[0] = 1
    power, inverse = np.cumprod(power), np.cumprod(inverse)  # products wrap mod 2**64
    prefix = np.zeros(m + 1, dtype=np.uint64)
    np.cumsum(h * inverse, out=prefix[1:])
    return (prefix[span:] - prefix[:n]) * power[span - 1 : span - 1 + n]


def vocabulary(words: list[str]) -> np.ndarray:
    """Sorted unique uint64 fingerprints (:func:`~mia_ray.features.textbatch.fingerprints`)
    of the ASCII words among normalised ``words``: a store's vocabulary."""
    kept = [w for w in words if w.isascii()]
    if not kept:
        return np.zeros(0, dtype=np.uint64)
    sizes = np.fromiter(map(len, kept), dtype=np.int64, count=len(kept))
    ends = np.cumsum(sizes)
    return np.unique(fingerprints("".join(kept).encode("ascii"), ends - sizes, ends))


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
    words are left out (the paper drops them too) and counted in ``skipped``. ``vocab``: the
    sorted fingerprints of the kept texts' ASCII words (:func:`vocabulary`), or None (a store
    saved without one: :meth:`match_many` then hashes every text).
    """

    def __init__(
        self,
        span: int,
        ref_ids: list[str],
        hashes: np.ndarray,
        ref: np.ndarray,
        pos: np.ndarray,
        skipped: int = 0,
        vocab: np.ndarray | None = None,
    ):
        order = np.argsort(hashes, kind="stable")
        self.span = int(span)
        self.ref_ids = list(ref_ids)
        self.hashes = np.asarray(hashes, dtype=np.uint64)[order]
        self.ref = np.asarray(ref, dtype=np.int32)[order]
        self.pos = np.asarray(pos, dtype=np.int32)[order]
        self.skipped = int(skipped)
        self.vocab = None if vocab is None else np.unique(np.asarray(vocab, dtype=np.uint64))

    @functools.cached_property
    def _vocab_bits(self) -> np.ndarray:
        """A one-hash Bloom filter of ``vocab`` (top bits of each fingerprint): membership in
        one gather, with a few false hits, which only cost an exact look."""
        bits = np.zeros(1 << _VOCAB_BITS, dtype=bool)
        bits[self.vocab >> np.uint64(64 - _VOCAB_BITS)] = True
        return bits

    @classmethod
    def build(cls, texts: Iterable[tuple[str, str]], span: int) -> ShingleStore:
        """From ``(ref_id, text)`` pairs."""

        def hashed(text: str) -> tuple[np.ndarray, np.ndarray]:
            words = words_with_offsets(text)[0]
            return window_hashes(words, span), vocabulary(words)

        return cls.from_hashes(((ref_id, *hashed(text)) for ref_id, text in texts), span)

    @classmethod
    def from_hashes(cls, items: Iterable[tuple], span: int) -> ShingleStore:
        """From ``(ref_id, window hashes[, vocabulary])`` hashed elsewhere (e.g. by Ray Data
        workers); a text with no window (shorter than ``span``) is counted in ``skipped``. The
        store has a vocabulary when every text kept came with its :func:`vocabulary`."""
        ids, hs, refs, poss, skipped = [], [], [], [], 0
        vocab: list[np.ndarray] | None = []
        for ref_id, h, *v in items:
            h = np.asarray(h, dtype=np.uint64)
            if not len(h):
                skipped += 1
                continue
            if vocab is not None and v:
                vocab.append(np.asarray(v[0], dtype=np.uint64))
            else:
                vocab = None
            refs.append(np.full(len(h), len(ids), dtype=np.int32))
            poss.append(np.arange(len(h), dtype=np.int32))
            hs.append(h)
            ids.append(str(ref_id))
        if not ids:
            raise MiaError(f"no reference text has {span} words or more: nothing to match against")
        return cls(
            span,
            ids,
            np.concatenate(hs),
            np.concatenate(refs),
            np.concatenate(poss),
            skipped,
            None if vocab is None else np.concatenate(vocab),
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
        vocabs = [p.vocab for p in parts]
        return cls(
            parts[0].span,
            ids,
            np.concatenate(hs),
            np.concatenate(refs),
            np.concatenate(poss),
            sum(p.skipped for p in parts),
            None if any(v is None for v in vocabs) else np.concatenate(vocabs),
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
        return self._match(text, *words_with_offsets(text)[1:])

    def _match(
        self, text: str, starts: np.ndarray, ends: np.ndarray, keep: np.ndarray | None = None
    ) -> list[SpanMatch]:
        """:meth:`match`, given the offsets of the words of ``text``; ``keep``: a mask of the
        words a matching window may hold (the others cannot be in the store), or None."""
        if keep is None:
            queries = window_hashes(_normalised(text, starts, ends), self.span)
            win = np.arange(len(queries))  # the word each window starts at
        else:
            # Only windows inside a run of ``span`` kept words can match: hash those runs'
            # words, and keep the windows whose words are consecutive in the text.
            edges = np.flatnonzero(np.diff(np.concatenate([[0], keep.astype(np.int8), [0]])))
            run_start, run_stop = edges[::2], edges[1::2]  # each run of kept words: [start, stop)
            long = run_stop - run_start >= self.span
            inside = np.zeros(len(keep) + 1, dtype=np.int64)
            inside[run_start[long]] = 1  # runs are apart: no two share a start or a stop
            inside[run_stop[long]] = -1
            idx = np.flatnonzero(np.cumsum(inside[:-1]))  # the long runs' words, in order
            if len(idx) < self.span:
                return []
            queries = window_hashes(
                _run_words(text, starts, ends, run_start[long], run_stop[long], idx), self.span
            )
            whole = idx[self.span - 1 :] - idx[: len(queries)] == self.span - 1
            queries, win = queries[whole], idx[: len(whole)][whole]
        n = len(self.hashes)
        if not n or not len(queries):
            return []
        lo = np.searchsorted(self.hashes, queries, side="left")
        hits = np.flatnonzero(self.hashes[np.minimum(lo, n - 1)] == queries)
        if not len(hits):
            return []
        # Most windows are in one place of the store only: look up the others' last place.
        hi = lo + 1
        nxt = lo[hits] + 1
        more = hits[(nxt < n) & (self.hashes[np.minimum(nxt, n - 1)] == queries[hits])]
        if more.size:
            hi[more] = np.searchsorted(self.hashes, queries[more], side="right")
        else:  # every window in one place: all runs at once
            ref, pos, w = self.ref[lo[hits]], self.pos[lo[hits]], win[hits]
            # A window continues a run when it is the next one and the same reference's next.
            goes_on = (np.diff(w) == 1) & (np.diff(ref) == 0) & (np.diff(pos) == 1)
            heads = np.flatnonzero(np.concatenate([[True], ~goes_on]))
            tails = np.append(heads[1:], len(hits)) - 1
            return [
                SpanMatch(r, p, a, b + self.span, int(starts[a]), int(ends[b + self.span - 1]))
                for r, p, a, b in zip(
                    ref[heads].tolist(),
                    pos[heads].tolist(),
                    w[heads].tolist(),
                    w[tails].tolist(),
                    strict=True,
                )
            ]
        out: list[SpanMatch] = []
        first = last = -1
        alive: set[tuple[int, int]] = set()  # (ref, its position at the run's first window)
        for q, j in zip(hits.tolist(), win[hits].tolist(), strict=True):
            cands = {(int(self.ref[k]), int(self.pos[k])) for k in range(lo[q], hi[q])}
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

    def match_many(self, batch: TextBatch) -> list[list[SpanMatch]]:
        """:meth:`match` of every text of ``batch``, hashing only those that hold ``span``
        consecutive words each either non-ASCII or in the vocabulary: a matching window's
        words are all in its reference text, so the others cannot match.

        Those texts are found in two steps. Every ``stride``-th word of the batch is looked
        up first: ``span`` consecutive words hold ``span // stride`` consecutive looked-up
        ones, all of them known, so only a text with such a run can hold a matching window.
        Then each word of those few texts is looked up."""
        out: list[list[SpanMatch]] = [[] for _ in batch.texts]
        starts, ends, first = batch.words
        known = None
        if self.vocab is None:
            todo = range(len(batch.texts))
        else:
            stride = min(_VOCAB_STRIDE, self.span)
            some = np.arange(0, len(starts), stride)
            todo = docs_with_runs(
                self._known(batch, some), batch.doc_of_word(some), self.span // stride
            )
            if todo:
                idx = np.concatenate([np.arange(first[i], first[i + 1]) for i in todo])
                known = np.zeros(len(starts), dtype=bool)
                known[idx] = self._known(batch, idx)
                todo = docs_with_runs(known[idx], batch.doc_of_word(idx), self.span)
        for i in todo:
            a, b, at = first[i], first[i + 1], batch.offsets[i]
            out[i] = self._match(
                batch.texts[i],
                starts[a:b] - at,
                ends[a:b] - at,
                None if known is None else known[a:b],
            )
        return out

    def _known(self, batch: TextBatch, idx: np.ndarray) -> np.ndarray:
        """Whether each word ``idx`` of ``batch`` may be in a window of the store: non-ASCII,
        or its fingerprint in the vocabulary's filter."""
        fp, ascii_ = batch.fingerprints_of(idx)
        return ~ascii_ | self._vocab_bits[fp >> np.uint64(64 - _VOCAB_BITS)]

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
            **({} if self.vocab is None else {"vocab": self.vocab}),
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
                z["vocab"] if "vocab" in z.files else None,
            )
