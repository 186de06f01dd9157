"""SmolLM2-135M-Instruct: GGUF -> HF conversion, and the fine-tuned target of the test world (slow)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.extra]


@pytest.fixture(scope="module")
def smollm2_home(tmp_path_factory):
    """MIA_RAY_HOME for these tests: the caller's (a warm conversion cache) or a temp dir."""
    home = os.environ.get("MIA_RAY_HOME") or str(tmp_path_factory.mktemp("mia-ray-home"))
    with mock.patch.dict(os.environ, {"MIA_RAY_HOME": home}):
        yield Path(home)


@pytest.fixture(scope="module")
def smollm2_base(smollm2_home):
    from mia_ray.demo.world import ensure_smollm2_base

    return ensure_smollm2_base()


def _mean_logprob(model, tok, texts: list[str]) -> np.ndarray:
    import torch

    out = []
    with torch.no_grad():
        for text in texts:
            x = torch.tensor([tok(text)["input_ids"][:256]])
            logp = torch.log_softmax(model(input_ids=x).logits[0, :-1], dim=-1)
            out.append(logp.gather(1, x[0, 1:, None]).mean().item())
    return np.asarray(out)


def test_gguf_converts_to_a_plain_hf_folder(smollm2_base):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_base / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert list(smollm2_base.glob("*.safetensors")) and not list(smollm2_base.glob("*.gguf"))
    tok = AutoTokenizer.from_pretrained(smollm2_base)
    model = AutoModelForCausalLM.from_pretrained(smollm2_base).eval()
    x = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        logits = model(**x).logits
        out = model.generate(**x, max_new_tokens=8, do_sample=False)
    assert torch.isfinite(logits).all()
    continuation = tok.decode(out[0, x["input_ids"].shape[1] :], skip_special_tokens=True)
    assert continuation.strip(), continuation
    assert "Paris" in continuation  # a dequantisation slip would garble this


def test_conversion_is_cached(smollm2_base):
    from mia_ray.demo.world import ensure_smollm2_base

    stamp = (smollm2_base / "model.safetensors").stat().st_mtime_ns
    assert ensure_smollm2_base() == smollm2_base
    assert (smollm2_base / "model.safetensors").stat().st_mtime_ns == stamp


def test_finetuned_target_learned_its_members(test_world, smollm2_base):
    from mia_ray.config import WorldConfig
    from mia_ray.demo.world import ensure_world
    from mia_ray.models.hf import load_causal_lm

    world = ensure_world(
        WorldConfig(root=test_world["root"], scale="test", target="smollm2"), num_cpus=2
    )
    assert world["reference"] == str(smollm2_base)
    manifest = json.loads(Path(world["manifest"]).read_text())
    rows = {json.loads(line)["id"]: json.loads(line)["text"] for line in open(world["documents"])}
    ids = sorted(manifest)
    y = np.array([manifest[i] for i in ids])
    assert 0 < y.sum() < len(y) and set(ids) <= set(rows)
    tuned, tok, _ = load_causal_lm(world["model"], device="cpu", dtype="float32")
    base, _, _ = load_causal_lm(world["reference"], device="cpu", dtype="float32")
    texts = [rows[i] for i in ids]
    gain = _mean_logprob(tuned, tok, texts) - _mean_logprob(base, tok, texts)
    # Fine-tuning raised the members' log-likelihood more than the non-members'.
    assert gain[y == 1].mean() > gain[y == 0].mean() + 0.05, (
        gain[y == 1].mean(),
        gain[y == 0].mean(),
    )
    meta = json.loads(Path(world["world_json"]).read_text())
    assert meta["steps"]["smollm2"]["steps"] > 0 and meta["steps"]["smollm2"]["elapsed_s"] > 0
    # smollm2-control: the same recipe on reference-pool text; it did not train on members.
    control = meta["steps"]["smollm2-control"]
    assert control["spec"] == meta["steps"]["smollm2"]["spec"] and control["seed"] == 4
    assert control["documents"] == meta["steps"]["smollm2"]["documents"]
    from mia_ray.demo.world import control_texts

    pool = {json.loads(x)["text"] for x in open(world["reference_pool"])}
    assert set(control_texts(Path(world["root"]), control["documents"])) <= pool
    other, _, _ = load_causal_lm(
        str(Path(world["root"]) / "models" / "smollm2-control"), device="cpu", dtype="float32"
    )
    gain = _mean_logprob(other, tok, texts) - _mean_logprob(base, tok, texts)
    assert abs(gain[y == 1].mean() - gain[y == 0].mean()) < 0.05
