"""Scorer: the model role that turns snippets into token-level statistics, one forward pass each.

From one pass we keep, per snippet, everything every reference-free attack needs
(``mia_ray.features.attacks``): the observed tokens' log-probs and the mean and std of
log p(z) over the vocabulary at each position (Min-K%++, Zhang et al. 2024). The lowercase
attack needs the lowercased text, a different input, so it gets its own pass here too.
"""

from __future__ import annotations

import pandas as pd

from mia_ray.errors import MiaError


def vocab_moments(logp):
    """Mean and std of log p(z) under p over the vocabulary (Min-K%++'s normalisers), each
    (T,), from log-probs (T, V). A token the model rules out (log p = -inf) adds nothing,
    where p * log p would give 0 * -inf = NaN."""
    p = logp.exp()
    # Below log p = -200, p = exp(log p) is exactly 0 in float32, bfloat16 and float16 (their
    # smallest positive values are above e^-104), and 200^2 stays finite in float16: the
    # clamp changes no term but the 0 * -inf ones, in one elementwise pass on the hot path.
    safe = logp.clamp_min(-200.0)
    mu = (p * safe).sum(-1)
    var = (p * safe.square()).sum(-1) - mu.square()
    return mu, var.clamp_min(0).sqrt()


def row_stats(logits, ids, mask, texts: list[str], full: bool, moments: bool = True) -> list[dict]:
    """Per row of one forward pass (logits (B, T, V), ids and mask (B, T)): the mean NLL
    ``loss`` and ``n_tokens``, and with ``full`` the observed tokens' log-probs and the
    vocabulary moments (``token_logprobs``, ``mu``, ``sigma``: float32, n_tokens - 1 each)
    and the ids of those tokens (``token_ids``, int32). ``moments=False`` leaves out ``mu``
    and ``sigma``: two more passes over the vocabulary per token, 17 % of a batch's time on
    SmolLM2-135M (BENCHMARKS.md), which an attack reading only log-probs need not pay.

    On an accelerator nothing here waits for the device per row: the rows' results stay on
    it, padded into (B, T - 1) tensors, and come to the host in one copy per column. Rows are
    still worked one at a time, so the (T, V) float32 log-probs of one row at most are live
    (a whole batch's would be B times that: gigabytes for a 128k vocabulary)."""
    import torch

    lengths = mask.sum(1)
    n = lengths.tolist()  # the one wait for the device before the rows
    host_ids = ids.cpu().numpy()
    for i, k in enumerate(n):
        if k < 2:
            raise MiaError(
                f"a snippet has fewer than 2 tokens after tokenization: {texts[i][:60]!r}"
            )
    B, T = mask.shape
    # Right or left padding keeps each row's real positions in one run: row i's start.
    starts = torch.where(mask[:, 0].bool(), 0, T - lengths)
    ar = torch.arange(T, device=mask.device)
    runs = (ar >= starts[:, None]) & (ar < (starts + lengths)[:, None])
    if not torch.equal(runs, mask.bool()):
        raise MiaError("the attention mask has gaps inside a row: pad on one side only")
    start = starts.tolist()
    width = max(n) - 1
    moments = full and moments
    cols = ["tok", "mu", "sigma"] if moments else ["tok"]
    out = {c: torch.zeros(B, width, dtype=torch.float32, device=logits.device) for c in cols}
    loss = torch.empty(B, dtype=torch.float32, device=logits.device)
    for i in range(B):
        a, k = start[i], n[i]
        logp = torch.log_softmax(logits[i, a : a + k - 1].float(), dim=-1)  # (k-1, V)
        tok_lp = logp.gather(-1, ids[i, a + 1 : a + k, None]).squeeze(-1)
        loss[i] = -tok_lp.mean()
        out["tok"][i, : k - 1] = tok_lp
        if moments:
            out["mu"][i, : k - 1], out["sigma"][i, : k - 1] = vocab_moments(logp)
    host = {c: v.cpu().numpy() for c, v in out.items()}
    losses = loss.cpu().tolist()
    rows = []
    for i, k in enumerate(n):
        row = {"loss": losses[i], "n_tokens": k}
        if full:
            row["token_logprobs"] = host["tok"][i, : k - 1].copy()
            if moments:
                row["mu"] = host["mu"][i, : k - 1].copy()
                row["sigma"] = host["sigma"][i, : k - 1].copy()
            row["token_ids"] = host_ids[i, start[i] + 1 : start[i] + k].astype("int32")
        rows.append(row)
    return rows


class Scorer:
    """``Dataset.map_batches(Scorer, fn_constructor_kwargs=..., batch_format="pandas")``.

    Input rows carry ``snippet_id`` and ``text``; output rows carry ``snippet_id``,
    ``n_tokens`` and, with ``prefix`` = "" (target) or "ref_" (reference model):
    ``token_logprobs``, ``mu``, ``sigma``, ``token_ids`` (lists, length n_tokens - 1),
    ``loss`` (mean NLL) and, when ``lowercase`` is on, ``lower_loss``.

    Two other passes, one per pool: with ``context``, each snippet is read after that text
    (ReCaLL's prefix) and ``loss`` is the mean NLL of the very tokens the plain pass scores
    (all of the snippet's encoding but its first), ``context_tokens`` how much of the context
    fitted the model's window (its end is kept); with ``grad_norm``, ``grad_norm`` is the mean
    over the model's parameter tensors of the max-norm of the gradient of ``loss`` (MIMIR's
    default norm; one backward per snippet). ``moments=False``: ``token_logprobs`` and
    ``token_ids`` without ``mu`` and ``sigma``.
    """

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        max_length: int = 512,
        revision: str = "",
        gguf_file: str = "",
        trust_remote_code: bool = False,
        torch_threads: int = 0,
        lowercase: bool = True,
        token_stats: bool = True,
        prefix: str = "",
        context: str = "",
        grad_norm: bool = False,
        moments: bool = True,
    ):
        from mia_ray.models.hf import load_causal_lm, set_torch_threads

        set_torch_threads(torch_threads)
        self.model, self.tok, self.device = load_causal_lm(
            model, device, dtype, revision, trust_remote_code, gguf_file
        )
        ctx = getattr(self.model.config, "max_position_embeddings", None) or getattr(
            self.model.config, "n_positions", None
        )
        self.max_length = min(max_length, ctx) if ctx else max_length
        self.window = ctx or max_length
        self.lowercase = lowercase
        self.token_stats = token_stats
        self.prefix = prefix
        self.context = self.tok(context, add_special_tokens=False)["input_ids"] if context else []
        self.grad_norm = grad_norm
        self.moments = moments
        self._prefixes: dict = {}  # leading special tokens -> the context's cache (or None)

    def _encode(self, texts: list[str]):
        enc = self.tok(
            texts,
            return_tensors="pt",
            padding=True,
            # Right padding: with left padding, absolute position embeddings (GPT-2 style)
            # would shift with the batch's longest row, and a score with its batch.
            padding_side="right",
            truncation=True,
            max_length=self.max_length,
        )
        return {
            k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")
        }

    def _pass(self, texts: list[str], full: bool) -> list[dict]:
        """One forward pass over a batch; per row the stats (full) or only the mean NLL."""
        import torch

        enc = self._encode(texts)
        with torch.inference_mode():
            logits = self.model(**enc).logits
        return row_stats(logits, enc["input_ids"], enc["attention_mask"], texts, full, self.moments)

    def _conditioned(self, texts: list[str]) -> list[dict]:
        """The snippets read after ``self.context`` (see the class). Rows whose window holds
        the whole context share one forward pass of it: its keys and values are computed once
        per actor and the rows run on from them (the prefix costs one pass, not one per
        snippet); the others, and models whose cache cannot be shared this way, are read
        whole."""
        specials = set(self.tok.all_special_ids)
        seqs, scored, kept, cached = [], [], [], {}
        for i, text in enumerate(texts):
            own = self.tok(text, truncation=True, max_length=self.max_length)["input_ids"]
            if len(own) < 2:
                raise MiaError(
                    f"a snippet has fewer than 2 tokens after tokenization: {text[:60]!r}"
                )
            lead = next((j for j, t in enumerate(own) if t not in specials), len(own))
            room = max(0, self.window - len(own))
            ctx = self.context[max(0, len(self.context) - room) :] if room else []
            seqs.append(own[:lead] + ctx + own[lead:])
            scored.append(len(own) - 1)
            kept.append(len(ctx))
            # (A second leading special token would put context tokens among the scored.)
            whole_ctx = len(ctx) == len(self.context) and lead <= 1
            if whole_ctx and self._prefix_state(tuple(own[:lead])):
                cached.setdefault(tuple(own[:lead]), []).append(i)
        losses = [0.0] * len(texts)
        whole = sorted(set(range(len(texts))) - {i for rows in cached.values() for i in rows})
        if whole:
            for i, loss in zip(whole, self._read_whole([seqs[i] for i in whole],
                                                       [scored[i] for i in whole]), strict=True):  # fmt: skip
                losses[i] = loss
        for lead, rows in cached.items():
            start = len(lead) + len(self.context)
            got = self._read_after_prefix(lead, [seqs[i][start:] for i in rows],
                                          [scored[i] for i in rows])  # fmt: skip
            for i, loss in zip(rows, got, strict=True):
                losses[i] = loss
        return [{"loss": loss, "n_tokens": k + 1, "context_tokens": c}
                for loss, k, c in zip(losses, scored, kept, strict=True)]  # fmt: skip

    def _read_whole(self, seqs: list[list[int]], scored: list[int]) -> list[float]:
        """Mean NLL of each sequence's last ``scored`` tokens, each read from its start."""
        import torch

        ids, mask = self._right_padded(seqs)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask).logits
        out = []
        for i, (q, k) in enumerate(zip(seqs, scored, strict=True)):
            end = len(q)
            logp = torch.log_softmax(logits[i, end - 1 - k : end - 1].float(), dim=-1)
            out.append(float(-logp.gather(-1, ids[i, end - k : end, None]).mean()))
        return out

    def _right_padded(self, seqs: list[list[int]], n_before: int = 0):
        """Token ids (B, T) padded on the right and their attention mask, which also covers
        ``n_before`` cached positions ahead of every row."""
        import torch

        width = max(map(len, seqs))
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        ids = torch.tensor([q + [pad] * (width - len(q)) for q in seqs], device=self.device)
        mask = torch.tensor(
            [[1] * (n_before + len(q)) + [0] * (width - len(q)) for q in seqs], device=self.device
        )
        return ids, mask

    def _prefix_state(self, lead: tuple):
        """The context's cache after ``lead`` (the snippet's leading special tokens) and the
        log-probs at its last position, computed once; None where the model's cache is not a
        plain one that a batch can run on from (sliding windows, recurrent state)."""
        import torch
        from transformers import DynamicCache

        if lead not in self._prefixes:
            ids = torch.tensor([list(lead) + self.context], device=self.device)
            with torch.inference_mode():
                out = self.model(input_ids=ids, use_cache=True)
            # transformers 5 names it `cache`; earlier releases `past_key_values`.
            cache = getattr(out, "cache", None)
            if cache is None:
                cache = getattr(out, "past_key_values", None)
            plain = type(cache) is DynamicCache and not any(getattr(cache, "is_sliding", []))
            last = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            self._prefixes[lead] = (cache, last) if plain else None
        return self._prefixes[lead]

    def _read_after_prefix(self, lead: tuple, rests: list[list[int]], scored: list[int]):
        """Mean NLL of each row's last ``scored`` tokens, the rows (``rests``: what follows
        the prefix) run on from the prefix's cache in one batch."""
        import copy
        import inspect

        import torch

        cache, last = self._prefix_state(lead)
        ids, mask = self._right_padded(rests, cache.get_seq_length())
        past = copy.deepcopy(cache)
        past.batch_repeat_interleave(len(rests))
        # transformers 5 names the argument `cache`; earlier releases `past_key_values`.
        params = inspect.signature(self.model.forward).parameters
        kw = {"cache" if "cache" in params else "past_key_values": past}
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, **kw).logits
        out = []
        for i, (r, k) in enumerate(zip(rests, scored, strict=True)):
            # Token j of the rest is predicted at position j - 1, the first by the prefix.
            logp = torch.log_softmax(logits[i, : len(r) - 1].float(), dim=-1)
            logp = torch.cat([last[None], logp])[len(r) - k :]
            out.append(float(-logp.gather(-1, ids[i, len(r) - k : len(r), None]).mean()))
        return out

    def _gradient(self, texts: list[str]) -> list[dict]:
        """One backward per snippet (see the class)."""
        import torch

        params = [p for p in self.model.parameters() if p.requires_grad]
        rows = []
        for text in texts:
            enc = self._encode([text])
            if int(enc["attention_mask"].sum()) < 2:
                raise MiaError(
                    f"a snippet has fewer than 2 tokens after tokenization: {text[:60]!r}"
                )
            self.model.zero_grad(set_to_none=True)
            with torch.enable_grad():
                loss = self.model(**enc, labels=enc["input_ids"]).loss
                loss.backward()
            grads = [p.grad.detach() for p in params if p.grad is not None]
            norms = torch.stack([g.float().abs().max() for g in grads])  # each tensor's inf-norm
            rows.append({"loss": float(loss.detach()), "n_tokens": int(enc["attention_mask"].sum()),
                         "grad_norm": float(norms.mean())})  # fmt: skip
        self.model.zero_grad(set_to_none=True)
        return rows

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        from mia_ray.actors import in_model_batches

        return in_model_batches(batch, self._score)

    def _score(self, batch: pd.DataFrame) -> pd.DataFrame:
        texts = [str(t) for t in batch["text"]]
        if self.grad_norm:
            rows = self._gradient(texts)
        elif self.context:
            rows = self._conditioned(texts)
        else:
            rows = self._pass(texts, self.token_stats)
        res = pd.DataFrame({"snippet_id": batch["snippet_id"].to_numpy()})
        for key in rows[0]:
            res[self.prefix + key] = [r[key] for r in rows]
        if self.lowercase:
            res[self.prefix + "lower_loss"] = [
                r["loss"] for r in self._pass([t.lower() for t in texts], False)
            ]
        return res
