"""Prompting backends: one interface (:class:`Backend`), a local HF model and an OpenAI-style API.

Importing this package does not import torch: the local backend loads it when built.
"""

from mia_ray.backends.base import Backend, LoglikRequest, LoglikResult, choice_logprobs

__all__ = [
    "Backend",
    "LoglikRequest",
    "LoglikResult",
    "LocalHFBackend",
    "OpenAICompletionsBackend",
    "choice_logprobs",
]


def __getattr__(name: str):
    # The two backends load on first use, so `import mia_ray.backends` stays cheap.
    if name == "LocalHFBackend":
        from mia_ray.backends.local import LocalHFBackend

        return LocalHFBackend
    if name == "OpenAICompletionsBackend":
        from mia_ray.backends.openai_api import OpenAICompletionsBackend

        return OpenAICompletionsBackend
    raise AttributeError(name)
