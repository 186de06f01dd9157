"""Synthetic audit worlds, and a runner that measures the audit's guarantees on them.

A *world* is what one `mia-ray audit` run sees once the model has scored the snippets:
snippet features ``X`` (n_snippets, d) oriented "higher = member", each snippet's file, each
file's side (1 suspected, 0 unseen) and source, which files were truly trained on (none under
H0), and optionally the snippets' texts (for the blind check). Nothing here runs a model.

Feature worlds: d = 6 features with pairwise correlation 0.7 at the snippet level (loss,
zlib and the Min-K% variants all derive from one forward pass), made of a per-file latent
effect (sd 0.5) plus snippet noise (sd 1), both with that correlation, and in some worlds a
per-source effect. A member's snippets shift by ``shift`` times the sd of a file's mean
feature, sqrt(0.5^2 + source_sd^2 + 1/m) for m snippets per file, on every feature.
The token world (``token_lengths``) goes one level down: per-token log-probabilities through
the project's own attacks (``features.attacks.score_table``).

:func:`after_world` runs the audit's statistics as ``pipelines/audit.py`` does (equalized
snippets via ``take_per_file``, ``file_matrix``, ``design_of``, ``audit``, ``null_check`` on
the unseen sources, the blind check on ``text_matrix``); :func:`run_scenario` repeats it over
seeded worlds and summarizes. ``bench/validity.py`` runs the former procedure beside it.

numpy/pandas and the project's functions only: no Ray, no torch.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pandas as pd

D = 6  # features per snippet
RHO = 0.7  # their pairwise correlation
FILE_SD = 0.5  # per-file latent effect
NOISE_SD = 1.0  # per-snippet noise
ALPHA = 0.05
FDRS = (0.05, 0.2)
ROUNDS = 5
C = 1.0
TEXT_WORDS = 32  # words per snippet text in the feature worlds that carry texts
SNIPPET_WORDS = 128  # the token world's snippet size (about 1 token per word)
OLD_MIN_SNIPPET = 32  # data.min_snippet_size before: a shorter tail of a document was dropped
MIN_K_RATIOS = (0.05, 0.1, 0.2, 0.3, 0.5)
# The audit's default features (audit.attacks): lowercase and ReCaLL get their losses below.
TOKEN_ATTACKS = ("loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "recall")
RECALL_SHOTS = 4  # audit.recall.shots
RECALL_SIBLING_SHIFT = -1.0  # a prefix's own source reads likelier after it: "less member"
TOKEN_FILE_SD = 0.12  # the token world's per-file effect on the log of token NLLs
TOKEN_SNIPPET_SD = 0.06  # and its per-snippet effect

_L = np.linalg.cholesky(RHO * np.ones((D, D)) + (1 - RHO) * np.eye(D))


@dataclass
class World:
    """One audit's inputs. ``X`` (n_snippets, d), ``unit_files`` (n_snippets,) doc ids,
    ``snippet_ids`` (n_snippets,), ``full`` (n_snippets,) bool: a full-size snippet (the audit
    now scores full-size ones only; before, a document's tail of >= 32 words counted too);
    ``files`` (n_files,) doc ids (``suspected/...``, ``unseen/...``), ``side`` (n_files,) 1/0,
    ``source`` (n_files,): the group the audit is given (a file alone, its near-duplicate pair,
    its book); ``member`` (n_files,) bool: truly trained on; ``texts`` (n_snippets,) or None;
    ``pick``: a random non-member suspected file, fixed before any analysis (an independent
    draw per world, for exact binomial checks of the per-file guarantee); ``h0``: whether a
    feature test must hold its level here."""

    name: str
    X: np.ndarray
    unit_files: np.ndarray
    snippet_ids: np.ndarray
    full: np.ndarray
    files: list[str]
    side: np.ndarray
    source: list[str]
    member: np.ndarray
    texts: list[str] | None
    pick: str | None
    h0: bool
    features: list[str]


# ---------------------------------------------------------------- generators


def _corr(rng, n: int, tails: str = "normal") -> np.ndarray:
    """(n, D) draws with unit variances and pairwise correlation RHO; ``t3``: multivariate
    Student t with 3 degrees of freedom, scaled to unit variance (one chi-square per row, so a
    row is an outlier in every feature at once, as a garbled snippet is)."""
    Z = rng.standard_normal((n, D)) @ _L.T
    if tails == "t3":
        Z = Z / np.sqrt(rng.chisquare(3, size=(n, 1)) / 3) / math.sqrt(3)
    return Z


_VOCAB_RNG = np.random.default_rng(20240527)
_LETTERS = np.array(list("etaoinshrdlucmfwypvbgkqjxz"))
_LETTER_P = np.linspace(2.0, 0.2, _LETTERS.size) / np.linspace(2.0, 0.2, _LETTERS.size).sum()


def _words(n: int, rng) -> list[str]:
    out = set()
    while len(out) < n:
        k = int(rng.integers(2, 10))
        out.add("".join(rng.choice(_LETTERS, k, p=_LETTER_P)))
    return sorted(out)


VOCAB = np.array(_words(3000, _VOCAB_RNG))  # shared by both sides
VOCAB_P = 1.0 / np.arange(1, VOCAB.size + 1) ** 1.05  # Zipf-like
VOCAB_P /= VOCAB_P.sum()
SIDE_WORDS = np.array(_words(3300, _VOCAB_RNG)[-200:])  # for the easier world: suspected only
EASY_SHARE = 0.03  # of a suspected snippet's words drawn from SIDE_WORDS in `easier`


def _texts(rng, n_snippets: int, words: int, special: np.ndarray | None = None) -> list[str]:
    """Random word snippets from VOCAB; ``special`` (n_snippets,) bool: that snippet draws
    EASY_SHARE of its words from SIDE_WORDS instead."""
    W = VOCAB[rng.choice(VOCAB.size, size=(n_snippets, words), p=VOCAB_P)]
    if special is not None:
        swap = special[:, None] & (rng.random((n_snippets, words)) < EASY_SHARE)
        W = np.where(swap, SIDE_WORDS[rng.integers(0, SIDE_WORDS.size, W.shape)], W)
    return [" ".join(r) for r in W]


def _members(rng, side: np.ndarray, n_members: int | None, source=None) -> np.ndarray:
    """``n_members`` suspected files trained on, drawn at random; where files come in sources,
    whole sources are drawn (in random order, until at least ``n_members`` files): a model
    trains on a book, not on some of its chapters, and a source part-trained would be neither
    a member nor exchangeable with the unseen ones."""
    member = np.zeros(side.size, dtype=bool)
    if n_members:
        sus = np.flatnonzero(side == 1)
        if n_members > sus.size:
            raise ValueError(f"{n_members} members but only {sus.size} suspected files")
        if source is None or np.unique(source).size == source.size:
            member[rng.choice(sus, n_members, replace=False)] = True
            return member
        for g in rng.permutation(np.unique(source[sus])):
            if member.sum() >= n_members:
                break
            member[source == g] = True
    return member


def _pick(rng, files, side, member) -> str | None:
    cand = np.flatnonzero((side == 1) & ~member)
    return files[int(rng.choice(cand))] if cand.size else None


def _ids(side: np.ndarray) -> list[str]:
    out, seen = [], {0: 0, 1: 0}
    for s in side:
        out.append(f"{'suspected' if s else 'unseen'}/f{seen[int(s)]:03d}")
        seen[int(s)] += 1
    return out


def feature_world(
    rng,
    name: str,
    *,
    counts,
    side,
    source=None,
    source_sd: float = 0.0,
    file_sd: float = FILE_SD,
    offset: float = 0.0,
    tails: str = "normal",
    lognormal: bool = False,
    shift: float = 0.0,
    n_members: int | None = None,
    m_ref: float | None = None,
    texts: str | None = None,
    h0: bool = True,
    source_offset=None,
) -> World:
    """A feature world. ``counts`` (n_files,) snippets per file, ``side`` (n_files,),
    ``source`` (n_files,) int source ids (default: each file its own); ``offset``: every
    suspected file's shift in sds of a file's mean feature (harder < 0 < easier); ``shift``:
    the members' shift in the same unit; ``m_ref``: the snippets per file that defines that
    sd (default: the median count); ``lognormal``: features exp(Z); ``texts``: None, "same"
    (one vocabulary) or "differ" (suspected snippets draw EASY_SHARE of words elsewhere)."""
    counts = np.asarray(counts, dtype=np.int64)
    side = np.asarray(side, dtype=np.int64)
    nf = side.size
    source = np.arange(nf) if source is None else np.asarray(source, dtype=np.int64)
    m_ref = float(np.median(counts)) if m_ref is None else float(m_ref)
    sd_mean = math.sqrt(file_sd**2 + source_sd**2 + NOISE_SD**2 / m_ref)
    member = _members(rng, side, n_members, source)
    fidx = np.repeat(np.arange(nf), counts)
    n_src = int(source.max()) + 1
    Z = (
        _corr(rng, n_src, tails)[source][fidx] * source_sd
        + _corr(rng, nf, tails)[fidx] * file_sd
        + _corr(rng, fidx.size, tails) * NOISE_SD
    )
    per_file = offset * (side == 1) + shift * member
    if source_offset is not None:  # a source's own shift, e.g. tied to its size
        per_file = per_file + np.asarray(source_offset, dtype=np.float64)[source]
    Z += (per_file * sd_mean)[fidx][:, None]
    X = np.exp(Z) if lognormal else Z
    files = _ids(side)
    src_name = [f"{'suspected' if side[i] else 'unseen'}/s{source[i]:03d}" for i in range(nf)]
    units = np.array(files, dtype=object)[fidx]
    within = np.arange(fidx.size) - np.repeat(np.cumsum(counts) - counts, counts)
    sids = np.array([f"{u}#{j}" for u, j in zip(units, within, strict=True)], dtype=object)
    txt = None
    if texts:
        special = (side[fidx] == 1) if texts == "differ" else None
        txt = _texts(rng, fidx.size, TEXT_WORDS, special)
    return World(
        name=name,
        X=X,
        unit_files=units,
        snippet_ids=sids,
        full=np.ones(fidx.size, dtype=bool),
        files=files,
        side=side,
        source=src_name,
        member=member,
        texts=txt,
        pick=_pick(rng, files, side, member),
        h0=h0 and not member.any(),
        features=[f"f{j}" for j in range(D)],
    )


def _sides(n1: int, n0: int) -> np.ndarray:
    return np.r_[np.ones(n1, np.int64), np.zeros(n0, np.int64)]


def matched(rng, shift=0.0, n_members=None) -> World:
    return feature_world(
        rng, "matched", counts=[8] * 70, side=_sides(30, 40), texts="same",
        shift=shift, n_members=n_members,
    )  # fmt: skip


def wide(rng, shift=0.0, n_members=None) -> World:
    return feature_world(
        rng, "wide", counts=[8] * 230, side=_sides(30, 200), texts=None,
        shift=shift, n_members=n_members,
    )  # fmt: skip


def harder(rng, shift=0.0, n_members=None) -> World:
    return feature_world(
        rng, "harder", counts=[8] * 70, side=_sides(30, 40), offset=-0.6,
        shift=shift, n_members=n_members,
    )  # fmt: skip


def easier(rng, shift=0.0, n_members=None) -> World:
    return feature_world(
        rng, "easier", counts=[8] * 70, side=_sides(30, 40), offset=0.6, texts="differ",
        shift=shift, n_members=n_members, h0=False,
    )  # fmt: skip


def near_duplicates(rng, shift=0.0, n_members=None) -> World:
    """15 + 20 originals (8 snippets each), each copied on its own side with noise sd 0.05 on
    every feature; a pair is one source. Members are chosen among the originals, and a
    member's copy is trained on as well."""
    side0 = _sides(15, 20)
    w = feature_world(rng, "near_duplicates", counts=[8] * 35, side=side0)
    member = _members(rng, side0, n_members)
    sd_mean = math.sqrt(FILE_SD**2 + NOISE_SD**2 / 8)
    X = w.X + (shift * member * sd_mean).repeat(8)[:, None]
    X2 = X + rng.normal(0.0, 0.05, X.shape)
    side = np.r_[side0, side0]
    files = _ids(side)
    # Originals first (their ids as feature_world gave them), then the copies.
    pair = np.r_[np.arange(35), np.arange(35)]
    source = [f"{'suspected' if side[i] else 'unseen'}/s{pair[i]:03d}" for i in range(70)]
    fidx = np.repeat(np.arange(70), 8)
    units = np.array(files, dtype=object)[fidx]
    sids = np.array([f"{u}#{j % 8}" for j, u in enumerate(units)], dtype=object)
    mem = np.r_[member, member]
    return World(
        name="near_duplicates",
        X=np.vstack([X, X2]),
        unit_files=units,
        snippet_ids=sids,
        full=np.ones(fidx.size, dtype=bool),
        files=files,
        side=side,
        source=source,
        member=mem,
        texts=None,
        pick=_pick(rng, files, side, mem),
        h0=not mem.any(),
        features=w.features,
    )


def sources_of_5(rng, shift=0.0, n_members=None) -> World:
    return feature_world(
        rng, "sources_of_5", counts=[8] * 70, side=_sides(30, 40),
        source=np.arange(70) // 5, source_sd=0.7, shift=shift, n_members=n_members,
    )  # fmt: skip


def unequal_lengths(rng, shift=0.0, n_members=None, file_sd=FILE_SD) -> World:
    return feature_world(
        rng, "unequal_lengths", counts=[1] * 30 + [20] * 40, side=_sides(30, 40),
        file_sd=file_sd, m_ref=1, shift=shift, n_members=n_members,
    )  # fmt: skip


def unequal_lengths_similar(rng, shift=0.0, n_members=None) -> World:
    w = unequal_lengths(rng, shift, n_members, file_sd=0.1)
    w.name = "unequal_lengths_similar"
    return w


def small_skewed(rng, shift=0.0, n_members=None) -> World:
    return feature_world(
        rng, "small_skewed", counts=[8] * 24, side=_sides(4, 20), lognormal=True,
        shift=shift, n_members=n_members,
    )  # fmt: skip


def imbalanced(rng, shift=0.0, n_members=None) -> World:
    return feature_world(
        rng, "imbalanced", counts=[8] * 120, side=_sides(80, 40), shift=shift, n_members=n_members
    )


def heavy_tailed(rng, shift=0.0, n_members=None) -> World:
    return feature_world(
        rng, "heavy_tailed", counts=[8] * 70, side=_sides(30, 40), tails="t3",
        shift=shift, n_members=n_members,
    )  # fmt: skip


def source_size(rng, shift=0.0, n_members=None) -> World:
    """20 suspected and 40 unseen sources, each one file or six (even odds, drawn alike on both
    sides); a six-file source sits 2 sd higher on every feature: its size is tied to its
    score, so a file drawn at random is more often from a high-scoring source than a source
    drawn at random is."""
    sizes = np.where(rng.random(60) < 0.5, 1, 6)
    src_side = np.r_[np.ones(20, np.int64), np.zeros(40, np.int64)]
    source = np.repeat(np.arange(60), sizes)
    return feature_world(
        rng, "source_size", counts=[8] * source.size, side=src_side[source], source=source,
        source_offset=2.0 * (sizes == 6), shift=shift, n_members=n_members,
    )  # fmt: skip


def mixed_sources(rng, shift=0.0, n_members=None) -> World:
    """Sources of 1-8 files (uniform; source effect sd 0.7), 40 suspected and 80 unseen files;
    suspected files have 1-12 snippets, unseen ones 3-24 (uniform)."""
    src, side, counts, s = [], [], [], 0
    for sd, n, lo, hi in ((1, 40, 1, 12), (0, 80, 3, 24)):
        left = n
        while left > 0:
            size = min(left, int(rng.integers(1, 9)))
            src += [s] * size
            side += [sd] * size
            s += 1
            left -= size
        counts += rng.integers(lo, hi + 1, n).tolist()
    return feature_world(
        rng, "mixed_sources", counts=counts, side=side, source=src, source_sd=0.7,
        shift=shift, n_members=n_members,
    )  # fmt: skip


def _cut(n_words: int) -> list[tuple[int, int]]:
    """The token world's snippets of a document of n words: every 128-word window and a tail
    of >= OLD_MIN_SNIPPET words (the former data.min_snippet_size)."""
    spans = [(a, min(a + SNIPPET_WORDS, n_words)) for a in range(0, n_words, SNIPPET_WORDS)]
    if len(spans) > 1 and spans[-1][1] - spans[-1][0] < OLD_MIN_SNIPPET:
        spans.pop()
    return spans


def token_lengths(rng, shift=0.0, n_members=None, n_sus=30, n_uns=40) -> World:
    """Token-level: suspected files of 3,000-6,000 words, unseen ones of 300-1,500 (uniform),
    random Zipf words (one token per word). A file's token NLLs are lognormal with log-mean
    log(2.2) + 0.12 a_f + 0.06 e_s (a_f per file, e_s per snippet, both N(0, 1); members:
    a_f - shift) and log-sd 0.9; Min-K%++'s mu_t = -exp(N(same - 0.2, 0.5)), sigma_t =
    exp(N(0.2, 0.25)). The lowercased text's mean NLL is the snippet's times exp(N(0.15,
    0.05)); its mean NLL after ReCaLL's prefix the snippet's times exp(0.03 + 0.02 b_f +
    N(0, 0.03)), b_f per file N(0, 1): neither depends on the side. Features: ``score_table``
    with the audit's default attacks, Min-K% and Min-K%++ at ratios 0.05-0.5 (14 columns, as
    the audit's feature columns)."""
    from mia_ray.features.attacks import score_table, stats_from_columns

    side = _sides(n_sus, n_uns)
    nf = side.size
    n_words = np.where(side == 1, rng.integers(3000, 6001, nf), rng.integers(300, 1501, nf))
    member = _members(rng, side, n_members)
    a = rng.standard_normal(nf) - shift * member
    files = _ids(side)
    b = rng.standard_normal(nf)
    units, sids, full, texts, lps, mus, sigmas, lower, recall = [], [], [], [], [], [], [], [], []
    for f in range(nf):
        w = VOCAB[rng.choice(VOCAB.size, size=int(n_words[f]), p=VOCAB_P)]
        for j, (lo, hi) in enumerate(_cut(int(n_words[f]))):
            T = hi - lo
            c = math.log(2.2) + TOKEN_FILE_SD * a[f] + TOKEN_SNIPPET_SD * rng.standard_normal()
            nll = np.exp(rng.normal(c - 0.5 * 0.9**2, 0.9, T - 1))
            lps.append(-nll)
            mus.append(-np.exp(rng.normal(c - 0.2, 0.5, T - 1)))
            sigmas.append(np.exp(rng.normal(0.2, 0.25, T - 1)))
            lower.append(nll.mean() * math.exp(rng.normal(0.15, 0.05)))
            recall.append(nll.mean() * math.exp(0.03 + 0.02 * b[f] + rng.normal(0.0, 0.03)))
            texts.append(" ".join(w[lo:hi]))
            units.append(files[f])
            sids.append(f"{files[f]}#{j}")
            full.append(T == SNIPPET_WORDS)
    table = score_table(
        stats_from_columns(texts, lps, mus, sigmas, lower, extra={"recall_loss": recall}),
        list(TOKEN_ATTACKS),
        list(MIN_K_RATIOS),
        MIN_K_RATIOS[0],
    )
    from mia_ray.pipelines.audit import feature_columns

    frame = pd.DataFrame(table)
    cols = feature_columns(frame, list(TOKEN_ATTACKS))
    return World(
        name="token_lengths",
        X=frame[cols].to_numpy(dtype=np.float64),
        unit_files=np.array(units, dtype=object),
        snippet_ids=np.array(sids, dtype=object),
        full=np.array(full, dtype=bool),
        files=files,
        side=side,
        source=list(files),
        member=member,
        texts=texts,
        pick=_pick(rng, files, side, member),
        h0=not member.any(),
        features=cols,
    )


def _files_only(w: World, keep: np.ndarray, name: str) -> World:
    """``w`` with only the files where ``keep`` (n_files,) holds."""
    files = [f for f, k in zip(w.files, keep, strict=True) if k]
    rows = np.isin(w.unit_files, files)
    return World(
        name=name, X=w.X[rows], unit_files=w.unit_files[rows], snippet_ids=w.snippet_ids[rows],
        full=w.full[rows], files=files, side=w.side[keep],
        source=[s for s, k in zip(w.source, keep, strict=True) if k], member=w.member[keep],
        texts=None if w.texts is None else [t for t, r in zip(w.texts, rows, strict=True) if r],
        pick=w.pick if w.pick in files else None, h0=w.h0, features=w.features,
    )  # fmt: skip


def recall_prefix(rng, shift=0.0, n_members=None) -> World:
    """30 suspected (15 sources) and 200 unseen files (100 sources), sources of 2 with a
    source effect sd 0.7, 8 snippets each, the 6 features and a ReCaLL column (0.7 times
    their mean plus independent noise). The audit's own split
    (:func:`~mia_ray.pipelines.audit.inputs.held_out_sources`, 4 shots) picks the prefix
    files; every file of their sources would read likelier after the prefix (its ReCaLL
    column falls by RECALL_SIBLING_SHIFT sd), and every file of those sources is held out,
    as the audit does."""
    from mia_ray.pipelines.audit.inputs import held_out_sources

    name = "recall_prefix"
    w = feature_world(
        rng, name, counts=[8] * 230, side=_sides(30, 200), source=np.arange(230) // 2,
        source_sd=0.7, shift=shift, n_members=n_members,
    )  # fmt: skip
    files = pd.DataFrame({"doc_id": w.files, "side": w.side, "source": w.source})
    prefix, sources = held_out_sources(files, RECALL_SHOTS, seed=int(rng.integers(2**31)))
    sibling = np.isin(np.array(w.source, dtype=object), sources)
    by_file = dict(zip(w.files, sibling, strict=True))
    hit = np.array([by_file[u] for u in w.unit_files])
    recall = 0.7 * w.X.mean(axis=1) + rng.standard_normal(len(w.X)) * 0.7
    recall = recall + RECALL_SIBLING_SHIFT * recall.std() * hit
    w.X = np.column_stack([w.X, recall])
    w.features = [*w.features, "recall"]
    assert set(prefix) <= {f for f, g in zip(w.files, sibling, strict=True) if g}
    return _files_only(w, ~sibling, name)


@dataclass(frozen=True)
class Scenario:
    make: Callable[..., World]
    doc: str
    h0: bool = True  # a feature test must hold its level here (no member)


SCENARIOS: dict[str, Scenario] = {
    "matched": Scenario(matched, "30 suspected vs 40 unseen independent files, 8 snippets each; "
                        "snippet texts of one vocabulary"),
    "wide": Scenario(wide, "30 suspected vs 200 unseen independent files, 8 snippets each: "
                     "100 calibration files per half, so p <= 0.05 and BH flags are "
                     "attainable and the per-file and FDR guarantees are tested where they "
                     "can fail"),
    "harder": Scenario(harder, "matched, every suspected file shifted -0.6 sd on every feature "
                       "(harder text, e.g. OCR noise)"),
    "easier": Scenario(easier, "matched, suspected files +0.6 sd (easier text), and their texts "
                       "draw 3 % of words from a suspected-only list: not an H0 a feature test "
                       "can hold; the blind check guards it", h0=False),
    "near_duplicates": Scenario(near_duplicates, "15+15 suspected and 20+20 unseen files: each "
                                "file has a near-duplicate on its own side (features copied, "
                                "noise sd 0.05); after: a pair is one source"),
    "sources_of_5": Scenario(sources_of_5, "30 suspected (6 sources) and 40 unseen (8 sources) "
                             "files, sources of 5 with a source effect sd 0.7 beside the file "
                             "effect; after: sources passed as groups"),
    "unequal_lengths": Scenario(unequal_lengths, "30 suspected files of 1 snippet, 40 unseen of "
                                "20; after: k = 1 snippet per file via take_per_file"),
    "unequal_lengths_similar": Scenario(unequal_lengths_similar, "unequal_lengths with a small "
                                        "per-file effect (sd 0.1)"),
    "token_lengths": Scenario(token_lengths, "token level through score_table: suspected files "
                              "3,000-6,000 words, unseen 300-1,500, 128-word snippets; before: "
                              "every snippet (tails >= 32 words too), after: k full snippets "
                              "of each file, the most all but the shortest 10 % of the files "
                              "have, the others left out"),
    "small_skewed": Scenario(small_skewed, "4 suspected vs 20 unseen files, 8 snippets each, "
                             "lognormal features"),
    "imbalanced": Scenario(imbalanced, "80 suspected vs 40 unseen files, 8 snippets each"),
    "heavy_tailed": Scenario(heavy_tailed, "matched with multivariate Student t3 file effects "
                             "and snippet noise (unit variance)"),
    "recall_prefix": Scenario(recall_prefix, "ReCaLL's prefix by the audit's split: 30 "
                              "suspected and 200 unseen files in sources of 2 (source sd 0.7), "
                              "a ReCaLL column beside the 6 features; 4 unseen prefix files, "
                              "and every file of their sources (which would read likelier "
                              "after the prefix: -1 sd on ReCaLL), held out of the audit"),
    "source_size": Scenario(source_size, "20 suspected and 40 unseen sources of 1 or 6 files "
                            "(even odds), six-file sources +2 sd on every feature: a source's "
                            "size tied to its score"),
    "mixed_sources": Scenario(mixed_sources, "40 suspected and 80 unseen files in sources of 1-8 "
                              "files (source sd 0.7), 1-12 vs 3-24 snippets per file; after: "
                              "sources as groups, k snippets as the audit chooses them"),
}  # fmt: skip


def make_world(name: str, rng, shift: float = 0.0, n_members: int | None = None) -> World:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    return SCENARIOS[name].make(rng, shift=shift, n_members=n_members)


def world_rng(name: str, seed: int, i: int):
    """World i of scenario ``name``: the same world whatever the shift or the other scenarios."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode()), int(i)])


# ---------------------------------------------------------------- the audit, after


def equalize(world: World, seed: int) -> tuple[World, np.ndarray]:
    """The files and rows the audit scores now: full-size snippets only, k of each file (k by
    ``snippets_per_file`` at the audit's defaults: the most that all but the shortest 10 %
    of the files have), files with fewer left out, drawn by ``take_per_file`` as
    ``select_snippets`` does. Returns the world of the kept files and their rows."""
    from mia_ray.data.snippets import take_per_file
    from mia_ray.pipelines.audit.config import AuditConfig
    from mia_ray.pipelines.audit.inputs import snippets_per_file

    full = np.flatnonzero(world.full)
    counts = pd.Series(world.unit_files[full]).value_counts().reindex(world.files, fill_value=0)
    a = AuditConfig()
    k = snippets_per_file(counts.to_numpy(), a.snippets_per_file, 0, a.short_files)
    if (counts < k).any():
        world = _files_only(world, (counts >= k).to_numpy(), world.name)
    rows = np.flatnonzero(world.full)
    df = pd.DataFrame(
        {"doc_id": world.unit_files[rows], "snippet_id": world.snippet_ids[rows], "row": rows}
    )
    return world, np.sort(take_per_file(df, k, seed)["row"].to_numpy())


def _share(flags) -> float:
    flags = np.asarray(flags, dtype=bool)
    return float(flags.mean()) if flags.size else math.nan


def verdicts(pvalues, flagged_by_q: dict, member: np.ndarray, pick: int | None, n_cal: int) -> dict:
    """Per-world numbers from the suspected files' p-values (floats or Fractions), their BH
    verdicts at each q, which are members, and the smallest calibration size: ``per_file``
    (share of non-members with p <= 0.05), ``pick`` (the picked non-member's p <= 0.05),
    ``fdp@q``, ``flagged@q``, ``members_flagged@q``, ``together@q`` (the fewest files BH can
    flag at once: the k-th smallest p-value must be <= q k / m and none is below
    1 / (n_cal + 1))."""
    p = np.array([float(x) for x in pvalues])
    # Fractions exactly; a float p-value (the former procedure's) with a rounding tolerance,
    # so that 1/20 computed in floats counts as <= 0.05.
    small = np.array(
        [x <= Fraction(1, 20) if isinstance(x, Fraction) else x <= 0.05 + 1e-12 for x in pvalues],
        dtype=bool,
    )
    non = ~member
    out = {
        "per_file": _share(small[non]),
        "pick": None if pick is None else bool(small[pick]),
        "min_p": float(p.min()) if p.size else math.nan,
        "n_cal": int(n_cal),
    }
    for q, flagged in flagged_by_q.items():
        n_flag = int(flagged.sum())
        out[f"fdp@{q:g}"] = float((flagged & non).sum() / max(n_flag, 1))
        out[f"flagged@{q:g}"] = n_flag
        out[f"members_flagged@{q:g}"] = _share(flagged[member]) if member.any() else math.nan
        out[f"together@{q:g}"] = math.ceil(p.size / (n_cal + 1) / q - 1e-9)
    return out


def source_verdicts(got: dict, design, member_of: dict, ids: list[str], fdrs=FDRS) -> dict:
    """The per-source view of one world's audit: the share of non-member suspected sources
    (no file trained on) with p <= 0.05, and at each q the false-discovery proportion of the
    step-up rule run over sources."""
    from mia_ray.stats.audit import benjamini_hochberg

    groups = np.flatnonzero(design.side == 1)
    trained = np.zeros(design.side.size, dtype=bool)
    for i, g in enumerate(design.group):
        trained[g] |= bool(member_of[ids[i]])
    gp = list(got["group_pvalues"][groups])
    small = np.array([x <= Fraction(1, 20) for x in gp], dtype=bool)
    non = ~trained[groups]
    out = {"per_source": _share(small[non])}
    for q in fdrs:
        fl = benjamini_hochberg(gp, q)[0]
        out[f"fdp@{q:g}"] = float((fl & non).sum() / max(int(fl.sum()), 1))
    return out


def _former_per_file(design, got: dict, seed: int, sus, member, pick, fdrs) -> dict:
    """The former per-file scheme on the same fits (split-conformal in the first round's
    halves, one file per unseen source), for the comparison in VALIDITY.md."""
    from mia_ray.detectors.dataset_inference import file_pvalues
    from mia_ray.stats.audit import benjamini_hochberg

    split = file_pvalues(design, got["rounds"][:1], seed)
    p = [split[i][0] for i in sus]
    flagged = {q: benjamini_hochberg(p, q)[0] for q in fdrs}
    v = verdicts(p, flagged, member, pick, min(split[i][1] for i in sus))
    return {k: x for k, x in v.items() if k == "per_file" or k.startswith(("fdp@", "members_"))}


def after_world(
    world: World,
    permutations: int,
    seed: int,
    *,
    null: bool = True,
    blind: bool = True,
    rounds: int = ROUNDS,
    alpha: float = ALPHA,
    fdrs=FDRS,
    former: bool = True,
) -> dict:
    """The audit's statistics on one world as ``pipelines/audit.py::analyse`` computes them
    (``audit.seed`` = ``seed``, ``audit.rounds``, ``audit.C`` = 1); with ``former``, also the
    former per-file scheme's numbers (``split``)."""
    from mia_ray.detectors.dataset_inference import (
        audit,
        file_matrix,
        null_check,
        permutation_test,
        text_matrix,
    )
    from mia_ray.detectors.premise import blind_check
    from mia_ray.pipelines.audit import design_of
    from mia_ray.stats.audit import benjamini_hochberg

    t0 = time.perf_counter()
    cfg = SimpleNamespace(audit=SimpleNamespace(seed=seed, rounds=rounds, C=C))
    world, rows = equalize(world, seed)
    units = world.unit_files[rows]
    files = (
        pd.DataFrame({"doc_id": world.files, "side": world.side, "source": world.source})
        .sort_values("doc_id")
        .reset_index(drop=True)
    )
    ids = files["doc_id"].tolist()
    F = file_matrix(units, world.X[rows], ids)
    design = design_of(files, F, cfg, nonneg=True)
    got = audit(design, permutations, seed, alpha, fdrs[0])
    sus = got["suspected"]
    pv = [got["pvalues"][i][0] for i in sus]
    flagged = {fdrs[0]: np.asarray(got["flagged"], dtype=bool)}
    for q in fdrs[1:]:
        flagged[q] = benjamini_hochberg(pv, q)[0]
    member_of = dict(zip(world.files, world.member, strict=True))
    names = [ids[i] for i in sus]
    member = np.array([member_of[n] for n in names], dtype=bool)
    pick = names.index(world.pick) if world.pick in names else None
    out = {
        "reject": bool(got["test"]["reject"]),
        "p_value": float(got["test"]["p_value"]),
        **verdicts(pv, flagged, member, pick, min(got["pvalues"][i][1] for i in sus)),
        "sources": source_verdicts(got, design, member_of, ids, fdrs),
    }
    if former:
        out["split"] = _former_per_file(design, got, seed, sus, member, pick, fdrs)
    if null:
        out["null"] = bool(null_check(design, permutations, seed, alpha)["reject"])
    if blind and world.texts is not None:
        # The audit's blind check (words, characters, surface: one min-p test) and, beside
        # it, the words-only check it replaced.
        texts = [world.texts[r] for r in rows]
        got = blind_check(design, units, texts, ids, permutations, seed, alpha)
        out["blind"] = bool(got["reject"])
        T = text_matrix(units, texts, ids)
        out["blind_words_only"] = bool(
            permutation_test(design_of(files, T, cfg, False), permutations, seed, alpha)["reject"]
        )
    out["seconds"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------- summaries


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion k / n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def rate(flags) -> dict:
    """A proportion over independent worlds: count, n, rate, 95 % Wilson interval."""
    f = [bool(x) for x in flags if x is not None]
    k, n = sum(f), len(f)
    return {"count": k, "n": n, "rate": k / n if n else math.nan, "ci": wilson(k, n)}


def mean_ci(values, z: float = 1.96) -> dict:
    """Mean over worlds of a per-world quantity with a normal 95 % interval over worlds (the
    worlds are independent; the files within one world are not, so the world is the unit)."""
    v = np.array([x for x in values if x is not None and not math.isnan(x)], dtype=np.float64)
    if v.size == 0:
        return {"mean": math.nan, "n": 0, "ci": (math.nan, math.nan)}
    m = float(v.mean())
    se = float(v.std(ddof=1)) / math.sqrt(v.size) if v.size > 1 else math.nan
    return {"mean": m, "n": int(v.size), "ci": (max(0.0, m - z * se), min(1.0, m + z * se))}


def summarize(records: list[dict], fdrs=FDRS) -> dict:
    """Rates and means over worlds of :func:`after_world`-shaped records."""
    out = {
        "n_worlds": len(records),
        "reject": rate(r["reject"] for r in records),
        "per_file": mean_ci(r["per_file"] for r in records),
        "pick": rate(r.get("pick") for r in records),
        "min_n_cal": min((r["n_cal"] for r in records if "n_cal" in r), default=None),
    }
    for q in fdrs:
        out[f"fdr@{q:g}"] = mean_ci(r[f"fdp@{q:g}"] for r in records)
        out[f"any_flagged@{q:g}"] = rate(r[f"flagged@{q:g}"] > 0 for r in records)
        out[f"members_flagged@{q:g}"] = mean_ci(r[f"members_flagged@{q:g}"] for r in records)
        out[f"together@{q:g}"] = min((r[f"together@{q:g}"] for r in records), default=None)
    for check in ("null", "blind", "blind_words_only", "half_reject"):
        if any(check in r for r in records):
            out[check] = rate(r.get(check) for r in records)
    for view in ("split", "sources"):
        if any(view in r for r in records):
            keys = records[0][view]
            out[view] = {k: mean_ci(r[view][k] for r in records) for k in keys}
    secs = [r["seconds"] for r in records if "seconds" in r]
    out["seconds_median"] = float(np.median(secs)) if secs else math.nan
    return out


def run_scenario(
    name: str,
    n_worlds: int,
    permutations: int,
    seed: int,
    shift: float = 0.0,
    n_members: int | None = None,
    *,
    null: bool = True,
    blind: bool = True,
    former: bool = True,
) -> dict:
    """The audit ("after") on ``n_worlds`` seeded worlds of scenario ``name``: the dataset
    test's rejection rate at alpha 0.05 (``reject``), per-file P(p <= 0.05) over the non-member
    suspected files (``per_file``: mean of per-world shares; ``pick``: one random non-member
    per world, independent over worlds), realized FDR at q = 0.05 (BH by ``audit``) and 0.2
    (``benjamini_hochberg`` on the same p-values), the null and blind checks' rejection rates,
    and with members the share of them flagged (``members_flagged@0.05``). World i is audited
    with ``audit.seed`` = i."""
    records = []
    for i in range(n_worlds):
        w = make_world(name, world_rng(name, seed, i), shift, n_members)
        records.append(after_world(w, permutations, i, null=null, blind=blind, former=former))
    out = summarize(records)
    out.update(
        scenario=name,
        h0=SCENARIOS[name].h0 and not n_members,
        shift=shift,
        n_members=n_members or 0,
        permutations=permutations,
    )
    return out
