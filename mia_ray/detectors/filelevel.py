"""File-level seen/unseen detection without thresholds (CopyCheck §IV-C).

Snippet-level uncertainty features (n_snippets, d) are standardised, reduced by PCA to 10
components and max-pooled over each file's snippets; the files (n_files, k) are then split
into two groups, by clustering (GMM, Ward hierarchical, k-means; §IV-C2) or by an anomaly
detector (Isolation Forest, One-Class SVM, DBSCAN: normal vs anomalous; §V-B3, an ablation).

Orientation. PCA signs are arbitrary and cluster indices carry no meaning, so the group
called "unseen" is chosen by a rule on an orientation score the caller computes from the
un-PCA'd features: ``unseen_score`` (n_files,), higher = more uncertain = more likely
unseen. The group with the higher mean ``unseen_score`` is unseen, the other seen
(verdict 1). When the method yields one group only, or the two means tie, there is no
evidence to call any file seen: every file is unseen and its confidence is 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.cluster import DBSCAN, AgglomerativeClustering, KMeans
from sklearn.decomposition import PCA
from sklearn.ensemble import IsolationForest
from sklearn.metrics import pairwise_distances
from sklearn.mixture import GaussianMixture
from sklearn.preprocessing import StandardScaler
from sklearn.svm import OneClassSVM

from mia_ray.errors import MiaError
from mia_ray.registry import get, register
from mia_ray.stats.metrics import MetricInputError

RULE = "the group with the higher mean unseen_score is unseen"
RULE_SINGLE = "single group: no evidence to call any file seen, every file is unseen"
RULE_TIE = "tie in mean unseen_score: no evidence to call any file seen, every file is unseen"


def _file_index(file_ids: Sequence[str], n: int) -> tuple[list[str], np.ndarray]:
    """Sorted distinct ids and, for each of the n rows, the index of its id in that list."""
    ids = np.asarray([str(f) for f in file_ids])
    if ids.shape != (n,):
        raise MiaError(f"{ids.size} file ids for {n} snippets")
    uniq, inv = np.unique(ids, return_inverse=True)
    return uniq.tolist(), inv


def pool_files(
    X, file_ids: Sequence[str], n_components: int = 10, seed: int = 0
) -> tuple[list[str], np.ndarray]:
    """Standardise X (n_snippets, d), PCA to k = min(n_components, d, n_snippets), max-pool per file.

    Returns the sorted file ids (n_files) and the pooled features (n_files, k). A constant
    column standardises to 0 (StandardScaler's unit scale for zero variance), never NaN.
    PCA uses the full LAPACK SVD, so the result does not depend on ``seed``; the argument is
    kept so that every stage of the pipeline takes one.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise MiaError(f"snippet features must be a non-empty 2-D array, got shape {X.shape}")
    bad = int((~np.isfinite(X)).any(axis=1).sum())
    if bad:
        raise MiaError(f"{bad} of {X.shape[0]} snippet feature rows hold NaN or inf")
    if n_components < 1:
        raise MiaError(f"n_components must be >= 1, got {n_components}")
    ids, inv = _file_index(file_ids, X.shape[0])
    k = min(n_components, X.shape[1], X.shape[0])
    scaler = StandardScaler().fit(X)
    if not scaler.var_.any():
        raise MiaError(f"all {X.shape[1]} snippet features are constant: nothing tells files apart")
    Z = scaler.transform(X)
    Z = PCA(n_components=k, svd_solver="full", random_state=seed).fit_transform(Z)
    F = np.full((len(ids), k), -np.inf)
    np.maximum.at(F, inv, Z)
    return ids, F


def _check_files(F, unseen_score) -> tuple[np.ndarray, np.ndarray]:
    F = np.asarray(F, dtype=np.float64)
    u = np.asarray(unseen_score, dtype=np.float64)
    if F.ndim != 2 or F.shape[1] == 0:
        raise MiaError(f"file features must be a 2-D array (n_files, k), got shape {F.shape}")
    if F.shape[0] < 2:
        raise MiaError(f"need at least 2 files to split into groups, got {F.shape[0]}")
    if u.shape != (F.shape[0],):
        raise MiaError(f"{u.size} unseen scores for {F.shape[0]} files")
    bad = int((~np.isfinite(F)).any(axis=1).sum())
    if bad:
        raise MiaError(f"{bad} of {F.shape[0]} file feature rows hold NaN or inf")
    bad = int((~np.isfinite(u)).sum())
    if bad:
        raise MiaError(f"{bad} of {u.size} unseen scores are NaN or inf")
    return F, u


def _orient(groups: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, dict]:
    """Verdict (n,) (1 = seen) and the orientation record for raw groups (n,) in {0, 1}."""
    sizes = [int((groups == g).sum()) for g in (0, 1)]
    means = [float(u[groups == g].mean()) if n else None for g, n in enumerate(sizes)]
    record = {"group_mean_unseen_score": means, "group_sizes": sizes}
    if 0 in sizes:
        return np.zeros(u.size, dtype=np.int64), {
            **record,
            "unseen_group": None,
            "rule": RULE_SINGLE,
        }
    # Means of equal scores summed in different orders can differ in the last bits.
    if abs(means[0] - means[1]) <= 1e-12 * max(1.0, abs(means[0]), abs(means[1])):
        return np.zeros(u.size, dtype=np.int64), {**record, "unseen_group": None, "rule": RULE_TIE}
    unseen = int(means[1] > means[0])
    return (groups != unseen).astype(np.int64), {**record, "unseen_group": unseen, "rule": RULE}


def _centroid_margin(F: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """d_other / (d_own + d_other) per file, distances to the two group means; 0.5 if both 0."""
    if np.unique(groups).size < 2:
        return np.full(groups.size, 0.5)
    centroids = np.stack([F[groups == g].mean(axis=0) for g in (0, 1)])
    d = pairwise_distances(F, centroids)
    own = d[np.arange(groups.size), groups]
    other = d[np.arange(groups.size), 1 - groups]
    total = own + other
    return np.divide(other, total, out=np.full(groups.size, 0.5), where=total > 0)


class _FileGroups(BaseEstimator):
    """Split files into two raw groups, then orient them by the caller's unseen score.

    Fitted attributes: ``groups_`` (n_files,) raw group in {0, 1}; ``verdict_`` (n_files,)
    1 = seen, 0 = unseen; ``confidence_`` (n_files,) confidence in the file's group, hence
    in its verdict (per method, see the subclass; 0.5 for every file when no group is
    called seen); ``orientation_``: ``group_mean_unseen_score`` [mean of group 0, of group
    1] (None for an empty group), ``group_sizes``, ``unseen_group`` (0, 1 or None) and
    ``rule``. Files are fitted in an order fixed by their features (row norm, then score),
    so a result does not depend on the order the files come in.
    """

    def _split(self, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def fit(self, F, unseen_score) -> _FileGroups:
        """F (n_files, k) pooled features; unseen_score (n_files,), higher = more likely unseen."""
        F, u = _check_files(F, unseen_score)
        # Seeded initialisations pick files by position. Fitting in an order set by the row
        # norm (then the score) makes the split independent of the order the files come in
        # and of PCA sign flips, which leave every norm unchanged.
        order = np.lexsort((u, np.linalg.norm(F, axis=1)))
        split, conf = self._split(F[order])
        groups, confidence = np.empty(u.size, dtype=np.int64), np.empty(u.size)
        groups[order], confidence[order] = split, conf
        self.groups_ = groups
        self.verdict_, self.orientation_ = _orient(self.groups_, u)
        if self.orientation_["unseen_group"] is None:
            confidence = np.full(u.size, 0.5)
        self.confidence_ = confidence
        return self

    def fit_predict(self, F, unseen_score) -> np.ndarray:
        """``fit`` and return ``verdict_`` (n_files,)."""
        return self.fit(F, unseen_score).verdict_


@register("detector", "gmm")
class GMMFiles(_FileGroups):
    """Two-component full-covariance Gaussian mixture (CopyCheck's default clusterer).

    ``confidence_`` is the posterior probability of the assigned component, in [0.5, 1].

    ``n_init=1`` (sklearn's default: one EM run from a seeded k-means start). With ~50 files
    in 10 dimensions a full covariance has 55 free parameters per component, and the
    likelihood that picks among restarts favours degenerate splits: in a synthetic check
    (50 files, 10 pooled dimensions, 12 seeds, weak planted signal) ``n_init=10`` picked
    splits with a 2-4-file component in several seeds and no better mean balanced accuracy.
    ``reg_covar=1e-2`` (sklearn: 1e-6): a component of 10 files in 10 dimensions has a
    singular sample covariance; pooled PCA scores vary by 0.3-1.5 per column, so 1e-2 is a
    few percent of a column's variance, enough to bound the collapse, too small to blur it.
    """

    def __init__(
        self, n_init: int = 1, reg_covar: float = 1e-2, max_iter: int = 200, seed: int = 0
    ):
        self.n_init = n_init
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.seed = seed

    def _split(self, F):
        self.model_ = GaussianMixture(
            n_components=2,
            covariance_type="full",
            n_init=self.n_init,
            reg_covar=self.reg_covar,
            max_iter=self.max_iter,
            random_state=self.seed,
        ).fit(F)
        post = self.model_.predict_proba(F)
        groups = post.argmax(axis=1)
        return groups, post.max(axis=1)


@register("detector", "hierarchical")
class HierarchicalFiles(_FileGroups):
    """Agglomerative clustering, Euclidean distance, Ward linkage, cut at 2 clusters (§IV-C2).

    ``confidence_`` = d_other / (d_own + d_other), the distances from the file to the mean
    of the other and of its own cluster: 0.5 = equidistant, 1 = on its own cluster's mean.
    Ward can leave a file nearer the other mean, so values below 0.5 occur: range [0, 1].
    Deterministic; ``seed`` is accepted and unused.
    """

    def __init__(self, seed: int = 0):
        self.seed = seed

    def _split(self, F):
        groups = AgglomerativeClustering(n_clusters=2, linkage="ward").fit_predict(F)
        return groups, _centroid_margin(F, groups)


@register("detector", "kmeans")
class KMeansFiles(_FileGroups):
    """K-means with K = 2 (§IV-C2), 10 k-means++ restarts.

    ``confidence_`` = d_other / (d_own + d_other), the distances from the file to the other
    and to its own centroid; k-means assigns each file to its nearer centroid, so [0.5, 1].
    """

    def __init__(self, n_init: int = 10, seed: int = 0):
        self.n_init = n_init
        self.seed = seed

    def _split(self, F):
        self.model_ = KMeans(n_clusters=2, n_init=self.n_init, random_state=self.seed).fit(F)
        return self.model_.labels_, _centroid_margin(F, self.model_.labels_)


@register("detector", "isolation_forest")
class IsolationForestFiles(_FileGroups):
    """Isolation Forest (Liu et al. 2008): group 0 = normal, 1 = anomalous (CopyCheck §V-B3).

    sklearn defaults (the paper gives none). ``confidence_`` = 0.5 + min(|decision|, 0.5):
    with ``contamination="auto"`` the decision function is 0.5 - s(x), s the anomaly score
    of Liu et al. in (0, 1], so this is 0.5 + |s(x) - 0.5|, in [0.5, 1].
    """

    def __init__(self, n_estimators: int = 100, contamination="auto", seed: int = 0):
        self.n_estimators = n_estimators
        self.contamination = contamination
        self.seed = seed

    def _split(self, F):
        self.model_ = IsolationForest(
            n_estimators=self.n_estimators, contamination=self.contamination, random_state=self.seed
        ).fit(F)
        d = self.model_.decision_function(F)
        return (d < 0).astype(np.int64), 0.5 + np.minimum(np.abs(d), 0.5)


@register("detector", "one_class_svm")
class OneClassSVMFiles(_FileGroups):
    """One-Class SVM (Schölkopf et al.): group 0 = normal (inside), 1 = anomalous (CopyCheck §V-B3).

    sklearn defaults (RBF kernel, gamma="scale", nu=0.5; the paper gives none).
    ``confidence_`` = 0.5 + 0.5 tanh(|f(x) - rho| / rho), the margin relative to the
    offset rho (> 0 for an RBF kernel; 1 is used if rho <= 0): 0.5 on the boundary, in
    [0.5, 1). Deterministic; ``seed`` is accepted and unused.
    """

    def __init__(self, kernel: str = "rbf", nu: float = 0.5, gamma="scale", seed: int = 0):
        self.kernel = kernel
        self.nu = nu
        self.gamma = gamma
        self.seed = seed

    def _split(self, F):
        self.model_ = OneClassSVM(kernel=self.kernel, nu=self.nu, gamma=self.gamma).fit(F)
        d = self.model_.decision_function(F)
        rho = float(np.ravel(self.model_.offset_)[0])
        scale = rho if rho > 0 else 1.0
        return (d < 0).astype(np.int64), 0.5 + 0.5 * np.tanh(np.abs(d) / scale)


@register("detector", "dbscan")
class DBSCANFiles(_FileGroups):
    """DBSCAN: group 1 = noise (label -1, anomalous), group 0 = every cluster together (§V-B3).

    sklearn defaults (eps=0.5, min_samples=5; the paper gives none). In 10 pooled PCA
    dimensions eps=0.5 is small, and DBSCAN often calls every file noise: one group, so
    every file is unseen (see the module docstring). ``confidence_`` from delta, the
    distance to the nearest core point: a clustered file 1 - delta / (2 eps) in [0.5, 1]
    (1 on a core point), a noise file 1 - eps / (2 delta) in (0.5, 1).
    Deterministic; ``seed`` is accepted and unused.
    """

    def __init__(self, eps: float = 0.5, min_samples: int = 5, seed: int = 0):
        self.eps = eps
        self.min_samples = min_samples
        self.seed = seed

    def _split(self, F):
        self.model_ = DBSCAN(eps=self.eps, min_samples=self.min_samples).fit(F)
        groups = (self.model_.labels_ == -1).astype(np.int64)
        if self.model_.components_.shape[0] == 0:
            return groups, np.full(groups.size, 0.5)
        delta = pairwise_distances(F, self.model_.components_).min(axis=1)
        inside = 1 - delta / (2 * self.eps)
        outside = 1 - self.eps / (2 * np.maximum(delta, self.eps))
        return groups, np.where(groups == 0, inside, outside)


def detect_files(
    X,
    file_ids: Sequence[str],
    unseen_score_per_snippet,
    method: str = "gmm",
    n_components: int = 10,
    seed: int = 0,
    **params,
) -> dict:
    """Pool snippet features X (n_snippets, d) into files and split them with ``method``.

    ``unseen_score_per_snippet`` (n_snippets,): higher = more uncertain; a file's score is
    the mean over its snippets. ``method`` names a registered detector; ``seed`` and
    ``params`` go to it (``seed`` only where it takes one). Returns ``file_ids`` (sorted),
    ``verdict`` (n_files,) 1 = seen, ``confidence`` (n_files,), ``orientation``,
    ``features`` (n_files, k) and ``unseen_score`` (n_files,).
    """
    s = np.asarray(unseen_score_per_snippet, dtype=np.float64)
    n = np.asarray(X).shape[0] if np.ndim(X) else 0
    if s.shape != (n,):
        raise MiaError(f"{s.size} unseen scores for {n} snippets")
    ids, F = pool_files(X, file_ids, n_components=n_components, seed=seed)
    _, inv = _file_index(file_ids, n)
    u = np.bincount(inv, weights=s, minlength=len(ids)) / np.bincount(inv, minlength=len(ids))
    cls = get("detector", method)
    valid = cls().get_params()
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise MiaError(
            f"detector {method!r} has no setting {', '.join(unknown)} "
            f"(settings: {', '.join(sorted(valid))})"
        )
    detector = cls(**params)
    if "seed" in valid:
        detector.set_params(seed=seed)
    detector.fit(F, u)
    return {
        "file_ids": ids,
        "verdict": detector.verdict_,
        "confidence": detector.confidence_,
        "orientation": detector.orientation_,
        "features": F,
        "unseen_score": u,
    }


def confusion(verdict, truth) -> dict:
    """Counts and accuracies of verdicts (n,) against truth (n,), positive = seen = 1 (§V-A4).

    Keys: tp, fp, fn, tn; acc; tpr = TP / (TP + FN) and tnr = TN / (TN + FP), None where
    the class is absent from truth; bacc = (tpr + tnr) / 2. When truth holds one class only,
    bacc is that class's rate alone and ``note`` says so (None otherwise). NaN is never
    returned, so the dict serialises as strict JSON.
    """
    v, t = np.asarray(verdict), np.asarray(truth)
    if v.ndim != 1 or v.shape != t.shape:
        raise MetricInputError(f"verdict {v.shape} and truth {t.shape} must be 1-D of one length")
    if v.size == 0:
        raise MetricInputError("confusion needs at least one file")
    for name, a in (("verdict", v), ("truth", t)):
        if not np.isin(a, (0, 1)).all():
            raise MetricInputError(f"{name} must be 1 (seen) or 0 (unseen)")
    v, t = v.astype(np.int64), t.astype(np.int64)
    tp = int(((v == 1) & (t == 1)).sum())
    fp = int(((v == 1) & (t == 0)).sum())
    fn = int(((v == 0) & (t == 1)).sum())
    tn = int(((v == 0) & (t == 0)).sum())
    tpr = tp / (tp + fn) if tp + fn else None
    tnr = tn / (tn + fp) if tn + fp else None
    if tpr is None:
        bacc, note = tnr, "truth has no seen file: bacc is the TNR alone"
    elif tnr is None:
        bacc, note = tpr, "truth has no unseen file: bacc is the TPR alone"
    else:
        bacc, note = (tpr + tnr) / 2, None
    return {
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "acc": (tp + tn) / v.size,
        "bacc": bacc,
        "tpr": tpr,
        "tnr": tnr,
        "note": note,
    }
