"""LUMIA's samples: documents (and their images, for a vision-language model) as labelled snippets."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mia_ray.data.inputs import labelled_documents, snippets_of
from mia_ray.errors import MiaError
from mia_ray.pipelines.lumia.config import LumiaJobConfig


def image_paths(data_cfg, ids: set[str]) -> dict[str, str]:
    """doc_id -> absolute image path, from the jsonl/parquet records' ``image_field``."""
    from mia_ray.data.sources import resolve_source

    source = resolve_source(data_cfg.path, data_cfg.format)
    fmt, base, files = source.fmt, Path(source.base), source.files
    if source.remote or fmt not in ("jsonl", "parquet"):
        raise MiaError(
            "a vision-language model needs local jsonl or parquet records with an image path "
            f"(field {data_cfg.image_field!r}); {data_cfg.path} is {fmt}"
            + (" in object storage" if source.remote else "")
        )
    out: dict[str, str] = {}
    for rel, _ in files:
        path = base / rel
        if fmt == "jsonl":
            df = pd.read_json(path, lines=True, dtype=False)
        else:
            df = pd.read_parquet(path)
        for col in (data_cfg.id_field, data_cfg.image_field):
            if col not in df:
                raise MiaError(
                    f"{rel}: records have no {col!r} field (data.id_field / image_field)"
                )
        for doc_id, img in zip(
            df[data_cfg.id_field].astype(str), df[data_cfg.image_field], strict=True
        ):
            if doc_id in ids:
                p = Path(str(img)).expanduser()
                out[doc_id] = str(p if p.is_absolute() else (path.parent / p).resolve())
    missing = sorted(ids - set(out))
    if missing:
        raise MiaError(
            f"sample {missing[0]} has no image"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    absent = [p for p in out.values() if not Path(p).is_file()]
    if absent:
        raise MiaError(
            f"image not found: {absent[0]}"
            + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else "")
        )
    return out


def samples_of(cfg: LumiaJobConfig, multimodal: bool):
    """(samples: snippet_id, doc_id, text [, image], label, sorted by id (pandas); documents)."""

    docs, labels = labelled_documents(cfg.data)
    if multimodal:
        # One sample per record: the text is cropped to the context in the reader.
        meta = docs.select_columns(["doc_id", "text"]).to_pandas()
        meta["snippet_id"] = meta["doc_id"]
        images = image_paths(cfg.data, set(meta["doc_id"]))
        meta["image"] = meta["doc_id"].map(images)
    else:
        snips = snippets_of(docs, cfg.data, cfg.model.name_or_path)
        meta = snips.select_columns(["snippet_id", "doc_id", "text"]).to_pandas()
    if meta["snippet_id"].duplicated().any():
        raise MiaError("sample ids are not unique: are doc ids unique?")
    meta["label"] = meta["doc_id"].map(labels).astype(int)
    meta = meta.sort_values("snippet_id").reset_index(drop=True)
    return meta, docs
