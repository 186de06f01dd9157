"""Membership-inference metrics: AUC, TPR at low FPR, bootstrap intervals, CV threshold accuracy.

Labels: 1 = member, 0 = non-member. Scores: higher = more likely a member. Reporting follows
Carlini et al. 2022 ("Membership Inference Attacks From First Principles"): TPR at low FPR
next to AUC, each with a bootstrap confidence interval.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

from mia_ray.errors import MiaError


class MetricInputError(MiaError, ValueError):
    """Unusable scores or labels: a ValueError to callers, one clear line in the CLI."""


def as_labels(labels) -> np.ndarray:
    """Membership labels (n,) as int64 0/1; raises unless both classes are present."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise MetricInputError(f"labels must be 1-D, got shape {y.shape}")
    if not np.isin(y, (0, 1)).all():
        raise MetricInputError("labels must be 1 (member) or 0 (non-member)")
    y = y.astype(np.int64)
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == y.size:
        raise MetricInputError(
            f"need both members and non-members (got {n_pos} members, {y.size - n_pos} non-members)"
        )
    return y


def _check(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    y = as_labels(labels)
    if s.shape != y.shape:
        raise MetricInputError(f"{s.size} scores but {y.size} labels")
    n_nan = int(np.isnan(s).sum())
    if n_nan:
        raise MetricInputError(f"{n_nan} of {s.size} scores are NaN")
    return s, y


def _roc(s: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ROC point for "member iff score >= thr[i]": fpr, tpr, thr, each (m+1,).

    thr holds the m distinct scores in descending order after a leading +inf (reject all).
    Tied scores move together, so a tie is a diagonal segment (half credit in the AUC).
    """
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    # != rather than np.diff: -inf - -inf is nan, which would split a tie.
    last = np.flatnonzero(np.r_[s[1:] != s[:-1], True])
    tps = np.cumsum(y)[last]
    fps = last + 1 - tps
    fpr = np.r_[0.0, fps / fps[-1]]
    tpr = np.r_[0.0, tps / tps[-1]]
    return fpr, tpr, np.r_[np.inf, s[last]]


def _auc(fpr: np.ndarray, tpr: np.ndarray) -> float:
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1])) / 2)


def _tpr_at(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    # The tolerance absorbs float error in k/n so that 1/100 counts as FPR <= 0.01.
    return float(tpr[fpr <= target + 1e-12].max())


def _check_fpr(fpr: float) -> float:
    if not 0 <= fpr <= 1:
        raise MetricInputError(f"FPR must lie in [0, 1], got {fpr}")
    return float(fpr)


def roc_auc(scores, labels) -> float:
    """Area under the ROC curve; scores (n,), labels (n,). Ties count one half."""
    s, y = _check(scores, labels)
    fpr, tpr, _ = _roc(s, y)
    return _auc(fpr, tpr)


def roc_points(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    """Every ROC point (fpr, tpr), each (m+1,) for m distinct scores, from (0, 0) to (1, 1)."""
    s, y = _check(scores, labels)
    fpr, tpr, _ = _roc(s, y)
    return fpr, tpr


def tpr_at_fpr(scores, labels, fpr: float) -> float:
    """Largest TPR over thresholds whose FPR <= ``fpr`` (Carlini et al. 2022), no interpolation.

    With n non-members the reachable FPRs are k/n: at 0.1 % FPR and 500 non-members only
    thresholds with no false positive count. If no threshold but "reject all" qualifies,
    the result is 0.0.
    """
    target = _check_fpr(fpr)
    s, y = _check(scores, labels)
    f, t, _ = _roc(s, y)
    return _tpr_at(f, t, target)


def bootstrap_ci(
    metric_fn: Callable[[np.ndarray, np.ndarray], float | Sequence[float]],
    scores,
    labels,
    n: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    groups=None,
):
    """Percentile bootstrap interval (lo, hi) of ``metric_fn(scores, labels)``.

    Members and non-members are resampled separately, with replacement and at their own
    sizes, so every draw has both classes. ``metric_fn`` may return a vector (k,); then lo
    and hi are arrays (k,), one interval per entry from the same draws.

    ``groups`` (n,), e.g. the document of each snippet: when some group holds several rows,
    whole groups are resampled (a cluster bootstrap). Snippets of one document are not
    independent draws; resampling them one by one gives intervals that are too narrow.
    """
    s, y = _check(scores, labels)
    if n < 1:
        raise MetricInputError(f"bootstrap needs n >= 1 resamples, got {n}")
    if not 0 < ci < 1:
        raise MetricInputError(f"ci must lie in (0, 1), got {ci}")
    rng = np.random.default_rng(seed)
    units = _bootstrap_units(y, groups)
    pos = [u for u in units if y[u[0]] == 1]
    neg = [u for u in units if y[u[0]] == 0]
    singletons = all(u.size == 1 for u in units)
    pos_rows, neg_rows = np.concatenate(pos), np.concatenate(neg)
    draws = []
    for _ in range(n):
        if singletons:  # the plain row bootstrap (same draws as with no groups at all)
            idx = np.concatenate(
                [rng.choice(pos_rows, pos_rows.size), rng.choice(neg_rows, neg_rows.size)]
            )
        else:
            picks = [rng.choice(len(pos), len(pos)), rng.choice(len(neg), len(neg))]
            idx = np.concatenate([pos[i] for i in picks[0]] + [neg[i] for i in picks[1]])
        draws.append(metric_fn(s[idx], y[idx]))
    lo, hi = np.percentile(
        np.asarray(draws, dtype=np.float64), [50 * (1 - ci), 50 * (1 + ci)], axis=0
    )
    if np.ndim(lo) == 0:
        return float(lo), float(hi)
    return lo, hi


def _bootstrap_units(y: np.ndarray, groups) -> list[np.ndarray]:
    """Row indices per resampling unit: one row each without ``groups``, else per group
    (first-appearance order). A group must not mix members and non-members."""
    if groups is None:
        return [np.array([i]) for i in range(y.size)]
    g = np.asarray(groups)
    if g.shape != y.shape:
        raise MetricInputError(f"{g.size} groups but {y.size} labels")
    _, first, inverse = np.unique(g, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rows = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse))[:-1]
    by_group = np.split(rows, bounds)
    units = [by_group[k] for k in order]
    for u in units:
        if np.unique(y[u]).size > 1:
            raise MetricInputError(
                f"group {str(g[u[0]])!r} holds both members and non-members: a group is resampled "
                "whole, so it needs one label"
            )
    return units


def cv_splits(
    labels, folds: int = 5, seed: int = 0, groups=None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified (train_idx, test_idx) folds; with ``groups`` (n,) no group straddles folds.

    Folds shrink to the number of rows (or groups) of the rarer class, down to 2; every
    training part then holds both classes, or this raises.
    """
    y = as_labels(labels)
    if folds < 2:
        raise MiaError(f"cross-validation needs at least 2 folds, got {folds}")
    if groups is None:
        units = "rows"
        n_pos, n_neg = int(y.sum()), int(y.size - y.sum())
        splitter = StratifiedKFold
    else:
        g = np.asarray(groups)
        if g.shape != y.shape:
            raise MiaError(f"{g.size} groups but {y.size} labels")
        units = "groups"
        n_pos, n_neg = np.unique(g[y == 1]).size, np.unique(g[y == 0]).size
        splitter = StratifiedGroupKFold
    k = min(folds, n_pos, n_neg)
    if k < 2:
        raise MiaError(
            f"cannot cross-validate: members span {n_pos} and non-members {n_neg} {units}; "
            "each class needs at least 2"
        )
    cv = splitter(n_splits=k, shuffle=True, random_state=seed)
    splits = list(cv.split(np.zeros(y.size), y, groups))
    for train, _ in splits:
        if np.unique(y[train]).size < 2:
            raise MiaError(
                f"cannot cross-validate: a {k}-fold split by group left one class out of a "
                "training part; give more groups per class"
            )
    return splits


def _best_threshold(s: np.ndarray, y: np.ndarray) -> float:
    """The threshold t ("member iff score >= t") that maximises balanced accuracy on (s, y).

    Balanced accuracy = (1 + TPR - FPR) / 2, so this maximises Youden's J over ROC points;
    ties go to the stricter threshold. t lies midway between the lowest accepted and the
    highest rejected score, so unseen scores in that gap are split evenly.
    """
    fpr, tpr, thr = _roc(s, y)
    i = int(np.argmax(tpr - fpr))
    if i == 0:
        return float("inf")
    a = thr[i]
    b = thr[i + 1] if i + 1 < thr.size else -np.inf
    return float(a / 2 + b / 2 if np.isfinite(b) else a)


def cv_threshold_accuracy(scores, labels, folds: int = 5, seed: int = 0, groups=None) -> dict:
    """Accuracy of a threshold chosen out of fold; scores (n,), labels (n,), groups (n,) or None.

    Each fold's rows are classified by the threshold that maximises balanced accuracy on the
    other folds, so no row is judged by a threshold its own label helped choose. Returns
    ``balanced_accuracy``, ``accuracy``, ``thresholds`` (one per fold) and ``folds`` (the
    number used, after shrinking for a rare class; see :func:`cv_splits`).
    """
    s, y = _check(scores, labels)
    splits = cv_splits(y, folds, seed, groups)
    pred = np.zeros(y.size, dtype=np.int64)
    thresholds = []
    for train, test in splits:
        t = _best_threshold(s[train], y[train])
        pred[test] = s[test] >= t
        thresholds.append(t)
    tpr = float(pred[y == 1].mean())
    tnr = float(1 - pred[y == 0].mean())
    return {
        "balanced_accuracy": (tpr + tnr) / 2,
        "accuracy": float((pred == y).mean()),
        "thresholds": thresholds,
        "folds": len(splits),
    }


def evaluate_scores(
    scores,
    labels,
    fprs: Sequence[float] = (0.001, 0.01, 0.05),
    bootstrap: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    groups=None,
    folds: int = 5,
) -> dict:
    """Everything a report states about one score column; scores (n,), labels (n,).

    Keys: auc, auc_ci [lo, hi], tpr_at_fpr {f"{fpr:g}": tpr}, tpr_at_fpr_ci {key: [lo, hi]},
    balanced_accuracy and accuracy (out-of-fold threshold, :func:`cv_threshold_accuracy`,
    grouped by ``groups``), n_members, n_nonmembers, roc {"fpr": [...], "tpr": [...]} (at most
    200 points, for plots). Plain Python values only. ``bootstrap=0`` skips the intervals
    (they are then None).
    """
    targets = [_check_fpr(f) for f in fprs]
    s, y = _check(scores, labels)
    keys = [f"{f:g}" for f in targets]

    def summary(s_: np.ndarray, y_: np.ndarray) -> list[float]:
        # One ROC per draw serves the AUC and every TPR@FPR.
        fpr_, tpr_, _ = _roc(s_, y_)
        return [_auc(fpr_, tpr_), *(_tpr_at(fpr_, tpr_, t) for t in targets)]

    point = summary(s, y)
    if bootstrap:
        lo, hi = bootstrap_ci(summary, s, y, n=bootstrap, ci=ci, seed=seed, groups=groups)
        intervals = [[float(a), float(b)] for a, b in zip(lo, hi, strict=True)]
    else:
        intervals = [None] * len(point)
    acc = cv_threshold_accuracy(s, y, folds=folds, seed=seed, groups=groups)

    fpr, tpr, _ = _roc(s, y)
    # Collinear points add nothing to a plot; drop them before thinning to 200.
    corner = np.r_[True, (np.diff(fpr, 2) != 0) | (np.diff(tpr, 2) != 0), True]
    fpr, tpr = fpr[corner], tpr[corner]
    if fpr.size > 200:
        keep = np.unique(np.linspace(0, fpr.size - 1, 200).round().astype(int))
        fpr, tpr = fpr[keep], tpr[keep]

    return {
        "auc": point[0],
        "auc_ci": intervals[0],
        "tpr_at_fpr": dict(zip(keys, point[1:], strict=True)),
        "tpr_at_fpr_ci": dict(zip(keys, intervals[1:], strict=True)),
        "balanced_accuracy": acc["balanced_accuracy"],
        "accuracy": acc["accuracy"],
        "n_members": int(y.sum()),
        "n_nonmembers": int(y.size - y.sum()),
        "roc": {"fpr": fpr.tolist(), "tpr": tpr.tolist()},
    }


def wilson_interval(k: int, n: int, ci: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (sound at k = 0 or k = n, unlike the
    normal approximation). n = 0 gives (0, 1): nothing is known."""
    from scipy.stats import norm

    if n < 0 or not 0 <= k <= n:
        raise MiaError(f"a proportion needs 0 <= k <= n, not k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    z = float(norm.ppf(0.5 + ci / 2))
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At k = 0 (k = n) the bound is exactly 0 (1); in floats center - half is ~1e-18 above
    # 0, above the rate itself, which breaks error bars drawn from rate - lo.
    lo = 0.0 if k == 0 else max(0.0, center - half)
    hi = 1.0 if k == n else min(1.0, center + half)
    return float(lo), float(hi)
