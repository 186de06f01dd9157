"""Dataset inference by cross-fitting (LLM Dataset Inference, Maini et al. 2024), on files,
with a permutation test of the whole procedure and conformal p-values per file.

Units are files, kept together in *groups* (a source: a book's chapters, a file and its
near-duplicates; a file alone is its own group). A group is wholly suspected (1) or unseen (0).

- :func:`file_matrix`: snippet features (n_snippets, d) -> one row per file (n_files, d): each
  feature's missing values get its median over all snippets, a file's row is the mean of its
  snippets', and columns are standardized over the files. :func:`text_matrix` does the same for
  the blind check from the snippets' words (tf-idf 1-2 grams, file means, truncated SVD).
  Both are label-free, so they can be computed once for the observed labels and every
  permutation alike.
- One *round*: the groups are split into halves, stratified by side and seeded; a ridge
  discriminant (least squares on the 0/1 side, both sides weighing alike, ridge 1/(C n_train))
  fitted on one half scores the other half's files, and the held-out half's AUC (suspected
  vs unseen, ties counting 1/2: the Mann-Whitney statistic, a rank statistic) measures the
  separation. Halves swap; rounds repeat over seeds. The statistic T is the mean held-out AUC.
- ``nonneg=True`` (the dataset test): the weights are constrained to be >= 0. Every feature is
  oriented "higher = member", so only files that look *more* trained-on than unseen ones can
  raise T; with no such feature every weight is 0, every score ties and T = 1/2.
  ``nonneg=False`` (the blind check): free weights, so any difference in kind raises T.
- :func:`permutation_test`: T for the observed sides and for ``permutations`` random
  permutations of the groups' sides (the whole cross-fit redone each time);
  p = (1 + #{T_perm >= T_obs}) / (permutations + 1), exactly valid when the groups' sides are
  exchangeable (H0: the model treats suspected and unseen sources alike), whatever the
  features' distribution, the files' dependence within a group or the fits' quality.
- :func:`pooled_pvalues` (the audit's per-file p-values): each group's score is fixed
  without the sides (the mean of its standardized features), and a suspected group is
  ranked against every unseen group, each weighing its files: exact for a file of a group
  exchangeable with the unseen ones (see there). :func:`file_pvalues`, the former scheme
  kept for the comparison in VALIDITY.md: in a round a suspected file is ranked against the
  unseen files of its own held-out half (one per unseen group), scored by the fit on the
  other half (split-conformal; Vovk et al. 2005, Bates et al. 2023), the largest over rounds.

Pure numpy/scipy/sklearn: no model, no Ray.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from mia_ray.errors import MiaError
from mia_ray.log import log
from mia_ray.stats.audit import cohens_d

MIN_GROUPS_PER_SIDE = 4  # two per half: a held-out AUC and a fit need each side in each half
CHUNK = 256  # permutations fitted together (bounded memory: CHUNK x n_files x d^2 floats)
MAX_PERMUTATIONS = 100_000
PROGRESS_EVERY_S = 10.0


# ---------------------------------------------------------------- label-free matrices


def file_matrix(unit_files: Sequence[str], X, files: Sequence[str]) -> np.ndarray:
    """Snippet features ``X`` (n_snippets, d) of files ``unit_files`` (n_snippets,) -> one
    standardized row per file of ``files`` (n_files, d), in the order of ``files``."""
    X = np.asarray(X, dtype=np.float64)
    idx, keep = _file_index(unit_files, files)
    X = X[keep]
    med = np.nanmedian(np.where(np.isfinite(X), X, np.nan), axis=0) if X.size else np.zeros(0)
    med = np.where(np.isfinite(med), med, 0.0)
    X = np.where(np.isfinite(X), X, med)
    F = _file_means(idx, X, len(files))
    return _standardize(F)


def text_matrix(
    unit_files: Sequence[str],
    texts: Sequence[str],
    files: Sequence[str],
    dims: int = 64,
    vectorizer=None,
) -> np.ndarray:
    """The blind check's rows: tf-idf of word 1-2 grams (lowercased; or ``vectorizer``'s
    terms) over the snippets, averaged per file and reduced to at most ``dims`` components by
    a truncated SVD (n_files, k), centred and scaled as a whole (mean squared row norm 1).
    The components keep their relative variance, so the ridge shrinks the minor ones most,
    as it would on the tf-idf itself; standardizing each would blow up noise directions
    (measured: web leads vs play scenes, held-out AUC 0.76 standardized, 1.0 not)."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    idx, keep = _file_index(unit_files, files)
    kept = [t for t, k in zip(texts, keep, strict=True) if k]
    if vectorizer is None:
        vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, max_features=20000)
    try:
        M = vectorizer.fit_transform(kept)
    except ValueError:  # no term anywhere (no word of two letters or more): nothing to tell apart
        return np.zeros((len(files), 1))
    import scipy.sparse as sp

    counts = np.bincount(idx, minlength=len(files)).astype(np.float64)
    avg = sp.csr_matrix(
        (1.0 / counts[idx], (idx, np.arange(len(idx)))), shape=(len(files), len(idx))
    )
    Mf = avg @ M
    k = int(min(dims, len(files) - 1, Mf.shape[1] - 1))
    if k < 1:
        Z = Mf.toarray()
    else:
        Z = TruncatedSVD(n_components=k, random_state=0, algorithm="randomized").fit_transform(Mf)
    Z = Z - Z.mean(axis=0)
    norm = np.sqrt((Z**2).sum(axis=1).mean())
    return Z / norm if norm > 0 else Z


def file_means(unit_files: Sequence[str], X, files: Sequence[str]) -> np.ndarray:
    """Each file's mean row of ``X`` (n_snippets, d), in the order of ``files`` (unscaled)."""
    idx, keep = _file_index(unit_files, files)
    return _file_means(idx, np.asarray(X, dtype=np.float64)[keep], len(files))


def _file_index(unit_files, files) -> tuple[np.ndarray, np.ndarray]:
    pos = {f: i for i, f in enumerate(files)}
    units = list(unit_files)
    keep = np.array([u in pos for u in units], dtype=bool)
    idx = np.array([pos[u] for u in units if u in pos], dtype=np.int64)
    missing = sorted(set(files) - {units[i] for i in np.flatnonzero(keep)})
    if missing:
        raise MiaError(f"{len(missing)} file(s) have no snippet, e.g. {missing[0]}")
    return idx, keep


def _file_means(idx: np.ndarray, X: np.ndarray, n: int) -> np.ndarray:
    F = np.zeros((n, X.shape[1]))
    np.add.at(F, idx, X)
    return F / np.bincount(idx, minlength=n)[:, None]


def _standardize(F: np.ndarray) -> np.ndarray:
    F = np.asarray(F, dtype=np.float64)
    sd = F.std(axis=0)
    return np.where(sd > 0, (F - F.mean(axis=0)) / np.where(sd > 0, sd, 1.0), 0.0)


# ---------------------------------------------------------------- the fits


def nonneg_quadratic(A: np.ndarray, b: np.ndarray, max_iter: int = 0) -> np.ndarray:
    """argmin over x >= 0 of x'Ax/2 - b'x for each of a batch of SPD ``A`` (B, d, d), ``b`` (B, d).

    Block principal pivoting (Kim & Park 2011, with their backup rule): the KKT conditions are
    x >= 0, g = Ax - b >= 0, x g = 0; each step exchanges every infeasible variable between the
    free and the zero set and solves the free ones exactly. A row that has not settled after
    ``max_iter`` steps (default 5 d + 10) is solved by scipy's NNLS on its Cholesky factor."""
    A = np.asarray(A, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    B, d = b.shape
    max_iter = max_iter or 5 * d + 10
    free = np.zeros((B, d), dtype=bool)
    x = np.zeros((B, d))
    g = -b.copy()
    tol = 1e-12 * (1.0 + np.abs(b).max(axis=1, keepdims=True))
    best = np.full(B, d + 1)
    backup = np.full(B, 3)
    eye = np.eye(d, dtype=bool)
    active = np.ones(B, dtype=bool)
    for _ in range(max_iter):
        bad = (free & (x < -tol)) | (~free & (g < -tol))
        n_bad = bad.sum(axis=1)
        active = n_bad > 0
        if not active.any():
            break
        better = active & (n_bad < best)
        best = np.where(better, n_bad, best)
        backup = np.where(better, 3, backup)
        full = better | (active & (backup >= 1))
        backup = np.where(active & ~better & (backup >= 1), backup - 1, backup)
        # The backup rule: when the count of infeasible variables stops falling, exchange only
        # the last one (guarantees termination).
        last = np.zeros_like(bad)
        rows = np.flatnonzero(active & ~full)
        if rows.size:
            last[rows, d - 1 - np.argmax(bad[rows, ::-1], axis=1)] = True
        flip = np.where(full[:, None], bad, last) & active[:, None]
        free ^= flip
        x, g = _solve_free(A, b, free, eye)
    if active.any():
        x = x.copy()
        for i in np.flatnonzero(active):
            x[i] = _nnls_one(A[i], b[i])
    return np.maximum(x, 0.0)


def _solve_free(A, b, free, eye):
    both = free[:, :, None] & free[:, None, :]
    Ar = np.where(both, A, np.where(eye, 1.0, 0.0))
    x = np.linalg.solve(Ar, np.where(free, b, 0.0)[..., None])[..., 0]
    x = np.where(free, x, 0.0)
    g = np.einsum("bij,bj->bi", A, x) - b
    return x, np.where(free, 0.0, g)


def _nnls_one(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    L = np.linalg.cholesky(A)
    # x'Ax/2 - b'x = |L'x - L^-1 b|^2 / 2 + const
    return nnls(L.T, np.linalg.solve(L, b))[0]


def _fit(F, outer, train_w, y, C, nonneg) -> np.ndarray:
    """Ridge discriminant weights (B, d): least squares of the 0/1 side on the files' rows with
    the training weights ``train_w`` (B, n; each row sums to 1, both sides weigh 1/2)."""
    Bc, d = train_w.shape[0], F.shape[1]
    n_train = (train_w > 0).sum(axis=1)
    fbar = train_w @ F
    A = (train_w @ outer).reshape(Bc, d, d) - fbar[:, :, None] * fbar[:, None, :]
    A += (1.0 / (C * n_train))[:, None, None] * np.eye(d)
    ybar = (train_w * y).sum(axis=1)
    bvec = (train_w * y) @ F - ybar[:, None] * fbar
    if nonneg:
        return nonneg_quadratic(A, bvec)
    return np.linalg.solve(A, bvec[..., None])[..., 0]


def _balanced_weights(y: np.ndarray, train: np.ndarray) -> np.ndarray:
    w = np.zeros(y.shape)
    for side in (0, 1):
        m = train & (y == side)
        n = m.sum(axis=1, keepdims=True)
        w = np.where(m, 0.5 / np.maximum(n, 1), w)
    return w


def _halves(sides: np.ndarray, priority: np.ndarray, start: np.ndarray) -> np.ndarray:
    """(B, G) sides -> (B, G) halves: within each side, groups in ``priority`` order alternate
    halves, the first one going to half ``start[side]``."""
    order = np.argsort(priority, kind="stable")
    s = sides[:, order].astype(np.int64)
    before1 = np.cumsum(s, axis=1) - s
    before0 = np.cumsum(1 - s, axis=1) - (1 - s)
    h = np.where(s == 1, (before1 + start[1]) % 2, (before0 + start[0]) % 2)
    out = np.empty_like(h)
    out[:, order] = h
    return out


def _auc(S: np.ndarray, y: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Held-out AUC per row: P(a suspected file's score > an unseen one's), ties 1/2."""
    from scipy.stats import rankdata

    ranks = rankdata(np.where(test, S, -np.inf), axis=1)
    ranks -= (~test).sum(axis=1, keepdims=True)
    pos = test & (y == 1)
    n1 = pos.sum(axis=1)
    n0 = (test & (y == 0)).sum(axis=1)
    U = (ranks * pos).sum(axis=1) - n1 * (n1 + 1) / 2
    return U / (n1 * n0)


@dataclass
class Design:
    """The files of one test: rows ``F`` (n, d), each file's group index (n,), and each group's
    side (G,): 1 suspected, 0 unseen; ``seeds``: one per round; ``C``: inverse ridge strength."""

    F: np.ndarray
    group: np.ndarray
    side: np.ndarray
    seeds: list[int]
    C: float = 1.0
    nonneg: bool = True
    outer: np.ndarray = field(init=False, repr=False)
    priority: np.ndarray = field(init=False, repr=False)
    start: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        self.F = np.asarray(self.F, dtype=np.float64)
        self.group = np.asarray(self.group, dtype=np.int64)
        self.side = np.asarray(self.side, dtype=np.int64)
        n, d = self.F.shape
        self.outer = (self.F[:, :, None] * self.F[:, None, :]).reshape(n, d * d)
        G = self.side.size
        rngs = [np.random.default_rng([0xA0D1, int(s)]) for s in self.seeds]
        self.priority = np.array([r.permutation(G) for r in rngs])
        self.start = np.array([r.integers(0, 2, size=2) for r in rngs])
        check_sides(self.side)

    def with_features(self, F: np.ndarray, nonneg: bool) -> Design:
        """The same files, groups, sides and rounds with other rows ``F`` (n, k)."""
        return Design(F, self.group, self.side, self.seeds, self.C, nonneg)


@dataclass
class Round:
    """One seed's cross-fit for the observed sides: each file's half, its out-of-fold score,
    the two fits' weights and held-out AUCs."""

    seed: int
    half: np.ndarray
    score: np.ndarray
    coefs: list[np.ndarray]
    auc: list[float]


def check_sides(side: np.ndarray, what: str = "") -> None:
    """Each side needs MIN_GROUPS_PER_SIDE groups (two in each cross-fitting half)."""
    n1 = int((side == 1).sum())
    for n, name in ((n1, "suspected"), (side.size - n1, "unseen")):
        if n < MIN_GROUPS_PER_SIDE:
            raise MiaError(
                f"{what}{name} has {n} independent group(s) of files: the dataset test needs "
                f"at least {MIN_GROUPS_PER_SIDE} (2 in each cross-fitting half)"
            )


def _statistics(design: Design, sides: np.ndarray, keep_rounds: bool = False):
    """Mean held-out AUC (B,) for each row of group sides (B, G); with ``keep_rounds``, also
    the first row's rounds."""
    D = design
    y = sides[:, D.group]
    aucs, rounds = [], []
    for r, seed in enumerate(D.seeds):
        half = _halves(sides, D.priority[r], D.start[r])[:, D.group]
        score = np.zeros(D.F.shape[0])
        coefs, round_auc = [], []
        for h in (0, 1):
            test = half == h
            w = _fit(D.F, D.outer, _balanced_weights(y, ~test), y, D.C, D.nonneg)
            S = w @ D.F.T
            auc = _auc(S, y, test)
            aucs.append(auc)
            if keep_rounds:
                score[test[0]] = S[0, test[0]]
                coefs.append(w[0].copy())
                round_auc.append(float(auc[0]))
        if keep_rounds:
            rounds.append(Round(int(seed), half[0].copy(), score, coefs, round_auc))
    return np.mean(aucs, axis=0), rounds


def cross_fit(design: Design) -> list[Round]:
    """The observed sides' rounds (out-of-fold scores, weights, held-out AUCs)."""
    return _statistics(design, design.side[None, :], keep_rounds=True)[1]


def check_permutations(key: str, permutations: int, alpha: float) -> None:
    """A permutation count that can reject at ``alpha`` and ends in reasonable time: p is at
    least 1 / (permutations + 1), so fewer than 1/alpha - 1 could never reject and would read
    as a clearance; more than :data:`MAX_PERMUTATIONS` buys no precision worth the wait."""
    least = max(1, math.ceil(1.0 / alpha - 1.0 - 1e-9))
    if permutations < least:
        raise MiaError(
            f"{key} = {permutations} cannot reject at level {alpha:g}: the smallest p-value it "
            f"can give is 1/({permutations} + 1) = {1 / (permutations + 1):.3g}; give at least "
            f"{least} (the default 1999 gives p down to 0.0005)"
        )
    if permutations > MAX_PERMUTATIONS:
        raise MiaError(
            f"{key} = {permutations} is more than {MAX_PERMUTATIONS}: each one refits the "
            "cross-fit, and at 99,999 the Monte Carlo error of a p-value near 0.05 is already "
            "±0.0007"
        )


def null_statistics(designs: Sequence[Design], permutations: int, seed: int) -> list[np.ndarray]:
    """Each design's statistic (permutations + 1,) for the observed sides (row 0) and for the
    same ``permutations`` random permutations of the groups' sides (seeded); the designs must
    share their groups and sides. Permutations are drawn and fitted :data:`CHUNK` at a time
    (memory stays bounded), and a run that takes longer than a few seconds logs its progress
    and the time left."""
    if permutations < 1:
        raise MiaError(f"the permutation test needs at least 1 permutation, not {permutations}")
    first = designs[0]
    for d in designs[1:]:
        if not (np.array_equal(d.side, first.side) and np.array_equal(d.group, first.group)):
            raise MiaError("tests that share permutations need the same groups and sides")
    rng = np.random.default_rng([0x9E57, int(seed)])
    rows = [first.side]  # the observed sides first, then the permutations, in chunks
    T: list[list[np.ndarray]] = [[] for _ in designs]
    done = 0
    start = last = time.monotonic()
    while done < permutations:
        take = min(CHUNK - len(rows), permutations - done)
        rows += [rng.permutation(first.side) for _ in range(take)]
        block = np.array(rows)
        for k, d in enumerate(designs):
            T[k].append(_statistics(d, block)[0])
        done, rows = done + take, []
        now = time.monotonic()
        if now - last > PROGRESS_EVERY_S and done < permutations:
            left = (now - start) / done * (permutations - done)
            log(f"permutation test: {done:,} of {permutations:,} permutations, about "
                f"{left:.0f} s left")  # fmt: skip
            last = now
    return [np.concatenate(t) for t in T]


def _at_least(T: np.ndarray) -> np.ndarray:
    """For each row of T (B + 1,), the share of rows with a statistic at least as high (equal
    up to rounding is equal): row 0's is the permutation p-value, each row's its own."""
    ordered = np.sort(T)
    return (T.size - np.searchsorted(ordered, T - 1e-12, side="left")) / T.size


def _summary(T: np.ndarray, p: float, permutations: int, alpha: float) -> dict:
    t_perm = T[1:]
    return {
        "statistic": float(T[0]),
        "p_value": p,
        "mc_error": math.sqrt(p * (1 - p) / permutations),
        "permutations": int(permutations),
        "null_mean": float(t_perm.mean()),
        "null_sd": float(t_perm.std(ddof=1)) if permutations > 1 else 0.0,
        "alpha": alpha,
        "reject": bool(p <= alpha),
    }


def permutation_test(design: Design, permutations: int, seed: int, alpha: float) -> dict:
    """The cross-fit's statistic for the observed sides against ``permutations`` random
    permutations of the groups' sides (seeded): ``{statistic, p_value, mc_error, permutations,
    null_mean, null_sd, reject, alpha}``, p = (1 + #{T_perm >= T_obs}) / (permutations + 1).
    ``mc_error`` is the Monte Carlo standard error of p as an estimate of the exact
    permutation p-value; p itself is exactly valid."""
    (T,) = null_statistics([design], permutations, seed)
    return _summary(T, float(_at_least(T)[0]), permutations, alpha)


def joint_permutation_test(
    designs: dict[str, Design], permutations: int, seed: int, alpha: float
) -> dict:
    """One test of several designs on the same groups (feature sets of the same files): the
    statistic is the smallest of their permutation p-values, referred to its own permutation
    distribution over the same permutations (min-p, Westfall & Young 1993), so the joint p is
    exactly valid under H0 whatever the designs' dependence, and each design's ``adjusted``
    p-value (single-step min-p) says which of them separates the sets, at the same level.
    Returns the joint summary (``statistic`` = the smallest marginal p) and ``parts``: per
    design its held-out AUC, marginal and adjusted p-values."""
    names = list(designs)
    T = null_statistics([designs[n] for n in names], permutations, seed)
    P = np.array([_at_least(t) for t in T])  # (designs, B + 1): each row's own p-values
    minp = P.min(axis=0)
    joint = float(np.mean(minp <= minp[0] + 1e-12))
    out = _summary(-minp, joint, permutations, alpha)
    out["statistic"] = float(minp[0])
    out.pop("null_mean"), out.pop("null_sd")
    out["parts"] = {
        n: {
            "statistic": float(T[k][0]),
            "p_value": float(P[k, 0]),
            "adjusted_p_value": float(np.mean(minp <= P[k, 0] + 1e-12)),
            "reject": bool(np.mean(minp <= P[k, 0] + 1e-12) <= alpha),
        }
        for k, n in enumerate(names)
    }
    return out


def effect_size(design: Design, rounds: Sequence[Round]) -> float:
    """Median over the held-out halves of Cohen's d between suspected and unseen file scores."""
    y = design.side[design.group]
    ds = []
    for r in rounds:
        for h in (0, 1):
            m = r.half == h
            ds.append(cohens_d(r.score[m & (y == 1)], r.score[m & (y == 0)]))
    return float(np.median(ds))


def file_pvalues(design: Design, rounds: Sequence[Round], seed: int) -> list[tuple[Fraction, int]]:
    """(p-value, calibration files) for each file (unseen ones get (1, 0)).

    In each round a suspected file is ranked against one file of each unseen group of its
    held-out half (a seeded draw; every file when groups are single files), scored by the same
    model: p_r = (1 + #{calibration scores >= the file's}) / (n + 1), a Fraction. The file's
    p-value is the largest over the rounds (n: that round's calibration size)."""
    D = design
    y = D.side[D.group]
    out: list[tuple[Fraction, int]] = [(Fraction(1), 0)] * len(y)
    best: dict[int, tuple[Fraction, int]] = {}
    for r in rounds:
        rng = np.random.default_rng([0xCA1, int(seed), int(r.seed)])
        for h in (0, 1):
            uns = np.flatnonzero((r.half == h) & (y == 0))
            cal = _one_per_group(uns, D.group, rng)
            c = np.sort(r.score[cal])
            for i in np.flatnonzero((r.half == h) & (y == 1)):
                at_least = int(c.size - np.searchsorted(c, r.score[i], side="left"))
                p = Fraction(1 + at_least, c.size + 1)
                if i not in best or p > best[i][0]:
                    best[i] = (p, int(c.size))
    for i, v in best.items():
        out[i] = v
    return out


def group_rows(design: Design, F: np.ndarray | None = None) -> np.ndarray:
    """Each group's mean file row (G, d) of ``F`` (the design's rows by default)."""
    return _file_means(design.group, design.F if F is None else np.asarray(F, float),
                       design.side.size)  # fmt: skip


def pooled_scores(design: Design, F: np.ndarray | None = None) -> np.ndarray:
    """One score per group (G,), fixed without the sides: the mean of its standardized
    features, each standardized over every group of both sides (every feature is oriented
    "higher = member")."""
    return _standardize(group_rows(design, F)).mean(axis=1)


def pooled_pvalues(design: Design, F: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(p (G,), scores (G,)): each suspected group's :func:`pooled_scores` ranked against
    every unseen group's, each group weighing as many files as it holds (1 for unseen groups):

        p_g = (n_g + sum of n_u over unseen groups u with s_u >= s_g) / (n_g + sum of all n_u)

    a Fraction; with single files, (1 + #{unseen scores >= s_g}) / (n_unseen + 1).

    The score is a function of all groups that ignores which side each is on, so a suspected
    group exchangeable with the unseen ones (a source the model did not train on, drawn like
    them) has a score exchangeable with theirs. A file drawn at random from such groups comes
    from a group drawn in proportion to its size, and the weights are that proportion's
    likelihood ratio: P(p <= t) <= t exactly for such a file (weighted exchangeability,
    Tibshirani, Barber, Candes & Ramdas 2019), even when a source's size is tied to its score,
    where ranking sources alike is exact per source but not per file. Scores symmetric in the
    calibration and test units keep Benjamini-Hochberg's FDR control on conformal p-values
    (Marandon, Lei, Mohamed & Roquain 2024; Bates et al. 2023 for a score fixed beforehand)."""
    s = pooled_scores(design, F)
    n = np.bincount(design.group, minlength=design.side.size)
    uns = np.flatnonzero(design.side == 0)
    order = uns[np.argsort(-s[uns], kind="stable")]
    cum = np.cumsum(n[order])  # files of the unseen groups scoring at least each in turn
    total = int(n[uns].sum())
    p = np.array([Fraction(1)] * s.size, dtype=object)
    for g in np.flatnonzero(design.side == 1):
        k = int(np.searchsorted(-s[order], -s[g], side="right"))  # unseen with s_u >= s_g
        above = int(cum[k - 1]) if k else 0
        p[g] = Fraction(int(n[g]) + above, int(n[g]) + total)
    return p, s


def _one_per_group(files: np.ndarray, group: np.ndarray, rng) -> np.ndarray:
    order = rng.permutation(files)
    _, first = np.unique(group[order], return_index=True)
    return np.sort(order[first])


def null_side(side: np.ndarray, seed: int) -> np.ndarray:
    """The null check's pseudo-sides of the unseen groups: a seeded random half of them is
    called suspected. Returns (G0,) 0/1 over the unseen groups in their order."""
    n0 = int((side == 0).sum())
    pseudo = np.zeros(n0, dtype=np.int64)
    pseudo[np.random.default_rng([0x9011, int(seed)]).permutation(n0)[: n0 // 2]] = 1
    return pseudo


def audit(
    design: Design,
    permutations: int,
    seed: int,
    alpha: float,
    fdr: float,
    fdr_method: str = "bh",
    score_F: np.ndarray | None = None,
) -> dict:
    """The audit's statistics on one design: ``test`` (:func:`permutation_test`), ``rounds``
    (:func:`cross_fit`), ``group_pvalues`` and ``group_scores`` (:func:`pooled_pvalues` on
    ``score_F``, the design's rows by default); each file takes its group's: ``pvalues``
    [(p, unseen files calibrated against)] and ``scores``; over the suspected files
    (``suspected``: their indices) the step-up rule's ``flagged`` and ``adjusted``."""
    from mia_ray.stats.audit import benjamini_hochberg

    test = permutation_test(design, permutations, seed, alpha)
    rounds = cross_fit(design)
    gp, gs = pooled_pvalues(design, score_F)
    n0 = int((design.side[design.group] == 0).sum())
    sus = np.flatnonzero(design.side[design.group] == 1)
    flagged, adjusted = benjamini_hochberg([gp[design.group[i]] for i in sus], fdr, fdr_method)
    return {
        "test": test,
        "rounds": rounds,
        "group_pvalues": gp,
        "group_scores": gs,
        "pvalues": [(gp[g], n0 if design.side[g] == 1 else 0) for g in design.group],
        "scores": gs[design.group],
        "suspected": sus,
        "flagged": flagged,
        "adjusted": adjusted,
    }


def null_check(design: Design, permutations: int, seed: int, alpha: float) -> dict:
    """:func:`permutation_test` on the unseen sources alone, a seeded random half of them
    (:func:`null_side`) called suspected. Its sides are a random split, so it rejects with
    probability at most ``alpha`` whatever the files: a check of the machinery, not of them."""
    unseen = np.flatnonzero(design.side == 0)
    rows = np.isin(design.group, unseen)
    group = np.searchsorted(unseen, design.group[rows])
    sub = Design(
        design.F[rows], group, null_side(design.side, seed), design.seeds, design.C, design.nonneg
    )
    return permutation_test(sub, permutations, seed, alpha)
