"""OpenAICompletionsBackend: continuation log-probs from an OpenAI-compatible completions API.

The classic way to score text through a completions endpoint: send ``context +
continuation`` as the prompt with ``echo: true, max_tokens: 0, logprobs: 1`` and read the
log-prob the server gives each prompt token (``token_logprobs``), where it starts
(``text_offset``) and the top-1 alternative (``top_logprobs``, for the greedy flag). Only the
standard library is used (``urllib``, ``json``, ``sqlite3``).

Works with ``mia-ray serve`` and any server that implements echo with log-probs (OpenAI's
legacy completion models, vLLM). A prompt that the server finds too long comes back as its
400 error: this backend cannot crop a context it does not tokenize.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import json
import os
import random
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mia_ray.backends.base import (
    Backend,
    LoglikRequest,
    LoglikResult,
    SampleRequest,
    no_token_error,
)
from mia_ray.errors import MiaError
from mia_ray.redact import redact, split_userinfo

KEY_ENV_VARS = ("MIA_RAY_API_KEY", "OPENAI_API_KEY")
_FIELDS = ("tokens", "token_logprobs", "text_offset", "top_logprobs")
_MAX_WAIT_S = 120.0  # a longer Retry-After or back-off would look like a hang


class RateLimiter:
    """At most ``rps`` calls of :meth:`wait` return per second, across threads (0 = no limit)."""

    def __init__(self, rps: float):
        self.interval = 1.0 / rps if rps > 0 else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + self.interval
        # Sleep outside the lock: each caller has its own slot already.
        if slot > now:
            time.sleep(slot - now)


class _Cache:
    """sqlite3 file of per-prompt server answers (the choice's ``logprobs`` object)."""

    def __init__(self, cache_dir: str):
        path = Path(cache_dir).expanduser()
        try:
            path.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(
                path / "completions.sqlite", timeout=60, check_same_thread=False
            )
            self.db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT)")
            self.db.commit()
        except (OSError, sqlite3.Error) as e:
            raise MiaError(f"cannot use cache_dir {cache_dir}: {e}") from None
        self._lock = threading.Lock()

    def get(self, keys: list[str]) -> dict[str, Any]:
        found = {}
        with self._lock:
            # Chunks stay below sqlite's limit on bound parameters.
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                marks = ",".join("?" * len(chunk))
                rows = self.db.execute(
                    f"SELECT key, value FROM answers WHERE key IN ({marks})", chunk
                )
                found.update((k, json.loads(v)) for k, v in rows)
        return found

    def put(self, items: dict[str, Any]) -> None:
        with self._lock, self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO answers (key, value) VALUES (?, ?)",
                [(k, json.dumps(v)) for k, v in items.items()],
            )

    def close(self) -> None:
        with self._lock:
            self.db.close()


class OpenAICompletionsBackend(Backend):
    """Score through ``POST {base_url}/completions`` (``base_url`` like ``http://host:8000/v1``).

    The key is ``api_key``, else ``$MIA_RAY_API_KEY``, else ``$OPENAI_API_KEY`` (none: no
    Authorization header). Each HTTP attempt waits for the rate limiter (``rate_limit_rps``;
    0 = unlimited) and gets ``timeout_s``. Connection errors, timeouts, 429 and 5xx are tried
    again, ``max_retries`` attempts in all (the first included), after an exponential back-off
    from ``backoff_s`` with jitter, or after the server's ``Retry-After``. Other 4xx answers
    stop at once. With ``cache_dir`` every answer is kept per prompt in an sqlite3 file, so a
    rerun (also from a new instance) sends only prompts it has not sent before; answers are
    keyed by ``cache_scope`` (default: the base URL), the model name and the whole request
    body (prompt, ``echo``, ``logprobs``, ``max_tokens``, ``temperature``: every option that
    changes the answer). A scope replaces the URL only where it names the answering weights
    better than the URL does: ``mia-ray serve`` on a loopback port that changes from run to
    run is scoped by its model's content key (see ``pipelines/leakage/evaluation.py``).

    ``bos_text`` scores an empty context: it is put before the continuation as the one context
    token (e.g. ``"<|endoftext|>"`` for GPT-2 style models, whose servers read it as that
    special token); without it an empty context is an error, as the first token of a prompt
    gets no log-prob. ``requests_sent`` counts HTTP attempts, ``cache_hits`` prompts answered
    from the cache.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "",
        timeout_s: float = 60,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        rate_limit_rps: float = 0,
        batch_size: int = 16,
        cache_dir: str = "",
        bos_text: str = "",
        cache_scope: str = "",
    ):
        if not base_url.startswith(("http://", "https://")):
            raise MiaError(
                f"base_url must start with http:// or https://, not {redact(base_url)!r}"
            )
        if max_retries < 1:
            raise MiaError(f"max_retries counts attempts and must be at least 1, not {max_retries}")
        if batch_size < 1:
            raise MiaError(f"batch_size must be at least 1, not {batch_size}")
        if timeout_s <= 0:
            raise MiaError(f"timeout_s must be positive, not {timeout_s}")
        # http://user:KEY@host/v1: urllib would take "user:KEY@host" for the host; the key
        # goes in the Authorization header instead, and the URL shown is the plain one.
        base_url, user, password = split_userinfo(base_url)
        self.base_url = base_url.rstrip("/")
        # Cached answers belong to (scope, model, prompt); the scope defaults to the endpoint.
        self.cache_scope = cache_scope or self.base_url
        self.url = self.base_url + "/completions"
        self.model = model
        self.name = f"openai:{model}@{self.base_url}"
        self.key_source = "api_key" if api_key else ""
        if not api_key and (password or user):
            api_key, self.key_source = password or user, "base_url's user info"
        if not api_key:
            for var in KEY_ENV_VARS:
                if os.environ.get(var):
                    api_key, self.key_source = os.environ[var], f"${var}"
                    break
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.batch_size = batch_size
        self.bos_text = bos_text
        self.limiter = RateLimiter(rate_limit_rps)
        self.cache = _Cache(cache_dir) if cache_dir else None
        self.requests_sent = 0
        self.cache_hits = 0
        self._count_lock = threading.Lock()

    def _body(self, prompts: str | list[str]) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": prompts,
            "max_tokens": 0,
            "echo": True,
            "logprobs": 1,
            "temperature": 0,
        }

    def _key(self, prompt: str) -> str:
        blob = json.dumps([self.cache_scope, self.model, self._body(prompt)], sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def loglikelihood(self, requests: list[LoglikRequest]) -> list[LoglikResult]:
        if not requests:
            return []
        # An empty context is scored from bos_text, which then is the context.
        prompts, cuts = [], []
        for r in requests:
            ctx = r.context or self.bos_text
            prompts.append(ctx + r.continuation)
            cuts.append(len(ctx))
        keys = [self._key(p) for p in prompts]
        answers = self.cache.get(sorted(set(keys))) if self.cache else {}
        with self._count_lock:
            self.cache_hits += sum(k in answers for k in keys)
        # Identical prompts in one call are sent once.
        todo = {k: p for k, p in zip(keys, prompts, strict=True) if k not in answers}
        items = list(todo.items())
        for i in range(0, len(items), self.batch_size):
            chunk = items[i : i + self.batch_size]
            got = self._complete([p for _, p in chunk])
            fresh = {k: lp for (k, _), lp in zip(chunk, got, strict=True)}
            if self.cache:
                self.cache.put(fresh)
            answers.update(fresh)
        return [
            self._result(req, answers[k], cut)
            for req, k, cut in zip(requests, keys, cuts, strict=True)
        ]

    def sample(
        self, requests: list[SampleRequest], temperature: float = 1.0, top_k: int = 0
    ) -> list[list[str]]:
        """One ``/completions`` request per prompt with ``n``, ``temperature``, ``seed`` (and
        ``top_k`` when set: vLLM's and ``mia-ray serve``'s extension; OpenAI's own API has
        none), answers cached as scored ones are. Whether a seed fixes the texts is the
        server's affair."""
        out = []
        for r in requests:
            body = {"model": self.model, "prompt": r.prompt, "max_tokens": r.max_tokens,
                    "temperature": temperature, "top_p": 1.0, "n": r.n, "seed": r.seed}  # fmt: skip
            if top_k:
                body["top_k"] = top_k
            key = hashlib.sha256(
                json.dumps([self.cache_scope, body], sort_keys=True).encode("utf-8")
            ).hexdigest()
            got = self.cache.get([key]) if self.cache else {}
            if key in got:
                with self._count_lock:
                    self.cache_hits += 1
                out.append(got[key])
                continue
            reply = self._post(body)
            try:
                texts = [c["text"] for c in sorted(reply["choices"], key=lambda c: int(c["index"]))]
            except (KeyError, TypeError, ValueError):
                raise MiaError(
                    f"{self.url} answered without a list of choices with texts"
                ) from None
            if len(texts) != r.n:
                raise MiaError(f"{self.url} answered {len(texts)} choices for n = {r.n}")
            if self.cache:
                self.cache.put({key: texts})
            out.append(texts)
        return out

    def _result(self, req: LoglikRequest, lp: dict[str, Any], cut: int) -> LoglikResult:
        offsets, tokens = lp["text_offset"], lp["tokens"]
        token_lps, tops = lp["token_logprobs"], lp["top_logprobs"]
        start = next((i for i, o in enumerate(offsets) if o >= cut), len(offsets))
        if start == len(offsets):
            raise no_token_error(req)
        if token_lps[start] is None:
            raise MiaError(
                "the server gives no log-prob for a prompt's first token and the context is "
                "empty: give a context, or set bos_text (e.g. '<|endoftext|>')"
            )
        greedy = True
        for tok, tlp, top in zip(tokens[start:], token_lps[start:], tops[start:], strict=True):
            if not top:
                raise MiaError(f"{self.url} gave no top_logprobs for the greedy check")
            best, best_lp = max(top.items(), key=lambda kv: kv[1])
            # Equal log-probs count as greedy: ties, and tokens that decode alike.
            greedy = greedy and (best == tok or tlp >= best_lp)
        return LoglikResult(
            logprobs=[float(x) for x in token_lps[start:]],
            tokens=list(tokens[start:]),
            greedy=greedy,
        )

    def _complete(self, prompts: list[str]) -> list[dict[str, Any]]:
        """The ``logprobs`` object of each prompt's choice, in the order of ``prompts``."""
        reply = self._post(self._body(prompts))
        try:
            by_index = {int(c["index"]): c.get("logprobs") for c in reply["choices"]}
        except (KeyError, TypeError, ValueError):
            raise MiaError(f"{self.url} answered without a list of choices with indices") from None
        missing = [i for i in range(len(prompts)) if i not in by_index]
        if missing:
            raise MiaError(
                f"{self.url} answered {len(by_index)} choices for {len(prompts)} prompts "
                f"(no choice for index {missing[0]})"
            )
        out = [by_index[i] for i in range(len(prompts))]
        # Checked before anything is cached: a bad answer must not outlive this run.
        for lp in out:
            if not isinstance(lp, dict) or any(not isinstance(lp.get(f), list) for f in _FIELDS):
                raise MiaError(
                    f"{self.url} gave no echoed log-probs ({', '.join(_FIELDS)}): does the "
                    "server support echo with logprobs?"
                )
        return out

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "User-Agent": "mia-ray"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        failure, timed_out = "", False
        for attempt in range(1, self.max_retries + 1):
            self.limiter.wait()
            with self._count_lock:
                self.requests_sent += 1
            wait = None
            try:
                req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as e:
                message = _error_message(e)
                if e.code != 429 and e.code < 500:
                    raise self._client_error(e.code, message) from None
                failure, timed_out = f"the server answered {e.code}: {message}", False
                wait = _retry_after(e.headers.get("Retry-After"))
            except (OSError, http.client.HTTPException) as e:
                # URLError, ConnectionError and TimeoutError are all OSErrors.
                reason = getattr(e, "reason", e)
                timed_out = isinstance(reason, TimeoutError) or isinstance(e, TimeoutError)
                failure = f"could not reach the server: {reason}"
            else:
                try:
                    return json.loads(raw)
                except ValueError:
                    raise MiaError(
                        f"{self.url} answered 200 with a body that is not JSON: "
                        f"{raw[:200].decode('utf-8', 'replace')!r}"
                    ) from None
            if attempt < self.max_retries:
                if wait is None:
                    wait = self.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
                time.sleep(min(wait, _MAX_WAIT_S))
        n = self.max_retries
        if timed_out:
            raise MiaError(f"POST {self.url} timed out after {n} attempts of {self.timeout_s:g} s")
        raise MiaError(f"POST {self.url} failed after {n} attempts: {failure}")

    def _client_error(self, status: int, message: str) -> MiaError:
        if status == 401:
            if self.key_source:
                where = f"the key came from {self.key_source}"
            else:
                where = f"no key was given: pass api_key or set ${' or $'.join(KEY_ENV_VARS)}"
            return MiaError(
                f"{self.url} answered 401 (unauthorized): {message}; the API key is missing "
                f"or wrong ({where})"
            )
        hint = " (base_url usually ends in /v1)" if status == 404 else ""
        return MiaError(f"{self.url} answered {status}: {message}{hint}")

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
            self.cache = None


def _error_message(e: urllib.error.HTTPError) -> str:
    """The server's own words: OpenAI's ``{"error": {"message"}}``, else the body's start."""
    try:
        raw = e.read()
    except OSError:
        raw = b""
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text.splitlines()[0][:300] if text else (e.reason or "no message")
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        err = err.get("message") or err.get("detail") or err
    return str(err)[:300]


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), None if absent."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
