"""Prompting backends: one interface (:class:`Backend`), a local HF model and an OpenAI-style API.

Importing this package does not import torch: the local backend loads it when built.
"""

from mia_ray.backends.base import (
    Backend,
    LoglikRequest,
    LoglikResult,
    SampleRequest,
    choice_logprobs,
)

__all__ = [
    "Backend",
    "LoglikRequest",
    "LoglikResult",
    "LocalHFBackend",
    "OpenAICompletionsBackend",
    "SampleRequest",
    "choice_logprobs",
    "from_spec",
]


def from_spec(spec: dict) -> Backend:
    """A backend from a plain dict (``BackendConfig`` fields plus ``model``, ``torch_threads``
    and ``cache_dir``; ``max_length``, ``seed`` where the caller has them): ``kind: local``
    loads ``model`` here with transformers, ``kind: vllm`` in vLLM's engine, ``kind: openai``
    sends it as the API's model name to ``base_url``."""
    if spec["kind"] == "openai":
        from mia_ray.backends.openai_api import OpenAICompletionsBackend

        return OpenAICompletionsBackend(
            spec["base_url"], spec["model"], timeout_s=spec["timeout_s"],
            max_retries=spec["max_retries"], rate_limit_rps=spec["rate_limit_rps"],
            batch_size=spec["batch_size"], cache_dir=spec.get("cache_dir", ""),
            bos_text=spec.get("bos_text", ""), cache_scope=spec.get("cache_scope", ""),
        )  # fmt: skip
    if spec["kind"] == "vllm":
        from mia_ray.backends.vllm_engine import VLLMBackend

        return VLLMBackend(
            spec["model"], dtype=spec.get("dtype", "auto"), max_length=spec.get("max_length", 0),
            seed=spec.get("seed", 0), torch_threads=spec.get("torch_threads", 0),
            kv_cache_gib=spec.get("kv_cache_gib", 1.0),
        )  # fmt: skip
    from mia_ray.backends.local import LocalHFBackend

    return LocalHFBackend(
        spec["model"], device=spec.get("device", "auto"), dtype=spec.get("dtype", "auto"),
        batch_size=spec["batch_size"], torch_threads=spec.get("torch_threads", 0),
    )  # fmt: skip


def __getattr__(name: str):
    # The two backends load on first use, so `import mia_ray.backends` stays cheap.
    if name == "LocalHFBackend":
        from mia_ray.backends.local import LocalHFBackend

        return LocalHFBackend
    if name == "OpenAICompletionsBackend":
        from mia_ray.backends.openai_api import OpenAICompletionsBackend

        return OpenAICompletionsBackend
    raise AttributeError(name)
