"""`mia-ray serve --engine vllm`: the command hands over to vLLM's own OpenAI server, and the
API backend reads the same numbers from it as the HF backend computes (vLLM tier)."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from mia_ray.backends import LoglikRequest, SampleRequest
from mia_ray.backends.openai_api import OpenAICompletionsBackend
from mia_ray.errors import MiaError

pytestmark = pytest.mark.vllm

TOLERANCE = 3e-5  # as test_vllm.py: 10 times the largest per-token difference measured

REQUESTS = [
    LoglikRequest("The k", "ing said unto them"),
    LoglikRequest("To be or no", "t to be"),
    LoglikRequest("Answer:", " 0"),
    LoglikRequest("To be, or not to be, that is the question:", " whether 'tis nobler"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_vllm(tiny, tmp_path_factory):
    port, key = _free_port(), "test-key-123"
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    env = {**os.environ, "MIA_RAY_API_KEY": key}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mia_ray", "serve", "--model", tiny, "--engine", "vllm",
             "--port", str(port), "--served-model-name", "tiny"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"vLLM's server did not come up:\n{log.read_text()[-3000:]}")
                time.sleep(1)
        yield url, key, log, proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_api_backend_reads_hf_s_numbers_from_vllm_s_server(served_vllm, local):
    url, key, log, _ = served_vllm
    assert "handing" in log.read_text() and key not in log.read_text()
    api = OpenAICompletionsBackend(url, "tiny", api_key=key)
    got, want = api.loglikelihood(REQUESTS), local.loglikelihood(REQUESTS)
    for g, w in zip(got, want, strict=True):
        assert g.tokens == w.tokens
        assert g.greedy == w.greedy
        np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=0, atol=TOLERANCE)
    # Samples by seed: the same texts again, other texts for another seed.
    ask = [SampleRequest("The king said", 3, 8, seed=11)]
    once, again = api.sample(ask, 1.0, 50), api.sample(ask, 1.0, 50)
    assert once == again and len(once[0]) == 3
    assert api.sample([SampleRequest("The king said", 3, 8, seed=12)], 1.0, 50) != once


def test_the_server_refuses_a_request_without_the_key(served_vllm):
    url, _, _, _ = served_vllm
    api = OpenAICompletionsBackend(url, "tiny", api_key="wrong", max_retries=1)
    with pytest.raises(MiaError, match="401"):
        api.loglikelihood(REQUESTS[:1])
