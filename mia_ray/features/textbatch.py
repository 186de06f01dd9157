"""A batch of texts laid out for vectorised scanning: one ASCII byte per code point (the
*view*) and the words of every text at once, as the shingle stores count them.

The leakage scanners read the view with cheap prefilters (Hyperscan, numpy) to find where
their exact Python scanners must look. Each code point becomes one ASCII byte chosen so that
a ``re`` pattern stripped of its lookarounds matches the view wherever the pattern matches
the text (:func:`view_table`), and offsets in the view are offsets in the text. A prefilter
only ever skips text the exact scanner would find nothing in, so it cannot change a finding.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Sequence

import numpy as np

_ASCII_WORD = frozenset(string.ascii_letters + string.digits + "_")
# Python's ``\s`` holds these ASCII characters; PCRE's (Hyperscan's) ``\s`` does not.
_PY_ONLY_SPACE = "\x0b\x1c\x1d\x1e\x1f"


@functools.cache
def view_table() -> np.ndarray:
    """(0x110000,) uint8: the view byte of every code point (:func:`_view_table`), read back
    from ``$MIA_RAY_HOME/hyperscan/`` when this module and Python's Unicode tables made it
    before (building it runs ``re`` over every code point: about a third of a second)."""
    import hashlib
    import os
    import sys
    import unicodedata
    from pathlib import Path

    key = hashlib.sha256(
        repr((Path(__file__).read_bytes(), sys.version, unicodedata.unidata_version)).encode()
    ).hexdigest()[:32]
    home = os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")
    path = Path(home).expanduser() / "hyperscan" / f"view-{key}.npy"
    try:
        table = np.load(path, allow_pickle=False)
        if table.shape == (0x110000,) and table.dtype == np.uint8:
            return table
    except Exception:  # noqa: BLE001 - none yet or unreadable: build it
        pass
    table = _view_table()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npy")
        np.save(tmp, table)
        os.replace(tmp, path)
    except OSError:
        pass
    return table


def _view_table() -> np.ndarray:
    """(0x110000,) uint8: the view byte of every code point.

    ASCII maps to itself (the whitespace only Python's ``\\s`` knows, to a space). Any other
    code point: one that ``re.I`` or ``str.lower`` equates with an ASCII letter becomes that
    letter, a decimal digit ``0``, another ``\\w`` character ``x``, whitespace a space, ’ an
    apostrophe, the rest ``~``. So ``\\w``, ``\\d``, ``\\b``, ``\\s`` and case-insensitive ASCII
    letters hold in the view wherever they hold in the text (built with ``re`` itself)."""
    every = "".join(map(chr, range(0x110000)))

    def where(pattern: str, flags: int = 0) -> np.ndarray:
        return np.fromiter((m.start() for m in re.finditer(pattern, every, flags)), dtype=np.int64)

    word = np.zeros(0x110000, dtype=bool)
    word[where(r"\w")] = True
    view = np.full(0x110000, ord("~"), dtype=np.uint8)
    view[word] = ord("x")
    view[where(r"\d")] = ord("0")
    view[where(r"\s")] = ord(" ")
    for c in where("[a-z]", re.I).tolist():  # ſ, K (Kelvin), İ, ı ... beside the ASCII ones
        view[c] = next(ord(a) for a in string.ascii_lowercase if re.fullmatch(a, chr(c), re.I))
    for c in where(r"[^\W\d_]").tolist():  # letters that lower-case to an ASCII one
        low = chr(c).lower()
        if len(low) == 1 and low in string.ascii_lowercase:
            view[c] = ord(low)
    view[ord("’")] = ord("'")
    for c in range(128):
        view[c] = ord(" ") if chr(c) in _PY_ONLY_SPACE else c
    # The view keeps \w: a word character becomes an ASCII word character and nothing else does.
    assert np.array_equal(np.isin(view, list(map(ord, _ASCII_WORD))), word)
    return view


_WORD_FLAG = bytes(c in _ASCII_WORD for c in map(chr, range(256)))  # view byte -> 1 if \\w
_ASCII_VIEW = bytes(ord(" ") if chr(c) in _PY_ONLY_SPACE else c for c in range(256))


_FP_MUL = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [2**64 - 1], dtype=np.uint64)


def fingerprints(data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """(w,) uint64: a fingerprint of each word ``data[s:e]`` from its length and its first and
    last (up to) 8 bytes, so equal words get equal ones (a word filter's keys)."""
    buf = np.frombuffer(data + bytes(8), dtype=np.uint8)
    eight = np.ndarray((len(data),), dtype="<u8", buffer=buf, strides=(1,))  # bytes i..i+7
    size = (ends - starts).astype(np.uint64)
    mask = _LOW_BYTES[np.minimum(ends - starts, 8)]
    head = eight[starts] & mask
    tail = eight[np.maximum(ends - 8, starts)] & mask
    return head * _FP_MUL[0] + tail * _FP_MUL[1] + size  # wraps mod 2**64


class TextBatch:
    """``texts`` joined by newlines as one view (``view``: bytes, ``len`` = every text's
    characters plus one per break); ``offsets[i]`` is where text i starts in it."""

    def __init__(self, texts: Sequence[str]):
        self.texts = list(texts)
        sizes = np.fromiter(map(len, self.texts), dtype=np.int64, count=len(self.texts))
        self.offsets = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]]).astype(np.int64)
        joined = "\n".join(self.texts)
        if joined.isascii():
            self.view = joined.encode("ascii").translate(_ASCII_VIEW)
            self._non_ascii = np.zeros(0, dtype=np.int64)
            self._non_ascii_codes = np.zeros(0, dtype=np.uint32)
        else:  # the whole batch in one pass: fewer numpy calls than text by text
            codes = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
            # Sorted view positions of the code points that are not ASCII.
            self._non_ascii = np.flatnonzero(codes >= 128)
            self._non_ascii_codes = codes[self._non_ascii]
            view = codes.astype(np.uint8)  # ASCII as itself; the few others from the table
            view[self._non_ascii] = view_table()[codes[self._non_ascii]]
            self.view = view.tobytes().translate(_ASCII_VIEW)

    def sizes(self) -> np.ndarray:
        """(n,) int64: characters per text, ``len(text)``."""
        return np.fromiter(map(len, self.texts), dtype=np.int64, count=len(self.texts))

    def utf8_sizes(self) -> np.ndarray:
        """(n,) int64: UTF-8 bytes per text, ``len(text.encode())``: a code point from U+0080
        takes 2 bytes, from U+0800 3 and from U+10000 4."""
        out = self.sizes()
        if len(self._non_ascii):
            c = self._non_ascii_codes
            extra = 1 + (c >= 0x800).astype(np.int64) + (c >= 0x10000)
            out = out + np.bincount(
                self.doc_of(self._non_ascii), weights=extra, minlength=len(out)
            ).astype(np.int64)
        return out

    def doc_of(self, positions: np.ndarray) -> np.ndarray:
        """Index of the text holding each view position."""
        return np.searchsorted(self.offsets, positions, side="right") - 1

    @functools.cached_property
    def words(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, first): view positions of every word, the matches of
        ``shingles.words_with_offsets``'s ``\\w+(?:['’]\\w+)*`` in order, and the index of
        each text's first word (``first[i + 1] - first[i]`` words in text i; n + 1 entries)."""
        n = len(self.view)
        w = np.frombuffer(self.view.translate(_WORD_FLAG), dtype=np.bool_)
        quote = np.flatnonzero(np.frombuffer(self.view, dtype=np.uint8) == ord("'"))
        quote = quote[(quote > 0) & (quote < n - 1)]
        quote = quote[w[quote - 1] & w[quote + 1]]
        if len(quote):  # an apostrophe (' or ’) between two word characters joins them
            w = w.copy()
            w[quote] = True
        # Where the flags change (padded with False at both ends): starts and ends alternate.
        padded = np.zeros(n + 2, dtype=np.int8)
        padded[1:-1] = w
        edges = np.flatnonzero(padded[1:] != padded[:-1])
        starts, ends = edges[0::2], edges[1::2]
        first = np.searchsorted(starts, np.append(self.offsets, n))
        return starts, ends, first

    def word_counts(self) -> np.ndarray:
        """(n,) int64: words per text, ``len(words_with_offsets(text)[0])``."""
        return np.diff(self.words[2]).astype(np.int64)

    def fingerprints_of(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(fingerprints, ascii) of the words ``idx`` (indices into :attr:`words`): each
        word's :func:`fingerprints` of its lower-cased bytes, which is its normalised form's
        whenever the word is ASCII (``ascii`` True)."""
        starts, ends, _ = self.words
        starts, ends = starts[idx], ends[idx]
        na = self._non_ascii  # a word is ASCII when no non-ASCII code point falls inside it
        ascii_ = np.searchsorted(na, starts) == np.searchsorted(na, ends)
        return fingerprints(self._lower, starts, ends), ascii_

    @functools.cached_property
    def _lower(self) -> bytes:
        return self.view.lower()

    def doc_of_word(self, idx: np.ndarray) -> np.ndarray:
        """Index of the text holding each word of ``idx`` (indices into :attr:`words`)."""
        return np.searchsorted(self.words[2], idx, side="right") - 1


def docs_with_runs(keep: np.ndarray, doc: np.ndarray, span: int) -> list[int]:
    """Sorted texts holding ``span`` consecutive items with ``keep`` True, ``doc`` (sorted)
    the text of each item: a run never crosses from one text into the next."""
    n = len(keep) - span + 1
    if n <= 0:
        return []
    dropped = np.concatenate([[0], np.cumsum(~keep, dtype=np.int64)])
    ok = (dropped[span:] == dropped[:n]) & (doc[span - 1 :] == doc[:n])
    return np.unique(doc[:n][ok]).tolist()
