"""FROZEN: the audit's dataset inference as it was before issue 27 (commit 937be49), kept only
so that bench/validity.py can measure "before" beside "after" in one run. Not used by mia_ray.

Dataset inference by cross-fitting (LLM Dataset Inference, Maini et al. 2024), on files.

The files are split into halves A/B, stratified by group (suspected = 1, unseen = 0) and
seeded. A linear model fitted on A's snippets tells suspected from unseen by their features;
it scores B's snippets, and a file's score is the mean over its snippets. Then the halves
swap, and the whole is repeated over seeds. A file's score therefore always comes from a
model that never saw the file or its label.

Per half, scores are centred and scaled by the mean and standard deviation of every file in
that half (a symmetric function of the half's files, so exchangeable files stay so), which
puts the two halves' models on one scale before their scores are pooled.

- ``LinearFeatureScorer``: impute, standardize, L2 logistic regression; every file weighs the
  same (its snippets share a weight of 1) and both groups weigh the same.
- ``TextScorer``: the blind bag-of-words baseline (``detectors.blind``), for the blind check.
- ``cross_fit`` -> rounds; ``dataset_test`` -> the combined one-sided Welch test;
  ``file_pvalues`` -> one conformal p-value per suspected file.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator

from mia_ray.errors import MiaError
from mia_ray.stats.audit import conformal_pvalues, two_times_median, welch_greater

MIN_FILES_PER_GROUP = 4  # two per half: a Welch test needs 2 values on each side


class LinearFeatureScorer(BaseEstimator):
    """Snippet features (n, d) -> a membership score (n,): median imputation, standardization,
    L2 logistic regression (``C``). ``coef_`` (d,) are the weights on standardized features."""

    def __init__(self, C: float = 1.0):
        self.C = C

    def fit(self, X, y, groups) -> LinearFeatureScorer:
        from sklearn.impute import SimpleImputer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=int)
        self.pipeline_ = make_pipeline(
            SimpleImputer(strategy="median", keep_empty_features=True),
            StandardScaler(),
            LogisticRegression(C=self.C, max_iter=2000),
        )
        self.pipeline_.fit(X, y, logisticregression__sample_weight=_file_weights(y, groups))
        self.coef_ = self.pipeline_[-1].coef_[0].copy()
        return self

    def score_samples(self, X) -> np.ndarray:
        return self.pipeline_.decision_function(np.asarray(X, dtype=np.float64))


class TextScorer(BaseEstimator):
    """Snippet texts -> the blind baseline's member probability; never sees a model."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def fit(self, texts, y, groups) -> TextScorer:
        from mia_ray.detectors.blind import BlindBagOfWords

        self.model_ = BlindBagOfWords(seed=self.seed).fit(list(texts), np.asarray(y, dtype=int))
        return self

    def score_samples(self, texts) -> np.ndarray:
        return self.model_.score_samples(list(texts))


@dataclass
class Round:
    """One seed's cross-fit: each file's half (0/1) and out-of-fold score, and the fitted
    models' ``coef_`` where they have one."""

    seed: int
    half: dict[str, int]
    score: dict[str, float]
    coefs: list[np.ndarray] = field(default_factory=list)


def check_groups(files: dict[str, int], what: str = "") -> None:
    """Each group needs MIN_FILES_PER_GROUP files for a test in each half."""
    n1 = sum(1 for v in files.values() if v == 1)
    n0 = len(files) - n1
    for n, name in ((n1, "suspected"), (n0, "unseen")):
        if n < MIN_FILES_PER_GROUP:
            raise MiaError(
                f"{what}{name} has {n} file(s): the dataset test needs at least "
                f"{MIN_FILES_PER_GROUP} (2 in each cross-fitting half)"
            )


def halves(files: dict[str, int], seed: int) -> dict[str, int]:
    """Stratified, seeded halves: file -> 0/1; each group is split as evenly as it can be."""
    out: dict[str, int] = {}
    for g in (1, 0):
        ids = sorted(f for f, v in files.items() if v == g)
        random.Random(f"audit-halves-{seed}-{g}").shuffle(ids)
        for i, f in enumerate(ids):
            out[f] = i % 2
    return out


def cross_fit(
    unit_files: Sequence[str],
    inputs: Any,
    files: dict[str, int],
    make_scorer: Callable[[], Any],
    seeds: Sequence[int],
) -> list[Round]:
    """Out-of-fold file scores over ``seeds``.

    ``unit_files`` (n,): the file of each snippet; ``inputs``: the snippets' features (n, d)
    or texts (n,); ``files``: file -> 1 suspected / 0 unseen (files not in it are ignored).
    ``make_scorer()`` returns a fresh estimator with ``fit(inputs, y, groups)`` and
    ``score_samples(inputs)``.
    """
    check_groups(files)
    unit_files = np.asarray(unit_files, dtype=object)
    known = np.array([f in files for f in unit_files])
    missing = set(files) - set(unit_files[known])
    if missing:
        raise MiaError(f"{len(missing)} file(s) have no snippet, e.g. {sorted(missing)[0]}")
    rounds = []
    for seed in seeds:
        half = halves(files, seed)
        unit_half = np.array([half.get(f, -1) for f in unit_files])
        score: dict[str, float] = {}
        coefs = []
        for h in (0, 1):
            train = np.flatnonzero(unit_half == 1 - h)
            test = np.flatnonzero(unit_half == h)
            y = np.array([files[f] for f in unit_files[train]])
            scorer = make_scorer().fit(_take(inputs, train), y, unit_files[train])
            if hasattr(scorer, "coef_"):
                coefs.append(np.asarray(scorer.coef_, dtype=np.float64))
            s = np.asarray(scorer.score_samples(_take(inputs, test)), dtype=np.float64)
            per_file = _file_means(unit_files[test], s)
            vals = np.array(list(per_file.values()))
            sd = vals.std(ddof=1)
            centre, scale = vals.mean(), (sd if sd > 0 else 1.0)
            score.update({f: float((v - centre) / scale) for f, v in per_file.items()})
        rounds.append(Round(seed=int(seed), half=half, score=score, coefs=coefs))
    return rounds


def dataset_test(rounds: Sequence[Round], files: dict[str, int], alpha: float) -> dict:
    """One-sided Welch test (suspected > unseen) on each held-out half of each round; the
    p-values merge by two-times-the-median (valid under any dependence)."""
    tests = []
    for r in rounds:
        for h in (0, 1):
            sus = [r.score[f] for f, v in files.items() if v == 1 and r.half[f] == h]
            uns = [r.score[f] for f, v in files.items() if v == 0 and r.half[f] == h]
            tests.append({"seed": r.seed, "half": h, **welch_greater(sus, uns)})
    p = two_times_median([t["p_value"] for t in tests])
    return {
        "p_value": p,
        "effect_size": float(np.median([t["effect_size"] for t in tests])),
        "alpha": alpha,
        "reject": bool(p < alpha),
        "n_suspected": sum(1 for v in files.values() if v == 1),
        "n_unseen": sum(1 for v in files.values() if v == 0),
        "halves": tests,
    }


def null_check(
    unit_files: Sequence[str],
    inputs: Any,
    unseen: Sequence[str],
    make_scorer: Callable[[], Any],
    seeds: Sequence[int],
    split_seed: int,
    alpha: float,
) -> dict:
    """The dataset test (:func:`cross_fit` over ``seeds``, :func:`dataset_test`) with the
    ``unseen`` files' random halves (:func:`halves` at ``split_seed``) as the two groups: no
    difference can be found there, so it rejects at most ``alpha`` of the time when the test
    is calibrated on these files."""
    pseudo = {f: int(h == 0) for f, h in halves(dict.fromkeys(unseen, 0), split_seed).items()}
    return dataset_test(cross_fit(unit_files, inputs, pseudo, make_scorer, seeds), pseudo, alpha)


def file_scores(rounds: Sequence[Round]) -> dict[str, float]:
    """Each file's out-of-fold score averaged over the rounds."""
    return {f: float(np.mean([r.score[f] for r in rounds])) for f in rounds[0].score}


def file_pvalues(
    rounds: Sequence[Round], files: dict[str, int], scheme: str
) -> dict[str, tuple[float, float, int]]:
    """Suspected file -> (score, conformal p-value, number of calibration files).

    ``cross``: the file's score averaged over rounds, ranked against every unseen file's
    (cross-conformal: all unseen files calibrate). ``split``: the first round only; the file
    is ranked against the unseen files of its own half, scored by the same model, which
    trained on neither (exact split-conformal, half the calibration files).
    """
    suspected = sorted(f for f, v in files.items() if v == 1)
    unseen = sorted(f for f, v in files.items() if v == 0)
    out: dict[str, tuple[float, float, int]] = {}
    if scheme == "cross":
        avg = file_scores(rounds)
        cal = np.array([avg[f] for f in unseen])
        ps = conformal_pvalues([avg[f] for f in suspected], cal)
        return {f: (avg[f], float(p), cal.size) for f, p in zip(suspected, ps, strict=True)}
    if scheme != "split":
        raise MiaError(f"unknown calibration scheme {scheme!r} (cross or split)")
    r = rounds[0]
    for h in (0, 1):
        sus = [f for f in suspected if r.half[f] == h]
        cal = np.array([r.score[f] for f in unseen if r.half[f] == h])
        ps = conformal_pvalues([r.score[f] for f in sus], cal)
        out.update({f: (r.score[f], float(p), cal.size) for f, p in zip(sus, ps, strict=True)})
    return out


def _file_weights(y: np.ndarray, groups) -> np.ndarray:
    """Each file's snippets share a weight of 1 / (files in its group): files and groups weigh
    alike whatever their snippet counts."""
    groups = np.asarray(groups, dtype=object)
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse]
    for g in (0, 1):
        n_files = len(set(groups[y == g]))
        if n_files == 0:
            raise MiaError("a cross-fitting half lacks suspected or unseen files")
        w[y == g] /= n_files
    return w * len(y) / w.sum()


def _file_means(unit_files: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for f, s in zip(unit_files, scores, strict=True):
        out.setdefault(f, []).append(s)
    return {f: float(np.mean(v)) for f, v in out.items()}


def _take(inputs: Any, idx: np.ndarray) -> Any:
    if isinstance(inputs, np.ndarray):
        return inputs[idx]
    return [inputs[i] for i in idx]
