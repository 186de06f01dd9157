"""One prompting interface: the log-likelihood of a continuation after a context.

A backend answers ``loglikelihood([LoglikRequest(context, continuation), ...])`` with the
natural-log probability of each continuation token given everything before it. Every
prompting method (the leakage survey's refusal comparison, LOSS / zlib / Min-K% on text
instances, self-detection, black-box CopyCheck) is built on this one call.

Tokenisation rule (the same for every backend, so their numbers agree):

* the whole string ``context + continuation`` is tokenised once, without special tokens;
* the continuation's tokens are those whose character span (the tokenizer's offset mapping,
  or the API's ``text_offset``) starts at or after ``len(context)``. When BPE merges a token
  across the boundary (context ``"To be or no"``, continuation ``"t to be"``), the merged
  token belongs to the context and the continuation is scored from the next token on. A
  continuation left with no token of its own is an error;
* an empty context is scored from the model's BOS token (its EOS token when it has no BOS)
  as the one context token, so the first token of a text gets a log-prob too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mia_ray.errors import MiaError


@dataclass(frozen=True)
class LoglikRequest:
    """Score ``continuation`` after ``context`` (plain strings, joined with nothing between)."""

    context: str
    continuation: str


@dataclass
class LoglikResult:
    """Per-token log-probs (natural log) of a continuation's tokens, with their texts.

    ``greedy`` is True when every continuation token was the model's most likely next token.
    """

    logprobs: list[float]
    tokens: list[str]
    greedy: bool

    @property
    def total(self) -> float:
        return float(sum(self.logprobs))


@dataclass(frozen=True)
class SampleRequest:
    """``n`` continuations of ``prompt``, at most ``max_tokens`` tokens each, drawn with a
    generator seeded by ``seed`` (the same texts on every run where the backend allows)."""

    prompt: str
    n: int
    max_tokens: int
    seed: int


class Backend:
    """A model that scores continuations: a local HF model or a completions API."""

    name: str = "backend"

    def loglikelihood(self, requests: list[LoglikRequest]) -> list[LoglikResult]:
        """One result per request, in the order of ``requests``."""
        raise NotImplementedError

    def sample(
        self, requests: list[SampleRequest], temperature: float = 1.0, top_k: int = 0
    ) -> list[list[str]]:
        """Per request its ``n`` continuations (text after the prompt), sampled at
        ``temperature`` from the ``top_k`` likeliest tokens (0: all of them)."""
        raise MiaError(f"{self.name} cannot sample continuations")

    def close(self) -> None:
        """Release what the backend holds (model memory, cache files)."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def choice_logprobs(backend: Backend, context: str, options: list[str]) -> np.ndarray:
    """Summed log-prob of each option after ``context``: shape (len(options),).

    E.g. options ``[" 0", " 1"]`` for a yes/no question; softmax over the result gives the
    model's choice restricted to the options.
    """
    if not options:
        raise MiaError("choice_logprobs needs at least one option")
    results = backend.loglikelihood([LoglikRequest(context, o) for o in options])
    return np.array([r.total for r in results], dtype=np.float64)


def no_token_error(req: LoglikRequest) -> MiaError:
    """The continuation vanished into the context's last token (see the tokenisation rule)."""
    return MiaError(
        f"continuation {req.continuation[:40]!r} has no token of its own after context "
        f"ending {req.context[-40:]!r}: the tokenizer merges it into the context's last "
        "token; end the context at a word boundary"
    )


def encode_requests(
    tokenizer, requests: list[LoglikRequest], bos_id: int | None, max_length: int
) -> list[tuple[list[int], int]]:
    """The tokenisation rule (see the module) for a local tokenizer (a fast one: offsets):
    ``(token ids, number of continuation tokens at their end)`` per request, the context
    cropped from the left to fit ``max_length`` (0: no limit)."""
    fulls = [r.context + r.continuation for r in requests]
    enc = tokenizer(fulls, add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for req, ids, offsets in zip(requests, enc["input_ids"], enc["offset_mapping"], strict=True):
        ids = list(ids)
        cut = len(req.context)
        start = next((i for i, (s, _) in enumerate(offsets) if s >= cut), len(ids))
        n_cont = len(ids) - start
        if n_cont == 0:
            raise no_token_error(req)
        if start == 0:
            if bos_id is None:
                raise MiaError(
                    "the context is empty and the model has no BOS or EOS token to score "
                    "the first token from; give a context"
                )
            ids = [bos_id] + ids
        if max_length and len(ids) > max_length:
            if n_cont + 1 > max_length:
                raise MiaError(
                    f"continuation {req.continuation[:40]!r} is {n_cont} tokens; with one "
                    f"context token it exceeds the model's maximum length {max_length}"
                )
            ids = ids[len(ids) - max_length :]
        out.append((ids, n_cont))
    return out


def sample_prompt_ids(tokenizer, prompt: str, bos_id: int, max_length: int, max_tokens: int):
    """A sampling prompt's token ids: without special tokens (an empty prompt starts from
    BOS), losing its oldest tokens so that ``max_tokens`` more fit ``max_length`` (0: no
    limit)."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] or [bos_id]
    if max_length:
        ids = ids[max(0, len(ids) - max(1, max_length - max_tokens)) :]
    return list(ids)
