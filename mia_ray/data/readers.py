"""Read documents into a Ray Dataset: a directory of text files, JSON Lines, or Parquet.

Every reader yields the columns ``doc_id`` (str) and ``text`` (str), plus ``label`` (int,
1 = member, 0 = non-member) and ``date`` (str) when the source has them, and ``group`` (str)
when the caller names a ``group_field``.

Cheap checks (path exists, directory not empty, empty files, the fields of each file) run
on the driver before any task starts. Per-document problems (binary, not UTF-8, empty, bad
label) are found by the workers, which do not raise: they return the problem in a private
``_error`` column, and ``read_documents`` raises it on the driver as one ``MiaError`` after
the single pass over the data. So callers always get a plain ``MiaError``, whatever Ray
does to exceptions raised inside tasks (Ray Data 2.60 drops the original exception type
of a failing map function unless ``DataContext.raise_original_map_exception`` is set).

The dataset that ``read_documents`` returns is materialized (blocks in the object store,
which spills to disk past memory) with a lazy projection on top that drops ``_error``:
using it never re-reads the files.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

from mia_ray.data.formats import reader_of
from mia_ray.data.sources import Source, read_placement, resolve_source
from mia_ray.errors import MiaError, find_mia_error

ERROR_COL = "_error"
_ROWS_PER_BLOCK = 4096
_READ_CHUNK = 8 << 20
DEFAULT_ID_FIELD = "id"  # may be absent (ids are then hashes); any other name must be there


@dataclass(frozen=True)
class Fields:
    """Source field names and which optional ones the source has."""

    text: str
    id: str
    label: str
    date: str
    has_id: bool
    has_label: bool
    has_date: bool
    group: str = ""  # "" = no group column
    has_group: bool = False


# ---------------------------------------------------------------- public API


def read_documents(
    path: str | os.PathLike | Source,
    format: str = "auto",
    text_field: str = "text",
    id_field: str = "id",
    label_field: str = "label",
    date_field: str = "date",
    note: Callable[[str], None] | None = None,
    group_field: str = "",
    subset: str = "",
    split: str = "",
):
    """Read documents into a ``ray.data.Dataset`` with ``doc_id``, ``text`` [, ``label``, ``date``].

    - a dataset on the Hugging Face hub, ``hf://datasets/<owner>/<name>``: loaded by
      ``datasets.load_dataset(<owner>/<name>, subset, split=split)`` on the driver (its
      cache), fields as for parquet; a local folder in the hub's layout reads the same way
      (``hf://datasets//abs/folder``). MIMIR (a repository or folder named ``mimir``,
      e.g. ``iamgroot42/mimir``) is read from its member and non-member files
      (:func:`mimir_files`): ``subset`` is the source, ``split`` the overlap cut.

    - text: a directory of text files (recursive, hidden files and folders skipped), one file
      = one document, ``doc_id`` = path relative to the directory (posix); or one ``.txt`` file.
    - jsonl / parquet: a file or a directory of ``*.jsonl`` / ``*.parquet`` files (recursive).
      ``text_field`` is required; ``id_field``, ``label_field`` and ``date_field`` are used
      when the source has them (as seen in the first record / schema of the first file).
      Without an id field, ``doc_id`` is ``text-`` + 16 hex digits of the BLAKE2b hash of the
      text (stable, independent of row order), and ``note`` (if given) is told so. That
      holds for the default id field ``id`` only: a source without an ``id_field`` the
      caller named otherwise is an error (a typo must not turn into hashed ids).
    - auto: by suffix for a file; for a directory, jsonl or parquet when every file has that
      suffix, text when none has.
    - ``group_field`` (optional) adds a ``group`` column (str) that keeps the documents of
      one source together (a book's chapters): for jsonl / parquet the field's value
      (``str()``), which the first record / schema must have and every record must fill; for
      text only ``"folder"``, the file's parent folder relative to the directory (posix; a
      file at the top is its own group).

    Raises ``MiaError`` for a missing path, an empty directory, an empty, binary or
    non-UTF-8 document, a missing text or group field, duplicate doc_ids and labels not in
    {0, 1}.
    """
    import ray

    from mia_ray.log import log

    if isinstance(path, str) and path.startswith(HUB_PREFIX):
        names = (text_field, id_field, label_field, date_field, group_field)
        return _read_hub(path, subset, split, names, note)
    source = path if isinstance(path, Source) else resolve_source(path, format)
    path = source.path
    fmt, base, files, paths = source.fmt, source.base, source.files, source.paths
    # Object storage and shared folders: read tasks on every node. Files on the driver's
    # disk alone: read tasks on the driver's node; the rows reach every node through the
    # object store.
    pinned = read_placement(source, log)
    reader = reader_of(fmt)
    if reader.fields is None:  # one document per file, no fields
        if group_field not in ("", "folder"):
            raise MiaError(
                f"data.group_field {group_field!r}: a folder of text files has no fields; use "
                '"folder" to group files by their parent folder'
            )
        empty = [rel for rel, size in files if size == 0]
        if empty:
            raise MiaError(f"document {empty[0]} is empty" + _more(len(empty), "empty documents"))
        ds = ray.data.read_binary_files(
            paths, include_paths=True, filesystem=source.filesystem, **pinned
        )
        ds = ds.map_batches(
            _decode_text_files,
            fn_kwargs={"base": base, "group": bool(group_field)},
            batch_format="numpy",
        )
        return _validated(ds, str(path), no_id=False)
    names = (text_field, id_field, label_field, date_field, group_field)
    fields = _fields_of(source, *names, note=note)
    if reader.native != "parquet" or pinned:
        # Ray Data's read_parquet reads the files' footers in actors of its own, which
        # ray_remote_args does not place: pinned Parquet files are read whole by our tasks.
        spec = _FileSpec(fmt, base, fields)
        records = _files_datasource(dict.fromkeys(paths, spec), source.filesystem)
        ds = ray.data.read_datasource(records, **pinned)
    else:
        ds = ray.data.read_parquet(paths, include_paths=True, filesystem=source.filesystem)
        ds = ds.select_columns([*_parquet_columns(fields), "path"]).map_batches(
            _normalize_parquet,
            fn_kwargs={"base": base, "fields": fields},
            batch_format="pyarrow",
        )
    return _validated(ds, str(path), no_id=not fields.has_id)


def read_shards(
    shards: list[tuple[str, Source]],
    text_field: str = "text",
    id_field: str = "id",
    sample: tuple[float, str] | None = None,
    ids_only: bool = False,
):
    """Many shards (``(name, source)``) as one lazy Ray dataset of ``doc_id``, ``text``,
    ``shard`` and ``_error`` (a record's problem, or null), for a pass that streams: nothing is
    materialized or validated here (the consumer raises ``_error``; doc_ids are not checked
    for duplicates). Every file of every shard is read by one read operator per place they
    are read from (object storage, or local files: on every node when every node sees them,
    else on the driver's node), whatever their formats: one operator per shard would cost the
    driver's executor loop a share of the scan on many shards (measured, see
    ``leakage.scan``). ``sample``: ``(fraction, seed)`` keeps a document when
    :func:`sample_point` of its shard and id is below the fraction, in the read task, so
    that nothing downstream sees the rest; a Parquet file's row groups that hold no drawn id
    are not read beyond their ids. ``ids_only``: no ``text`` column (a Parquet file's text
    is never read), for a pass that only draws the sample."""
    import ray

    from mia_ray.log import log

    groups: dict[Any, tuple[list, dict]] = {}
    names: dict[Any, list[str]] = {}
    for name, source in shards:
        if reader_of(source.fmt).fields is None:
            empty = [rel for rel, size in source.files if size == 0]
            if empty:
                raise MiaError(f"document {empty[0]} of shard {name} is empty")
            fields = Fields(text_field, "", "", "", True, False, False)
        else:
            fields = _fields_of(source, text_field, id_field, "label", "date")
        spec = _FileSpec(source.fmt, source.base, fields, name, sample, ids_only)
        where = ("remote", id(source.filesystem)) if source.remote else ("local",)
        files, specs = groups.setdefault(where, ([], {}))
        names.setdefault(where, []).append(source.path)
        files.extend(zip(source.paths, (size for _, size in source.files), strict=True))
        specs.update(dict.fromkeys(source.paths, (source.filesystem, spec)))
    parts = []
    for where, (files, specs) in groups.items():
        filesystem = next(iter(specs.values()))[0]
        together = Source(
            ", ".join(names[where]), "mixed", "", tuple(files), filesystem, where[0] == "remote"
        )
        pinned = read_placement(together, log)  # one probe for all the local files
        source = _files_datasource({p: s for p, (_, s) in specs.items()}, filesystem)
        parts.append(ray.data.read_datasource(source, **pinned))
    return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]


def sample_point(seed: str, shard: str, doc_id: str) -> float:
    """A document's place in [0, 1) for ``crawl.sample``: a hash of the seed, its shard and
    its id, so the same documents are drawn on every rerun and any number of nodes."""
    digest = hashlib.blake2b(f"{seed}\x1f{shard}\x1f{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _parquet_columns(fields: Fields) -> list[str]:
    optional = [
        (fields.id, fields.has_id),
        (fields.label, fields.has_label),
        (fields.date, fields.has_date),
        (fields.group, fields.has_group),
    ]
    # dict.fromkeys: a group field may also serve as another field (the id, say).
    return list(dict.fromkeys([fields.text] + [name for name, has in optional if has]))


def load_manifest(path: str | os.PathLike) -> dict[str, int]:
    """Read a membership manifest: a JSON object ``{doc_id: 0/1 or false/true}`` -> ``{doc_id: 0/1}``."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise MiaError(f"labels manifest not found: {path}")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise MiaError(
            f"labels manifest {path} is not valid UTF-8 (byte offset {e.start})"
        ) from None
    except json.JSONDecodeError as e:
        raise MiaError(
            f"labels manifest {path} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        ) from None
    if not isinstance(obj, dict):
        raise MiaError(
            f"labels manifest {path} must be a JSON object mapping doc_id to 0 or 1, "
            f"not a {type(obj).__name__}"
        )
    if not obj:
        raise MiaError(f"labels manifest {path} is empty")
    bad = [
        (k, v)
        for k, v in obj.items()
        if not (isinstance(v, bool) or (type(v) is int and v in (0, 1)))
    ]
    if bad:
        k, v = bad[0]
        raise MiaError(
            f"labels manifest {path}: the label of {k!r} is {json.dumps(v)}; labels must be "
            f"0, 1, false or true" + _more(len(bad), "bad labels")
        )
    return {str(k): int(v) for k, v in obj.items()}


def attach_labels(
    ds,
    manifest: dict[str, int],
    unlabelled: str = "error",
    note: Callable[[str], None] | None = None,
):
    """Add or replace the ``label`` column of ``ds`` from ``manifest`` (doc_id -> 0/1).

    The doc_ids of ``ds`` are collected on the driver first (one pass; cheap on the
    materialized dataset that ``read_documents`` returns), so a manifest that lacks some
    documents fails before anything else runs, or with ``unlabelled="skip"`` those documents
    are left out (a manifest that picks its documents from a larger corpus). Manifest entries
    without a document are left out too; ``note`` (if given) is told how many, since a
    manifest of another id scheme (or other data) would otherwise pass unseen.
    """
    ids = _column_values(ds, "doc_id")
    missing = sorted(set(ids) - manifest.keys())
    if missing and unlabelled == "skip":
        keep = manifest.keys()
        ds = ds.filter(lambda r: r["doc_id"] in keep).materialize()
        ids = [i for i in ids if i in keep]
        if not ids:
            raise MiaError(
                f"labels manifest names none of the {len(missing)} documents (its ids look "
                f"like {_shown(sorted(manifest), 2)}, the documents' like {_shown(missing, 2)})"
            )
    elif missing:
        raise MiaError(
            f"labels manifest lacks {len(missing)} of {len(ids)} documents: {_shown(missing)} "
            "(set data.unlabelled=skip to leave unlabelled documents out)"
        )
    extra = sorted(manifest.keys() - set(ids))
    if extra and note is not None:
        note(
            f"labels manifest names {len(extra)} of its {len(manifest)} documents that the "
            f"data does not have ({_shown(extra)}); they are left out"
        )
    needed = {doc_id: int(manifest[doc_id]) for doc_id in ids}
    return ds.map_batches(_set_labels, fn_kwargs={"labels": needed}, batch_format="pyarrow")


# ---------------------------------------------------------------- driver-side checks


def _jsonl_fields(
    source: Source, text: str, id_: str, label: str, date_: str, group: str = ""
) -> Fields:
    """Check the first record of every file; optional fields count when the first record has them."""
    first_keys: list[str] | None = None
    for rel in source.rels:
        with source.open(rel) as f:
            try:
                first = next(((n, raw) for n, raw in _iter_lines(f) if raw.strip()), None)
            except UNREADABLE as e:
                raise MiaError(cut_short(rel, e)) from None
            if first is not None:
                lineno, raw = first
                rec = _parse_json_line(raw.rstrip(b"\r"), lineno, rel)
                if isinstance(rec, str):
                    raise MiaError(rec)
                if text not in rec:
                    raise MiaError(_missing_field(text, f"line {lineno} of {rel}", rec.keys()))
                if first_keys is None:
                    first_keys = list(rec)
    if first_keys is None:
        where = source.path if len(source.rels) > 1 else f"{source.base}/{source.rels[0]}"
        raise MiaError(f"no documents in {where}: the .jsonl files are empty")
    has = [f in first_keys for f in (id_, label, date_)]
    return Fields(
        text, id_, label, date_, *has, group, has_group=bool(group) and group in first_keys
    )


def _parquet_fields(
    source: Source, text: str, id_: str, label: str, date_: str, group: str = ""
) -> Fields:
    import pyarrow.parquet as pq

    rels, schemas = source.rels, []
    for rel, full in zip(rels, source.paths, strict=True):
        try:
            schemas.append(pq.read_schema(full, filesystem=source.filesystem).names)
        except Exception as e:  # pyarrow raises ArrowInvalid or OSError for a bad footer
            raise MiaError(f"{rel} is not a readable Parquet file: {_first_line(e)}") from None
    first = schemas[0]
    for rel, names in zip(rels, schemas, strict=True):
        for field, needed in (
            (text, True),
            (id_, id_ in first),
            (label, label in first),
            (date_, date_ in first),
            (group, bool(group) and group in first),
        ):
            if needed and field not in names:
                raise MiaError(_missing_field(field, rel, names))
    has = [f in first for f in (id_, label, date_)]
    return Fields(text, id_, label, date_, *has, group, has_group=bool(group) and group in first)


def _fields_of(
    source: Source, text: str, id_: str, label: str, date_: str, group: str = "", note=None
) -> Fields:
    """The fields a source of a format with fields has (its reader's ``fields``: the first
    record, a schema; checked on the driver, before any task starts)."""
    reader = reader_of(source.fmt)
    fields = reader.fields(source, text, id_, label, date_, group)
    first = f"{reader.where} {source.rels[0]}"
    if group and not fields.has_group:
        raise MiaError(f"group field {group!r} (data.group_field) is not in {first}")
    if not fields.has_id:
        if id_ != DEFAULT_ID_FIELD:
            raise MiaError(
                f"id field {id_!r} (data.id_field) is not in {first}: name the "
                f"field that holds each document's id, or leave it at {DEFAULT_ID_FIELD!r} to "
                "use hashes of the texts"
            )
        if note is not None:
            note(
                f"{source.path}: its records have no {id_!r} field, so each doc_id is a hash of "
                "the text (text-...); set data.id_field to the field that holds the ids"
            )
    return fields


HUB_PREFIX = "hf://datasets/"


def _read_hub(path: str, subset: str, split: str, names: tuple, note):
    """A hub dataset's split through ``datasets.load_dataset`` (see :func:`read_documents`)."""
    import pyarrow as pa
    import ray

    repo = path[len(HUB_PREFIX) :].rstrip("/")
    try:
        import datasets
    except ImportError:  # pragma: no cover - a dependency
        raise MiaError(f"{path}: reading hub datasets needs the `datasets` package") from None
    mimir = repo.rsplit("/", 1)[-1].lower() == "mimir"
    if not split and not mimir:
        raise MiaError(f"{path}: name the split to read (data.split), e.g. train")
    datasets.disable_progress_bars()
    if mimir:
        table = _mimir_table(datasets, repo, subset, split, path)
        names = ("text", "id", "label", "", "")
    else:
        try:
            got = datasets.load_dataset(repo, subset or None, split=split)
        except Exception as e:
            raise MiaError(f"cannot load {path} (subset {subset or '-'}, split {split}): "
                           f"{_first_line(e)}") from None  # fmt: skip
        table = got.data.table if hasattr(got.data, "table") else got.data
    text, id_, label, date_, group = names
    columns = table.column_names
    if text not in columns:
        raise MiaError(_missing_field(text, f"{path} split {split}", columns))
    has = [f in columns for f in (id_, label, date_)]
    fields = Fields(
        text, id_, label, date_, *has, group, has_group=bool(group) and group in columns
    )
    if group and not fields.has_group:
        raise MiaError(_missing_field(group, f"{path} split {split}", columns))
    if not fields.has_id:
        if id_ != DEFAULT_ID_FIELD:
            raise MiaError(_missing_field(id_, f"{path} split {split}", columns))
        if note is not None:
            note(f"{path}: its records have no {id_!r} field, so each doc_id is a hash of the text")
    table = table.select(_parquet_columns(fields))
    table = table.append_column("path", pa.array([f"{repo}/{split}"] * len(table), pa.string()))
    ds = ray.data.from_arrow(table).map_batches(
        _normalize_parquet, fn_kwargs={"base": "", "fields": fields}, batch_format="pyarrow"
    )
    return _validated(ds, f"{path} split {split}", no_id=not fields.has_id)


# MIMIR (Duan et al. 2024, iamgroot42/mimir) as its loading script lays it out: for each
# source (the script's configuration) and split (its n-gram overlap cut, or month), the
# members in <cache>/train/<source>[_<split>].jsonl and the non-members in .../test/, one
# JSON string per line. `datasets` 4 and later no longer run loading scripts, so the files
# are read here with `datasets`' own text builder (hf:// paths through huggingface_hub).
_MIMIR_PILE = ("ngram_7_0.2", "ngram_13_0.2", "ngram_13_0.8")
MIMIR_SPLITS = {
    **{name: _MIMIR_PILE for name in ("arxiv", "dm_mathematics", "github", "hackernews",
                                     "pile_cc", "pubmed_central", "wikipedia_(en)")},
    "full_pile": ("none",),
    "c4": ("none",),
    "temporal_arxiv": ("2020_08", "2021_01", "2021_06", "2022_01", "2022_06", "2023_01",
                       "2023_06"),
    "temporal_wiki": ("none",),
}  # fmt: skip


def mimir_files(subset: str, split: str) -> dict[str, str]:
    """The member and non-member files of one MIMIR source and split, relative to the repo."""
    if subset not in MIMIR_SPLITS:
        raise MiaError(f"MIMIR has no source {subset!r} (data.subset); its sources: "
                       f"{', '.join(MIMIR_SPLITS)}")  # fmt: skip
    if split not in MIMIR_SPLITS[subset]:
        raise MiaError(f"MIMIR's {subset} has no split {split!r} (data.split); its splits: "
                       f"{', '.join(MIMIR_SPLITS[subset])}")  # fmt: skip
    cache = "cache_100_200_10000_512" if subset == "full_pile" else "cache_100_200_1000_512"
    name = subset if split == "none" else f"{subset}_{split}"
    return {"member": f"{cache}/train/{name}.jsonl", "nonmember": f"{cache}/test/{name}.jsonl"}


def _mimir_table(datasets, repo: str, subset: str, split: str, path: str):
    """MIMIR's members (label 1) and non-members (0), ids ``member/<line>``, ``nonmember/<line>``."""
    import pyarrow as pa

    files = mimir_files(subset, split)
    root = repo if repo.startswith("/") else f"{HUB_PREFIX}{repo}"
    try:
        got = datasets.load_dataset("text", data_files={k: f"{root}/{v}" for k, v in files.items()})
    except Exception as e:
        raise MiaError(f"cannot load {path} (subset {subset}, split {split}): "
                       f"{_first_line(e)}") from None  # fmt: skip
    ids, texts, labels = [], [], []
    for kind, label in (("member", 1), ("nonmember", 0)):
        for lineno, line in enumerate(got[kind]["text"]):
            if not line.strip():
                continue
            try:
                text = json.loads(line)
            except ValueError:
                text = None
            if not isinstance(text, str):
                raise MiaError(f"{files[kind]} line {lineno + 1} in {path} is not a JSON "
                               f"string: {line[:60]!r}")  # fmt: skip
            ids.append(f"{kind}/{lineno}")
            texts.append(text)
            labels.append(label)
    return pa.table({"id": ids, "text": texts, "label": pa.array(labels, pa.int64())})


def _missing_field(field: str, where: str, columns) -> str:
    return f"field {field!r} not in {where}; columns: {', '.join(map(str, columns)) or '(none)'}"


def _validated(ds, source: str, no_id: bool):
    """Run the read once; raise the first per-document problem, duplicate ids or no documents."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        ds = ds.materialize()
    except Exception as e:
        err = find_mia_error(e)
        if err is None:
            raise
        raise MiaError(_first_line(err.args[0] if err.args else err)) from None
    if ds.count() == 0:  # metadata of a materialized dataset: no pass over the data
        raise MiaError(f"no documents in {source}")
    chunks, n_errors, first_error = [], 0, None
    for batch in ds.select_columns(["doc_id", ERROR_COL]).iter_batches(
        batch_format="pyarrow", batch_size=None
    ):
        errors = pc.drop_null(batch.column(ERROR_COL))
        if len(errors):
            n_errors += len(errors)
            smallest = pc.min(errors).as_py()
            first_error = smallest if first_error is None else min(first_error, smallest)
        chunks.extend(batch.column("doc_id").chunks)
    if first_error is not None:
        raise MiaError(first_error + _more(n_errors, "problems"))
    ids = pa.chunked_array(chunks, type=pa.string())
    counts = pc.value_counts(ids)
    dup = sorted(counts.field("values").filter(pc.greater(counts.field("counts"), 1)).to_pylist())
    if dup:
        shown = ", ".join(dup[:5]) + (", ..." if len(dup) > 5 else "")
        what = (
            "identical texts (no id field, so doc_id is a hash of the text)"
            if no_id
            else "duplicate doc_ids"
        )
        raise MiaError(f"{what} in {source}: {len(dup)} ids appear more than once: {shown}")
    return ds.drop_columns([ERROR_COL])


def _column_values(ds, column: str) -> list:
    out: list = []
    for batch in ds.select_columns([column]).iter_batches(batch_format="pyarrow", batch_size=None):
        out.extend(batch.column(column).to_pylist())
    return out


def _shown(ids: list[str], n: int = 5) -> str:
    return ", ".join(ids[:n]) + (", ..." if len(ids) > n else "")


def _more(n: int, what: str) -> str:
    return f" (and {n - 1} more {what})" if n > 1 else ""


def _first_line(x: Any) -> str:
    text = str(x).strip()
    return text.splitlines()[0] if text else type(x).__name__


# ---------------------------------------------------------------- worker-side


class Rows:
    """Collects normalized rows (or their problems) and builds one Arrow block."""

    def __init__(self, has_label: bool, has_date: bool, has_group: bool = False):
        self.has_label, self.has_date, self.has_group = has_label, has_date, has_group
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.labels: list[int | None] = []
        self.dates: list[str | None] = []
        self.groups: list[str | None] = []
        self.errors: list[str | None] = []

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, doc_id: str, text: str, label=None, date_=None, group=None, error=None) -> None:
        self.ids.append(doc_id)
        self.texts.append(text)
        self.labels.append(label)
        self.dates.append(date_)
        self.groups.append(group)
        self.errors.append(error)

    def fail(self, message: str) -> None:
        self.add("", "", error=message)

    def table(self):
        import pyarrow as pa

        cols = {
            "doc_id": pa.array(self.ids, pa.string()),
            "text": pa.array(self.texts, pa.string()),
        }
        if self.has_label:
            cols["label"] = pa.array(self.labels, pa.int64())
        if self.has_date:
            cols["date"] = pa.array(self.dates, pa.string())
        if self.has_group:
            cols["group"] = pa.array(self.groups, pa.string())
        cols[ERROR_COL] = pa.array(self.errors, pa.string())
        return pa.table(cols)


def _decode_text_files(batch: dict, base: str, group: bool = False):
    rows = Rows(False, False, group)
    for data, path in zip(batch["bytes"], batch["path"], strict=True):
        doc_id = Path(os.path.relpath(str(path), base)).as_posix()
        data = bytes(data)
        if b"\x00" in data:
            rows.fail(f"document {doc_id} looks binary (it contains NUL bytes)")
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            rows.fail(f"document {doc_id} is not valid UTF-8 (byte offset {e.start})")
            continue
        text = text.removeprefix("\ufeff")
        if not text.strip():
            rows.fail(f"document {doc_id} is empty")
            continue
        # A file's group is its parent folder; a file at the top is a group of its own.
        rows.add(doc_id, text, group=(doc_id.rpartition("/")[0] or doc_id) if group else None)
    return rows.table()


def add_record(rows: Rows, fields: Fields, get, keys, where: str) -> None:
    """Check one record (``get(name)`` reads a field; ``keys``: its fields, for messages; ``where``:
    where it is, e.g. ``line 3 of a.jsonl``); add it to ``rows`` or its problem."""
    if fields.has_id:
        raw_id = get(fields.id)
        if raw_id is None or raw_id == "":
            rows.fail(_missing_field(fields.id, where, keys))
            return
        doc_id = name = str(raw_id)
    else:
        doc_id, name = "", f"at {where}"
    text = get(fields.text)
    if text is None or (isinstance(text, str) and not text.strip()):
        rows.fail(f"document {name} is empty")
        return
    if not isinstance(text, str):
        rows.fail(f"field {fields.text!r} of document {name} is a {type(text).__name__}, not text")
        return
    if "\x00" in text:
        rows.fail(f"document {name} looks binary (it contains NUL characters)")
        return
    if not fields.has_id:
        doc_id = "text-" + hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()
    label = None
    if fields.has_label:
        raw = get(fields.label)
        label = _label(raw)
        if label is None:
            rows.fail(f"label of document {name} is {raw!r}; labels must be 0 or 1")
            return
    group = None
    if fields.has_group:
        raw = get(fields.group)
        if raw is None or raw == "":
            rows.fail(f"document {name} has no group field {fields.group!r} (data.group_field)")
            return
        group = str(raw)
    date_ = None
    if fields.has_date:
        raw = get(fields.date)
        if isinstance(raw, (datetime, date)):
            date_ = raw.isoformat()
        elif raw is not None:
            date_ = str(raw)
    rows.add(doc_id, text, label, date_, group)


def _label(v: Any) -> int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) and v in (0, 1):
        return int(v)
    return None


def _parse_json_line(raw: bytes, lineno: int, name: str) -> dict | str:
    """The record on one line, or the message that says why it is not one."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"line {lineno} of {name} is not valid UTF-8 (byte offset {e.start} in the line)"
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        return f"line {lineno} of {name} is not valid JSON: {e.msg} (column {e.colno})"
    if not isinstance(rec, dict):
        return f"line {lineno} of {name} is not a JSON object"
    return rec


def _iter_lines(f):
    """``(line number, bytes)`` for each line of a binary stream, read in chunks."""
    rest = b""
    lineno = 0
    while True:
        chunk = f.read(_READ_CHUNK)
        if not chunk:
            break
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for part in parts:
            lineno += 1
            yield lineno, part
    if rest:
        yield lineno + 1, rest


def jsonl_records(f, name: str, fields: Fields):
    """The records of one JSON Lines stream as :class:`Rows` tables: split on ``\\n`` only
    (Ray's own ``read_text`` splits with ``str.splitlines``, which also breaks lines at U+2028
    and U+0085, characters that may stand unescaped inside JSON strings), problems named by
    line number."""
    rows = Rows(fields.has_label, fields.has_date, fields.has_group)
    for lineno, raw in _iter_lines(f):
        if not raw.strip():
            continue
        rec = _parse_json_line(raw.rstrip(b"\r"), lineno, name)
        where = f"line {lineno} of {name}"
        if isinstance(rec, str):
            rows.fail(rec)
        elif fields.text not in rec:
            rows.fail(_missing_field(fields.text, where, rec.keys()))
        else:
            add_record(rows, fields, rec.get, rec.keys(), where)
        if len(rows) >= _ROWS_PER_BLOCK:
            yield rows.table()
            rows = Rows(fields.has_label, fields.has_date, fields.has_group)
    if len(rows):
        yield rows.table()


@dataclass(frozen=True)
class _FileSpec:
    """How to read one file: its format, the folder its names are relative to, its fields;
    for a scan, the shard it belongs to (a ``shard`` column) and the sample to keep."""

    fmt: str
    base: str
    fields: Fields
    shard: str = ""
    sample: tuple[float, str] | None = None
    ids_only: bool = False
    # The format's reader, resolved on the driver: a read task needs no registry of its own.
    reader: Any = None

    def __post_init__(self) -> None:
        if self.reader is None:
            object.__setattr__(self, "reader", reader_of(self.fmt))


def _file_rows(f, path: str, spec: _FileSpec):
    """The rows of one file as :class:`Rows` tables (see :func:`read_documents`)."""
    name = Path(os.path.relpath(path, spec.base)).as_posix() if spec.base else path
    yield from spec.reader.rows(f, name, path, spec)


def _whole_file_rows(f, path: str, spec: _FileSpec):
    """:func:`_file_rows`, and a row with the file's problem when its bytes break off or do
    not decompress (a truncated ``.gz`` or ``.zst``, a corrupt WARC): the rows read before
    it stand, and the problem names the file (and its shard) for the driver to raise."""
    try:
        yield from _file_rows(f, path, spec)
    except UNREADABLE as e:
        name = Path(os.path.relpath(path, spec.base)).as_posix() if spec.base else path
        shard = f" of shard {spec.shard}" if spec.shard and spec.shard != Path(name).name else ""
        has = spec.reader.error_columns(spec.fields)
        rows = Rows(*has, spec.fields.has_group and spec.reader.fields is not None)
        rows.fail(cut_short(f"{name}{shard}", e))
        yield rows.table()


# What a file's bytes raise when they break off or do not decompress: pyarrow's codecs raise
# OSError ("Truncated compressed stream") or ArrowInvalid (a ValueError).
UNREADABLE = (OSError, EOFError, ValueError)


def cut_short(name: str, e: BaseException) -> str:
    """The one message for a file that cannot be read to its end."""
    from mia_ray.data.sources import compression_of

    codec = compression_of(name.split(" of shard ")[0])
    what = f"a truncated or corrupt {codec} file" if codec else "a truncated or corrupt file"
    return f"file {name} cannot be read to its end ({what}?): {_first_line(e)}"


def _parquet_ids(pf, name: str, spec: _FileSpec):
    """The ids of a Parquet file, row group by row group, as ``doc_id`` and ``_error`` (a
    missing id), without reading any other column."""
    import pyarrow as pa

    for i in range(pf.num_row_groups):
        ids = pf.read_row_group(i, columns=[spec.fields.id]).column(0).to_pylist()
        problem = _missing_field(spec.fields.id, f"a row of {name}", pf.schema_arrow.names)
        bad = [d is None or d == "" for d in ids]
        doc_ids = ["" if b else str(d) for d, b in zip(ids, bad, strict=True)]
        errors = [problem if b else None for b in bad]
        yield pa.table({"doc_id": pa.array(doc_ids, pa.string()),
                        ERROR_COL: pa.array(errors, pa.string())})  # fmt: skip


def parquet_row_groups(pf, id_field: str, shard: str, sample) -> list[int]:
    """The row groups of a Parquet file (a ``pyarrow.parquet.ParquetFile``) that a read of
    ``shard`` with ``sample`` (``(fraction, seed)`` or None) needs: all of them, or the ones
    holding a drawn id or a missing one (its problem is raised as a whole read would). Only
    the id column of the others is read. Without an ``id_field`` every group is needed: a
    document's place then hangs on its text."""
    every = list(range(pf.num_row_groups))
    if sample is None or sample[0] >= 1 or not id_field:
        return every
    fraction, seed = sample

    def needed(i: int) -> bool:
        ids = pf.read_row_group(i, columns=[id_field]).column(0).to_pylist()
        return any(
            d is None or d == "" or sample_point(seed, shard, str(d)) < fraction for d in ids
        )

    return [i for i in every if needed(i)]


def _scan_columns(table, spec: _FileSpec):
    """A scan's columns of a block (``doc_id``, ``text`` unless ``ids_only``, ``shard``,
    ``_error``), the documents outside the sample left out (a record's problem is kept)."""
    import pyarrow as pa

    table = table.select(["doc_id"] + ([] if spec.ids_only else ["text"]) + [ERROR_COL])
    if spec.sample is not None:
        fraction, seed = spec.sample
        ids, errors = table.column("doc_id").to_pylist(), table.column(ERROR_COL).to_pylist()
        keep = [
            e is not None or sample_point(seed, spec.shard, d) < fraction
            for d, e in zip(ids, errors, strict=True)
        ]
        table = table.filter(pa.array(keep, pa.bool_()))
    return table.append_column("shard", pa.array([spec.shard] * len(table), pa.string()))


_FILES_CLASS = None


def _files_datasource(specs: dict[str, _FileSpec], filesystem):
    """A datasource that streams each file (decompressed as its suffix says) as its spec
    says; Ray Data names its read ``Read<Format>`` (``ReadJsonl``, ``ReadWarc``; several
    formats: ``ReadShards``). Its class is built on first use so that importing this module
    does not import Ray."""
    global _FILES_CLASS
    if _FILES_CLASS is None:
        from ray.data.datasource import FileBasedDatasource

        class FilesDatasource(FileBasedDatasource):
            def __init__(self, specs: dict[str, _FileSpec], filesystem=None):
                super().__init__(list(specs), filesystem=filesystem)
                # Ray hands _read_stream the path without a scheme: look it up the same way.
                self._specs = {p.split("://", 1)[-1]: s for p, s in specs.items()}
                fmts = {s.fmt for s in specs.values()}
                self._name = fmts.pop().capitalize() if len(fmts) == 1 else "Shards"

            def get_name(self) -> str:
                return self._name

            def _open_input_source(self, filesystem, path: str, **open_args):
                # Parquet keeps its footer at the end and its columns apart: random access
                # reads only what is needed (a reader's ``random_access``).
                if self._specs[path.split("://", 1)[-1]].reader.random_access:
                    return filesystem.open_input_file(path)
                return super()._open_input_source(filesystem, path, **open_args)

            def _read_stream(self, f, path: str):
                spec = self._specs[path.split("://", 1)[-1]]
                for table in _whole_file_rows(f, path, spec):
                    yield _scan_columns(table, spec) if spec.shard else table

        _FILES_CLASS = FilesDatasource
    return _FILES_CLASS(specs, filesystem=filesystem)


WARC_FIELDS = {"id": "WARC-Record-ID", "url": "WARC-Target-URI"}


def _warc_fields(text: str, id_: str, label: str, date_: str, group: str) -> Fields:
    """A WARC record's fields: its text is the record's content, ``id`` its WARC-Record-ID
    (or ``url``: its WARC-Target-URI), ``date`` its WARC-Date; ``group_field="host"`` groups
    the pages of one site. There are no labels."""
    if id_ not in WARC_FIELDS:
        raise MiaError(
            f'data.id_field {id_!r}: a WARC record\'s id is its WARC-Record-ID ("id") or its '
            'WARC-Target-URI ("url")'
        )
    if group not in ("", "host"):
        raise MiaError(
            f'data.group_field {group!r}: WARC records can be grouped by "host" (one site) only'
        )
    return Fields(text, WARC_FIELDS[id_], label, date_, True, False, True, group, bool(group))


class _Counted:
    """A pyarrow stream as fastwarc reads one: ``read`` and a ``tell`` of its own (pyarrow's
    decompressing streams have none)."""

    def __init__(self, f):
        self.f, self.pos = f, 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n) if n is not None and n >= 0 else self.f.read()
        self.pos += len(data)
        return data

    def tell(self) -> int:
        return self.pos

    def readable(self) -> bool:
        return True


def warc_records(f, name: str, fields: Fields):
    """The ``conversion`` records of one WARC/WET stream as :class:`Rows` tables. Content is
    UTF-8 (bad bytes replaced: web text is not clean); records without text are skipped, as
    a WET file has many (pages without text)."""
    from urllib.parse import urlsplit

    from fastwarc import ArchiveIterator, WarcRecordType

    rows = Rows(False, True, fields.has_group)
    records = ArchiveIterator(_Counted(f), record_types=WarcRecordType.conversion, parse_http=False)
    for n, record in enumerate(records, 1):
        text = record.reader.read().decode("utf-8", errors="replace")
        if not text.strip():
            continue
        doc_id = record.headers.get(fields.id) or ""
        if not doc_id:
            rows.fail(f"record {n} of {name} has no {fields.id} header")
            continue
        if "\x00" in text:
            rows.fail(f"document {doc_id} of {name} looks binary (it contains NUL characters)")
            continue
        url = record.headers.get("WARC-Target-URI") or ""
        group = (urlsplit(url).hostname or url) if fields.has_group else None
        rows.add(doc_id.strip("<>"), text, None, record.headers.get("WARC-Date"), group)
        if len(rows) >= _ROWS_PER_BLOCK:
            yield rows.table()
            rows = Rows(False, True, fields.has_group)
    if len(rows):
        yield rows.table()


def _normalize_parquet(table, base: str, fields: Fields):
    rows = Rows(fields.has_label, fields.has_date, fields.has_group)
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    keys = [name for name in table.column_names if name != "path"]
    for i, path in enumerate(cols["path"]):
        where = f"a row of {Path(os.path.relpath(str(path), base)).as_posix()}"
        add_record(rows, fields, lambda name, i=i: cols[name][i], keys, where)
    return rows.table()


def _set_labels(table, labels: dict[str, int]):
    import pyarrow as pa

    values = pa.array([labels[d] for d in table.column("doc_id").to_pylist()], pa.int64())
    if "label" in table.column_names:
        return table.set_column(table.column_names.index("label"), "label", values)
    return table.append_column("label", values)


# ---------------------------------------------------------------- the formats' readers


def _has_fields(fields: Fields) -> tuple[bool, bool]:
    return fields.has_label, fields.has_date


@dataclass(frozen=True)
class FormatReader:
    """How one format is read (:mod:`mia_ray.data.formats` names it).

    - ``fields(source, text, id_, label, date_, group) -> Fields``: the fields a source of it
      has, checked on the driver before any task; None: a file is one document, no fields;
    - ``rows(f, name, path, spec)``: one file's rows as :class:`Rows` tables, in a read task;
    - ``where``: where ``fields`` looks, as a message says it ("the columns of" a file);
    - ``error_columns(fields)``: (has_label, has_date) of the table that reports a file's
      problem (its rows must have the columns of the file's other tables);
    - ``random_access``: a file is opened for random access (a footer, columns apart);
    - ``native``: Ray Data's own reader of the format, used when every node reads the files.
    """

    fields: Callable | None
    rows: Callable
    where: str = "the first record of"
    error_columns: Callable = _has_fields
    random_access: bool = False
    native: str = ""


def _text_rows(f, name: str, path: str, spec: _FileSpec):
    yield _decode_text_files({"bytes": [f.read()], "path": [path]}, spec.base)


def _jsonl_rows(f, name: str, path: str, spec: _FileSpec):
    yield from jsonl_records(f, name, spec.fields)


def _warc_rows(f, name: str, path: str, spec: _FileSpec):
    yield from warc_records(f, name, spec.fields)


def _warc_source_fields(source: Source, text: str, id_: str, label: str, date_: str,
                        group: str = "") -> Fields:  # fmt: skip
    return _warc_fields(text, id_, label, date_, group)


def _parquet_rows(f, name: str, path: str, spec: _FileSpec):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if spec.ids_only and spec.fields.has_id:
        yield from _parquet_ids(pq.ParquetFile(f), name, spec)
        return
    # f is random access (FilesDatasource._open_input_source): only the columns read
    # and, in a sample, the row groups holding a drawn document are fetched.
    pf = pq.ParquetFile(f)
    columns = _parquet_columns(spec.fields)
    id_field = spec.fields.id if spec.fields.has_id else ""
    groups = parquet_row_groups(pf, id_field, spec.shard, spec.sample)
    if not groups:
        return
    for batch in pf.iter_batches(batch_size=_ROWS_PER_BLOCK, row_groups=groups, columns=columns):
        table = pa.Table.from_batches([batch])
        table = table.append_column("path", pa.array([path] * len(table), pa.string()))
        yield _normalize_parquet(table, spec.base, spec.fields)


def _no_label_date(fields: Fields) -> tuple[bool, bool]:
    return False, False


def _date_only(fields: Fields) -> tuple[bool, bool]:
    return False, True


TEXT_FILES = FormatReader(None, _text_rows, error_columns=_no_label_date)
JSON_LINES = FormatReader(_jsonl_fields, _jsonl_rows)
PARQUET = FormatReader(_parquet_fields, _parquet_rows, where="the columns of",
                       random_access=True, native="parquet")  # fmt: skip
WARC = FormatReader(_warc_source_fields, _warc_rows, error_columns=_date_only)
