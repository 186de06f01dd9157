"""Wiring shared by pipelines: demo-world resolution, documents → labelled snippets, progress."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mia_ray.errors import MiaError
from mia_ray.keys import fingerprint
from mia_ray.log import log, note

__all__ = ["fingerprint", "log", "note"]  # the pipelines' wiring imports them from here

PART_ROWS = 512  # result rows per part file: the granularity of resuming
BLOCK_ROWS = 64  # rows per input block: results (and progress) arrive at least this often


def resolve_world(cfg) -> None:
    """With ``world.target`` set, build the demo world if missing and point data/model at it."""
    if not cfg.world.target:
        return
    from mia_ray.demo.world import ensure_world

    targets = [cfg.world.target]
    log(f"demo world at {cfg.world.resolved_root()} (target {cfg.world.target})")
    info = ensure_world(cfg.world, targets)
    cfg.data.path = cfg.data.path or str(info["documents"])
    if not cfg.data.labels:
        # A target's manifest is its evaluated set: smollm2's is a sample of the corpus.
        cfg.data.labels = str(info["manifest"])
        cfg.data.unlabelled = "skip"
    cfg.model.name_or_path = cfg.model.name_or_path or str(info["model"])
    if info.get("reference"):
        cfg.model.reference = cfg.model.reference or str(info["reference"])


def check_model_early(
    name: str, what: str, revision: str = "", trust_remote_code: bool = False, gguf_file: str = ""
) -> None:
    """Fail before any scoring if a model's config or tokenizer cannot load (cheap: no weights)."""
    if not name:
        return
    from transformers import AutoConfig

    from mia_ray.models.hf import describe_load_failure, load_tokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        AutoConfig.from_pretrained(name, **kwargs)
    except Exception as e:
        raise MiaError(f"{what}: " + describe_load_failure(name, e)) from None
    try:
        load_tokenizer(name, revision, trust_remote_code, gguf_file)
    except MiaError as e:
        raise MiaError(f"{what}: {e}") from None
    folder = Path(name).expanduser()
    for path in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        problem = _safetensors_problem(path)
        if problem:
            raise MiaError(f"{what}: weights file {path.name} of {name!r} {problem}")


def _safetensors_problem(path: Path) -> str:
    """Why a .safetensors file cannot load ("" if its header and size agree).

    Reads the header only (8 bytes of length, then JSON): a file cut short by a copy or a
    download fails here in a line, not in the ``__init__`` of every scoring actor.
    """
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 + n:
                return f"is cut short: {size} bytes, its header alone needs {8 + n}"
            header = json.loads(f.read(n))
        end = max(
            (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "is not a readable safetensors file (its header does not parse)"
    if 8 + n + end > size:
        return f"is cut short: {size} bytes, its tensors need {8 + n + end}"
    return ""


def check_target_early(model_cfg) -> None:
    """:func:`check_model_early` for the target model of a job's ``model`` section."""
    check_model_early(
        model_cfg.name_or_path,
        "model.name_or_path",
        model_cfg.revision,
        model_cfg.trust_remote_code,
        model_cfg.gguf_file,
    )


def labelled_documents(data_cfg):
    """Read documents, attach labels, sample per class, check classes. Returns (ds, labels)."""
    from mia_ray.data.readers import attach_labels, load_manifest, read_documents
    from mia_ray.data.splits import check_classes, sample_per_class

    ds = read_documents(
        data_cfg.path,
        format=data_cfg.format,
        text_field=data_cfg.text_field,
        id_field=data_cfg.id_field,
        label_field=data_cfg.label_field,
        date_field=data_cfg.date_field,
        note=note,
    )
    if data_cfg.labels:
        ds = attach_labels(ds, load_manifest(data_cfg.labels), data_cfg.unlabelled, note=note)
    if "label" not in ds.columns():
        raise MiaError(
            f"no membership labels: {data_cfg.path} has no '{data_cfg.label_field}' field and "
            "data.labels (a doc_id -> 0/1 manifest) is not set"
        )
    # read_documents has read and checked every document once already (before any model work).
    ids = ds.select_columns(["doc_id", "label"]).to_pandas()
    labels = dict(zip(ids["doc_id"].astype(str), ids["label"].astype(int), strict=True))
    if data_cfg.max_docs_per_class:
        labels = sample_per_class(labels, data_cfg.max_docs_per_class, data_cfg.seed)
        keep = set(labels)
        ds = ds.filter(lambda r: r["doc_id"] in keep).materialize()
    check_classes(labels, data_cfg.min_docs_per_class)
    return ds, labels


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


def model_blocks(rows, batch_size: int, block_rows: int = BLOCK_ROWS):
    """``draw_batches(rows, batch_size)`` as a Ray Dataset whose blocks hold whole batches,
    ~``block_rows`` rows each."""
    import ray

    rows = draw_batches(rows, batch_size)
    # One map task emits its output only when its whole block is done: small blocks keep
    # results streaming into parts (and Ray Data's no-progress watchdog fed).
    per_block = batch_size * max(1, block_rows // batch_size)
    return ray.data.from_pandas(
        [rows.iloc[i : i + per_block] for i in range(0, len(rows), per_block)]
    )


def resumable_map(
    rows, out_dir: Path, fp: str, mapper: Callable[[Any], Any], what: str, batch_size: int,
    load: bool = True,
):  # fmt: skip
    """Stream ``rows`` (pandas, with a unique ``snippet_id`` and a ``text``) in model batches
    of ``batch_size`` (``model_blocks``) through ``mapper(ds) -> ds`` and write the results in
    parts to ``out_dir`` as they arrive; return all rows (pandas), or with ``load=False`` the
    part files (for results larger than memory). The mapper's actors take each block whole
    (``batch_size=None``) and run ``in_model_batches``.

    A rerun with the same fingerprint ``fp`` skips every row already in a part, so an
    interrupted run resumes where it stopped; a different fingerprint starts afresh.
    """
    import shutil

    import pandas as pd

    from mia_ray import storage
    from mia_ray.actors import BATCH
    from mia_ray.reports.io import read_json, write_json, write_parquet

    meta = out_dir / "meta.json"
    if out_dir.exists() and (not meta.exists() or read_json(meta).get("fingerprint") != fp):
        log(f"{what}: inputs changed since the last run; computing afresh")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(meta, {"fingerprint": fp})
    storage.push(meta)
    parts = sorted(out_dir.glob("part-*.parquet"))
    done: set[str] = set()
    for part in parts:
        done.update(pd.read_parquet(part, columns=["snippet_id"])["snippet_id"])
    total = len(rows)
    todo = rows
    if done:
        log(f"{what}: reusing {len(done)} of {total} rows")
        todo = rows[~rows["snippet_id"].isin(done)]
    n_new, buffer = 0, []
    t0, last = time.time(), 0.0

    def flush() -> None:
        if buffer:
            path = out_dir / f"part-{len(parts):05d}.parquet"
            write_parquet(path, pd.concat(buffer, ignore_index=True))
            storage.push(path)  # a checkpoint: a new driver resumes from it
            parts.append(path)
            buffer.clear()

    if len(done) < total:
        ds = model_blocks(todo, batch_size)
        for batch in mapper(ds).iter_batches(batch_format="pandas", batch_size=None):
            buffer.append(batch.drop(columns=BATCH, errors="ignore"))
            n_new += len(batch)
            if sum(len(b) for b in buffer) >= PART_ROWS:
                flush()
            if time.time() - last > 10:
                last = time.time()
                rate = n_new / max(last - t0, 1e-9)
                log(f"{what}: {len(done) + n_new}/{total} rows ({rate:.1f}/s)")
        flush()
        # The periodic line above stops short of the end: say where the work ended.
        took = time.time() - t0
        log(
            f"{what}: {len(done) + n_new}/{total} rows in {took:.0f} s ({n_new / max(took, 1e-9):.1f}/s)"
        )
    if not load:
        return parts
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def snippets_of(docs, data_cfg, model_path: str):
    """Documents (a Ray Dataset with doc_id, text) -> snippets as configured in ``data_cfg``
    (lazy); token snippets use ``model_path``'s tokenizer."""
    from mia_ray import storage
    from mia_ray.data.snippets import make_snippets

    return make_snippets(
        docs,
        unit=data_cfg.snippet_unit,
        size=data_cfg.snippet_size,
        min_size=data_cfg.min_snippet_size,
        max_per_doc=data_cfg.max_snippets_per_doc,
        # The snippet tasks load the tokenizer on any node: a driver folder goes by storage.
        tokenizer_path=storage.stage(model_path) if data_cfg.snippet_unit == "tokens" else None,
    )
