"""The text span every model of a run scores: the longest prefix that fits them all.

A Scorer crops a snippet at ``max_length`` tokens of its own tokenizer. A reference model
with another vocabulary would crop elsewhere, and the reference attack would then compare
losses over different text (and zlib would compress text no model scored). So the
pipeline crops each snippet once, before scoring, to the characters that the first
``max_length`` tokens of *every* tokenizer cover, and every model and zlib see exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def model_context(
    name_or_path: str, revision: str = "", trust_remote_code: bool = False, gguf_file: str = ""
) -> int | None:
    """The model's context in tokens (its position embeddings), or None when its config
    does not say."""
    from transformers import AutoConfig

    from mia_ray.storage import localize

    kwargs = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    cfg = AutoConfig.from_pretrained(localize(name_or_path), **kwargs)
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)


def context_limit(
    name_or_path: str,
    max_length: int,
    revision: str = "",
    trust_remote_code: bool = False,
    gguf_file: str = "",
) -> int:
    """``max_length`` capped at the model's context (what a Scorer of that model keeps)."""
    ctx = model_context(name_or_path, revision, trust_remote_code, gguf_file)
    return min(max_length, ctx) if ctx else max_length


def window_snippet_tokens(models: Sequence[tuple[str, str, bool, str]], max_length: int,
                          prefix_room: bool) -> int:  # fmt: skip
    """The snippet size, in tokens of the first model's tokenizer, that every model of
    ``models`` ((name_or_path, revision, trust_remote_code, gguf_file), the target first)
    reads whole: ``max_length`` capped at each model's context, less the special tokens its
    tokenizer adds (a Scorer counts them). ``prefix_room``: ReCaLL reads a prefix before
    each snippet inside the same context, so a snippet takes at most half of each model's
    context (``Scorer`` keeps the prefix's last tokens that fit)."""
    from mia_ray.models.hf import load_tokenizer

    size = max_length
    for name, rev, trust, gguf in models:
        ctx = model_context(name, rev, trust, gguf)
        tok = load_tokenizer(name, rev, trust, gguf)
        specials = len(tok("a", add_special_tokens=True)["input_ids"]) - len(
            tok("a", add_special_tokens=False)["input_ids"]
        )
        limit = min(max_length, ctx) if ctx else max_length
        if prefix_room:
            limit = min(limit, (ctx or max_length) // 2)
        size = min(size, limit - specials)
    return max(1, size)


def _n_tokens(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=True)["input_ids"])


def token_prefix_ends(tok, texts: Sequence[str], limit: int) -> np.ndarray:
    """Per text, the character end of what its first ``limit`` tokens (specials included,
    as the Scorer counts them) cover: ``len(text)`` when the whole text fits. (n,) int64."""
    ends = np.array([len(t) for t in texts], dtype=np.int64)
    if tok.is_fast:
        enc = tok(
            list(texts),
            add_special_tokens=True,
            truncation=True,
            max_length=limit,
            return_overflowing_tokens=False,
            return_offsets_mapping=True,
            return_length=True,
        )
        full = tok(list(texts), add_special_tokens=True, return_length=True)["length"]
        for i, (offsets, n_full) in enumerate(zip(enc["offset_mapping"], full, strict=True)):
            if n_full > limit:
                ends[i] = max(end for _, end in offsets)
        return ends
    # A slow tokenizer has no offsets: the longest prefix whose tokens fit, by bisection.
    for i, text in enumerate(texts):
        if _n_tokens(tok, text) <= limit:
            continue
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _n_tokens(tok, text[:mid]) <= limit:
                lo = mid
            else:
                hi = mid - 1
        ends[i] = lo
    return ends


def common_prefix(texts: Sequence[str], tokenizers: Sequence[tuple[object, int]]) -> list[str]:
    """Each text cut to the shortest of its ``(tokenizer, limit)`` prefixes (see module doc).

    A cut that leaves a tokenizer more tokens than its limit (a prefix can tokenize
    differently at its end) is shortened until it fits, so no Scorer crops it again."""
    texts = [str(t) for t in texts]
    ends = np.array([len(t) for t in texts], dtype=np.int64)
    for tok, limit in tokenizers:
        ends = np.minimum(ends, token_prefix_ends(tok, texts, limit))
    out = [t[:e] for t, e in zip(texts, ends, strict=True)]
    # Only a cut text can tokenize past a limit: an uncut one was measured whole above.
    cut = np.flatnonzero(ends < np.array([len(t) for t in texts]))
    for tok, limit in tokenizers:
        if not cut.size:
            break
        lengths = np.asarray(
            tok([out[i] for i in cut], add_special_tokens=True, return_length=True)["length"]
        )
        for i in cut[lengths > limit]:
            t = out[i]
            while len(t) > 1 and _n_tokens(tok, t) > limit:
                t = t[:-1]
            out[i] = t
    return out
