"""Where documents come from and in which format: a local path, a folder every node mounts, or
object storage (``s3://``, ``gs://``, any ``pyarrow.fs`` URI, globs included), listed once on the
driver through ``pyarrow.fs`` and read by Ray Data's tasks wherever they run.

Formats: ``text`` (a folder of text files, one file = one document), ``jsonl`` (``.jsonl``,
``.json``, ``.ndjson``), ``parquet`` and ``warc`` (``.warc``, ``.wet``: a WARC file's
``conversion`` records, as Common Crawl's WET files hold them). A compression suffix
(``.gz``, ``.zst``, ``.bz2``, ``.lz4``) is decompressed on the fly by the reading task, so
``x.jsonl.zst`` is jsonl and ``CC-MAIN-....warc.wet.gz`` is warc.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mia_ray.data import formats
from mia_ray.errors import MiaError
from mia_ray.keys import listing_sha256, tree_sha256, visible_files

COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".lz4": "lz4"}
_GLOB = set("*?[")


def compression_of(name: str) -> str | None:
    """The codec a file's suffix names (``gzip``, ``zstd``, ...), or None."""
    return COMPRESSION.get(Path(name).suffix.lower())


def format_of(name: str) -> str:
    """The format a file's name says (its compression suffix aside), or ""."""
    p = Path(name)
    if p.suffix.lower() in COMPRESSION:
        p = Path(p.stem)
    return formats.by_suffix(p.suffix)


def is_marker(rel: str) -> bool:
    # Writers leave markers such as _SUCCESS or _metadata next to Parquet/JSONL shards.
    return Path(rel).name.startswith("_")


@dataclass(frozen=True)
class Source:
    """The files of one data path: ``files`` are ``(name relative to base, size)``;
    ``filesystem`` reads ``base/name``. ``remote``: object storage, which every node reads."""

    path: str
    fmt: str
    base: str
    files: tuple[tuple[str, int], ...]
    filesystem: Any
    remote: bool

    @property
    def rels(self) -> list[str]:
        return [rel for rel, _ in self.files]

    @property
    def paths(self) -> list[str]:
        return [f"{self.base}/{rel}" if self.base else rel for rel in self.rels]

    def one(self, rel: str) -> Source:
        """The source of one of its files."""
        size = dict(self.files)[rel]
        # Named as a user would name it: the file's path, or the glob and the file in a bucket.
        path = f"{self.path} ({rel})" if self.remote else f"{self.base}/{rel}"
        return Source(path, self.fmt, self.base, ((rel, size),), self.filesystem, self.remote)

    def open(self, rel: str):
        """A stream of a file's bytes, decompressed as its suffix says."""
        full = f"{self.base}/{rel}" if self.base else rel
        return self.filesystem.open_input_stream(full, compression=compression_of(rel))

    def identity(self) -> str:
        """A key of the files' contents: their bytes on a local disk; in object storage, each
        file's name, size and modification time (reading a bucket to hash it would cost a
        whole pass)."""
        if not self.remote:
            root = Path(self.base)
            return listing_sha256((rel, tree_sha256(root / rel)) for rel in self.rels)
        from pyarrow import fs

        infos = self.filesystem.get_file_info(self.paths)
        return listing_sha256(
            (rel, f"{i.size}:{i.mtime_ns if i.type == fs.FileType.File else ''}")
            for rel, i in zip(self.rels, infos, strict=True)
        )


def resolve_source(path: str | os.PathLike, format: str = "auto") -> Source:
    """List the files of a data path and choose their format (see the module docstring).

    - a file: its format from its suffix (or ``format``);
    - a folder (or a bucket prefix): every file under it, hidden ones left out; ``auto`` picks
      jsonl, parquet or warc when every data file has that suffix, text when none has;
    - a glob (``s3://bucket/crawl/*.warc.wet.gz``, ``data/*.jsonl``): the files it matches.

    Raises ``MiaError`` for a missing path or bucket, storage that refuses the credentials,
    an empty folder or glob, a format it cannot tell, and a folder that mixes formats."""
    if format not in formats.names():
        raise MiaError(f"data format must be one of {', '.join(formats.names())}, not {format!r}")
    from mia_ray.storage import is_uri

    text = str(path)
    if is_uri(text):
        return _choose(text, format, *_list_remote(text), remote=True)
    return _choose(text, format, *_list_local(text), remote=False)


def shard_sources(paths: list[str]) -> list[tuple[str, Source]]:
    """``(shard name, source)`` for each shard a list of paths names: a glob gives one shard
    per file it matches, a file or a folder one shard. A shard's name is its file or
    folder name, unique across the list."""
    out: list[tuple[str, Source]] = []
    for path in paths:
        if _GLOB & set(str(path).split("?", 1)[0]):
            # Each file a shard of its own format: a glob may match .jsonl.zst and WET files.
            listing = resolve_source(path, formats.TEXT)
            for rel in listing.rels:
                if is_marker(rel):
                    continue
                fmt = format_of(rel)
                if not fmt:
                    raise MiaError(
                        f"cannot tell the format of {rel} (matched by {listing.path}) from its "
                        f"suffix: narrow the glob to {formats.suffix_list()} files (optionally "
                        ".gz or .zst)"
                    )
                out.append((Path(rel).name, replace(listing.one(rel), fmt=fmt)))
        else:
            src = resolve_source(path)
            out.append((Path(str(path).split("?", 1)[0].rstrip("/")).name, src))
    names = [name for name, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise MiaError(
            f"crawl.shards: two shards have the same file name ({dup[0]}); findings name "
            "shards by it"
        )
    return out


def _list_local(text: str) -> tuple[str, list[tuple[str, int]], Any, bool]:
    from pyarrow import fs

    if text.startswith("file://"):
        text = text[len("file://") :]
    root = Path(text).expanduser()
    local = fs.LocalFileSystem()
    if not root.exists() and _GLOB & set(str(root)):
        base, pattern = _split_glob(str(root))
        files = [(rel, full.stat().st_size) for rel, full in visible_files(Path(base))]
        return str(Path(base).resolve()), _matching(files, pattern, text), local, False
    if not root.exists():
        raise MiaError(f"data path not found: {text}")
    root = root.resolve()
    if root.is_file():
        return str(root.parent), [(root.name, root.stat().st_size)], local, True
    files = [(rel, full.stat().st_size) for rel, full in visible_files(root)]
    if not files:
        raise MiaError(f"data directory {root} has no files (hidden files are skipped)")
    return str(root), files, local, False


def _list_remote(uri: str) -> tuple[str, list[tuple[str, int]], Any, bool]:
    from pyarrow import fs

    from mia_ray.storage import filesystem_of, redact

    plain, _, query = uri.partition("?")
    scheme, rest = plain.split("://", 1)
    globbed = bool(_GLOB & set(rest))
    base_uri, pattern = _split_glob(plain) if globbed else (plain.rstrip("/"), "")
    try:
        filesystem, base = filesystem_of(base_uri + (f"?{query}" if query else ""))
        info = filesystem.get_file_info(base)
        if info.type == fs.FileType.File and not globbed:
            parent, _, name = base.rpartition("/")
            return parent, [(name, info.size)], filesystem, True
        if info.type == fs.FileType.NotFound:
            raise FileNotFoundError(base)
        listing = filesystem.get_file_info(fs.FileSelector(base, recursive=True))
    except MiaError:
        raise
    except FileNotFoundError:
        raise MiaError(f"data path not found: {redact(uri)}") from None
    except Exception as e:  # noqa: BLE001 - pyarrow's OSError/ArrowInvalid for bucket or auth
        raise MiaError(_remote_failure(redact(uri), e)) from None
    files = []
    for i in listing:
        if i.type != fs.FileType.File:
            continue
        rel = i.path[len(base) :].lstrip("/")
        if not any(part.startswith(".") for part in rel.split("/")):
            files.append((rel, i.size))
    files.sort()
    if globbed:
        return base, _matching(files, pattern, redact(uri)), filesystem, False
    if not files:
        raise MiaError(f"data path {redact(uri)} has no files")
    return base, files, filesystem, False


def _remote_failure(uri: str, e: BaseException) -> str:
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    low = first.lower()
    if "bucket" in low and ("not found" in low or "nosuchbucket" in low or "does not exist" in low):
        return f"data path not found: {uri} (no such bucket: {first})"
    if any(w in low for w in ("credential", "access denied", "access_denied", "forbidden",
                              "signature", "invalidaccesskeyid", "403", "oauth2",
                              "authenticat")):  # fmt: skip
        return (
            f"cannot read {uri}: the storage refused this machine's credentials ({first}); "
            "for S3 set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE, for GCS "
            "GOOGLE_APPLICATION_CREDENTIALS, on every node"
        )
    return f"cannot read {uri}: {first}"


def _split_glob(text: str) -> tuple[str, str]:
    """``prefix/with/no/glob``, ``the/rest`` of a path or URI with a glob in it."""
    parts = text.split("/")
    i = next(k for k, part in enumerate(parts) if _GLOB & set(part))
    return "/".join(parts[:i]), "/".join(parts[i:])


def _matching(files: list[tuple[str, int]], pattern: str, shown: str) -> list[tuple[str, int]]:
    """Files whose relative name matches ``pattern`` (``*`` within one folder; ``**`` any)."""
    depth = pattern.count("/")
    chosen = [
        (rel, size)
        for rel, size in files
        if fnmatch.fnmatchcase(rel, pattern) and ("**" in pattern or rel.count("/") == depth)
    ]
    if not chosen:
        raise MiaError(f"no files match {shown}")
    return chosen


# Ray Data's path handling parses paths as URLs, and URL parsing drops these characters
# (WHATWG; Python's urlsplit): "doc\t3.txt" would be looked for as "doc3.txt".
_DROPPED = {"\t": "a tab", "\r": "a carriage return", "\n": "a newline"}


def _choose(
    text: str, format: str, base: str, files: list[tuple[str, int]], filesystem, single: bool,
    remote: bool,
) -> Source:  # fmt: skip
    for rel, _ in files:
        bad = next((name for c, name in _DROPPED.items() if c in rel), "")
        if bad:
            raise MiaError(
                f"file name {rel!r} (in {text}) holds {bad}, which Ray Data's path handling "
                "drops, so the file could not be found: rename it"
            )
    if single:
        fmt = format
        if fmt == "auto":
            fmt = format_of(files[0][0])
            if not fmt:
                raise MiaError(
                    f"cannot tell the format of {text} from its suffix: give a folder of text "
                    f"files, a {formats.suffix_list()} file (optionally .gz or .zst), or set "
                    "data.format"
                )
        return Source(text, fmt, base, tuple(files), filesystem, remote)
    if format == formats.TEXT:
        return Source(text, formats.TEXT, base, tuple(files), filesystem, remote)
    data = [(rel, size) for rel, size in files if not is_marker(rel)]
    if format != "auto":
        chosen = [(rel, size) for rel, size in data if format_of(rel) == format]
        if not chosen:
            raise MiaError(f"data directory {text} has no {format} files")
        return Source(text, format, base, tuple(chosen), filesystem, remote)
    kinds = {format_of(rel) for rel, _ in data} - {formats.TEXT, ""}
    if not kinds:
        return Source(text, formats.TEXT, base, tuple(files), filesystem, remote)
    fmt = sorted(kinds)[0]
    others = [rel for rel, _ in data if format_of(rel) != fmt]
    if others:
        raise MiaError(
            f"data directory {text} mixes {fmt} files with other files ({others[0]}): "
            "set data.format to say how to read it"
        )
    return Source(text, fmt, base, tuple(data), filesystem, remote)


def read_placement(source: Source, log=None) -> dict[str, Any]:
    """Ray options for the tasks that read ``source``: none (any node) for object storage, on
    one machine, or for a folder every node sees (a shared mount); else pinned to the
    driver's node, whose disk alone has the files (and ``log`` says so)."""
    from mia_ray import storage

    ws = storage.current()
    if source.remote or ws is None or not ws.node_affinity():
        return {}
    size = sum(s for _, s in source.files)
    if seen_by_every_node(source.paths, size):
        return {}
    if log is not None:
        log(
            f"on the driver's disk alone: {source.path}; its read tasks run on the driver's "
            "node (put it on a folder every node mounts, or in object storage, to read it on "
            "every node)"
        )
    return {"ray_remote_args": ws.node_affinity()}


def seen_by_every_node(paths: list[str], size: int) -> bool:
    """Whether every alive node of the cluster has these files with this total size (a task
    pinned to each node looks)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_total_size)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(
            paths
        )
        for n in nodes
    ]
    try:
        return all(got == size for got in ray.get(refs, timeout=120))
    except Exception:  # noqa: BLE001 - a node that cannot answer cannot be counted on
        return False


def _total_size(paths: list[str]) -> int:
    try:
        return sum(os.stat(p).st_size for p in paths)
    except OSError:
        return -1
