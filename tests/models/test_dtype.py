"""model.dtype=auto: float32 on a CPU, bfloat16 on a GPU that has it, else float16."""

import pytest
import torch

from mia_ray.errors import MiaError
from mia_ray.models.hf import pick_dtype


def test_auto_is_float32_on_cpu_and_half_on_a_gpu(monkeypatch):
    assert pick_dtype("auto", "cpu") is torch.float32
    # No GPU here: the CUDA query is the one thing stood in for.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert pick_dtype("auto", "cuda") is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # a T4, a V100
    assert pick_dtype("auto", "cuda") is torch.float16
    assert pick_dtype("bfloat16", "cpu") is torch.bfloat16


def test_an_unknown_dtype_is_named():
    with pytest.raises(
        MiaError, match="model.dtype must be auto, float32, bfloat16 or float16, not 'fp8'"
    ):
        pick_dtype("fp8", "cpu")
