"""Storage every node reaches: where artifacts that cross a process or node boundary live.

A run has two places:

- ``--out`` (``Workspace.local``): a folder on the driver's machine. The pipelines read and
  write their working files there with plain paths, as on a laptop, and the final report
  files land there.
- ``resources.storage`` (``Workspace.storage``): a URI every node reaches, a local path (one
  node, or a shared mount such as NFS/EFS) or an object store (``s3://bucket/prefix``,
  ``gs://...``) through ``pyarrow.fs``, the way Ray Train and Tune take ``storage_path``.
  Unset, it is ``--out`` itself, which is right on one machine and on a cluster whose nodes
  all mount ``--out``; :func:`check_visible` stops a multi-node run whose storage some node
  cannot see.

The layer's contract, which every pipeline follows:

- remote code (tasks, actors, Tune trials) never receives a path of the driver's disk: it
  gets :meth:`Workspace.url` of a relative name and reads or writes it through
  :class:`Storage` (:func:`open_storage` on the node), or small values through Ray's object
  store;
- the driver keeps ``--out`` as a mirror of storage: :meth:`Workspace.push` after a
  checkpoint (a part file, a finished stage), :meth:`Workspace.pull` of what remote code
  wrote, and at start-up a pull of everything, so a new driver on another machine with the
  same storage resumes the run;
- inputs that exist only on the driver (a local model folder, a LoRA adapter) are staged
  once into storage by content hash (:meth:`Workspace.stage`), and :func:`localize` on a
  node turns the staged URL into a local folder, cached per node by that hash.

When storage is ``--out`` and Ray runs on this machine only, every call here is a no-op and
paths pass through unchanged. Credentials for object stores come from the environment
(``AWS_*``, the instance role, ``GOOGLE_APPLICATION_CREDENTIALS``); a URI's own user info
or query is never written to reports or logs (:func:`mia_ray.redact.redact`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from mia_ray.errors import MiaError
from mia_ray.keys import listing_sha256, tree_sha256
from mia_ray.log import log as _log
from mia_ray.redact import redact

COMPLETE = ".complete.json"  # written last into a staged folder: the folder is whole
_PROBE_DIR = ".mia-ray-probe"


def is_uri(s: str) -> bool:
    """An object-store (or other non-local) URI: ``scheme://...``, ``file://`` excepted."""
    return "://" in str(s) and not str(s).startswith("file://")


class Storage:
    """A folder of a ``pyarrow.fs`` filesystem: relative names in, bytes and folders out."""

    def __init__(self, uri: str):
        from pyarrow import fs

        self.uri = str(uri).rstrip("/") or "/"
        if is_uri(self.uri):
            try:
                _, root = fs.FileSystem.from_uri(self.uri)
                self.fs = _filesystem(_authority(self.uri))
            except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...
                raise MiaError(
                    f"resources.storage {redact(self.uri)} cannot be opened: "
                    f"{str(e).splitlines()[0][:200]}"
                ) from None
            self.root = root.rstrip("/")
            self.local = False
        else:
            path = self.uri[len("file://") :] if self.uri.startswith("file://") else self.uri
            self.fs = fs.LocalFileSystem()
            self.root = str(Path(path).expanduser().resolve())
            self.local = True

    def __repr__(self) -> str:
        return f"Storage({redact(self.uri)!r})"

    def path(self, rel: str = "") -> str:
        """The filesystem path of ``rel`` (for pyarrow calls)."""
        rel = str(rel).strip("/")
        return f"{self.root}/{rel}" if rel else self.root

    def url(self, rel: str = "") -> str:
        """A URI of ``rel`` that :func:`open_storage` opens on any node."""
        if self.local:
            return self.path(rel)
        base = self.uri.split("?", 1)
        rel = str(rel).strip("/")
        joined = f"{base[0]}/{rel}" if rel else base[0]
        return joined + (f"?{base[1]}" if len(base) > 1 else "")

    # -- files

    def _info(self, rel: str):
        return self.fs.get_file_info(self.path(rel))

    def exists(self, rel: str) -> bool:
        from pyarrow import fs

        return self._info(rel).type != fs.FileType.NotFound

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as f:
            return f.read()

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write ``rel`` whole: a local file through a temp file and a rename, an object
        in one PUT (an object store never shows half an object)."""
        target = self.path(rel)
        parent = target.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        if self.local:
            tmp = f"{parent}/.{target.rsplit('/', 1)[1]}.{uuid.uuid4().hex[:8]}.tmp"
            with self.fs.open_output_stream(tmp) as f:
                f.write(data)
            os.replace(tmp, target)
        else:
            with self.fs.open_output_stream(target) as f:
                f.write(data)

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_bytes(rel))

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    def files(self, rel: str = "") -> dict[str, int]:
        """Every file under ``rel`` (recursive): relative name (to ``rel``) -> size."""
        from pyarrow import fs

        base = self.path(rel)
        if self._info(rel).type != fs.FileType.Directory:
            return {}
        sel = fs.FileSelector(base, recursive=True, allow_not_found=True)
        out = {}
        for info in self.fs.get_file_info(sel):
            if info.type == fs.FileType.File:
                out[info.path[len(base) :].lstrip("/")] = info.size
        return out

    def delete(self, rel: str) -> None:
        from pyarrow import fs

        info = self._info(rel)
        if info.type == fs.FileType.Directory:
            self.fs.delete_dir(self.path(rel))
        elif info.type == fs.FileType.File:
            self.fs.delete_file(self.path(rel))

    # -- folders

    def put_file(self, local: str | os.PathLike, rel: str) -> None:
        self.write_bytes(rel, Path(local).read_bytes())

    def get_file(self, rel: str, local: str | os.PathLike) -> None:
        dest = Path(local)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(self.read_bytes(rel))
        os.replace(tmp, dest)

    def put_dir(self, local: str | os.PathLike, rel: str, meta: dict | None = None) -> str:
        """Copy folder ``local`` to ``rel``, then write ``rel/.complete.json`` (``meta`` and
        the content's sha256), so a reader that finds the marker finds the whole folder;
        return the sha256."""
        src = Path(local)
        self.delete(f"{rel}/{COMPLETE}")
        entries = []
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            name = path.relative_to(src).as_posix()
            data = path.read_bytes()
            entries.append((name, hashlib.sha256(data).hexdigest()))
            self.write_bytes(f"{rel}/{name}", data)
        digest = listing_sha256(entries)
        self.write_json(f"{rel}/{COMPLETE}", {**(meta or {}), "content_sha256": digest})
        return digest

    def complete(self, rel: str) -> bool:
        return self.exists(f"{rel}/{COMPLETE}")

    def get_dir(self, rel: str, local: str | os.PathLike) -> Path:
        """Copy folder ``rel`` to ``local`` (replacing it), through a temp folder and a rename."""
        dest = Path(local)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
        for name in self.files(rel):
            self.get_file(f"{rel}/{name}", tmp / name)
        tmp.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        return dest


def _authority(uri: str) -> str:
    """``scheme://host?query`` of a URI: what decides its filesystem (bucket paths aside)."""
    plain, _, query = uri.partition("?")
    scheme, rest = plain.split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0]}" + (f"?{query}" if query else "")


# pyarrow's GCS client retries a request for 15 minutes, also one that no credentials can
# authorize: 10 s fails a bucket without credentials in ~25 s, as s3:// fails (~30 s); a
# URI's own ?retry_limit_seconds= wins.
GCS_RETRY_LIMIT_S = 10


def with_retry_limit(uri: str) -> str:
    """``uri`` with :data:`GCS_RETRY_LIMIT_S` as its retry limit when it is a GCS URI that
    sets none."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme not in ("gs", "gcs") or "retry_limit_seconds=" in uri:
        return uri
    return uri + ("&" if "?" in uri else "?") + f"retry_limit_seconds={GCS_RETRY_LIMIT_S}"


@lru_cache(maxsize=16)
def _filesystem(authority: str):
    """One filesystem (one S3 client, its connections) per process and authority."""
    from pyarrow import fs

    # "mock://" (pyarrow's in-memory filesystem, for tests) has no host: give it a root.
    uri = with_retry_limit(authority + "/" if authority.endswith("://") else authority)
    return fs.FileSystem.from_uri(uri)[0]


def filesystem_of(uri: str):
    """``(filesystem, path in it)`` of a URI: the process's one filesystem of its authority."""
    from pyarrow import fs

    _, path = fs.FileSystem.from_uri(uri)
    return _filesystem(_authority(uri)), path


@lru_cache(maxsize=32)
def open_storage(uri: str) -> Storage:
    """The :class:`Storage` of ``uri`` (one per process and URI)."""
    return Storage(uri)


def _node_cache() -> Path:
    home = Path(os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")).expanduser()
    return home / "node-cache"


def localize(name: str) -> str:
    """On any node: the URL of a folder put in storage (:meth:`Storage.put_dir`) -> a local
    folder holding it, copied once per node into ``$MIA_RAY_HOME/node-cache`` and keyed by
    the folder's content hash (from its marker), never by its URL; anything else (a hub
    name, a local path) unchanged."""
    if not is_uri(name):
        return name
    plain, _, query = name.partition("?")
    base, _, leaf = plain.rstrip("/").rpartition("/")
    store = open_storage(base + (f"?{query}" if query else ""))
    try:
        meta = store.read_json(f"{leaf}/{COMPLETE}")
    except (OSError, ValueError):
        raise MiaError(f"{redact(name)} is not a complete folder in storage") from None
    dest = _node_cache() / meta["content_sha256"][:32]
    if not (dest / COMPLETE).exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        store.get_dir(leaf, dest)
    return str(dest)


@dataclass
class Workspace:
    """This run's ``--out`` (driver) and storage (every node); see the module docstring."""

    local: Path
    storage_uri: str = ""
    distributed: bool = False
    driver_node: str = ""
    # Names this run in its manifest and its stages' markers (mia_ray.stages).
    run_id: str = field(
        default_factory=lambda: time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    )
    _pushed: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.local = Path(self.local)
        self.storage_uri = self.storage_uri or str(self.local)

    @property
    def storage(self) -> Storage:
        return open_storage(self.storage_uri)

    @property
    def mirrored(self) -> bool:
        """Whether storage is a place of its own (else it is ``--out``: nothing to copy)."""
        s = self.storage
        return not (s.local and Path(s.root) == self.local.resolve())

    def url(self, rel: str | os.PathLike = "") -> str:
        """Where remote code finds ``rel`` (a name relative to ``--out``)."""
        return self.storage.url(self._rel(rel))

    def _rel(self, rel: str | os.PathLike) -> str:
        p = Path(rel)
        if p.is_absolute():
            try:
                return p.resolve().relative_to(self.local.resolve()).as_posix()
            except ValueError:
                raise MiaError(f"{p} is not inside the run folder {self.local}") from None
        return "" if str(rel) in ("", ".") else p.as_posix()

    def push(self, rel: str | os.PathLike = "") -> int:
        """Copy what changed under ``rel`` (a file or folder of ``--out``) to storage;
        return the number of files copied."""
        if not self.mirrored:
            return 0
        rel = self._rel(rel)
        root = self.local / rel

        # Markers after every file, inner folders' before outer ones': a push cut short (a
        # node lost) must not leave a marker in storage whose folder is not all there.
        def order(p: Path):
            marker = p.name == COMPLETE
            return (marker, -len(p.parts) if marker else 0, p)

        paths = (
            [root]
            if root.is_file()
            else sorted((p for p in root.rglob("*") if p.is_file()), key=order)
        )
        n = 0
        for path in paths:
            name = path.relative_to(self.local).as_posix()
            if _skipped(name):
                continue
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            if self._pushed.get(name) == stamp:
                continue
            self.storage.put_file(path, name)
            self._pushed[name] = stamp
            n += 1
        return n

    def pull(self, rel: str | os.PathLike = "", outputs: bool = True) -> int:
        """Copy the files under ``rel`` (a file or folder) in storage that ``--out`` lacks,
        or holds at another size; return how many. ``outputs=False`` leaves out the files
        at the top of ``--out`` (a past run's outputs: a new run resumes from its stages'
        folders, never from another run's outputs)."""
        if not self.mirrored:
            return 0
        rel = self._rel(rel).strip("/")
        store = self.storage
        inside = store.files(rel)
        if inside:
            names = {(f"{rel}/{n}" if rel else n): size for n, size in inside.items()}
        elif rel and store.exists(rel):
            names = {rel: store._info(rel).size}
        else:
            names = {}
        n = 0
        for name, size in names.items():
            dest = self.local / name
            if not outputs and "/" not in name:
                continue
            if _skipped(name) or (dest.exists() and dest.stat().st_size == size):
                continue
            store.get_file(name, dest)
            st = dest.stat()
            self._pushed[name] = (st.st_size, st.st_mtime_ns)
            n += 1
        return n

    def stage(self, path: str) -> str:
        """What remote code should load for ``path``: a local folder of the driver (a model,
        an adapter) becomes a copy in storage, put once per content under
        ``inputs/<sha256>``; hub names, URIs, files and anything on a one-machine run pass
        through unchanged."""
        if not path or not self.distributed or is_uri(path):
            return path
        local = Path(path).expanduser()
        if not local.is_dir():
            return path  # a hub name (or a typo the loader reports)
        rel = f"inputs/{tree_sha256(local)[:32]}"
        store = self.storage
        if not store.complete(rel):
            t0 = time.time()
            store.put_dir(local, rel, {"source": local.name})
            _log(f"staged {local} in storage ({time.time() - t0:.1f} s)")
        return store.url(rel)

    def node_affinity(self) -> dict[str, Any]:
        """Ray options that pin a task to the driver's node when the run is distributed (for
        work that reads the driver's own files); empty otherwise."""
        if not (self.distributed and self.driver_node):
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(self.driver_node, soft=False)}


# The driver's alone: a run's report files, its log and the run it set aside. Storage holds
# work to resume, never a report that a new run's folder could mistake for its own.
RUN_LOCK = ".mia-ray.lock"  # held by a run in its --out (cli.py); never pushed
DRIVER_ONLY = (
    "report.json",
    "report.html",
    "config.yaml",
    "error.log",
    "previous",
    RUN_LOCK,
)


# Storage's alone: what workers write for storage to keep (the leakage scanners' parts,
# ``scan/<shard>/findings/`` and ``documents/``, as large as a fifth of the corpus). A driver
# resuming a run never copies them; what needs them reads them from storage.
STORAGE_ONLY = ("findings", "documents")


def _skipped(name: str) -> bool:
    parts = name.split("/")
    scanned = len(parts) >= 4 and parts[-4] == "scan" and parts[-2] in STORAGE_ONLY
    return parts[0] in DRIVER_ONLY or name.endswith(".tmp") or scanned


_CURRENT: Workspace | None = None


def current() -> Workspace | None:
    """The workspace of the run this driver process is running (None outside a run)."""
    return _CURRENT


def set_current(ws: Workspace | None) -> None:
    global _CURRENT
    _CURRENT = ws


def push(rel: str | os.PathLike = "") -> None:
    """:meth:`Workspace.push` of the current run (nothing outside a run)."""
    if _CURRENT is not None:
        _CURRENT.push(rel)


def stage(path: str) -> str:
    """:meth:`Workspace.stage` of the current run (``path`` unchanged outside a run)."""
    return _CURRENT.stage(path) if _CURRENT is not None else path


def node_affinity() -> dict[str, Any]:
    return _CURRENT.node_affinity() if _CURRENT is not None else {}


def workspace_of(out: Path) -> Workspace:
    """The workspace whose ``local`` holds ``out``: the CLI's run, or a sweep cell's own;
    outside a run (a test calling ``run`` directly), ``out`` itself on this machine, where
    every storage call below is a plain path."""
    ws = current()
    if ws is not None and inside(out, ws.local) is not None:
        return ws
    return Workspace(Path(out))


def inside(path: str | os.PathLike, folder: Path) -> str | None:
    """``path`` relative to ``folder`` (posix), or None when it is not inside it."""
    try:
        return Path(path).expanduser().resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return None


def for_remote(path: str) -> str:
    """What remote code (an actor, a task) loads for a model or adapter folder ``path`` of
    this process: on one machine the path itself; on a distributed run, for a folder of the
    run that remote code put into storage (a fine-tune's output, complete), its URL there,
    and for anything else what :func:`stage` makes of it (a content-hashed copy)."""
    ws = current()
    if ws is None or not ws.distributed or not path:
        return path
    rel = inside(path, ws.local)
    if rel and Path(path).is_dir() and ws.storage.complete(rel):
        return ws.url(rel)
    return ws.stage(path)


def open_workspace(out: Path, storage_uri: str, mode: str) -> Workspace:
    """The run's workspace once Ray is up: decide whether the run is distributed, check that
    storage is visible from every node, and pull what storage holds that ``--out`` lacks."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    # A cluster we attached to may still grow (an autoscaler adds GPU workers on demand):
    # there, storage set explicitly also means that inputs are staged.
    distributed = len(nodes) > 1 or (mode != "local" and bool(storage_uri))
    ws = Workspace(
        Path(out),
        storage_uri,
        distributed=distributed,
        driver_node=ray.get_runtime_context().get_node_id(),
    )
    if distributed:
        check_visible(ws, nodes, explicit=bool(storage_uri))
    if ws.mirrored:
        n = ws.pull(outputs=False)
        if n:
            _log(f"resumed {n} files from storage {redact(ws.storage_uri)}")
    return ws


def check_visible(ws: Workspace, nodes: list[dict], explicit: bool) -> None:
    """Stop unless every alive node sees storage: a token written here must be readable from
    a task pinned to each node (and, for an object store, the node's credentials work)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    store = ws.storage
    token = f"{_PROBE_DIR}/{uuid.uuid4().hex}"
    try:
        store.write_bytes(token, b"mia-ray")
    except Exception as e:  # noqa: BLE001 - a wrong bucket, credentials, a read-only mount
        raise MiaError(
            f"resources.storage {redact(ws.storage_uri)} cannot be written from the driver: "
            f"{str(e).splitlines()[0][:200]}"
        ) from None
    probe = ray.remote(num_cpus=0, max_retries=0)(_sees)
    refs = {
        n["NodeID"]: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(ws.storage_uri, token)
        for n in nodes
    }
    try:
        seen = dict(zip(refs, ray.get(list(refs.values()), timeout=120), strict=True))
    finally:
        try:
            store.delete(token)
        except Exception:  # noqa: BLE001 - a leftover token costs nothing
            pass
    blind = [nid for nid, ok in seen.items() if ok is not True]
    if not blind:
        return
    hosts = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in nodes}
    which = ", ".join(f"{hosts[n]} ({n[:8]})" for n in blind[:3])
    what = (
        f"resources.storage {redact(ws.storage_uri)}"
        if explicit
        else f"resources.storage is not set, so artifacts go to --out {ws.local}, which"
    )
    why = seen[blind[0]]
    detail = f" ({why})" if isinstance(why, str) and why else ""
    raise MiaError(
        f"this Ray cluster has {len(nodes)} nodes and {what} is not visible from "
        f"{len(blind)} of them: {which}{detail}; set resources.storage to a URI every node "
        "reaches: s3://bucket/prefix or gs://bucket/prefix, or a folder every node mounts "
        "(NFS/EFS)"
    )


def _sees(uri: str, token: str):
    """In a task on one node: True if storage ``uri`` holds ``token``, else why not."""
    try:
        return open_storage(uri).exists(token) or ""
    except Exception as e:  # noqa: BLE001
        return str(e).splitlines()[0][:200]
