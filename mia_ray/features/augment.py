"""PAC's augmented copies (Ye et al. 2024): a text with words swapped at random.

Each copy splits the text on single spaces (as the authors' EDA code does, so line breaks
stay inside their words) and makes ``max(1, int(share * n_words))`` swaps, each of two word
positions drawn uniformly (a second draw equal to the first is redrawn, up to 3 times, as in
EDA's ``random_swap``). The generator is seeded with SHA-256 of ``str(seed)``, so a (text,
seed) pair gives the same copies in every process. A text of fewer than two words is its
own copy.
"""

from __future__ import annotations

import hashlib

import numpy as np

from mia_ray.errors import MiaError


def random_swaps(text: str, copies: int = 5, share: float = 0.3, seed: int | str = 0) -> list[str]:
    """``copies`` texts, each ``text`` with ``max(1, int(share * n_words))`` word swaps."""
    if copies < 1:
        raise MiaError(f"copies (augmented texts per snippet) must be >= 1, got {copies}")
    if not 0 < share <= 1:
        raise MiaError(f"share (swaps per word) must be in (0, 1], got {share}")
    words = text.split(" ")
    if len(words) < 2:
        return [text] * copies
    digest = hashlib.sha256(str(seed).encode("utf-8")).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    swaps = max(1, int(share * len(words)))
    out = []
    for _ in range(copies):
        w = list(words)
        for _ in range(swaps):
            i = j = int(rng.integers(len(w)))
            for _ in range(3):
                j = int(rng.integers(len(w)))
                if j != i:
                    break
            w[i], w[j] = w[j], w[i]
        out.append(" ".join(w))
    return out
