"""Checks of the audit's premise: suspected and unseen files differ only by training.

No check can prove the premise; each can falsify it, and each sees only some differences:

- the **blind check** (no model): three views of the snippets' text, each through the dataset
  test's cross-fit with free weights (two-sided in effect), joined by one min-p permutation
  test (:func:`~mia_ray.detectors.dataset_inference.joint_permutation_test`) so it rejects
  at most ``alpha`` of the time under H0 however many views it reads:

  - ``words``: tf-idf of word 1-2 grams, lowercased (which words the files use);
  - ``characters``: tf-idf of character 1-4 grams, case kept (casing, punctuation,
    spelling, OCR-like noise, digits);
  - ``surface``: the 13 statistics of :mod:`mia_ray.features.surface` (casing shares,
    compressibility, repeated 4-grams, word / sentence / line lengths, digits, non-ASCII,
    punctuation, layout whitespace), standardized like the model's features.

- the **reference check** (``model.reference``): the dataset test's cross-fit on the
  reference model's own features (the same attacks on the same snippets), with weights >= 0
  and with free weights, one min-p test over the two. A model that never saw the files
  cannot score the two sets apart because of training; if it does, in any direction, the
  difference is in the texts. (Each version alone let shifts past that the other caught:
  weights >= 0 missed text harder on most features and easier on one, free weights missed
  text easier on every feature half as often as not; VALIDITY.md's token-level section.)

What is left unseen: a difference that a model sees, that none of these views shows and that
the reference model does not share (or any such difference, without a reference).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mia_ray.detectors.dataset_inference import (
    Design,
    file_matrix,
    joint_permutation_test,
    text_matrix,
)
from mia_ray.features.surface import SURFACE_FEATURES, surface_matrix

BLIND_PARTS = {
    "words": "which words the files use (tf-idf of word 1-2 grams, lowercased)",
    "characters": "casing, punctuation, spelling and character noise (tf-idf of character "
    "1-4 grams, case kept)",
    "surface": "casing shares, compressibility, repetition, word / sentence / line lengths, "
    "digits, non-ASCII characters, punctuation and layout (13 statistics)",
}
REFERENCE_SEES = (
    "any difference in how a model that never saw the files scores the two sets (the same "
    "attacks, either direction)"
)
UNSEEN_WITHOUT_REFERENCE = (
    "differences a model sees but the blind check's words, characters and surface "
    "statistics do not (give --reference, a model that never saw the files, to test them)"
)


def char_vectorizer():
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(
        analyzer="char", ngram_range=(1, 4), lowercase=False, sublinear_tf=True,
        max_features=20000,
    )  # fmt: skip


def blind_matrices(
    unit_files: Sequence[str], texts: Sequence[str], files: Sequence[str]
) -> dict[str, np.ndarray]:
    """Each view's file rows (n_files, k), in the order of ``files``."""
    texts = [str(t) for t in texts]
    return _matrices(unit_files, texts, files, surface_matrix(texts))


def _matrices(unit_files, texts: list[str], files, S: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "words": text_matrix(unit_files, texts, files),
        "characters": text_matrix(unit_files, texts, files, vectorizer=char_vectorizer()),
        "surface": file_matrix(unit_files, S, files),
    }


def blind_check(
    design: Design,
    unit_files: Sequence[str],
    texts: Sequence[str],
    files: Sequence[str],
    permutations: int,
    seed: int,
    alpha: float,
) -> dict:
    """The joint test of the three views on ``design``'s groups and sides (free weights):
    :func:`joint_permutation_test`'s summary, each part with what it sees, and ``surface``'s
    largest differences (``contrasts``)."""
    texts = [str(t) for t in texts]
    S = surface_matrix(texts)  # read once: the surface view and its contrasts
    mats = _matrices(unit_files, texts, files, S)
    designs = {name: design.with_features(F, nonneg=False) for name, F in mats.items()}
    out = joint_permutation_test(designs, permutations, seed, alpha)
    for name, part in out["parts"].items():
        part["sees"] = BLIND_PARTS[name]
    y = design.side[design.group]
    out["contrasts"] = surface_contrasts(S, unit_files, files, y)
    return out


def reference_check(design: Design, permutations: int, seed: int, alpha: float) -> dict:
    """The reference check on ``design`` (its features: the reference model's scores): the
    cross-fit with weights >= 0 and with free weights, one min-p test over the two on the same
    permutations (:func:`joint_permutation_test`, with ``parts`` "one-sided" and "two-sided").
    Each alone missed a shift the other caught (VALIDITY.md, token level)."""
    views = {"one-sided": design.with_features(design.F, nonneg=True),
             "two-sided": design.with_features(design.F, nonneg=False)}  # fmt: skip
    return joint_permutation_test(views, permutations, seed, alpha)


def surface_contrasts(S: np.ndarray, unit_files, files, y: np.ndarray, top: int = 3) -> list:
    """The ``top`` surface statistics whose file means differ most between suspected (y = 1)
    and unseen files, as Cohen's d (suspected minus unseen, pooled sd) with both means."""
    from mia_ray.detectors.dataset_inference import file_means

    F = file_means(unit_files, S, files)
    rows = []
    for j, name in enumerate(SURFACE_FEATURES):
        a, b = F[y == 1, j], F[y == 0, j]
        pooled = np.sqrt(((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1))
                         / max(a.size + b.size - 2, 1))  # fmt: skip
        d = 0.0 if pooled == 0 else float((a.mean() - b.mean()) / pooled)
        rows.append({"feature": name, "cohens_d": round(d, 3),
                     "suspected_mean": round(float(a.mean()), 4),
                     "unseen_mean": round(float(b.mean()), 4)})  # fmt: skip
    rows.sort(key=lambda r: -abs(r["cohens_d"]))
    return rows[:top]
