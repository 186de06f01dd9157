"""Attack scores for one snippet, from the passes the run made over it.

Each registered attack is ``fn(s: SnippetStats, **params) -> float`` with higher = more
likely a member. The actors compute a snippet's :class:`SnippetStats` once per pass; every
attack and every Min-K ratio is then pure numpy over those numbers. An attack that needs
more than the target's plain forward pass says which passes with :func:`uses`
(:data:`PASSES` describes them); attacks that need the same pass share it.
"""

from __future__ import annotations

import inspect
import math
import re
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mia_ray.errors import MiaError
from mia_ray.registry import get, register


class SnippetError(MiaError, ValueError):
    """A snippet that cannot be scored: a ValueError to callers, one clear line in the CLI."""


@dataclass(eq=False)  # arrays make field-wise == ambiguous
class SnippetStats:
    """One forward pass over a snippet of T tokens; T-1 positions are scored.

    ``token_logprobs[t]`` is log p(x_{t+1} | x_<=t) of the observed next token, shape (T-1,).
    ``mu`` and ``sigma`` (T-1,) are the mean and std of log p(z | x_<=t) for z drawn from the
    model's own next-token distribution (the Min-K%++ normalisers).
    ``lower_loss``: mean NLL of the lowercased text; ``ref_loss``: mean NLL of this text under
    the reference model. The rest come from the other passes (:data:`PASSES`):
    ``token_ids`` (T-1,) the scored tokens' ids; ``recall_loss`` / ``member_loss`` the mean
    NLL of the same tokens read after the non-member / member prefix; ``token_freq`` (T-1,)
    each scored token's smoothed frequency in a reference corpus; ``neighbour_losses`` the
    neighbour texts' mean NLLs; ``augment_logprobs`` the augmented copies' token log-probs;
    ``grad_norm`` the mean max-norm of the loss's gradient over the parameter tensors;
    ``samples`` continuations the model wrote after the snippet's first half
    (:func:`samia_split`). Each is None when the run did not compute it.
    """

    text: str
    token_logprobs: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray
    lower_loss: float | None = None
    ref_loss: float | None = None
    token_ids: np.ndarray | None = None
    recall_loss: float | None = None
    member_loss: float | None = None
    token_freq: np.ndarray | None = None
    neighbour_losses: np.ndarray | None = None
    augment_logprobs: tuple[np.ndarray, ...] | None = None
    grad_norm: float | None = None
    samples: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        self.token_logprobs = np.asarray(self.token_logprobs, dtype=np.float64)
        self.mu = np.asarray(self.mu, dtype=np.float64)
        self.sigma = np.asarray(self.sigma, dtype=np.float64)
        if self.token_logprobs.ndim != 1:
            raise SnippetError(
                f"token_logprobs must be 1-D (T-1,), got shape {self.token_logprobs.shape}"
            )
        if self.token_logprobs.size == 0:
            raise SnippetError(
                f"snippet {self.text[:40]!r} has no scored tokens: attacks need at least 2 tokens"
            )
        if self.mu.shape != self.token_logprobs.shape or self.sigma.shape != self.mu.shape:
            raise SnippetError(
                f"mu {self.mu.shape} and sigma {self.sigma.shape} must match "
                f"token_logprobs {self.token_logprobs.shape}"
            )


def _mean_nll(s: SnippetStats) -> float:
    return -float(np.mean(s.token_logprobs))


# The passes an attack can cost, beyond the target's plain forward pass ("target").
PASSES = {
    "target": "one forward pass of the target",
    "lowercase": "one more forward pass, of the lowercased text, in the target's pool (its "
    "seconds count with the target's)",
    "reference": "one forward pass of the reference model",
    "recall": "one forward pass after the non-member prefix",
    "recall_member": "one forward pass after the member prefix",
    "token_counts": "one read of the frequency corpus (cached), no model pass",
    "neighbours": "one forward pass per neighbour text",
    "augment": "one forward pass per augmented copy",
    "gradient": "one forward and one backward pass",
    "samples": "sampled continuations of each snippet's first half (generation)",
}


def uses(*passes: str):
    """Declare the passes an attack reads (the target's plain pass is always made)."""
    unknown = set(passes) - set(PASSES)
    if unknown:
        raise ValueError(f"unknown passes {sorted(unknown)}")

    def deco(fn):
        fn.passes = ("target", *passes)
        return fn

    return deco


def passes_of(attacks: Sequence[str]) -> dict[str, list[str]]:
    """Per pass the attacks among ``attacks`` that read it, in :data:`PASSES` order."""
    need: dict[str, list[str]] = {}
    for name in attacks:
        for p in getattr(get("attack", name), "passes", ("target",)):
            need.setdefault(p, []).append(name)
    return {p: need[p] for p in PASSES if p in need}


def _given(s: SnippetStats, field: str, attack: str):
    value = getattr(s, field)
    if value is None:
        raise SnippetError(f"attack {attack!r} needs {field} (its pass did not run)")
    return value


def _positive_nll(s: SnippetStats, attack: str) -> float:
    nll = _mean_nll(s)
    if not nll > 0:
        raise SnippetError(f"attack {attack!r} divides by the mean NLL, which is {nll}")
    return nll


def _lowest_k_mean(values: np.ndarray, ratio: float) -> float:
    """Mean of the k smallest of ``values`` (n,), k = max(1, floor(ratio * n))."""
    if not 0 < ratio <= 1:
        raise SnippetError(f"min-k ratio must lie in (0, 1], got {ratio}")
    # The tolerance keeps float error from flooring 0.29 * 100 = 28.999... down to 28.
    k = max(1, math.floor(ratio * values.size + 1e-9))
    return float(np.mean(np.partition(values, k - 1)[:k]))


@register("attack", "loss")
def loss(s: SnippetStats) -> float:
    """LOSS attack (Yeom et al. 2018): -mean NLL = mean(token_logprobs)."""
    return -_mean_nll(s)


@register("attack", "zlib")
def zlib_ratio(s: SnippetStats) -> float:
    """zlib ratio (Carlini et al. 2021): -(mean NLL) / zlib_entropy.

    zlib_entropy = len(zlib.compress(text.encode("utf-8"))) in bytes, default level (6);
    never 0, since the zlib header alone is 8 bytes. Equal to mean(token_logprobs) / zlib_len.
    """
    return -_mean_nll(s) / len(zlib.compress(s.text.encode("utf-8")))


@register("attack", "min_k")
def min_k(s: SnippetStats, ratio: float = 0.2) -> float:
    """Min-K% Prob (Shi et al. 2024): mean of the k lowest token log-probs.

    k = max(1, floor(ratio * (T-1))): 10 tokens at ratio 0.25 use the lowest 2.
    """
    return _lowest_k_mean(s.token_logprobs, ratio)


@register("attack", "min_k_plus_plus")
def min_k_plus_plus(s: SnippetStats, ratio: float = 0.2) -> float:
    """Min-K%++ (Zhang et al. 2024): mean of the k lowest z_t = (log p(x_t) - mu_t) / sigma_t.

    k as in :func:`min_k`. sigma is clipped below at 1e-8: a near one-hot next-token
    distribution has sigma -> 0 and would give inf or 0/0.
    """
    z = (s.token_logprobs - s.mu) / np.maximum(s.sigma, 1e-8)
    return _lowest_k_mean(z, ratio)


@register("attack", "lowercase")
@uses("lowercase")
def lowercase(s: SnippetStats) -> float:
    """Lowercase ratio (Carlini et al. 2021): -(mean NLL of text) / (mean NLL of lowercased text).

    A ratio of log-perplexities: a member's original casing is much likelier than its
    lowercased form, so the ratio is small and the score high.
    """
    if s.lower_loss is None:
        raise SnippetError("attack 'lowercase' needs lower_loss (the lowercased text's mean NLL)")
    if not s.lower_loss > 0:
        raise SnippetError(f"attack 'lowercase' needs lower_loss > 0, got {s.lower_loss}")
    return -_mean_nll(s) / s.lower_loss


@register("attack", "ref")
@uses("reference")
def ref(s: SnippetStats) -> float:
    """Reference-model attack (Carlini et al. 2021), difference form: ref_loss - mean NLL.

    The paper's ratio of target to reference log-perplexity, taken as a difference so the
    score stays monotone when either loss is near 0: a member is easier for the target
    than for a reference model that never saw it.
    """
    if s.ref_loss is None:
        raise SnippetError("attack 'ref' needs ref_loss (the text's mean NLL under the reference)")
    return s.ref_loss - _mean_nll(s)


@register("attack", "recall")
@uses("recall")
def recall(s: SnippetStats) -> float:
    """ReCaLL (Xie et al. 2024): LL(x | P) / LL(x), P a prefix of non-member texts.

    LL is the mean log-likelihood, so the ratio is NLL(x | P) / NLL(x): a member's
    likelihood drops more when it is read after non-members, and its ratio is higher.
    Here both means run over the same tokens, the T-1 the plain pass scores (the authors'
    code, ruoyuxie/recall, also scores the first token and BOS after the prefix). The
    prefix is cut from the left to fit the model's window (as Fast-MIA and MIMIR do; the
    authors' default never cuts).
    """
    return _given(s, "recall_loss", "recall") / _positive_nll(s, "recall")


@register("attack", "con_recall")
@uses("recall", "recall_member")
def con_recall(s: SnippetStats, gamma: float = 0.5) -> float:
    """Con-ReCall (Wang et al. 2024): (LL(x | P_non) - gamma * LL(x | P_mem)) / LL(x).

    With mean NLLs: (NLL(x | P_non) - gamma * NLL(x | P_mem)) / NLL(x), higher for members.
    The authors sweep gamma over 0.1 .. 1.0; the default 0.5 is Fast-MIA's. Tokens as in
    :func:`recall`.
    """
    non = _given(s, "recall_loss", "con_recall")
    mem = _given(s, "member_loss", "con_recall")
    return (non - gamma * mem) / _positive_nll(s, "con_recall")


@register("attack", "dc_pdd")
@uses("token_counts")
def dc_pdd(s: SnippetStats, a: float = 0.01) -> float:
    """DC-PDD (Zhang et al. 2024): mean over the first occurrence of each scored token of
    min(p(x_i) * log(1 / f(x_i)), a), f the token's Laplace-smoothed frequency in a reference
    corpus, (count + 1) / (total + V), and a = 0.01 the paper's bound. Higher for members.

    The authors' released code indexes the unsmoothed frequencies (zhang-wei-chao/DC-PDD,
    ``cal_met``); the paper and MIMIR smooth, as here. Tokens 2..T are scored, as the
    authors do (MIMIR also scores the first).
    """
    ids = np.asarray(_given(s, "token_ids", "dc_pdd"))
    freq = np.asarray(_given(s, "token_freq", "dc_pdd"), dtype=np.float64)
    if ids.shape != s.token_logprobs.shape or freq.shape != ids.shape:
        raise SnippetError("attack 'dc_pdd' needs one token id and frequency per scored token")
    _, first = np.unique(ids, return_index=True)
    first = np.sort(first)
    alpha = np.exp(s.token_logprobs[first]) * -np.log(freq[first])
    return float(np.mean(np.minimum(alpha, a)))


def polarized_distance(token_logprobs: np.ndarray, low: float = 0.3, high: float = 0.05) -> float:
    """PAC's polarized distance: the mean of the k_high largest token log-probs minus the
    mean of the k_low smallest, k = max(1, int(share * n)) (Ye et al. 2024)."""
    lp = np.sort(np.asarray(token_logprobs, dtype=np.float64))
    n = lp.size
    k_low, k_high = max(1, int(low * n)), max(1, int(high * n))
    return float(lp[-k_high:].mean() - lp[:k_low].mean())


@register("attack", "pac")
@uses("augment")
def pac(s: SnippetStats, low: float = 0.3, high: float = 0.05) -> float:
    """PAC, polarized augment calibration (Ye et al. 2024): -(PD(x) - mean_j PD(x~_j)),
    PD the :func:`polarized_distance` of the token log-probs and x~_j copies of x with words
    swapped at random (:func:`mia_ray.features.augment.random_swaps`). The authors
    (yyy01/PAC) call a low PAC a member; negated here, so higher is a member.
    """
    copies = _given(s, "augment_logprobs", "pac")
    if not len(copies):
        raise SnippetError("attack 'pac' needs at least one augmented copy")
    calibration = np.mean([polarized_distance(c, low, high) for c in copies])
    return -(polarized_distance(s.token_logprobs, low, high) - float(calibration))


@register("attack", "neighbourhood")
@uses("neighbours")
def neighbourhood(s: SnippetStats) -> float:
    """Neighbourhood comparison (Mattern et al. 2023): mean_j NLL(n_j) - NLL(x), the
    neighbours n_j from :func:`mia_ray.features.neighbors.make_neighbours` (word swaps by
    MiniLM embedding neighbours, not BERT's). A member sits below its neighbours: higher.
    MIMIR's run effectively takes the neighbour of largest NLL (an ``np.min`` over the
    per-neighbour differences); the paper and this take the mean.
    """
    nb = np.asarray(_given(s, "neighbour_losses", "neighbourhood"), dtype=np.float64)
    if not nb.size:
        raise SnippetError("attack 'neighbourhood' needs at least one neighbour")
    return float(nb.mean()) - _mean_nll(s)


@register("attack", "grad_norm")
@uses("gradient")
def grad_norm(s: SnippetStats) -> float:
    """Gradient norm (as in MIMIR's GradNormAttack): minus the mean over the model's
    parameter tensors of the max-norm of the gradient of the snippet's mean NLL. A member
    sits near a minimum, where the gradient is small: higher. MIMIR returns the same
    quantity but its evaluation negates every score, so there a larger norm counts as a
    member; this keeps the direction the attack's reasoning gives.
    """
    return -float(_given(s, "grad_norm", "grad_norm"))


def samia_split(text: str, ratio: float = 0.5) -> tuple[str, list[str]]:
    """SaMIA's prompt and reference: the text up to the end of its first int(ratio * n)
    whitespace-separated words (its own spacing kept), and the remaining words."""
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    k = int(len(spans) * ratio)
    prompt = text[: spans[k - 1][1]] if k else ""
    return prompt, [text[a:b] for a, b in spans[k:]]


def rouge1_recall(candidate: str, reference: Sequence[str]) -> float:
    """ROUGE-1 recall as SaMIA's authors compute it: the reference's words (whitespace,
    case-sensitive, no stemming) that the candidate also has, each counted at most as often
    as the candidate has it, over the reference's length."""
    ref, cand = Counter(reference), Counter(candidate.split())
    return sum(min(n, cand[w]) for w, n in ref.items()) / len(reference)


@register("attack", "samia")
@uses("samples")
def samia(s: SnippetStats, prefix_ratio: float = 0.5) -> float:
    """SaMIA (Kaneko et al. 2024): the mean ROUGE-1 recall (:func:`rouge1_recall`) of the
    true continuation by continuations the model samples after the snippet's first half
    (:func:`samia_split`). Text only, so it runs on an API too. Higher for members. The
    authors (nlp-titech/samia) sample up to 1024 tokens; here a sample is as long as the
    true continuation in tokens unless ``attack.samia.max_tokens`` says otherwise (recall
    grows with a candidate's length).
    """
    samples = _given(s, "samples", "samia")
    _, reference = samia_split(s.text, prefix_ratio)
    if not reference or not len(samples):
        raise SnippetError(
            f"attack 'samia' needs words after the prompt and samples: {s.text[:40]!r}"
        )
    return float(np.mean([rouge1_recall(c, reference) for c in samples]))


def stats_from_columns(
    texts: Sequence[str],
    token_logprobs: Sequence[Sequence[float]],
    mu: Sequence[Sequence[float]],
    sigma: Sequence[Sequence[float]],
    lower_loss: Sequence[float] | None = None,
    ref_loss: Sequence[float] | None = None,
    extra: dict[str, Sequence] | None = None,
) -> list[SnippetStats]:
    """Row-aligned columns (as a Scorer writes them) -> one SnippetStats per snippet;
    ``extra``: other passes' columns by :class:`SnippetStats` field name."""
    n = len(texts)
    lower = [None] * n if lower_loss is None else [float(v) for v in lower_loss]
    ref = [None] * n if ref_loss is None else [float(v) for v in ref_loss]
    more = (
        [dict(zip(extra, vals, strict=True)) for vals in zip(*extra.values(), strict=True)]
        if extra
        else [{}] * n
    )
    return [
        SnippetStats(
            t,
            np.asarray(lp, np.float64),
            np.asarray(m, np.float64),
            np.asarray(sd, np.float64),
            lo,
            rf,
            **kw,
        )
        for t, lp, m, sd, lo, rf, kw in zip(
            texts, token_logprobs, mu, sigma, lower, ref, more, strict=True
        )
    ]


def score_table(
    stats: Sequence[SnippetStats],
    attacks: Sequence[str],
    min_k_ratios: Sequence[float],
    min_k_ratio: float,
    params: dict[str, dict] | None = None,
) -> dict[str, np.ndarray]:
    """One score column (n,) per attack, for n snippets.

    An attack that takes ``ratio`` (min_k, min_k_plus_plus) also gets a column
    ``f"{name}@{r:g}"`` per ratio in ``min_k_ratios``; its plain column is the one at
    ``min_k_ratio``. ``params``: keyword arguments per attack (Con-ReCall's gamma, say).
    """
    params = params or {}
    # Resolve every name first: a typo fails before any scoring.
    fns = {name: get("attack", name) for name in attacks}

    def column(fn, **kw) -> np.ndarray:
        return np.fromiter((fn(s, **kw) for s in stats), dtype=np.float64, count=len(stats))

    table: dict[str, np.ndarray] = {}
    for name, fn in fns.items():
        # An attack declares a Min-K ratio by its signature; no list of such names to keep in step.
        if "ratio" in inspect.signature(fn).parameters:
            for r in min_k_ratios:
                table[f"{name}@{r:g}"] = column(fn, ratio=r)
            key = f"{name}@{min_k_ratio:g}"
            table[name] = table[key] if key in table else column(fn, ratio=min_k_ratio)
        else:
            table[name] = column(fn, **params.get(name, {}))
    return table


def vocab_moments_np(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of log p(z) under p = softmax(logits), over the vocabulary axis.

    logits (..., V) -> mu (...), sigma (...). The numpy reference for the actor's torch
    version; computed in float64, so keep T*V modest. Logits of -inf (masked tokens) have
    p = 0 and contribute nothing.
    """
    x = np.asarray(logits, dtype=np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    p = np.exp(logp)
    logp = np.where(p > 0, logp, 0.0)  # avoids 0 * -inf = nan for masked tokens
    mu = (p * logp).sum(axis=-1)
    # Centred second moment: equal to E[log p^2] - mu^2 but without its cancellation.
    var = (p * (logp - mu[..., None]) ** 2).sum(axis=-1)
    return mu, np.sqrt(var)
