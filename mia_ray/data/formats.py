"""The document formats, in one place: each format's name, the file suffixes that say it, and
its reader (by name, loaded when first used): how its fields are found on the driver and how
one file of it becomes rows in the read tasks. Adding a format is one :func:`register` call
(a line in :data:`FORMATS` for one shipped here) and its reader. Compression suffixes (``.gz``,
``.zst``, ...) are apart: any format may be compressed.

No Ray, pandas or pyarrow import here: the sources layer reads names and suffixes only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from mia_ray.errors import MiaError

# The format of a folder whose files are not of a structured format: one document per file.
TEXT = "text"


@dataclass(frozen=True)
class Format:
    """``reader``: a :class:`mia_ray.data.readers.FormatReader`, or ``"module:NAME"`` of one."""

    name: str
    suffixes: tuple[str, ...]
    reader: Any


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a format (a name or a suffix already taken is refused)."""
    if fmt.name in FORMATS or fmt.name == "auto":
        raise MiaError(f"data format {fmt.name!r} is registered already")
    taken = {s: f.name for f in FORMATS.values() for s in f.suffixes}
    clash = [s for s in fmt.suffixes if s.lower() in taken]
    if clash:
        raise MiaError(f"suffix {clash[0]} already names the {taken[clash[0].lower()]} format")
    FORMATS[fmt.name] = Format(fmt.name, tuple(s.lower() for s in fmt.suffixes), fmt.reader)
    return FORMATS[fmt.name]


for _fmt in (
    Format(TEXT, (".txt",), "mia_ray.data.readers:TEXT_FILES"),
    Format("jsonl", (".jsonl", ".json", ".ndjson"), "mia_ray.data.readers:JSON_LINES"),
    Format("parquet", (".parquet",), "mia_ray.data.readers:PARQUET"),
    Format("warc", (".warc", ".wet"), "mia_ray.data.readers:WARC"),
):
    register(_fmt)


def names() -> tuple[str, ...]:
    """What ``data.format`` takes: ``auto`` (by suffix) and every format's name."""
    return ("auto", *FORMATS)


def by_suffix(suffix: str) -> str:
    """The format a file suffix says (``.jsonl`` -> ``jsonl``), or ""."""
    suffix = suffix.lower()
    return next((f.name for f in FORMATS.values() if suffix in f.suffixes), "")


def suffix_list() -> str:
    """Every suffix a format is known by, for a message: ``.txt, .jsonl, ... or .wet``."""
    every = [s for f in FORMATS.values() for s in f.suffixes]
    return ", ".join(every[:-1]) + f" or {every[-1]}"


def reader_of(name: str):
    """The reader of format ``name`` (imported on first use)."""
    try:
        reader = FORMATS[name].reader
    except KeyError:
        raise MiaError(f"data format must be one of {', '.join(names())}, not {name!r}") from None
    if isinstance(reader, str):
        module, _, attr = reader.partition(":")
        reader = getattr(importlib.import_module(module), attr)
    return reader
