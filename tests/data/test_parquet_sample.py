"""A sample of a Parquet corpus reads only what it draws: the text of a row group without a
drawn id is never fetched (checked on a file whose other text chunks are overwritten)."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq

from mia_ray.data.readers import parquet_row_groups, read_shards
from mia_ray.data.sources import resolve_source

GROUPS, PER_GROUP, SEED, SHARE = 8, 50, "3", 0.01
IDS = [f"d{i:03d}" for i in range(GROUPS * PER_GROUP)]


def _point(doc_id: str) -> float:
    # The definition of crawl.sample, written out: blake2b-64 of "seed \x1f shard \x1f id".
    key = f"{SEED}\x1fcrawl\x1f{doc_id}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


DRAWN = sorted(d for d in IDS if _point(d) < SHARE)
HIT = sorted({IDS.index(d) // PER_GROUP for d in DRAWN})


def _text(doc_id: str) -> str:
    return f"Page {doc_id}: write to {doc_id}@example.com. " * 20


def _corpus(tmp_path):
    """The same pages as a Parquet file in row groups of 50 (no dictionary, so each text
    chunk starts at its data page) and as JSON Lines."""
    table = pa.table({"id": IDS, "text": [_text(d) for d in IDS]})
    pq.write_table(table, tmp_path / "crawl.parquet", row_group_size=PER_GROUP,
                   use_dictionary=False, compression="none")  # fmt: skip
    lines = "".join(json.dumps({"id": d, "text": _text(d)}) + "\n" for d in IDS)
    (tmp_path / "crawl.jsonl").write_text(lines)
    return tmp_path / "crawl.parquet", tmp_path / "crawl.jsonl"


def _wreck_text(path, groups) -> None:
    """Overwrite the text column chunk (page header included) of ``groups`` with 0xff."""
    meta = pq.ParquetFile(path).metadata
    data = bytearray(path.read_bytes())
    for g in groups:
        chunk = meta.row_group(g).column(1)
        assert chunk.path_in_schema == "text" and not chunk.has_dictionary_page
        start = chunk.data_page_offset
        data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))


def _read(path, sample=None, ids_only=False):
    ds = read_shards([("crawl", resolve_source(path))], sample=sample, ids_only=ids_only)
    return ds.to_pandas().sort_values("doc_id").reset_index(drop=True)


def test_the_row_groups_a_sample_needs_are_those_holding_a_drawn_id(tmp_path):
    assert 0 < len(HIT) < GROUPS - 1  # the seed draws from some groups, not all
    parquet, _ = _corpus(tmp_path)
    pf = pq.ParquetFile(parquet)
    assert parquet_row_groups(pf, "id", "crawl", (SHARE, SEED)) == HIT
    assert parquet_row_groups(pf, "id", "crawl", None) == list(range(GROUPS))
    assert parquet_row_groups(pf, "id", "crawl", (1.0, SEED)) == list(range(GROUPS))
    # Without ids a document's place is a hash of its text: every group is read.
    assert parquet_row_groups(pf, "", "crawl", (SHARE, SEED)) == list(range(GROUPS))
    assert parquet_row_groups(pf, "id", "other", (SHARE, SEED)) != HIT


def test_a_sample_of_parquet_never_reads_the_text_it_does_not_draw(ray_local, tmp_path):
    parquet, jsonl = _corpus(tmp_path)
    want = _read(jsonl, sample=(SHARE, SEED))
    assert list(want["doc_id"]) == DRAWN and len(DRAWN) > 0
    _wreck_text(parquet, [g for g in range(GROUPS) if g not in HIT])
    got = _read(parquet, sample=(SHARE, SEED))
    assert got[["doc_id", "text", "shard"]].equals(want[["doc_id", "text", "shard"]])
    # The N-draw's read takes ids only: every id, no text column, nothing wrecked is read.
    ids = _read(parquet, ids_only=True)
    assert list(ids["doc_id"]) == IDS and "text" not in ids.columns
    # The wrecked chunks are unreadable: a whole read ends in the file's problem (a row the
    # scan raises, naming the file), so the sample did skip them.
    errors = _read(parquet)["_error"].dropna().tolist()
    assert len(errors) == 1
    assert errors[0].startswith(f"file {parquet.name} of shard crawl cannot be read to its end")
