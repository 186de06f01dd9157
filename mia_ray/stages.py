"""The stage layer: every cached artifact of a run is keyed, stored, reused and recorded here.

A *stage* is one named output of a run, a folder under the run's folder (``--out``, or the
folder of a sub-run such as an audit method or a sweep cell):

- ``name``: the folder, relative to that run folder (``rows/target``, ``extraction/manual``);
- ``key``: what determines its output (:func:`mia_ray.keys.fingerprint` of the inputs by
  content, the model by :func:`mia_ray.models.identity.model_key`, the options);
- ``kind``: ``json`` (a value), ``frame`` (a table), ``folder`` (files the computation
  writes, e.g. an adapter) or ``parts`` (model rows written part by part as they arrive).

Resolving a stage (:func:`json_stage`, :func:`frame_stage`, :func:`folder_stage`,
:func:`parts_stage`): pull the folder from the run's storage (a new driver resumes from
it); reuse it when its marker (``.complete.json``, written last) holds the same key; else
clear it, compute into it, write the marker, push the folder to storage, and record the
stage in the run's ``manifest.json``. A ``parts`` stage keeps the rows of every part whose
marker holds the same key, so an interrupted pass resumes where it stopped; its parts are
written as they arrive. Code on other nodes (Tune trials, tasks) that writes a stage into
storage itself uses :func:`done` and :func:`commit`, the same marker.

Resume, caching and multi-node staging come from this one place; no pipeline writes a
marker file of its own.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia_ray import storage
from mia_ray.keys import fingerprint
from mia_ray.log import log
from mia_ray.reports.io import read_json, write_json

if TYPE_CHECKING:
    import pandas as pd

MARKER = storage.COMPLETE  # one marker for a stage and for a folder staged into storage
MANIFEST = "manifest.json"
KINDS = ("json", "frame", "folder", "parts")
PART_ROWS = 64  # a part is written when this many rows have arrived: what an interrupt loses
BLOCK_ROWS = 64  # rows per input block: results (and progress) arrive at least this often


def _where(path: Path) -> tuple[storage.Workspace | None, str | None]:
    """The current run's workspace and ``path`` relative to its ``--out`` (None outside)."""
    ws = storage.current()
    if ws is None:
        return None, None
    try:
        return ws, path.resolve().relative_to(ws.local.resolve()).as_posix()
    except ValueError:
        return None, None


def marker(path: Path) -> dict | None:
    """A stage folder's marker, or None."""
    try:
        return read_json(path / MARKER)
    except (OSError, ValueError):
        return None


def recorded(out: Path, name: str, key: str, kind: str, reused: bool) -> None:
    """Record in the run's manifest a stage resolved by hand (:func:`done`, :func:`commit`)."""
    _record(*_where(Path(out) / name), key, kind, reused)


def stage_seconds(path: Path) -> float | None:
    """A parts stage's wall seconds, summed over the runs that added its rows (None when it
    holds no count: a stage of an earlier version)."""
    got = marker(Path(path))
    return got.get("seconds") if got else None


def stage_key(path: Path) -> str:
    """The key a stage folder was computed for ("" when it holds no marker)."""
    got = marker(Path(path))
    return got.get("key", "") if got else ""


def _record(ws: storage.Workspace | None, rel: str | None, key: str, kind: str, reused: bool):
    if ws is None or rel is None:
        return
    path = ws.local / MANIFEST
    manifest = _read_or_empty(path)
    if manifest.get("run") != ws.run_id:
        manifest = {"run": ws.run_id, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    manifest.setdefault("stages", {})[rel] = {"key": key, "kind": kind, "reused": reused}
    write_json(path, manifest)


def _read_or_empty(path: Path) -> dict:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return {}


def _open(out: Path, name: str, key: str, kind: str, keep_same_key: bool = False):
    """Pull the stage; return ``(path, ws, rel, marker)`` with the marker of a reusable
    stage, or None after clearing what another key left (``keep_same_key``: keep a folder
    whose marker holds this key, complete or not: a ``parts`` stage resumes it)."""
    if kind not in KINDS:
        raise ValueError(f"stage kind must be one of {KINDS}, not {kind!r}")
    path = Path(out) / name
    ws, rel = _where(path)
    if ws is not None and rel:
        ws.pull(rel)
    got = marker(path)
    same = got is not None and got.get("key") == key and got.get("kind") == kind
    if same and (holds(got, key) or keep_same_key):
        return path, ws, rel, got
    if path.exists():
        if got is not None:
            log(f"{name.rsplit('/', 1)[-1]}: inputs changed since the last run; computing afresh")
        shutil.rmtree(path)
    if ws is not None and rel and ws.mirrored:
        ws.storage.delete(rel)
    return path, ws, rel, None


def _close(path: Path, ws, rel, name: str, key: str, kind: str, meta: dict | None) -> dict:
    info = record(name, key, kind, meta, ws.run_id if ws is not None else "")
    write_json(path / MARKER, info)  # last: a folder with this marker is whole
    if ws is not None and rel:
        ws.push(rel)
    _record(ws, rel, key, kind, reused=False)
    return info


def json_stage(out: Path, name: str, key: str, compute: Callable[[], Any], reused: str = "") -> Any:
    """The JSON value ``compute()`` gives for ``key``, computed once (``reused``: a log line
    for when it is not computed)."""
    got = reuse_json(out, name, key, reused)
    if got is not None:
        return got
    return save_json(out, name, key, compute())


def reuse_json(out: Path, name: str, key: str, reused: str = "") -> Any | None:
    """The value of json stage ``name`` when it holds ``key``, else None (and the stage is
    cleared for :func:`save_json`): for values that arrive out of order (Ray tasks)."""
    path, ws, rel, got = _open(out, name, key, "json")
    if got is None:
        return None
    _record(ws, rel, key, "json", reused=True)
    if reused:
        log(reused)
    return read_json(path / "value.json")


def save_json(out: Path, name: str, key: str, value: Any) -> Any:
    """Write json stage ``name`` (``value`` for ``key``); return ``value``."""
    path = Path(out) / name
    ws, rel = _where(path)
    write_json(path / "value.json", value)
    _close(path, ws, rel, name, key, "json", None)
    return value


def frame_stage(
    out: Path, name: str, key: str, compute: Callable[[], pd.DataFrame], reused: str = ""
):
    """The table ``compute()`` gives for ``key``, computed once (parquet)."""
    got = reuse_frame(out, name, key, reused)
    return got if got is not None else save_frame(out, name, key, compute())


def reuse_frame(out: Path, name: str, key: str, reused: str = ""):
    """:func:`reuse_json` for a table."""
    import pandas as pd

    path, ws, rel, got = _open(out, name, key, "frame")
    if got is None:
        return None
    _record(ws, rel, key, "frame", reused=True)
    if reused:
        log(reused)
    return pd.read_parquet(path / "frame.parquet")


def save_frame(out: Path, name: str, key: str, frame):
    """:func:`save_json` for a table; returns it as read back (parquet keeps it exactly)."""
    import pandas as pd

    from mia_ray.reports.io import write_parquet

    path = Path(out) / name
    ws, rel = _where(path)
    write_parquet(path / "frame.parquet", frame)
    _close(path, ws, rel, name, key, "frame", None)
    return pd.read_parquet(path / "frame.parquet")


def folder_stage(
    out: Path, name: str, key: str, compute: Callable[[Path], dict | None], reused: str = ""
) -> tuple[Path, dict]:
    """The folder ``compute(folder)`` fills for ``key`` (an adapter, a model's answers),
    computed once; returns the folder and its marker (with the dict ``compute`` returned in
    it). ``reused``: a log line for when it is not computed."""
    path, ws, rel, got = _open(out, name, key, "folder")
    if got is not None:
        _record(ws, rel, key, "folder", reused=True)
        if reused:
            log(reused)
        return path, got
    path.mkdir(parents=True, exist_ok=True)
    meta = compute(path)
    return path, _close(path, ws, rel, name, key, "folder", meta)


def remote_folder_stage(
    out: Path, name: str, key: str, launch: Callable[[str, str, dict], Any], reused: str = ""
) -> tuple[Path, dict]:
    """A folder stage that remote code computes (a task or trial on any node):
    ``launch(storage_url, rel, marker)`` must write the folder ``rel`` into the storage at
    ``storage_url`` and finish it with ``marker`` (``Storage.put_dir(..., meta=marker)`` or
    :func:`commit`). Reused when storage holds the key; the driver pulls the folder into
    ``out/name``. Returns the folder and its marker."""
    path = Path(out) / name
    ws = storage.workspace_of(Path(out))  # the run's, or out's own outside a run
    rel = storage.inside(path, ws.local)
    got = done(ws.storage, rel, key)
    if got is None:
        if ws.storage.exists(rel):
            ws.storage.delete(rel)  # another key's folder, or half of one
        launch(ws.url(), rel, record(rel, key, "folder", run=ws.run_id))
        got = done(ws.storage, rel, key)
        if got is None:
            raise RuntimeError(f"stage {rel}: the remote computation left no marker for its key")
        reused = ""
    if path.exists() and not holds(marker(path), key):
        shutil.rmtree(path)  # a local copy of another key's folder
    ws.pull(rel)
    _record(*_where(path), key, "folder", reused=bool(reused))
    if reused:
        log(reused)
    return path, got


def record(name: str, key: str, kind: str, meta: dict | None = None, run: str = "") -> dict:
    """A finished stage's marker: what it is, the key it holds, and ``meta`` (its record)."""
    return {"stage": name, "key": key, "kind": kind, "run": run, "complete": True, **(meta or {})}


def holds(got: dict | None, key: str) -> bool:
    """Whether marker ``got`` is a finished stage's for ``key``."""
    return got is not None and got.get("key") == key and bool(got.get("complete"))


def done(store: storage.Storage, rel: str, key: str) -> dict | None:
    """On any node: the marker of stage ``rel`` in storage ``store`` when it holds ``key``."""
    try:
        got = store.read_json(f"{rel}/{MARKER}" if rel else MARKER)
    except (OSError, ValueError):
        return None
    return got if holds(got, key) else None


def commit(store: storage.Storage, rel: str, key: str, kind: str, meta: dict | None = None):
    """On any node, after writing stage ``rel`` into storage ``store``: its marker, last."""
    info = record(rel, key, kind, meta)
    store.write_json(f"{rel}/{MARKER}" if rel else MARKER, info)
    return info


def done_at(path: Path, key: str) -> dict | None:
    """On any node: the marker of the stage folder ``path`` (on this node's disk) when it
    holds ``key``; the local twin of :func:`done`."""
    got = marker(Path(path))
    return got if holds(got, key) else None


def commit_at(path: Path, info: dict) -> dict:
    """On any node, after writing a stage folder ``path`` on this node's disk: its marker
    ``info`` (a :func:`record`), last and atomically; the local twin of :func:`commit`."""
    write_json(Path(path) / MARKER, info)
    return info


def commit_record(store: storage.Storage, rel: str, info: dict) -> dict:
    """:func:`commit` of a marker built already (a :func:`record` with the stage's own name)."""
    store.write_json(f"{rel}/{MARKER}" if rel else MARKER, info)
    return info


def rows_key(rows) -> str:
    """``rows`` (pandas) by content: every column, whatever the rows' order."""
    import pandas as pd

    cols = sorted(rows.columns)
    try:
        hashed = pd.util.hash_pandas_object(rows[cols], index=False)
    except TypeError:  # a column of lists or arrays
        hashed = pd.util.hash_pandas_object(rows[cols].astype(str), index=False)
    return fingerprint(cols, str(hashed.sum()), len(rows))


def parts_key(rows, batch_size: int, inputs: Any) -> str:
    """The key of a parts stage, derived from what decides its results: ``rows`` by content
    (:func:`rows_key`), the model batch size (it sets each batch's mates and padding, so
    float32's last bits) and ``inputs``, everything else the mapper is given that changes
    its numbers (the model by ``model_key``, options). Equal keys, equal rows."""
    return fingerprint(rows_key(rows), batch_size, inputs)


def parts_stage(
    out: Path,
    name: str,
    rows,
    mapper: Callable[[Any], Any],
    batch_size: int,
    *,
    inputs: Any,
    load: bool = True,
    what: str = "",
    block_rows: int = BLOCK_ROWS,
):
    """Stream ``rows`` (pandas, with a unique ``snippet_id`` and a ``text``) in model batches
    of ``batch_size`` (:func:`model_blocks`) through ``mapper(ds) -> ds`` and write the
    results in parts to ``out/name`` as they arrive; return all rows (pandas), or with
    ``load=False`` the part files (for results larger than memory). The mapper's actors take
    each block whole (``batch_size=None``) and run ``in_model_batches``. ``inputs``: what
    besides the rows decides the results; the stage's key is :func:`parts_key`. Results and
    progress arrive a block (~``block_rows`` rows) at a time: a slow pass (seconds per row)
    takes smaller blocks so that its user sees it move.

    A rerun with the same key skips every model batch whose rows are all in a part, so an
    interrupted run resumes where it stopped; another key starts afresh. The batches are
    drawn from all the rows before any is skipped, so a resumed row has the batch mates
    (and numbers, to the last bit) it has in a run that was never interrupted."""
    import pandas as pd

    from mia_ray.actors import BATCH
    from mia_ray.reports.io import write_parquet

    key = parts_key(rows, batch_size, inputs)
    what = what or name.rsplit("/", 1)[-1]
    path, ws, rel, got = _open(out, name, key, "parts", keep_same_key=True)
    # The pass's wall seconds over every run that added rows (a resume adds its own).
    before = float((got or {}).get("seconds", 0.0))

    def pending(seconds: float) -> None:
        write_json(path / MARKER, {"stage": name, "key": key, "kind": "parts", "complete": False,
                                   "seconds": round(seconds, 2)})  # fmt: skip
        if ws is not None and rel:
            ws.push(f"{rel}/{MARKER}")

    if got is None:
        path.mkdir(parents=True, exist_ok=True)
        pending(0.0)
    parts = sorted(path.glob("part-*.parquet"))
    done_ids: set[str] = set()
    for part in parts:
        done_ids.update(pd.read_parquet(part, columns=["snippet_id"])["snippet_id"])
    total = len(rows)
    if done_ids:
        log(f"{what}: reusing {len(done_ids)} of {total} rows")
    todo = draw_batches(rows, batch_size)
    if done_ids:  # whole batches again where any row is missing, so its mates stay its own
        missing = todo.loc[~todo["snippet_id"].isin(done_ids), BATCH].unique()
        todo = todo[todo[BATCH].isin(missing)]
    n_new, buffer = 0, []
    t0, last = time.time(), 0.0

    def flush() -> None:
        if buffer:
            part = path / f"part-{len(parts):05d}.parquet"
            write_parquet(part, pd.concat(buffer, ignore_index=True))
            if ws is not None and rel:
                ws.push(f"{rel}/{part.name}")  # a checkpoint: a new driver resumes from it
            parts.append(part)
            buffer.clear()
            pending(before + time.time() - t0)

    if len(todo):
        try:
            ds = model_blocks(todo, batch_size, block_rows, drawn=True)
            for batch in mapper(ds).iter_batches(batch_format="pandas", batch_size=None):
                if done_ids:
                    batch = batch[~batch["snippet_id"].isin(done_ids)]
                buffer.append(batch.drop(columns=BATCH, errors="ignore"))
                n_new += len(batch)
                if sum(len(b) for b in buffer) >= PART_ROWS:
                    flush()
                if time.time() - last > 10:
                    last = time.time()
                    rate = n_new / max(last - t0, 1e-9)
                    left = (len(todo) - n_new) / max(rate, 1e-9)
                    eta = f"{left:.0f} s" if left < 120 else f"{left / 60:.0f} min"
                    log(f"{what}: {len(done_ids) + n_new}/{total} rows ({rate:.1f}/s, "
                        f"about {eta} left)")  # fmt: skip
        finally:
            flush()  # rows that arrived are kept, interrupted or not
        took = time.time() - t0
        log(
            f"{what}: {len(done_ids) + n_new}/{total} rows in {took:.0f} s "
            f"({n_new / max(took, 1e-9):.1f}/s)"
        )
    if got is not None and got.get("complete") and not n_new:
        _record(ws, rel, key, "parts", reused=True)
    else:
        took = time.time() - t0 if len(todo) else 0.0
        _close(path, ws, rel, name, key, "parts",
               {"rows": total, "seconds": round(before + took, 2)})  # fmt: skip
    if not load:
        return parts
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def draw_batches(rows, batch_size: int):
    """``rows`` (pandas, with ``snippet_id`` and ``text``) in model batches, drawn from the rows
    alone: sorted by text length, longest first (less padding, and a batch too large for the
    device fails at once), ties by ``snippet_id``, cut every ``batch_size`` rows; column
    ``_batch`` holds each row's batch. So a row's batch mates, and its numbers to the last
    bit, are the same on one node or many."""
    import numpy as np

    from mia_ray.actors import BATCH

    ids = rows["snippet_id"].astype(str).to_numpy()
    rows = rows.iloc[np.lexsort((ids, -rows["text"].str.len().to_numpy()))].reset_index(drop=True)
    rows[BATCH] = np.arange(len(rows)) // batch_size
    return rows


def model_blocks(rows, batch_size: int, block_rows: int = BLOCK_ROWS, drawn: bool = False):
    """``draw_batches(rows, batch_size)`` (``drawn``: ``rows`` are already drawn) as a Ray
    Dataset whose blocks hold whole batches, ~``block_rows`` rows each."""
    import ray

    if not drawn:
        rows = draw_batches(rows, batch_size)
    # One map task emits its output only when its whole block is done: small blocks keep
    # results streaming into parts (and Ray Data's no-progress watchdog fed).
    per_block = batch_size * max(1, block_rows // batch_size)
    return ray.data.from_pandas(
        [rows.iloc[i : i + per_block] for i in range(0, len(rows), per_block)]
    )
