"""LUMIA probes: per-layer classifiers on mean hidden states (Ibanez-Lissen et al., 2411.19876).

One probe per layer reads the token-averaged activations (n, d) and predicts membership; its
held-out AUC says how much membership information that layer carries. The paper trains an
MLP with Adam (lr 1e-3, up to 100 epochs, early stopping, dropout) on 80/20 splits repeated
three times; :class:`MLPProbe` follows it, :class:`LogisticProbe` is the linear reference.

Honesty rules: splits are grouped by document, so no document is on both sides, and
early stopping and model selection use a validation fold carved from the training part;
the test labels are read only to compute the metrics after prediction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.model_selection import StratifiedGroupKFold
from sklearn.preprocessing import StandardScaler

from mia_ray.errors import MiaError
from mia_ray.stats.metrics import as_labels, roc_auc, tpr_at_fpr

# Tags that keep the seed streams of holdout splits, validation splits and probes apart.
_HOLDOUT, _VALIDATION, _PROBE = 0, 1, 2


def _derive(seed: int, *keys: int) -> int:
    """A 32-bit seed from ``seed`` and ``keys``: reproducible, and distinct across keys."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0])


def _grouped_split(y, g, test_size: float, random_state: int, min_per_side: int, what: str):
    """One stratified split (train_idx, test_idx), sorted, with no group on both sides."""
    y = as_labels(y)
    g = np.asarray(g)
    if g.shape != y.shape:
        raise MiaError(f"{what}: {g.size} groups but {y.size} labels")
    if not 0 < test_size <= 0.5:
        raise MiaError(f"{what}: the held-out share must lie in (0, 0.5], got {test_size}")
    k = round(1 / test_size)
    n_pos, n_neg = np.unique(g[y == 1]).size, np.unique(g[y == 0]).size
    need = min_per_side * k
    if min(n_pos, n_neg) < need:
        raise MiaError(
            f"{what}: members span {n_pos} groups and non-members {n_neg}; each class needs "
            f"at least {need} groups for a {test_size:.0%} held-out share"
        )
    cv = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=random_state)
    train, test = next(cv.split(np.zeros(y.size), y, g))
    if np.unique(y[train]).size < 2 or np.unique(y[test]).size < 2:
        raise MiaError(f"{what}: a grouped split left one class out of one side; add groups")
    return np.sort(train), np.sort(test)


def grouped_holdout_splits(
    labels, groups, n_repeats: int = 3, test_size: float = 0.2, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n_repeats`` stratified (train_idx, test_idx) splits; labels, groups (n,).

    Each repeat is the first fold of a shuffled ``StratifiedGroupKFold`` with
    round(1 / test_size) folds, seeded from (seed, repeat): repeats differ, reruns agree.
    Each class needs at least 2 * round(1 / test_size) groups, so that about 2 of its groups
    land in every test part.
    """
    if n_repeats < 1:
        raise MiaError(f"grouped holdout: n_repeats must be at least 1, got {n_repeats}")
    return [
        _grouped_split(labels, groups, test_size, _derive(seed, _HOLDOUT, r), 2, "grouped holdout")
        for r in range(n_repeats)
    ]


def validation_split(
    labels, groups, val_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Grouped, stratified (fit_idx, val_idx) of a training part; indices into ``labels``."""
    return _grouped_split(labels, groups, val_fraction, seed, 1, "validation split")


def _as_rows(X, what: str) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise MiaError(f"{what}: features must be 2-D (n, d), got shape {X.shape}")
    if not np.isfinite(X).all():
        raise MiaError(f"{what}: features contain NaN or infinite values")
    return X


def _fit_inputs(X, y, X_val, y_val, what: str):
    X, X_val = _as_rows(X, what), _as_rows(X_val, what)
    y, y_val = as_labels(y), as_labels(y_val)
    if X.shape[0] != y.size or X_val.shape[0] != y_val.size:
        raise MiaError(f"{what}: feature rows and labels differ in number")
    if X_val.shape[1] != X.shape[1]:
        raise MiaError(f"{what}: {X.shape[1]} training but {X_val.shape[1]} validation features")
    # Standardise with the fit rows only, so neither validation nor test rows shape the scale.
    scaler = StandardScaler().fit(X)
    return scaler, scaler.transform(X), y, scaler.transform(X_val), y_val


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


def _forward(params: dict, X: np.ndarray, mask: np.ndarray | None = None):
    """Logits (n,) and the hidden activations (n, h) after ReLU and the dropout ``mask``."""
    h = np.maximum(X @ params["W1"] + params["b1"], 0.0)
    if mask is not None:
        h = h * mask
    return h @ params["W2"] + params["b2"][0], h


def _bce(z: np.ndarray, y: np.ndarray) -> float:
    # log(1 + e^z) - y z is BCE from logits without overflow for large |z|.
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def loss_and_grads(params: dict, X, y, mask=None) -> tuple[float, dict]:
    """Mean BCE over (X (n, d), y (n,)) and its gradient for every parameter.

    ``mask`` (n, h) is an inverted-dropout mask (0 or 1/(1-p)); None means no dropout.
    """
    z, h = _forward(params, X, mask)
    dz = (_sigmoid(z) - y) / y.size
    dh = np.outer(dz, params["W2"])
    if mask is not None:
        dh = dh * mask
    dh = dh * (h > 0)  # ReLU gate; a dropped unit has h == 0 and passes nothing back too.
    grads = {"W1": X.T @ dh, "b1": dh.sum(0), "W2": h.T @ dz, "b2": np.array([dz.sum()])}
    return _bce(z, y), grads


def adam_step(params, grads, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8) -> None:
    """One Adam update (Kingma & Ba 2015) in place; ``t`` counts steps from 1."""
    for k, g in grads.items():
        m[k] = beta1 * m[k] + (1 - beta1) * g
        v[k] = beta2 * v[k] + (1 - beta2) * g * g
        m_hat, v_hat = m[k] / (1 - beta1**t), v[k] / (1 - beta2**t)
        params[k] -= lr * m_hat / (np.sqrt(v_hat) + eps)


class MLPProbe(BaseEstimator):
    """One-hidden-layer MLP probe: Linear(d, hidden) → ReLU → dropout → Linear(hidden, 1).

    Trained on BCE with Adam and minibatches, as in LUMIA §4.3; early stopping keeps the
    epoch with the lowest validation BCE. The paper gives no width: 256 hidden units and
    dropout 0.2 are our choice. ``weight_decay`` is coupled L2 on all parameters (as torch's
    Adam). Float64 and one seeded Generator: same inputs and seed, same outputs.
    Fitted: ``scaler_``, ``params_``, ``best_epoch_`` (1-based), ``epochs_run_``,
    ``train_loss_`` and ``val_loss_`` (one per epoch).
    """

    def __init__(
        self,
        hidden: int = 256,
        dropout: float = 0.2,
        lr: float = 1e-3,
        max_epochs: int = 100,
        patience: int = 10,
        batch_size: int = 32,
        weight_decay: float = 0.0,
        seed: int = 0,
    ):
        self.hidden = hidden
        self.dropout = dropout
        self.lr = lr
        self.max_epochs = max_epochs
        self.patience = patience
        self.batch_size = batch_size
        self.weight_decay = weight_decay
        self.seed = seed

    def fit(self, X, y, X_val, y_val) -> MLPProbe:
        """Train on X (n, d), y (n,); stop early on X_val (m, d), y_val (m,)."""
        if not 0 <= self.dropout < 1:
            raise MiaError(f"MLP probe: dropout must lie in [0, 1), got {self.dropout}")
        if min(self.hidden, self.max_epochs, self.patience, self.batch_size) < 1:
            raise MiaError("MLP probe: hidden, max_epochs, patience, batch_size must be >= 1")
        self.scaler_, X, y, X_val, y_val = _fit_inputs(X, y, X_val, y_val, "MLP probe")
        y, y_val = y.astype(np.float64), y_val.astype(np.float64)
        rng = np.random.default_rng(self.seed)
        (n, d), h, p = X.shape, self.hidden, self.dropout
        # He init for the ReLU layer, Glorot for the output layer; biases start at zero.
        lim = np.sqrt(6.0 / (h + 1))
        params = {
            "W1": rng.standard_normal((d, h)) * np.sqrt(2.0 / d),
            "b1": np.zeros(h),
            "W2": rng.uniform(-lim, lim, h),
            "b2": np.zeros(1),
        }
        m = {k: np.zeros_like(a) for k, a in params.items()}
        v = {k: np.zeros_like(a) for k, a in params.items()}
        self.train_loss_, self.val_loss_ = [], []
        best, t = np.inf, 0
        for epoch in range(1, self.max_epochs + 1):
            order, total = rng.permutation(n), 0.0
            for start in range(0, n, self.batch_size):
                idx = order[start : start + self.batch_size]
                mask = (rng.random((idx.size, h)) >= p) / (1 - p) if p > 0 else None
                loss, grads = loss_and_grads(params, X[idx], y[idx], mask)
                if self.weight_decay:
                    grads = {k: g + self.weight_decay * params[k] for k, g in grads.items()}
                t += 1
                adam_step(params, grads, m, v, t, self.lr)
                total += loss * idx.size
            self.train_loss_.append(total / n)
            val = _bce(_forward(params, X_val)[0], y_val)
            self.val_loss_.append(val)
            if not np.isfinite(val):
                raise MiaError(f"MLP probe: validation loss became {val} at epoch {epoch}")
            if val < best:
                best, self.best_epoch_ = val, epoch
                self.params_ = {k: a.copy() for k, a in params.items()}
            elif epoch - self.best_epoch_ >= self.patience:
                break
        self.epochs_run_ = epoch
        return self

    def score_samples(self, X) -> np.ndarray:
        """Member probability (n,) for X (n, d), without dropout, from the best epoch."""
        if not hasattr(self, "params_"):
            raise MiaError("MLP probe: call fit before score_samples")
        X = self.scaler_.transform(_as_rows(X, "MLP probe"))
        return _sigmoid(_forward(self.params_, X)[0])


class LogisticProbe(BaseEstimator):
    """Standardised L2 logistic regression; C is the grid value with the lowest validation
    log-loss (ties: the smaller C). Fitted: ``scaler_``, ``model_``, ``C_``, ``val_loss_``
    (one per grid value)."""

    def __init__(self, Cs: Sequence[float] = (0.01, 0.1, 1.0, 10.0), max_iter: int = 2000):
        self.Cs = Cs
        self.max_iter = max_iter

    def fit(self, X, y, X_val, y_val) -> LogisticProbe:
        """Fit X (n, d), y (n,) once per C; choose C on X_val (m, d), y_val (m,) only."""
        if len(self.Cs) == 0 or min(self.Cs) <= 0:
            raise MiaError(f"logistic probe: Cs must be positive and non-empty, got {self.Cs}")
        self.scaler_, X, y, X_val, y_val = _fit_inputs(X, y, X_val, y_val, "logistic probe")
        self.val_loss_, best = [], np.inf
        for C in self.Cs:
            model = LogisticRegression(C=C, solver="lbfgs", max_iter=self.max_iter).fit(X, y)
            loss = float(log_loss(y_val, model.predict_proba(X_val)[:, 1], labels=[0, 1]))
            self.val_loss_.append(loss)
            if loss < best:
                best, self.C_, self.model_ = loss, float(C), model
        return self

    def score_samples(self, X) -> np.ndarray:
        """Member probability (n,) for X (n, d) from the selected model."""
        if not hasattr(self, "model_"):
            raise MiaError("logistic probe: call fit before score_samples")
        X = self.scaler_.transform(_as_rows(X, "logistic probe"))
        return self.model_.predict_proba(X)[:, 1]


_KINDS = {"mlp": MLPProbe, "logreg": LogisticProbe}


def probe_layer(
    X,
    labels,
    groups,
    splits,
    kinds: Sequence[str] = ("mlp", "logreg"),
    fprs: Sequence[float] = (0.01,),
    val_fraction: float = 0.2,
    seed: int = 0,
    mlp_params: dict | None = None,
    logreg_params: dict | None = None,
) -> dict:
    """Probe one layer's features X (n, d) on each (train_idx, test_idx) of ``splits``.

    Per repeat r, a grouped validation fold (seeded from seed and r) is cut from the training
    part; each probe fits on the rest and stops early / selects C on that fold, then scores
    the test part, whose labels serve the metrics only. Returns, per kind, lists over
    repeats: ``auc``, ``tpr_at_fpr`` {f"{fpr:g}": [...]}, ``val_auc``, ``epochs`` (best epoch, None for
    logreg), ``test_scores``, ``test_index``, and for logreg ``C``; plain Python values.
    With under 1/fpr test non-members, TPR at that FPR is TPR at zero false positives.
    """
    X = _as_rows(X, "probe_layer")
    y, g = as_labels(labels), np.asarray(groups)
    if X.shape[0] != y.size or g.shape != y.shape:
        raise MiaError(f"probe_layer: {X.shape[0]} rows, {y.size} labels, {g.size} groups")
    unknown = sorted(set(kinds) - set(_KINDS))
    if unknown or not kinds:
        raise MiaError(f"probe_layer: unknown probe kinds {unknown}; choose from {sorted(_KINDS)}")
    splits = list(splits)
    if not splits:
        raise MiaError("probe_layer: no splits given")
    extra = {"mlp": mlp_params or {}, "logreg": logreg_params or {}}
    out = {
        kind: {"auc": [], "tpr_at_fpr": {f"{f:g}": [] for f in fprs}, "epochs": [],
               "val_auc": [], "test_scores": [], "test_index": []}
        for kind in kinds
    }  # fmt: skip
    if "logreg" in out:
        out["logreg"]["C"] = []
    for r, (train, test) in enumerate(splits):
        train, test = np.asarray(train), np.asarray(test)
        if np.intersect1d(g[train], g[test]).size:
            raise MiaError(f"probe_layer: split {r} has groups on both sides")
        fit_rel, val_rel = validation_split(
            y[train], g[train], val_fraction, _derive(seed, _VALIDATION, r)
        )
        fit, val = train[fit_rel], train[val_rel]
        for kind in kinds:
            params = {"seed": _derive(seed, _PROBE, r)} if kind == "mlp" else {}
            probe = _KINDS[kind](**{**params, **extra[kind]})
            probe.fit(X[fit], y[fit], X[val], y[val])
            scores = probe.score_samples(X[test])
            res = out[kind]
            # Validation AUC: what picks the best layer, so that l* is not chosen on the test part.
            res["val_auc"].append(roc_auc(probe.score_samples(X[val]), y[val]))
            # The only read of the test labels: after prediction, for the metrics.
            res["auc"].append(roc_auc(scores, y[test]))
            for f in fprs:
                res["tpr_at_fpr"][f"{f:g}"].append(tpr_at_fpr(scores, y[test], f))
            res["epochs"].append(int(probe.best_epoch_) if kind == "mlp" else None)
            res["test_scores"].append(scores.tolist())
            res["test_index"].append(test.tolist())
            if kind == "logreg":
                res["C"].append(probe.C_)
    return out


def summarize_layer(result: dict, fpr: float = 0.01) -> dict:
    """Per kind of a :func:`probe_layer` result: means and sample stds (ddof=1) over repeats.

    Keys: auc_mean, auc_std, val_auc_mean, tpr_at_{100 fpr:g}pct_fpr (e.g. ``tpr_at_1pct_fpr``), tpr_std,
    n_repeats, epochs_mean (None for logreg). With one repeat the stds are 0.0: there is no
    spread to estimate, not a claim of zero variance.
    """
    key = f"{fpr:g}"
    name = f"tpr_at_{fpr * 100:g}pct_fpr"

    def std(xs: np.ndarray) -> float:
        return float(np.std(xs, ddof=1)) if xs.size > 1 else 0.0

    summary = {}
    for kind, res in result.items():
        if key not in res["tpr_at_fpr"]:
            raise MiaError(f"summarize_layer: no TPR at FPR {key} for {kind}; probe with it")
        auc = np.asarray(res["auc"], dtype=np.float64)
        tpr = np.asarray(res["tpr_at_fpr"][key], dtype=np.float64)
        epochs = [e for e in res["epochs"] if e is not None]
        summary[kind] = {
            "auc_mean": float(auc.mean()),
            "auc_std": std(auc),
            "val_auc_mean": float(np.mean(res["val_auc"])),
            name: float(tpr.mean()),
            "tpr_std": std(tpr),
            "n_repeats": int(auc.size),
            "epochs_mean": float(np.mean(epochs)) if epochs else None,
        }
    return summary
