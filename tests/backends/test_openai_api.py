"""OpenAICompletionsBackend against a scripted stdlib server: retries, errors, cache, rate."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mia_ray.backends import LoglikRequest
from mia_ray.backends.openai_api import OpenAICompletionsBackend, RateLimiter
from mia_ray.errors import MiaError


def _fake_logprobs(prompt: str) -> dict:
    """One token per character; token i has log-prob -i and is always the top token."""
    return {
        "tokens": list(prompt),
        "token_logprobs": [None] + [-float(i) for i in range(1, len(prompt))],
        "top_logprobs": [None] + [{c: -float(i)} for i, c in enumerate(prompt) if i],
        "text_offset": list(range(len(prompt))),
    }


class Stub:
    """A completions server that plays ``script`` (one step per request, then "ok" forever).

    A step is "ok" (the fake payload, choices in reverse order to test the index mapping),
    ("sleep", s) or (status, message, headers).
    """

    def __init__(self, script=()):
        self.script = list(script)
        self.bodies, self.times, self.auth = [], [], []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.bodies.append(body)
                stub.times.append(time.monotonic())
                stub.auth.append(self.headers.get("Authorization"))
                step = stub.script.pop(0) if stub.script else "ok"
                headers = {}
                if step == "ok":
                    status, payload = (
                        200,
                        {
                            "object": "text_completion",
                            "choices": [
                                {"index": i, "text": p, "logprobs": _fake_logprobs(p)}
                                for i, p in reversed(list(enumerate(body["prompt"])))
                            ],
                        },
                    )
                elif step[0] == "sleep":
                    time.sleep(step[1])
                    return
                else:
                    status, message, headers = step
                    payload = {"error": {"message": message, "type": "test"}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    @property
    def hits(self) -> int:
        return len(self.bodies)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    servers = []

    def make(script=()):
        servers.append(Stub(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.fixture(autouse=True)
def _no_key_in_env(monkeypatch):
    monkeypatch.delenv("MIA_RAY_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def _backend(url, **kw):
    kw.setdefault("backoff_s", 0.01)
    return OpenAICompletionsBackend(url, "fake-model", **kw)


REQ = LoglikRequest("ab", "cd")


def test_request_body_and_result(stub):
    s = stub()
    res = _backend(s.url).loglikelihood([REQ, LoglikRequest("x", "yz")])
    assert [(r.logprobs, r.tokens, r.greedy) for r in res] == [
        ([-2.0, -3.0], ["c", "d"], True),
        ([-1.0, -2.0], ["y", "z"], True),
    ]
    assert s.bodies == [
        {
            "model": "fake-model",
            "prompt": ["abcd", "xyz"],
            "max_tokens": 0,
            "echo": True,
            "logprobs": 1,
            "temperature": 0,
        }
    ]
    assert s.auth == [None]


def test_a_key_in_the_urls_user_info_is_sent_as_the_bearer_key(stub):
    s = stub()
    key = "sk-fromtheurl0123456789"
    b = _backend(s.url.replace("http://", f"http://user:{key}@"))
    assert b.base_url == s.url and key not in b.name  # the host parsed right, shown plain
    assert b.key_source == "base_url's user info"
    b.loglikelihood([REQ])
    assert s.auth == [f"Bearer {key}"]
    # an explicit key wins over the URL's
    _backend(s.url.replace("http://", "http://u:other@"), api_key="given").loglikelihood(
        [LoglikRequest("q", "r")]
    )
    assert s.auth[-1] == "Bearer given"


def test_two_500s_then_success_takes_three_requests(stub):
    s = stub([(500, "boom", {}), (503, "busy", {})])
    b = _backend(s.url)
    assert b.loglikelihood([REQ])[0].logprobs == [-2.0, -3.0]
    assert s.hits == 3
    assert b.requests_sent == 3


def test_429_waits_for_retry_after(stub):
    s = stub([(429, "slow down", {"Retry-After": "0.2"})])
    assert _backend(s.url, backoff_s=0).loglikelihood([REQ])[0].tokens == ["c", "d"]
    assert s.hits == 2
    assert s.times[1] - s.times[0] >= 0.2


def test_timeout_after_all_attempts(stub):
    s = stub([("sleep", 1.0)] * 3)
    b = _backend(s.url, timeout_s=0.3, max_retries=3)
    with pytest.raises(MiaError) as e:
        b.loglikelihood([REQ])
    assert str(e.value) == f"POST {s.url}/completions timed out after 3 attempts of 0.3 s"
    assert s.hits == 3


def test_5xx_until_the_last_attempt(stub):
    s = stub([(500, "boom", {})] * 2)
    with pytest.raises(MiaError) as e:
        _backend(s.url, max_retries=2).loglikelihood([REQ])
    assert str(e.value) == (
        f"POST {s.url}/completions failed after 2 attempts: the server answered 500: boom"
    )


def test_unreachable_server(stub):
    s = stub()
    url = s.url
    s.close()
    with pytest.raises(MiaError) as e:
        _backend(url, max_retries=2).loglikelihood([REQ])
    assert str(e.value).startswith(
        f"POST {url}/completions failed after 2 attempts: could not reach the server: "
    )


def test_400_is_not_retried(stub):
    s = stub([(400, "prompt is too long", {})])
    with pytest.raises(MiaError) as e:
        _backend(s.url).loglikelihood([REQ])
    assert str(e.value) == f"{s.url}/completions answered 400: prompt is too long"
    assert s.hits == 1


def test_401_names_the_key_source(stub, monkeypatch):
    s = stub([(401, "bad key", {})] * 2)
    with pytest.raises(MiaError) as e:
        _backend(s.url).loglikelihood([REQ])
    assert str(e.value) == (
        f"{s.url}/completions answered 401 (unauthorized): bad key; the API key is missing or "
        "wrong (no key was given: pass api_key or set $MIA_RAY_API_KEY or $OPENAI_API_KEY)"
    )
    monkeypatch.setenv("OPENAI_API_KEY", "k-openai")
    monkeypatch.setenv("MIA_RAY_API_KEY", "k-mia")
    with pytest.raises(MiaError) as e:
        _backend(s.url).loglikelihood([REQ])
    assert str(e.value).endswith("(the key came from $MIA_RAY_API_KEY)")
    assert s.auth == [None, "Bearer k-mia"]
    assert s.hits == 2
    _backend(s.url, api_key="k-arg").loglikelihood([REQ])
    assert s.auth[-1] == "Bearer k-arg"


def test_cache_sends_each_prompt_once(stub, tmp_path):
    s = stub()
    reqs = [LoglikRequest("ab", "cd"), LoglikRequest("x", "yz"), LoglikRequest("a", "bcd")]
    first = _backend(s.url, cache_dir=str(tmp_path), batch_size=2)
    want = first.loglikelihood(reqs)
    # "ab"+"cd" and "a"+"bcd" are one prompt: sent once, split two ways.
    assert [b["prompt"] for b in s.bodies] == [["abcd", "xyz"]]
    assert want[2].tokens == ["b", "c", "d"]
    assert first.loglikelihood(reqs) == want
    assert s.hits == 1
    assert (first.requests_sent, first.cache_hits) == (1, 3)
    first.close()

    again = _backend(s.url, cache_dir=str(tmp_path))
    assert again.loglikelihood(reqs) == want
    assert (s.hits, again.requests_sent, again.cache_hits) == (1, 0, 3)
    again.loglikelihood([LoglikRequest("ab", "ce"), reqs[0]])
    assert s.bodies[-1]["prompt"] == ["abce"]
    assert (s.hits, again.cache_hits) == (2, 4)
    # Another model behind the same URL is another cache entry.
    OpenAICompletionsBackend(s.url, "other-model", cache_dir=str(tmp_path)).loglikelihood([reqs[0]])
    assert s.hits == 3
    # Another URL is too, unless both name the same cache scope (a server that moved port).
    moved = s.url.replace("127.0.0.1", "localhost")
    _backend(moved, cache_dir=str(tmp_path)).loglikelihood([reqs[0]])
    assert s.hits == 4
    _backend(s.url, cache_dir=str(tmp_path), cache_scope="m").loglikelihood([reqs[0]])
    scoped = _backend(moved, cache_dir=str(tmp_path), cache_scope="m")
    assert scoped.loglikelihood([reqs[0]]) == [want[0]] and s.hits == 5
    assert scoped.cache_hits == 1


def test_a_failed_request_is_not_cached(stub, tmp_path):
    s = stub([(400, "nope", {})])
    b = _backend(s.url, cache_dir=str(tmp_path))
    with pytest.raises(MiaError):
        b.loglikelihood([REQ])
    assert b.loglikelihood([REQ])[0].logprobs == [-2.0, -3.0]
    assert s.hits == 2


def test_rate_limit(stub):
    s = stub()
    b = _backend(s.url, rate_limit_rps=10, batch_size=1)
    t0 = time.monotonic()
    b.loglikelihood([LoglikRequest("a", c) for c in "bcdef"])
    assert time.monotonic() - t0 >= 0.4
    assert s.hits == 5
    gaps = [t1 - t0 for t0, t1 in zip(s.times, s.times[1:], strict=False)]
    assert min(gaps) >= 0.09


def test_rate_limiter_is_shared_by_threads():
    limiter = RateLimiter(20)
    stamps = []
    lock = threading.Lock()

    def call():
        limiter.wait()
        with lock:
            stamps.append(time.monotonic())

    threads = [threading.Thread(target=call) for _ in range(6)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(stamps) - t0 >= 0.25 - 1e-3


def test_empty_context_needs_bos_text(stub):
    s = stub()
    with pytest.raises(MiaError) as e:
        _backend(s.url).loglikelihood([LoglikRequest("", "abc")])
    assert str(e.value) == (
        "the server gives no log-prob for a prompt's first token and the context is empty: "
        "give a context, or set bos_text (e.g. '<|endoftext|>')"
    )
    res = _backend(s.url, bos_text="^").loglikelihood([LoglikRequest("", "abc")])[0]
    assert (res.tokens, res.logprobs) == (["a", "b", "c"], [-1.0, -2.0, -3.0])
    assert s.bodies[-1]["prompt"] == ["^abc"]


def test_not_greedy_when_another_token_is_on_top(stub):
    s = stub()
    b = _backend(s.url)
    lp = _fake_logprobs("abcd")
    lp["top_logprobs"][3] = {"x": -0.5}
    assert b._result(REQ, lp, 2).greedy is False
    assert b._result(REQ, _fake_logprobs("abcd"), 2).greedy is True


def test_bad_settings():
    with pytest.raises(MiaError, match="max_retries counts attempts and must be at least 1"):
        OpenAICompletionsBackend("http://127.0.0.1:1/v1", "m", max_retries=0)
    with pytest.raises(MiaError, match="base_url must start with http:// or https://"):
        OpenAICompletionsBackend("127.0.0.1:1/v1", "m")
