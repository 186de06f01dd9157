"""The format registry: one place names every format and its suffixes, and a format added
there (here: tab-separated values, in this file) is read like the shipped ones, through the
same checks, on Ray."""

from __future__ import annotations

import sys

import pytest

from mia_ray.data import formats
from mia_ray.data.readers import Fields, FormatReader, Rows, add_record, read_documents
from mia_ray.data.sources import format_of
from mia_ray.errors import MiaError


def test_the_registry_names_every_format_and_suffix():
    assert formats.names() == ("auto", "text", "jsonl", "parquet", "warc")
    got = {s: format_of(f"a{s}.gz") for s in (".txt", ".jsonl", ".json", ".ndjson", ".parquet",
                                              ".warc", ".wet", ".JSONL", ".csv")}  # fmt: skip
    assert got == {".txt": "text", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
                   ".parquet": "parquet", ".warc": "warc", ".wet": "warc", ".JSONL": "jsonl",
                   ".csv": ""}  # fmt: skip
    assert formats.suffix_list() == ".txt, .jsonl, .json, .ndjson, .parquet, .warc or .wet"


def test_a_taken_name_or_suffix_is_refused():
    with pytest.raises(MiaError, match=r"^data format 'jsonl' is registered already$"):
        formats.register(formats.Format("jsonl", (".jl",), "x:y"))
    with pytest.raises(MiaError, match=r"^suffix \.JSON already names the jsonl format$"):
        formats.register(formats.Format("json5", (".JSON",), "x:y"))
    with pytest.raises(MiaError, match=r"^data format must be one of auto, text, jsonl, "):
        formats.reader_of("tsv")


def _tsv_fields(source, text, id_, label, date_, group=""):
    with source.open(source.rels[0]) as f:
        header = f.read().decode().split("\n", 1)[0].split("\t")  # a pyarrow stream: no readline
    if text not in header:
        raise MiaError(f"no {text!r} column in {source.rels[0]}")
    has = [c in header for c in (id_, label, date_)]
    return Fields(text, id_, label, date_, *has, group, bool(group) and group in header)


def _tsv_rows(f, name, path, spec):
    lines = f.read().decode().splitlines()
    header = lines[0].split("\t")
    rows = Rows(spec.fields.has_label, spec.fields.has_date, spec.fields.has_group)
    for n, line in enumerate(lines[1:], 2):
        record = dict(zip(header, line.split("\t"), strict=True))
        if "label" in record:  # text in a TSV; the shared checks take 0 or 1 only
            record["label"] = int(record["label"])
        add_record(rows, spec.fields, record.get, header, f"line {n} of {name}")
    yield rows.table()


@pytest.mark.ray
def test_a_registered_format_is_read_like_the_shipped_ones(ray_local, tmp_path):
    import ray

    # The reader travels to the read tasks with each file's spec: by value, as a user's
    # module would be on a cluster that has it installed.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    formats.register(formats.Format("tsv", (".tsv",), FormatReader(_tsv_fields, _tsv_rows)))
    try:
        (tmp_path / "docs.tsv").write_text("id\ttext\tlabel\na\tfirst text\t1\nb\tsecond\t0\n")
        got = read_documents(str(tmp_path / "docs.tsv")).to_pandas().sort_values("doc_id")
        assert got[["doc_id", "text", "label"]].values.tolist() == [
            ["a", "first text", 1], ["b", "second", 0]
        ]  # fmt: skip
        # The shared checks hold for it too: an empty document is refused, naming its line.
        (tmp_path / "docs.tsv").write_text("id\ttext\na\t \n")
        with pytest.raises(MiaError, match=r"document a is empty"):
            read_documents(str(tmp_path / "docs.tsv")).materialize()
    finally:
        del formats.FORMATS["tsv"]
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
