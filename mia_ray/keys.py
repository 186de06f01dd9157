"""Content keys, written once: what a cached artifact's key is made of.

- :func:`fingerprint` of JSON-able parts (options, other keys): the key of a stage's output;
- :func:`file_sha256` of a file's bytes, remembered under ``$MIA_RAY_HOME/file-hashes`` by
  its path, size, mtime and inode, so a large file is read once until it changes;
- :func:`listing_sha256` of ``[(name, sha256), ...]``: a folder's content key, the same for
  :func:`tree_sha256` of a local folder and for a folder put in storage
  (:meth:`mia_ray.storage.Storage.put_dir`).

No torch, Ray or pandas import here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_CHUNK = 1 << 22


def fingerprint(*parts: Any) -> str:
    """A 16-hex key of JSON-able ``parts`` (dict keys sorted; other objects by ``str``)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


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


def listing_sha256(entries: Iterable[tuple[str, str]]) -> str:
    """The content key of a folder from its ``(relative name, file sha256)`` entries, in order."""
    return hashlib.sha256(json.dumps([list(e) for e in entries]).encode()).hexdigest()


def visible_files(root: Path) -> Iterator[tuple[str, Path]]:
    """Every regular file under ``root`` in a stable order, hidden files and folders left
    out; yields ``(relative posix path, full path)``. A subfolder that is a symlink is
    followed (a corpus assembled from links is common); one that leads back to a folder
    already walked is not, so a link loop ends."""
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if not name.startswith(".") and full.is_file():
                yield full.relative_to(root).as_posix(), full


def tree_sha256(path: str | os.PathLike) -> str:
    """Content key of a file (its sha256), or of every file under a folder (names and bytes;
    hidden files and folders such as ``.cache`` are left out)."""
    root = Path(path).expanduser()
    if root.is_file():
        return file_sha256(root)
    return listing_sha256((rel, file_sha256(full)) for rel, full in visible_files(root))
