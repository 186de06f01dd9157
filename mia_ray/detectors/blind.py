"""The blind baseline: how well membership can be told from the text alone, never the model.

Members and non-members that differ in topic, date or style are separable without any
model; an attack that does not beat this baseline has shown nothing (Das et al. 2024,
"Blind Baselines Beat Membership Inference Attacks for Foundation Models").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline

from mia_ray.errors import MiaError
from mia_ray.stats.metrics import as_labels, cv_splits, evaluate_scores


def _texts(texts: Sequence[str]) -> list[str]:
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise MiaError("blind baseline: every text must be a string")
    return texts


class BlindBagOfWords(BaseEstimator):
    """TF-IDF word n-grams + logistic regression; scores are member probabilities.

    ``oof_scores`` gives each row a score from a model fitted on the other folds only;
    ``fit`` / ``score_samples`` train on everything, for scoring new texts.
    """

    def __init__(
        self,
        folds: int = 5,
        seed: int = 0,
        max_features: int = 20000,
        ngram_range: tuple[int, int] = (1, 2),
    ):
        self.folds = folds
        self.seed = seed
        self.max_features = max_features
        self.ngram_range = ngram_range

    def _pipeline(self) -> Pipeline:
        return make_pipeline(
            TfidfVectorizer(
                max_features=self.max_features,
                ngram_range=tuple(self.ngram_range),
                sublinear_tf=True,
            ),
            # Balanced weights keep a majority class from flattening the probabilities.
            LogisticRegression(max_iter=1000, class_weight="balanced"),
        )

    def fit(self, texts: Sequence[str], labels) -> BlindBagOfWords:
        """Fit on all texts (n,) and labels (n,); sets ``pipeline_``."""
        texts, y = _texts(texts), as_labels(labels)
        if len(texts) != y.size:
            raise MiaError(f"blind baseline: {len(texts)} texts but {y.size} labels")
        self.pipeline_ = self._pipeline().fit(texts, y)
        return self

    def score_samples(self, texts: Sequence[str]) -> np.ndarray:
        """Member probability (n,) for each text, from the model fitted by ``fit``."""
        if not hasattr(self, "pipeline_"):
            raise MiaError("blind baseline: call fit before score_samples")
        return self.pipeline_.predict_proba(_texts(texts))[:, 1]

    def oof_scores(self, texts: Sequence[str], labels, groups=None) -> np.ndarray:
        """Out-of-fold member probability (n,) per text.

        Folds are stratified; with ``groups`` (n,), e.g. document ids, all snippets of one
        document fall in the same fold, so a document's own words never score it.
        """
        texts, y = _texts(texts), as_labels(labels)
        if len(texts) != y.size:
            raise MiaError(f"blind baseline: {len(texts)} texts but {y.size} labels")
        scores = np.empty(y.size, dtype=np.float64)
        for train, test in cv_splits(y, self.folds, self.seed, groups):
            model = self._pipeline().fit([texts[i] for i in train], y[train])
            scores[test] = model.predict_proba([texts[i] for i in test])[:, 1]
        return scores


def blind_baseline(
    texts: Sequence[str], labels, groups=None, folds: int = 5, seed: int = 0, **eval_kwargs
) -> dict:
    """:func:`~mia_ray.stats.metrics.evaluate_scores` of the blind out-of-fold scores, plus ``method``.

    ``groups`` (n,) groups both the classifier's folds and the threshold folds.
    """
    scores = BlindBagOfWords(folds=folds, seed=seed).oof_scores(texts, labels, groups)
    report = evaluate_scores(scores, labels, seed=seed, groups=groups, folds=folds, **eval_kwargs)
    cv = "k-fold grouped CV" if groups is not None else "k-fold CV"
    report["method"] = f"tfidf+logreg, {cv}"
    return report
