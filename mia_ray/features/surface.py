"""What a snippet's surface looks like, without a model: the numbers the premise checks read.

A language model finds text easier when it repeats itself, follows a fixed layout, uses
common casing or short words, whatever words it uses. Word counts (tf-idf, lowercased) see
none of that, so the audit's blind check also reads these (``detectors.premise``):

- casing: the share of letters in upper case, of words starting with one, of words in
  capitals (two letters or more);
- compressibility and repetition: zlib's compressed size over the raw size, the share of
  word 4-grams seen earlier in the snippet, distinct words over words;
- lengths: characters per word, words per sentence (``.``, ``!``, ``?`` end one), words
  per line;
- characters: digits, non-ASCII characters, punctuation and whitespace other than single
  spaces, each as a share of the characters.

Pure Python; one row per text, every value finite (an empty text gives zeros).
"""

from __future__ import annotations

import re
import string
import zlib
from collections.abc import Sequence

import numpy as np

SURFACE_FEATURES = (
    "upper_share",
    "title_word_share",
    "caps_word_share",
    "zlib_ratio",
    "repeated_4gram_share",
    "distinct_word_share",
    "chars_per_word",
    "words_per_sentence",
    "words_per_line",
    "digit_share",
    "non_ascii_share",
    "punctuation_share",
    "layout_whitespace_share",
)
REPEAT_N = 4
_WORD = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")
_PUNCT = frozenset(string.punctuation)


def surface_row(text: str) -> list[float]:
    """The :data:`SURFACE_FEATURES` of one text, in that order."""
    n = len(text)
    words = _WORD.findall(text)
    w = len(words)
    if n == 0 or w == 0:
        return [0.0] * len(SURFACE_FEATURES)
    letters = sum(c.isalpha() for c in text)
    upper = sum(c.isupper() for c in text)
    alpha_words = [x.strip(string.punctuation) for x in words]
    alpha_words = [x for x in alpha_words if x and x[0].isalpha()]
    title = sum(x[0].isupper() for x in alpha_words)
    caps = sum(len(x) >= 2 and x.isupper() for x in alpha_words)
    raw = text.encode("utf-8")
    lowered = [x.lower() for x in words]
    grams = [tuple(lowered[i : i + REPEAT_N]) for i in range(w - REPEAT_N + 1)]
    seen: set[tuple[str, ...]] = set()
    repeated = 0
    for g in grams:
        repeated += g in seen
        seen.add(g)
    sentences = max(1, len(_SENTENCE_END.findall(text)))
    lines = max(1, sum(1 for line in text.splitlines() if line.strip()))
    return [
        upper / max(letters, 1),
        title / max(len(alpha_words), 1),
        caps / max(len(alpha_words), 1),
        len(zlib.compress(raw)) / len(raw),
        repeated / max(len(grams), 1),
        len(set(lowered)) / w,
        sum(len(x) for x in words) / w,
        w / sentences,
        w / lines,
        sum(c.isdigit() for c in text) / n,
        sum(ord(c) > 127 for c in text) / n,
        sum(c in _PUNCT for c in text) / n,
        _layout_chars(text) / n,
    ]


def _layout_chars(text: str) -> int:
    """Whitespace that is not a single space between two non-spaces: newlines, tabs, runs."""
    single = len(re.findall(r"(?<=\S) (?=\S)", text))
    return sum(c.isspace() for c in text) - single


def surface_matrix(texts: Sequence[str]) -> np.ndarray:
    """(n, len(SURFACE_FEATURES)) rows of :func:`surface_row`."""
    return np.array([surface_row(str(t)) for t in texts], dtype=np.float64).reshape(
        len(texts), len(SURFACE_FEATURES)
    )
