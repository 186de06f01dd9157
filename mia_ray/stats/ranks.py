"""Exact rank tests for randomized marks (canaries: Zhang, Das, Kamath, Tramèr 2025).

Under H0 the model never trained on text holding the published candidate, which was drawn
uniformly from ``K`` candidates of one generator: its score's rank among the ``K`` is
uniform, so ``p = (1 + #{alternatives scoring >= it}) / K`` has P(p <= t) <= t for every t
(ties count against the mark, which keeps the bound). Marks chosen independently give
independent p-values; the dataset p-value combines them with Fisher's statistic against
its null drawn from independent discrete uniform ranks (a Monte Carlo test, valid for any
number of draws: ``(1 + #{null >= observed}) / (draws + 1)``).
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil

import numpy as np


def rank_pvalue(published: float, alternatives: np.ndarray) -> float:
    """``(1 + #{alternatives >= published}) / (len(alternatives) + 1)``; higher = more like
    trained on. NaN scores are refused by the caller."""
    alt = np.asarray(alternatives, dtype=np.float64)
    return float((1 + np.count_nonzero(alt >= published)) / (alt.size + 1))


def fisher_statistic(p: np.ndarray) -> float:
    """-2 sum log p."""
    return float(-2.0 * np.log(np.asarray(p, dtype=np.float64)).sum())


def combined_pvalue(
    p: np.ndarray, candidates: int, draws: int = 9999, seed: int = 0
) -> tuple[float, float]:
    """Fisher's statistic of the marks' p-values and its Monte Carlo p-value against
    independent ranks uniform on 1..``candidates`` (each mark's null; ``draws`` sets of them,
    seeded). Returns (statistic, p-value); the smallest p-value is 1 / (draws + 1)."""
    p = np.asarray(p, dtype=np.float64)
    observed = fisher_statistic(p)
    rng = np.random.default_rng(seed)
    exceed, chunk = 0, max(1, 2_000_000 // max(1, p.size))
    done = 0
    while done < draws:
        n = min(chunk, draws - done)
        ranks = rng.integers(1, candidates + 1, size=(n, p.size))
        null = -2.0 * np.log(ranks / candidates).sum(axis=1)
        # A relative tolerance: float sums of the same ranks in another order tie exactly.
        exceed += int(np.count_nonzero(null >= observed * (1 - 1e-12)))
        done += n
    return observed, (1 + exceed) / (draws + 1)


def floor_marks(n_marks: int, candidates: int, fdr: float) -> int:
    """How many marks must reach the smallest p (1/K) together before Benjamini-Hochberg at
    ``fdr`` flags any of ``n_marks``: the k smallest, all 1/K, pass when 1/K <= fdr k / n."""
    level = Fraction(str(fdr))  # as Benjamini-Hochberg takes it: 0.05 is 1/20, exactly
    return max(1, ceil(Fraction(n_marks) / (candidates * level)))
