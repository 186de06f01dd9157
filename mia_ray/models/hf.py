"""Load causal LMs and tokenizers from a hub name, a local folder or a GGUF file.

Real users pass hub names; the demo world passes local folders. Either way this is the one
code path (``from_pretrained``), so what the tests exercise is what a cluster run does.
"""

from __future__ import annotations

import os
import re
import time
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
        if device != "cuda":
            return torch.float32  # CPUs without bf16 matmul units would emulate it, slower
        # Half precision on a GPU; float16 where it has no bfloat16 (before Ampere).
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            dtype
        ]
    except KeyError:
        raise MiaError(
            f"model.dtype must be auto, float32, bfloat16 or float16, not {dtype!r}"
        ) from None


# A hub repo id: "name" or "owner/name" of letters, digits, "-", "_", "." (huggingface_hub's rule).
_HUB_ID = re.compile(r"^(?![-.])[\w.-]{1,96}(?<![-.])(/(?![-.])[\w.-]{1,96}(?<![-.]))?$")
_TRUE = ("1", "true", "yes", "on")


def _hub_offline() -> str:
    """The variable that switches the hub off ("" when none does)."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return var
    return ""


def describe_load_failure(name: str, exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if Path(name).expanduser().exists():
        return f"model {name!r} does not load: {first[:300]}"
    if not _HUB_ID.match(name):
        return f"model {name!r} does not load: no such local folder, and it is not a hub name"
    # transformers says "couldn't connect" both when offline mode is on and when the network
    # is down; either way the name may be right and only the hub is out of reach.
    if "connect" in str(exc).lower() or "offline" in str(exc).lower():
        offline = _hub_offline()
        why = f"offline mode: {offline}={os.environ[offline]}" if offline else "no connection"
        return (
            f"model {name!r} is not a local folder and the Hugging Face hub cannot be reached "
            f"({why}), nor is the model in the local cache: pass the path of a local folder "
            "that holds it (config.json, weights, tokenizer files), e.g. one saved with "
            f"save_pretrained or fetched with `hf download {name} --local-dir DIR` where the "
            "hub is reachable"
        )
    return f"model {name!r} does not load: {first[:300]}"


# Any real vocabulary turns this into tokens; a folder without tokenizer files gives an empty
# one (transformers 5 then builds a tokenizer that encodes every text to nothing).
_PROBE_TEXT = "The quick brown fox jumps over the lazy dog."


def load_tokenizer(
    name_or_path: str, revision: str = "", trust_remote_code: bool = False, gguf_file: str = ""
):
    from transformers import AutoTokenizer

    from mia_ray.storage import localize

    name_or_path = localize(name_or_path)
    kwargs = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    except Exception as e:  # transformers raises OSError, ValueError, HFValidationError, ...
        raise MiaError(describe_load_failure(name_or_path, e)) from None
    if not tok(_PROBE_TEXT, add_special_tokens=False)["input_ids"]:
        raise MiaError(
            f"model {name_or_path!r} has no usable tokenizer (its vocabulary has {len(tok)} "
            "entries and encodes text to no tokens): add the tokenizer files (tokenizer.json, "
            "or vocab.json + merges.txt, with tokenizer_config.json) to the model folder"
        )
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
    """Return ``(model, tokenizer, device)`` with the model in eval mode on ``device``.

    ``name_or_path`` may also be a folder staged in storage (:func:`mia_ray.storage.localize`).
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from mia_ray.storage import localize

    name_or_path = localize(name_or_path)
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
        raise MiaError(describe_load_failure(name_or_path, e)) from None
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


# This process's torch threads: asked for, what Ray gave it, and the last look at the machine.
_THREADS: dict = {"wanted": 0, "given": 0, "now": 0, "seen": None}
THREADS_LOOK_S = 2.0  # how often fit_threads looks at the machine again


def set_torch_threads(n: int) -> None:
    """``n`` torch threads for this process (0: torch's own choice). Where ``n`` exceeds the
    CPUs Ray gave this worker, :func:`fit_threads` holds it to those CPUs while other work
    uses the machine."""
    import torch

    if n > 0:
        torch.set_num_threads(n)
        os.environ.setdefault("OMP_NUM_THREADS", str(n))
    _THREADS.update(wanted=n, given=ray_cpus() or n, now=n, seen=None)
    fit_threads()  # the first look: from here (a model's load) to its first batch


def ray_cpus() -> int:
    """The CPUs Ray gave this worker, rounded up (0 outside a Ray worker)."""
    try:
        import ray

        if not ray.is_initialized():
            return 0
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0)
    except Exception:  # noqa: BLE001 - no Ray, or no worker context: nothing was given
        return 0
    return max(1, -int(-cpus // 1)) if cpus else 0


def threads_for(wanted: int, given: int, others: float, cores: int) -> int:
    """Torch threads for an actor that asked for ``wanted`` and was given ``given`` CPUs while
    other work keeps ``others`` cores of ``cores`` busy: ``wanted`` while they fit beside it
    (half a core of slack for Ray's own processes), else ``given``. Measured on 2 cores
    (bench/threads_bench.py): 2 threads run 1.5-1.6x faster than 1 on an idle machine and
    0.24-0.67x as fast on a busy one."""
    return wanted if others <= cores - wanted + 0.5 else given


def fit_threads() -> int:
    """Before a model batch: where this process asked for more threads than its CPUs, look
    at the machine (at most every ``THREADS_LOOK_S``; Linux's /proc/stat) and set the threads
    :func:`threads_for` picks. Threads change no number (measured: 1, 2 and 4 threads give
    every Scorer column to the bit)."""
    t = _THREADS
    if t["wanted"] <= t["given"] or not os.path.exists("/proc/stat"):
        return t["now"]
    wall, own, busy = time.monotonic(), time.process_time(), _machine_busy_s()
    if t["seen"] is None:
        t["seen"] = (wall, own, busy)
        return t["now"]
    w0, o0, b0 = t["seen"]
    if wall - w0 < THREADS_LOOK_S:
        return t["now"]
    t["seen"] = (wall, own, busy)
    others = max(0.0, (busy - b0) - (own - o0)) / (wall - w0)
    n = threads_for(t["wanted"], t["given"], others, os.cpu_count() or 1)
    if n != t["now"]:
        import torch

        torch.set_num_threads(n)
        t["now"] = n
    return n


def _machine_busy_s() -> float:
    """Seconds of CPU time the whole machine has spent busy since boot."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def is_vision_language(
    name_or_path: str, revision: str = "", trust_remote_code: bool = False
) -> bool:
    """True for a model whose config pairs a vision encoder with a language model (LLaVA)."""
    from transformers import AutoConfig

    from mia_ray.storage import localize

    name_or_path = localize(name_or_path)
    kwargs = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    try:
        cfg = AutoConfig.from_pretrained(name_or_path, **kwargs)
    except Exception as e:
        raise MiaError(describe_load_failure(name_or_path, e)) from None
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
    from mia_ray.storage import localize

    name_or_path = localize(name_or_path)
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
        raise MiaError(describe_load_failure(name_or_path, e)) from None
    tok = processor.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    model.to(dev).eval()
    return model, processor, tok, dev
