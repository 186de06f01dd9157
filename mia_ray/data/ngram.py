"""N-gram overlap between members and non-members: a bias diagnostic (MIMIR, Duan et al. 2024).

For each non-member text, the share of its word n-grams that also occur somewhere in the
member set (LUMIA §3 "N-gram bias": N = 7 or 13, threshold P). A high overlap means the
two sets are hard to tell apart by construction, a low one that an attack may succeed on
distribution shift alone. Words are the lowercased ``\\w+`` runs of the text (punctuation
dropped). A text's n-grams are counted with multiplicity: a repeated n-gram weighs each
time it occurs. A text with fewer than N words has no n-grams and is left out of the
statistics (counted in ``n_too_short``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable

import numpy as np

from mia_ray.errors import MiaError

_WORD = re.compile(r"\w+")
_COMPACT_AT = 1 << 22  # hashes buffered on the driver before deduplicating them


def words(text: str) -> list[str]:
    """Lowercased word tokens of ``text``."""
    return _WORD.findall(text.lower())


def ngrams(text: str, n: int) -> list[tuple[str, ...]]:
    """The word n-grams of ``text`` in order, repeats included."""
    toks = words(text)
    return [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]


def _check(n: int, p: float) -> None:
    if int(n) != n or n < 1:
        raise MiaError(f"n-gram length must be a whole number of at least 1, not {n}")
    if not 0 <= p <= 1:
        raise MiaError(f"n-gram overlap threshold must lie in [0, 1], not {p}")


def _summary(overlaps: Iterable[float], n: int, p: float, n_total: int) -> dict:
    arr = np.sort(np.asarray(list(overlaps), dtype=np.float64))
    k = len(arr)
    out = {"n": int(n), "p": float(p), "mean": None, "median": None, "share_at_least_p": None}
    if k:
        # fsum over sorted values: the same number whatever order Ray returned the rows in.
        out["mean"] = math.fsum(arr) / k
        out["median"] = float(np.median(arr))
        out["share_at_least_p"] = int(np.count_nonzero(arr >= p)) / k
    out["n_texts"] = k
    out["n_too_short"] = int(n_total) - k
    # Overlap is measured against the run's member texts, not the pretraining corpus.
    out["reference_set"] = "members"
    return out


def ngram_overlap(members: Iterable[str], nonmembers: Iterable[str], n: int, p: float) -> dict:
    """Overlap of each non-member text's n-grams with the members' n-grams, summarized.

    Returns ``{n, p, mean, median, share_at_least_p, n_texts, n_too_short, reference_set}``
    (``reference_set`` is ``"members"``: the overlap is with the member texts given):
    ``share_at_least_p`` is the fraction of scored non-member texts whose overlap is >= p;
    ``n_texts`` the number scored. mean/median/share are None when no text has N words.
    """
    _check(n, p)
    seen: set[tuple[str, ...]] = set()
    for text in members:
        seen.update(ngrams(text, n))
    overlaps, total = [], 0
    for text in nonmembers:
        total += 1
        grams = ngrams(text, n)
        if grams:
            overlaps.append(sum(g in seen for g in grams) / len(grams))
    return _summary(overlaps, n, p, total)


# ---------------------------------------------------------------- Ray Data version


def _hashes(text: str, n: int) -> np.ndarray:
    """64-bit BLAKE2b of each n-gram (words joined by a space), shape (number of n-grams,)."""
    return np.array(
        [
            int.from_bytes(
                hashlib.blake2b(" ".join(g).encode("utf-8"), digest_size=8).digest(), "little"
            )
            for g in ngrams(text, n)
        ],
        dtype=np.uint64,
    )


def _batch_hashes(table, n: int, column: str):
    import pyarrow as pa

    parts = [_hashes(t or "", n) for t in table.column(column).to_pylist()]
    hashes = np.unique(np.concatenate(parts)) if parts else np.empty(0, np.uint64)
    return pa.table({"h": pa.array(hashes.astype(np.uint64), pa.uint64())})


def _batch_overlap(table, member_hashes, n: int, column: str):
    import pyarrow as pa
    import ray

    known = ray.get(member_hashes)  # sorted uint64, read zero-copy from the object store
    out = []
    for text in table.column(column).to_pylist():
        h = _hashes(text or "", n)
        if len(h) == 0:
            out.append(None)
            continue
        idx = np.minimum(np.searchsorted(known, h), max(len(known) - 1, 0))
        hits = int(np.count_nonzero(known[idx] == h)) if len(known) else 0
        out.append(hits / len(h))
    return pa.table({"overlap": pa.array(out, pa.float64())})


def ngram_overlap_ds(
    members_ds, nonmembers_ds, n: int, p: float, text_column: str = "text"
) -> dict:
    """``ngram_overlap`` over two Ray Datasets with a ``text`` column; same result, same keys.

    Workers hash the members' n-grams (64-bit BLAKE2b, deduplicated per batch); the driver
    merges them into one sorted uint64 array, put once in the object store, that the workers
    scoring non-members read zero-copy and search with ``searchsorted``.
    Memory tradeoff: the driver and each node's object store hold 8 bytes per distinct
    member n-gram (1e9 distinct n-grams = 8 GB), far less than Python sets of strings; past
    that, a shuffle join on the hash would be needed. Hash collisions (about d*k/2^64 false
    hits for d member and k non-member n-grams) are negligible at any realistic size.
    """
    import ray

    _check(n, p)
    hashed = members_ds.map_batches(
        _batch_hashes, fn_kwargs={"n": int(n), "column": text_column}, batch_format="pyarrow"
    )
    buffered: list[np.ndarray] = []
    size, limit = 0, _COMPACT_AT
    for batch in hashed.iter_batches(batch_format="pyarrow", batch_size=None):
        arr = batch.column("h").to_numpy().astype(np.uint64, copy=False)
        buffered.append(arr)
        size += len(arr)
        if size >= limit:
            buffered = [np.unique(np.concatenate(buffered))]
            size = len(buffered[0])
            limit = max(_COMPACT_AT, 2 * size)  # amortized: each hash is re-sorted O(log) times
    known = np.unique(np.concatenate(buffered)) if buffered else np.empty(0, np.uint64)
    ref = ray.put(known)
    scored = nonmembers_ds.map_batches(
        _batch_overlap,
        fn_kwargs={"member_hashes": ref, "n": int(n), "column": text_column},
        batch_format="pyarrow",
    )
    overlaps, total = [], 0
    for batch in scored.iter_batches(batch_format="pyarrow", batch_size=None):
        values = batch.column("overlap").to_pylist()
        total += len(values)
        overlaps.extend(v for v in values if v is not None)
    return _summary(overlaps, n, p, total)
