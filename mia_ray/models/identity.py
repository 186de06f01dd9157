"""What a model *is*, for cache keys: its weights by content, not the path they sit at.

A cache keyed on ``name_or_path`` reuses stale rows after a user retrains a model into the
same folder. :func:`model_key` hashes a local folder's files (or a single file) by content;
the hash of a file is remembered under ``$MIA_RAY_HOME/file-hashes`` keyed by its path, size,
mtime and inode, so a folder is read in full once and then only when a file changes. A hub
name is identified by its name and revision, and by the commit the local Hugging Face cache
resolved that revision to when it holds one. The load options that change the numbers
(dtype, device, GGUF file) are part of the key. No torch import here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

_CHUNK = 1 << 22


def _hash_cache_dir() -> Path:
    home = Path(os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")).expanduser()
    return home / "file-hashes"


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, remembered while its size, mtime and inode stay the same."""
    p = Path(path).resolve()
    st = p.stat()
    stamp = f"{p}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    memo = _hash_cache_dir() / (hashlib.sha1(stamp.encode()).hexdigest() + ".sha256")
    try:
        cached = memo.read_text().strip()
        if len(cached) == 64:
            return cached
    except OSError:
        pass
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(digest)
        os.replace(tmp, memo)
    except OSError:
        pass  # a read-only home only costs a re-hash next time
    return digest


def tree_sha256(path: str | os.PathLike) -> str:
    """Content hash of a file, or of every file under a folder (names and bytes; hidden
    files and folders such as ``.cache`` are left out)."""
    from mia_ray.data.readers import visible_files

    root = Path(path).expanduser()
    if root.is_file():
        return file_sha256(root)
    entries = [(rel, file_sha256(full)) for rel, full in visible_files(root)]
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


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


def model_identity(
    name_or_path: str,
    revision: str = "",
    gguf_file: str = "",
    dtype: str = "auto",
    device: str = "auto",
    **options: Any,
) -> dict[str, Any]:
    """A JSON-able description of everything about a model that decides its scores:
    ``content`` (a local folder's or file's sha256) or ``hub`` + ``revision`` + ``commit``,
    the GGUF file, dtype, device, and any further ``options`` (e.g. an accelerator count
    that turns ``dtype: auto`` into bfloat16)."""
    ident: dict[str, Any] = {"gguf_file": gguf_file, "dtype": dtype, "device": device}
    if not name_or_path:
        ident["model"] = ""
    elif Path(name_or_path).expanduser().exists():
        ident["content"] = tree_sha256(name_or_path)
    else:
        ident["hub"] = name_or_path
        ident["revision"] = revision
        ident["commit"] = _hub_commit(name_or_path, revision)
    ident.update(options)
    return ident


def model_key(name_or_path: str, *args: Any, **kwargs: Any) -> str:
    """A short hex key of :func:`model_identity` (same arguments): equal keys, equal numbers."""
    ident = model_identity(name_or_path, *args, **kwargs)
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_cfg_key(model_cfg, name: str | None = None, **options: Any) -> str:
    """:func:`model_key` of a job's ``model`` section; ``name`` picks another model of it (the
    reference) that shares its dtype and device but not its revision or GGUF file."""
    own = name is None or name == model_cfg.name_or_path
    return model_key(
        model_cfg.name_or_path if name is None else name,
        model_cfg.revision if own else "",
        model_cfg.gguf_file if own else "",
        model_cfg.dtype,
        model_cfg.device,
        **options,
    )
