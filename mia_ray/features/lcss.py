"""MemHunter's memorization value: mu = LCSS(output, y) / |y| (Wu et al., eqs. 2-3).

LCSS is the longest common *substring*: the longest contiguous run shared by both
sequences (not the longest common subsequence). Sequences are token ids or characters.
The dynamic programme runs one numpy row per element of the shorter sequence, so a pair of
a few hundred tokens costs well under a millisecond.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mia_ray.errors import MiaError


def _codes(seq: str | Sequence[int] | np.ndarray) -> np.ndarray:
    if isinstance(seq, str):
        return np.frombuffer(seq.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    return np.asarray(seq, dtype=np.int64).reshape(-1)


def lcss(a: str | Sequence[int], b: str | Sequence[int]) -> int:
    """Length of the longest common substring of ``a`` and ``b`` (both str, or both int
    sequences). 0 when either is empty."""
    if isinstance(a, str) != isinstance(b, str):
        raise MiaError("lcss: compare two strings or two token sequences, not one of each")
    x, y = _codes(a), _codes(b)
    if x.size == 0 or y.size == 0:
        return 0
    if x.size < y.size:
        x, y = y, x
    # run[j]: length of the common run ending at x[i], y[j - 1]; one row per element of x.
    run = np.zeros(y.size + 1, dtype=np.int64)
    best = 0
    for xi in x:
        run[1:] = np.where(y == xi, run[:-1] + 1, 0)
        top = int(run.max())
        if top > best:
            best = top
    return best


def memorization(output: str | Sequence[int], target: str | Sequence[int]) -> float:
    """mu = LCSS(output, target) / |target| in [0, 1]; |target| counts tokens or characters.

    An empty target has no memorization value: it is an error, not 0 or 1.
    """
    n = len(target)
    if n == 0:
        raise MiaError("memorization: the target continuation y is empty")
    return lcss(output, target) / n


def memorization_many(
    outputs: Sequence[str | Sequence[int]], targets: Sequence[str | Sequence[int]]
) -> np.ndarray:
    """mu for each (output, target) pair: (n,) float64."""
    if len(outputs) != len(targets):
        raise MiaError(f"memorization: {len(outputs)} outputs but {len(targets)} targets")
    return np.array([memorization(o, t) for o, t in zip(outputs, targets, strict=True)])


def best_of_k(trials, ks: Sequence[int]):
    """Avg LCSS and Hit Rate for k trials per sample (MemHunter Tables 1-3, Figures 7-8).

    ``trials``: a DataFrame with ``pair_id``, ``trial`` (0-based) and ``mu``, one row per
    trial. For each k, a sample's value is its best mu over trials 0..k-1; ``avg_lcss`` is the
    mean of those values and ``hit_rate`` the share equal to 1 (the whole y recovered), both
    fractions in [0, 1]. Returns one row per k: k, avg_lcss, hit_rate, pairs.
    """
    import pandas as pd

    if len(trials) == 0:
        raise MiaError("best_of_k: no trials")
    n_trials = trials.groupby("pair_id")["trial"].nunique()
    rows = []
    for k in ks:
        if k < 1 or (n_trials < k).any():
            raise MiaError(f"best_of_k: k = {k}, but a sample has only {n_trials.min()} trials")
        best = trials[trials["trial"] < k].groupby("pair_id")["mu"].max()
        rows.append(
            {
                "k": int(k),
                "avg_lcss": float(best.mean()),
                "hit_rate": float((best >= 1.0).mean()),
                "pairs": int(best.size),
            }
        )
    return pd.DataFrame(rows)
