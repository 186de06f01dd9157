"""LocalHFBackend: continuation log-probs from a Hugging Face causal LM on this machine."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from mia_ray.backends.base import (
    Backend,
    LoglikRequest,
    LoglikResult,
    SampleRequest,
    encode_requests,
    sample_prompt_ids,
)
from mia_ray.errors import MiaError


@dataclass
class TokenScores:
    """Scores of a sequence's last ``n`` tokens, each predicted from all tokens before it.

    ``logprobs`` (n,) of the actual tokens, ``argmax`` (n,) the most likely token ids,
    ``top_ids`` / ``top_logprobs`` (n, top_n) the ``top_n`` most likely ids and their log-probs;
    ``first``, when asked for, the whole distribution at the first of the n positions.
    """

    logprobs: np.ndarray
    argmax: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    first: np.ndarray | None = None  # (vocab,) log-probs where the first of the n is predicted


SAMPLE_ROWS = 64  # rows (samples) sampled together: one request's n rows are never split
SHARED_PREFIX_MIN = 32  # tokens: below this, one padded batch is as cheap as a cached prefix


def shared_prefix(seqs: list[list[int]], n_last: list[int]) -> int:
    """Length of the token prefix all rows share, short of each row's last context token
    (every row keeps one context token of its own to predict its continuation from)."""
    limit = min(len(s) - n - 1 for s, n in zip(seqs, n_last, strict=True))
    first = seqs[0]
    k = 0
    while k < limit and all(s[k] == first[k] for s in seqs):
        k += 1
    return k


class LocalHFBackend(Backend):
    """Score with a causal LM loaded by :func:`mia_ray.models.hf.load_causal_lm`.

    Requests are sorted by length and run ``batch_size`` at a time, left-padded so every
    continuation ends its row and only its positions are projected onto the vocabulary.
    When all requests of a call share a long token prefix (a few-shot block), the prefix
    runs once and its KV cache serves every row; one-token continuations of the same context
    (the answers of a multiple-choice question) are read from one row. A
    context too long for the model (``max_length``; 0 = the model's own limit) loses its
    oldest tokens; the continuation is never cropped.
    """

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int = 8,
        torch_threads: int = 0,
        max_length: int = 0,
    ):
        from mia_ray.models.hf import load_causal_lm, set_torch_threads

        if batch_size < 1:
            raise MiaError(f"batch_size must be at least 1, not {batch_size}")
        set_torch_threads(torch_threads)
        self.model, self.tokenizer, self.device = load_causal_lm(model, device, dtype)
        if not self.tokenizer.is_fast:
            raise MiaError(
                f"model {model!r} has no fast tokenizer: the continuation's tokens are found "
                "from character offsets, which only fast tokenizers give"
            )
        from mia_ray.storage import redact

        # ``model`` may be a staged storage URL (mia_ray.storage.localize): no credentials in it.
        self.name = f"hf:{redact(model)}"
        self.batch_size = batch_size
        cfg = self.model.config.get_text_config()
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        limits = [n for n in (max_length, limit) if n and n > 0]
        self.max_length = min(limits) if limits else 0  # 0: no limit known
        tok = self.tokenizer
        # transformers 5 renamed the KV cache argument and output field to `cache`.
        params = inspect.signature(self.model.forward).parameters
        self._cache_key = "cache" if "cache" in params else "past_key_values"
        self.bos_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else (self.bos_id or 0)
        eos = self.model.generation_config.eos_token_id
        eos = tok.eos_token_id if eos is None else eos
        self.eos_set = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        import torch

        self.eos_ids = torch.tensor(sorted(self.eos_set), dtype=torch.long, device=self.device)

    def sample(
        self, requests: list[SampleRequest], temperature: float = 1.0, top_k: int = 0
    ) -> list[list[str]]:
        """Multinomial sampling, requests together in left-padded batches of at most
        ``SAMPLE_ROWS`` rows (a request's ``n`` samples are its rows). Each prompt is read
        once and its KV cache copied to its rows; then, at each step, every request draws its
        rows' next tokens from a generator of its own, seeded with its seed, for each of its
        ``max_tokens`` steps whether or not a row has ended: an exponential race over the
        ``top_k`` likeliest tokens in order (all tokens when 0), each row taking the token of
        largest p / E. So a request's texts do not depend
        on what else is in the call (up to the rounding of a batched forward, which can move a
        draw only when it falls within ~1e-6 of a boundary). The prompt is tokenised without
        special tokens (an empty one starts from BOS) and loses its oldest tokens to fit
        ``max_length``; a continuation stops at EOS."""
        prompts = [
            sample_prompt_ids(self.tokenizer, r.prompt, self.bos_id, self.max_length, r.max_tokens)
            for r in requests
        ]
        order = sorted(range(len(requests)), key=lambda i: -len(prompts[i]))
        out: list[list[str]] = [[] for _ in requests]
        group: list[int] = []
        rows = 0
        for i in order + [-1]:
            if group and (i < 0 or rows + requests[i].n > SAMPLE_ROWS):
                texts = self._sample_group(
                    [prompts[j] for j in group], [requests[j] for j in group], temperature, top_k
                )
                for j, t in zip(group, texts, strict=True):
                    out[j] = t
                group, rows = [], 0
            if i < 0:
                break
            group.append(i)
            rows += requests[i].n
        return out

    def _sample_group(self, prompts, requests, temperature, top_k):
        import torch

        from mia_ray.models.hf import left_pad

        dev = self.device
        n = torch.tensor([r.n for r in requests])
        rows = torch.repeat_interleave(torch.arange(len(requests)), n).to(dev)
        ends = torch.cumsum(n, 0).tolist()
        spans = [(e - r.n, e) for e, r in zip(ends, requests, strict=True)]
        gens = [torch.Generator(device=dev).manual_seed(r.seed) for r in requests]
        steps = max(r.max_tokens for r in requests)
        limit = torch.repeat_interleave(torch.tensor([r.max_tokens for r in requests]), n).to(dev)
        ids, mask, pos = left_pad(prompts, self.pad_id, dev)
        drawn = torch.full((len(rows), steps), self.pad_id, dtype=torch.long, device=dev)
        ended = torch.zeros(len(rows), dtype=torch.bool, device=dev)
        with torch.inference_mode():
            # A static cache holds the whole loop in place (a dynamic one copies itself at
            # every step: measured, the largest cost of the loop on the tiny model).
            cache = {}
            if getattr(self.model, "_can_compile_fullgraph", False):
                from transformers import StaticCache

                cache = {self._cache_key: StaticCache(config=self.model.config,
                                                      max_cache_len=ids.shape[1] + steps)}  # fmt: skip
            res = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                             use_cache=True, logits_to_keep=1, **cache)  # fmt: skip
            cache = getattr(res, "cache", None) or res.past_key_values
            cache.reorder_cache(rows)
            logits, mask, pos = res.logits[rows, -1], mask[rows], pos[rows, -1:]
            # A row's last position is its prompt's plus its own max_tokens (within the
            # window by the prompt's crop); rows that are done idle there while others go on.
            last = pos + limit[:, None] - 1
            for t in range(steps):
                scores = logits.float() / temperature
                if top_k:  # the top_k likeliest tokens, likeliest first
                    scores, token = scores.topk(min(top_k, scores.shape[-1]), dim=-1)
                else:
                    token = torch.arange(scores.shape[-1], device=dev).expand_as(scores)
                probs = torch.softmax(scores, dim=-1)
                nxt = torch.full((len(rows),), self.pad_id, dtype=torch.long, device=dev)
                for (a, b), r, g in zip(spans, requests, gens, strict=True):
                    if t < r.max_tokens:  # an exponential race: argmax p / E picks i w.p. p_i
                        race = torch.empty_like(probs[a:b]).exponential_(generator=g)
                        pick = (probs[a:b] / race).argmax(-1, keepdim=True)
                        nxt[a:b] = token[a:b].gather(-1, pick)[:, 0]
                live = ~ended & (t < limit)
                nxt = torch.where(live, nxt, self.pad_id)
                drawn[:, t] = nxt
                ended |= ~live | torch.isin(nxt, self.eos_ids)
                if t == steps - 1 or bool(ended.all()):
                    break  # no forward for logits nobody draws from
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                pos = torch.minimum(pos + 1, last)
                res = self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos,
                                 use_cache=True, **{self._cache_key: cache})  # fmt: skip
                cache = getattr(res, "cache", None) or res.past_key_values
                logits = res.logits[:, -1]
        texts = []
        for (a, b), r in zip(spans, requests, strict=True):
            batch = []
            for row in drawn[a:b, : r.max_tokens].tolist():
                cut = next((k for k, x in enumerate(row) if x in self.eos_set), len(row))
                batch.append(row[:cut])
            texts.append(self.tokenizer.batch_decode(batch, skip_special_tokens=True))
        return texts

    def encode(self, requests: list[LoglikRequest]) -> list[tuple[list[int], int]]:
        """``(token ids, number of continuation tokens at their end)`` per request, with the
        context cropped from the left to fit ``max_length``."""
        return encode_requests(self.tokenizer, requests, self.bos_id, self.max_length)

    def score_last(
        self, seqs: list[list[int]], n_last: list[int], top_n: int = 0, keep_first: bool = False
    ):
        """:class:`TokenScores` of the last ``n_last[i]`` tokens of each ``seqs[i]``
        (``1 <= n_last[i] < len(seqs[i])``), in the order given."""
        import torch

        from mia_ray.models.hf import left_pad

        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        out: list[TokenScores | None] = [None] * len(seqs)
        with torch.inference_mode():
            for b in range(0, len(order), self.batch_size):
                idx = order[b : b + self.batch_size]
                ids, mask, pos = left_pad([seqs[i] for i in idx], self.pad_id, self.device)
                width = max(n_last[i] for i in idx)
                logits = self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=pos,
                    logits_to_keep=width + 1,
                ).logits[:, :-1]
                logp = torch.log_softmax(logits.float(), dim=-1)
                target = ids[:, -width:]
                tok_lp = logp.gather(-1, target[..., None]).squeeze(-1).cpu().numpy()
                best = logp.argmax(-1).cpu().numpy()
                if top_n > 0:
                    top_lp, top_id = logp.topk(top_n, dim=-1)
                    top_lp, top_id = top_lp.cpu().numpy(), top_id.cpu().numpy()
                else:
                    top_lp = np.zeros((len(idx), width, 0), np.float32)
                    top_id = np.zeros((len(idx), width, 0), np.int64)
                for row, i in enumerate(idx):
                    n = n_last[i]
                    first = logp[row, -n].cpu().numpy() if keep_first else None
                    out[i] = TokenScores(
                        tok_lp[row, -n:], best[row, -n:], top_id[row, -n:], top_lp[row, -n:], first
                    )
        return out

    def score_shared(
        self, seqs: list[list[int]], n_last: list[int], shared: int, keep_first: bool = False
    ):
        """:meth:`score_last` for sequences whose first ``shared`` tokens are the same: that
        prefix runs once and its KV cache serves every row (a few-shot block asked about
        many texts costs one pass, not one per text). Rows are right-padded after it."""
        import copy

        import torch

        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        out: list[TokenScores | None] = [None] * len(seqs)
        with torch.inference_mode():
            pre = torch.tensor([seqs[0][:shared]], device=self.device)
            res = self.model(input_ids=pre, use_cache=True)
            cache = getattr(res, "cache", None) or res.past_key_values
            for b in range(0, len(order), self.batch_size):
                idx = order[b : b + self.batch_size]
                rest = [seqs[i][shared:] for i in idx]
                width = max(len(r) for r in rest)
                ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(idx), shared + width), dtype=torch.long)
                mask[:, :shared] = 1
                for row, r in enumerate(rest):
                    ids[row, : len(r)] = torch.tensor(r)
                    mask[row, shared : shared + len(r)] = 1
                past = copy.deepcopy(cache)
                past.batch_repeat_interleave(len(idx))
                pos = torch.arange(shared, shared + width)[None].expand(len(idx), -1)
                logits = self.model(
                    input_ids=ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    position_ids=pos.to(self.device),
                    **{self._cache_key: past},
                ).logits
                logp = torch.log_softmax(logits.float(), dim=-1)
                for row, i in enumerate(idx):
                    n, m = n_last[i], len(rest[row])
                    lp = logp[row, m - n - 1 : m - 1]
                    target = ids[row, m - n : m].to(lp.device)
                    out[i] = TokenScores(
                        lp.gather(-1, target[:, None]).squeeze(-1).cpu().numpy(),
                        lp.argmax(-1).cpu().numpy(),
                        np.zeros((n, 0), np.int64),
                        np.zeros((n, 0), np.float32),
                        lp[0].cpu().numpy() if keep_first else None,
                    )
        return out

    def loglikelihood(self, requests: list[LoglikRequest]) -> list[LoglikResult]:
        if not requests:
            return []
        encoded = self.encode(requests)
        # One-token answers after the same context (" 0" / " 1") share one row: the
        # distribution at that position gives every answer's log-prob.
        rep: dict[tuple[int, ...], int] = {}
        row_of = []
        for i, (ids, n) in enumerate(encoded):
            key = tuple(ids[:-1]) if n == 1 else (i, -1)
            row_of.append(rep.setdefault(key, i))
        rows = sorted(set(row_of))
        seqs = [encoded[i][0] for i in rows]
        n_last = [encoded[i][1] for i in rows]
        keep = len(rows) < len(encoded)
        shared = shared_prefix(seqs, n_last)
        if len(seqs) > 1 and shared >= SHARED_PREFIX_MIN:
            got = self.score_shared(seqs, n_last, shared, keep_first=keep)
        else:
            got = self.score_last(seqs, n_last, keep_first=keep)
        scores = dict(zip(rows, got, strict=True))
        results = []
        for i, (ids, n) in enumerate(encoded):
            s, cont = scores[row_of[i]], ids[-n:]
            if row_of[i] == i:
                lps, greedy = [float(x) for x in s.logprobs], bool(np.array_equal(s.argmax, cont))
            else:
                lps, greedy = [float(s.first[cont[0]])], int(np.argmax(s.first)) == cont[0]
            results.append(
                LoglikResult(
                    logprobs=lps,
                    tokens=[self.tokenizer.decode([t]) for t in cont],
                    greedy=greedy,
                )
            )
        return results

    def close(self) -> None:
        self.model = None
