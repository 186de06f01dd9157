"""What a model *is*, for cache keys: its weights by content, not the path they sit at.

A cache keyed on ``name_or_path`` reuses stale rows after a user retrains a model into the
same folder. :func:`model_key` hashes a local folder's files (or a single file) by content;
the hash of a file is remembered under ``$MIA_RAY_HOME/file-hashes`` keyed by its path, size,
mtime and inode, so a folder is read in full once and then only when a file changes. A hub
name is identified by its name and revision, and by the commit the local Hugging Face cache
resolved that revision to when it holds one. The load options that change the numbers
(dtype and device as they resolve where the model runs, GGUF file) are part of the key:
:func:`model_key` is the one key every pipeline uses. No torch import here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mia_ray.keys import file_sha256, fingerprint, tree_sha256

__all__ = [
    "file_sha256", "tree_sha256", "weights_identity", "resolved_precision", "model_key",
]  # fmt: skip


def _hub_commit(name: str, revision: str) -> str:
    """The commit the local HF cache resolved ``revision`` to, or "" when it holds none."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:  # pragma: no cover - transformers always brings huggingface_hub
        return ""
    ref = revision or "main"
    if len(ref) == 40 and all(c in "0123456789abcdef" for c in ref):
        return ref
    refs = Path(HF_HUB_CACHE) / ("models--" + name.replace("/", "--")) / "refs" / ref
    try:
        return refs.read_text().strip()
    except OSError:
        return ""


def weights_identity(name_or_path: str, revision: str = "", gguf_file: str = "") -> dict[str, Any]:
    """What a model's weights are: ``content`` (a local folder's or file's sha256), or ``hub``
    + ``revision`` + ``commit`` (the commit the local HF cache resolved it to, when known);
    and the GGUF file the weights load from."""
    ident: dict[str, Any] = {"gguf_file": gguf_file}
    if not name_or_path:
        ident["model"] = ""
    elif Path(name_or_path).expanduser().exists():
        ident["content"] = tree_sha256(name_or_path)
    else:
        ident["hub"] = name_or_path
        ident["revision"] = revision
        ident["commit"] = _hub_commit(name_or_path, revision)
    return ident


def resolved_precision(dtype: str, device: str, accelerator: bool) -> dict[str, str]:
    """The device and dtype a model loads with (``models.hf.pick_device``/``pick_dtype``),
    known before it loads: ``device: auto`` is cuda where the code that loads it has an
    accelerator (a Ray actor sees a GPU only when it asked for one), else cpu; ``dtype: auto``
    is float32 on a CPU and half precision on a GPU (bfloat16, or float16 on a GPU without
    it: the driver cannot tell which, so both are "half" here)."""
    dev = device if device != "auto" else ("cuda" if accelerator else "cpu")
    if dtype != "auto":
        return {"device": dev, "dtype": dtype}
    return {"device": dev, "dtype": "half" if dev == "cuda" else "float32"}


def model_key(model_cfg: Any, accelerator: bool, name: str | None = None, **options: Any) -> str:
    """The one cache key of a model's numbers: its weights by content
    (:func:`weights_identity`), the device and dtype it resolves to where it runs
    (:func:`resolved_precision`; ``accelerator``: whether that code has a GPU), and
    ``options`` that change its numbers. ``model_cfg`` is any section with ``dtype`` and
    ``device`` (and ``name_or_path``, ``revision``, ``gguf_file`` where it has them);
    ``name`` picks another model of it (the reference, a fine-tune) that shares its dtype
    and device but not its revision or GGUF file. Equal keys, equal numbers."""
    own_name = getattr(model_cfg, "name_or_path", "")
    own = name is None or name == own_name
    ident = weights_identity(
        own_name if name is None else name,
        getattr(model_cfg, "revision", "") if own else "",
        getattr(model_cfg, "gguf_file", "") if own else "",
    )
    ident.update(resolved_precision(model_cfg.dtype, model_cfg.device, bool(accelerator)))
    ident.update(options)
    return fingerprint(ident)
