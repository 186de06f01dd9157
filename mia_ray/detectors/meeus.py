"""Document-level meta-classifier of Meeus et al. 2024, CopyCheck's "Meeus et al." baseline.

Meeus, Jain, Rei, de Montjoye, "Did the Neurons Read your Book? Document-level Membership
Inference for Large Language Models" (USENIX Security 2024): the target model scores every
token of a document; the token-level values are turned into a fixed-length vector of
handcrafted features (a normalised histogram, or summary statistics), and a supervised
meta-classifier (a random forest among others) trained on labelled member and non-member
documents predicts membership of new ones. CopyCheck (§V-C) trains it on a labelled set of
files disjoint from the suspected files and applies it to them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.ensemble import RandomForestClassifier

from mia_ray.errors import MiaError

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


def meeus_features(
    token_logprobs_per_snippet: Sequence[np.ndarray],
    file_ids: Sequence[str],
    n_bins: int = 100,
    max_nll: float = 20.0,
) -> tuple[list[str], np.ndarray]:
    """Handcrafted document features from token log-probabilities (Meeus et al. 2024).

    ``token_logprobs_per_snippet``: one array per snippet of log p(observed token), natural
    log, each <= 0; ``file_ids`` (n_snippets,): the snippet's file. A file's snippets are
    concatenated and described by its token negative log-likelihoods nll = -log p:

    - columns [0, n_bins): the share of the file's tokens whose nll falls in each of
      ``n_bins`` equal bins over [0, ``max_nll``] nats (nll above ``max_nll`` counts in the
      last bin); the row sums to 1;
    - then mean, std, min, max of nll and its percentiles 1, 5, 10, 25, 50, 75, 90, 95, 99.

    Returns the sorted file ids and features (n_files, n_bins + 13).

    Differences from the paper. Their bins come from the training documents' values; ours
    are fixed so that a training set and the suspected files share one feature space
    whoever computes them, and so that a feature means the same in every run. They use
    1000 bins; 100 bins of 0.2 nats keep bins populated for documents of a few thousand
    tokens. Left out, because log p(observed token) alone does not determine them: the
    token's rank in the model's distribution and the gap to the most likely token (both need
    the full next-token distribution), and the normalisation by a token's frequency or mean
    probability over a reference corpus (needs the token ids). Their token count feature is
    left out too: a document's length needs no model, and the blind baseline measures it.
    """
    if n_bins < 1:
        raise MiaError(f"n_bins must be >= 1, got {n_bins}")
    if not max_nll > 0:
        raise MiaError(f"max_nll must be > 0, got {max_nll}")
    arrays = [np.asarray(a, dtype=np.float64).ravel() for a in token_logprobs_per_snippet]
    ids = np.asarray([str(f) for f in file_ids])
    if ids.shape != (len(arrays),):
        raise MiaError(f"{ids.size} file ids for {len(arrays)} snippets")
    if not arrays:
        raise MiaError("no snippets to build features from")
    bad = sum(int((~np.isfinite(a)).sum()) for a in arrays)
    if bad:
        raise MiaError(f"{bad} token log-probabilities are NaN or inf")
    # 1e-6 absorbs float error in a log-softmax that should give log p <= 0.
    bad = sum(int((a > 1e-6).sum()) for a in arrays)
    if bad:
        raise MiaError(f"{bad} token log-probabilities are > 0; pass log p, not -log p")
    files = sorted(set(ids.tolist()))
    edges = np.linspace(0.0, max_nll, n_bins + 1)
    rows = []
    for f in files:
        nll = np.concatenate([arrays[i] for i in np.flatnonzero(ids == f)])
        if nll.size == 0:
            raise MiaError(f"file {f!r} has no tokens")
        nll = np.maximum(-nll, 0.0)
        counts, _ = np.histogram(np.minimum(nll, max_nll), bins=edges)
        stats = [nll.mean(), nll.std(), nll.min(), nll.max()]
        rows.append(np.concatenate([counts / nll.size, stats, np.percentile(nll, PERCENTILES)]))
    return files, np.vstack(rows)


class MeeusClassifier(BaseEstimator):
    """Random-forest meta-classifier on :func:`meeus_features`; label 1 = member (seen).

    Forest settings follow Meeus et al.'s code (500 trees, depth 5, 3 samples per leaf);
    their min-max feature scaling is omitted, as a forest is invariant to it.
    ``class_weight="balanced"`` (theirs: none) keeps an unbalanced training set from
    moving the 0.5 threshold of ``predict``.
    """

    def __init__(
        self,
        n_estimators: int = 500,
        max_depth: int | None = 5,
        min_samples_leaf: int = 3,
        class_weight: str | None = "balanced",
        seed: int = 0,
    ):
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.class_weight = class_weight
        self.seed = seed

    def fit(self, F, y) -> MeeusClassifier:
        """F (n_files, n_features) from :func:`meeus_features`, y (n_files,) 1 = member, 0 = not."""
        F = _features(F)
        y = np.asarray(y)
        if y.shape != (F.shape[0],):
            raise MiaError(f"{y.size} labels for {F.shape[0]} files")
        if not np.isin(y, (0, 1)).all():
            raise MiaError("labels must be 1 (member) or 0 (non-member)")
        n_pos = int(y.sum())
        n_neg = y.size - n_pos
        if min(n_pos, n_neg) < 2:
            raise MiaError(
                "the meta-classifier needs at least 2 labelled files per class, got "
                f"{n_pos} members and {n_neg} non-members"
            )
        self.model_ = RandomForestClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            class_weight=self.class_weight,
            random_state=self.seed,
        ).fit(F, y.astype(np.int64))
        self.classes_ = self.model_.classes_
        self.n_features_in_ = F.shape[1]
        return self

    def predict_proba(self, F) -> np.ndarray:
        """(n_files, 2): columns p(non-member), p(member)."""
        if not hasattr(self, "model_"):
            raise MiaError("Meeus classifier: call fit before predict_proba")
        F = _features(F)
        if F.shape[1] != self.n_features_in_:
            raise MiaError(
                f"Meeus classifier was fitted on {self.n_features_in_} features, got {F.shape[1]}"
                " (build train and test features with the same n_bins)"
            )
        return self.model_.predict_proba(F)

    def predict(self, F) -> np.ndarray:
        """(n_files,) 1 = member iff p(member) > 0.5; a tie at 0.5 is not evidence of membership."""
        return (self.predict_proba(F)[:, 1] > 0.5).astype(np.int64)


def _features(F) -> np.ndarray:
    F = np.asarray(F, dtype=np.float64)
    if F.ndim != 2 or F.shape[0] == 0:
        raise MiaError(
            f"features must be a non-empty 2-D array (n_files, n_features), got {F.shape}"
        )
    bad = int((~np.isfinite(F)).any(axis=1).sum())
    if bad:
        raise MiaError(f"{bad} of {F.shape[0]} feature rows hold NaN or inf")
    return F
