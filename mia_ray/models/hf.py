"""Load causal LMs and tokenizers from a hub name, a local folder or a GGUF file.

Real users pass hub names; the demo world passes local folders. Either way this is the one
code path (``from_pretrained``), so what the tests exercise is what a cluster run does.
"""

from __future__ import annotations

import os
from pathlib import Path

from mia_ray.errors import MiaError


def pick_device(device: str = "auto") -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise MiaError("model.device is cuda but no GPU is visible to this worker")
    return device


def pick_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            dtype
        ]
    except KeyError:
        raise MiaError(
            f"model.dtype must be auto, float32, bfloat16 or float16, not {dtype!r}"
        ) from None


def _describe_load_failure(name: str, exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not Path(name).exists() and ("/" not in name or name.startswith((".", "/", "~"))):
        return f"model {name!r} does not load: no such local folder, and it is not a hub name"
    return f"model {name!r} does not load: {first[:300]}"


def load_tokenizer(
    name_or_path: str, revision: str = "", trust_remote_code: bool = False, gguf_file: str = ""
):
    from transformers import AutoTokenizer

    kwargs = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    except Exception as e:  # transformers raises OSError, ValueError, HFValidationError, ...
        raise MiaError(_describe_load_failure(name_or_path, e)) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    return tok


def load_causal_lm(
    name_or_path: str,
    device: str = "auto",
    dtype: str = "auto",
    revision: str = "",
    trust_remote_code: bool = False,
    gguf_file: str = "",
):
    """Return ``(model, tokenizer, device)`` with the model in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per actor per model is noise in the job log
    dev = pick_device(device)
    kwargs = {"trust_remote_code": trust_remote_code, "dtype": pick_dtype(dtype, dev)}
    if revision:
        kwargs["revision"] = revision
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    tok = load_tokenizer(name_or_path, revision, trust_remote_code, gguf_file)
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    except Exception as e:
        raise MiaError(_describe_load_failure(name_or_path, e)) from None
    model.to(dev).eval()
    return model, tok, dev


def left_pad(seqs: list[list[int]], pad: int, device="cpu"):
    """``(ids, attention_mask, position_ids)``, each (n, width), for token-id lists padded on
    the left. Positions count real tokens only, so a padded row sees what it would alone."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids.to(device), mask.to(device), pos.to(device)


def set_torch_threads(n: int) -> None:
    import torch

    if n > 0:
        torch.set_num_threads(n)
        os.environ.setdefault("OMP_NUM_THREADS", str(n))


def is_vision_language(
    name_or_path: str, revision: str = "", trust_remote_code: bool = False
) -> bool:
    """True for a model whose config pairs a vision encoder with a language model (LLaVA)."""
    from transformers import AutoConfig

    kwargs = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    try:
        cfg = AutoConfig.from_pretrained(name_or_path, **kwargs)
    except Exception as e:
        raise MiaError(_describe_load_failure(name_or_path, e)) from None
    return getattr(cfg, "vision_config", None) is not None


def load_activation_model(
    name_or_path: str,
    device: str = "auto",
    dtype: str = "auto",
    revision: str = "",
    trust_remote_code: bool = False,
):
    """``(model, processor or None, tokenizer, device)`` for reading hidden states.

    A vision-language model loads with ``AutoModelForImageTextToText`` and its
    ``AutoProcessor``; any other model as a causal LM (:func:`load_causal_lm`).
    """
    if not is_vision_language(name_or_path, revision, trust_remote_code):
        model, tok, dev = load_causal_lm(name_or_path, device, dtype, revision, trust_remote_code)
        return model, None, tok, dev
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    dev = pick_device(device)
    kwargs = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
        model = AutoModelForImageTextToText.from_pretrained(
            name_or_path, dtype=pick_dtype(dtype, dev), **kwargs
        )
    except Exception as e:
        raise MiaError(_describe_load_failure(name_or_path, e)) from None
    tok = processor.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    model.to(dev).eval()
    return model, processor, tok, dev
