"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Each writer fills a temp file in the target's folder, fsyncs it and ``os.replace``s it
over the target (a rename within one filesystem is atomic). A failed write removes its
temp file and leaves any previous version of the target untouched.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from mia_ray.redact import scrub

__all__ = ["read_json", "to_jsonable", "write_bytes", "write_json", "write_parquet", "write_text"]


def _atomic_write(path: str | os.PathLike, fill: Callable[[IO[bytes]], None]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    # os.open with 0o666 lets the umask decide the mode, like a plain open() would;
    # tempfile.mkstemp would leave every report readable by its owner only.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (parent folders are created)."""
    return _atomic_write(path, lambda f: f.write(data))


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` atomically, encoded as given; newlines are written as they are.
    Credentials are masked (:func:`mia_ray.redact.scrub`): reports, configs and markers are
    read by people the credentials are not for."""
    return write_bytes(path, scrub(text).encode(encoding))


def to_jsonable(obj: Any) -> Any:
    """A copy of ``obj`` that strict JSON can hold.

    NaN and ±inf become None (JSON has no such numbers); numpy scalars and arrays become
    Python numbers and lists; tuples and sets become lists; paths become strings; dates
    become ISO strings. Mapping keys become strings. Anything else is returned unchanged,
    so ``json`` reports it as not serializable.
    """
    # numpy first: np.float64 subclasses float, and should leave here as a plain float.
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {_json_key(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return [to_jsonable(v) for v in sorted(obj, key=repr)]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    return obj


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    value = to_jsonable(key)
    return value if isinstance(value, str) else json.dumps(value)


def write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    """Write ``obj`` as strict JSON (keys in insertion order, see :func:`to_jsonable`)."""
    text = json.dumps(to_jsonable(obj), indent=indent, ensure_ascii=False, allow_nan=False)
    return write_text(path, text + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_parquet(path: str | os.PathLike, table: Any) -> Path:
    """Write a pyarrow Table, a pandas DataFrame or a mapping of columns as one parquet file.

    A DataFrame's index is dropped: every row carries its ids as columns.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(table, pa.Table):
        tbl = table
    elif isinstance(table, Mapping):
        tbl = pa.table(dict(table))
    elif hasattr(table, "to_parquet") and hasattr(table, "columns"):  # pandas, without importing it
        tbl = pa.Table.from_pandas(table, preserve_index=False)
    else:
        raise TypeError(
            f"write_parquet takes a pyarrow Table, a pandas DataFrame or a mapping of columns, "
            f"not {type(table).__name__}"
        )
    return _atomic_write(path, lambda f: pq.write_table(tbl, f))
