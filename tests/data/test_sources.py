"""Documents from anywhere Ray Data reads, in the formats corpora ship in: compressed JSON
Lines, WARC/WET (through fastwarc, the real parser), and object storage (moto's S3 server)."""

from __future__ import annotations

import gzip
import json
import logging

import pytest

from mia_ray.data.readers import read_documents
from mia_ray.data.sources import format_of, resolve_source, shard_sources
from mia_ray.errors import MiaError

DOCS = [
    {"id": "a", "text": "The first page, in plain ASCII."},
    {"id": "b", "text": "Zweite Seite: Grüße aus Köln\u2028with a line separator inside."},
    {"id": "c", "text": "Third page " * 40},
]


def _jsonl(docs=DOCS) -> bytes:
    return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()


def _zstd(data: bytes) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as f:
        f.write(data)
    return sink.getvalue().to_pybytes()


def _rows(ds) -> list[tuple[str, str]]:
    df = ds.to_pandas().sort_values("doc_id")
    return list(zip(df["doc_id"], df["text"], strict=True))


def test_formats_by_suffix_with_compression_aside():
    assert format_of("part-000.jsonl.zst") == "jsonl"
    assert format_of("c4-train.00001-of-01024.json.gz") == "jsonl"
    assert format_of("CC-MAIN-2024-10-000.warc.wet.gz") == "warc"
    assert format_of("crawl.warc.gz") == "warc"
    assert format_of("shard.parquet") == "parquet"
    assert format_of("notes.txt") == "text"
    assert format_of("blob.bin.gz") == "" and format_of("README") == ""


def test_compressed_json_lines_read_as_the_plain_file(ray_local, tmp_path):
    (tmp_path / "plain.jsonl").write_bytes(_jsonl())
    (tmp_path / "docs.jsonl.gz").write_bytes(gzip.compress(_jsonl()))
    (tmp_path / "docs.jsonl.zst").write_bytes(_zstd(_jsonl()))
    (tmp_path / "docs.json.gz").write_bytes(gzip.compress(_jsonl()))
    want = _rows(read_documents(tmp_path / "plain.jsonl"))
    assert want == [(d["id"], d["text"]) for d in DOCS]
    for name in ("docs.jsonl.gz", "docs.jsonl.zst", "docs.json.gz"):
        assert _rows(read_documents(tmp_path / name)) == want, name
    # A folder of compressed shards is jsonl; its doc_ids are the records' ids.
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "part-0.jsonl.zst").write_bytes(_zstd(_jsonl(DOCS[:2])))
    (shards / "part-1.jsonl.gz").write_bytes(gzip.compress(_jsonl(DOCS[2:])))
    assert resolve_source(shards).fmt == "jsonl"
    assert _rows(read_documents(shards)) == want
    # A bad line inside a compressed file is named by its line number, as in a plain one.
    (tmp_path / "bad.jsonl.gz").write_bytes(gzip.compress(_jsonl() + b"{oops\n"))
    with pytest.raises(MiaError, match=r"^line 4 of bad.jsonl.gz is not valid JSON"):
        read_documents(tmp_path / "bad.jsonl.gz")


def _pages():
    return [
        {"id": "p1", "text": "A page about rivers.\nIt has two lines."},
        {"id": "p2", "text": ""},  # a page without text: WET files hold such records
        {"id": "p3", "text": "Ünïcödé page with an e-mail: someone@example.org"},
    ]


def test_a_wet_file_of_the_demo_crawl_reads_through_fastwarc(ray_local, tmp_path):
    from mia_ray.demo.crawl import wet_record_id, wet_url, write_wet

    path = tmp_path / "CC-MAIN-demo-00000.warc.wet.gz"
    write_wet(_pages(), path)
    got = _rows(read_documents(path))
    # The conversion records' text, by WARC-Record-ID; the warcinfo record and the empty
    # page are not documents.
    assert got == sorted((wet_record_id(p["id"]), p["text"]) for p in _pages() if p["text"])
    by_url = _rows(read_documents(path, id_field="url"))
    assert [i for i, _ in by_url] == sorted(wet_url(p) for p in ("p1", "p3"))
    df = read_documents(path, group_field="host").to_pandas()
    assert set(df["group"]) == {wet_url(p).split("/")[2] for p in ("p1", "p3")}
    assert set(df["date"]) == {"2026-01-01T00:00:00Z"}
    with pytest.raises(MiaError, match=r"a WARC record's id is its WARC-Record-ID"):
        read_documents(path, id_field="doc")


def test_paths_that_do_not_resolve_say_why(tmp_path):
    with pytest.raises(MiaError, match=r"^data path not found: .*absent$"):
        resolve_source(tmp_path / "absent")
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(MiaError, match=r"^no files match .*\*\.parquet$"):
        resolve_source(tmp_path / "*.parquet")
    assert [rel for rel, _ in resolve_source(tmp_path / "*.jsonl").files] == ["a.jsonl"]
    (tmp_path / "blob.bin.gz").write_bytes(b"x")
    with pytest.raises(MiaError, match=r"cannot tell the format of .*blob.bin.gz from its suffix"):
        resolve_source(tmp_path / "blob.bin.gz")
    with pytest.raises(MiaError, match=r"mixes jsonl files with other files \(blob.bin.gz\)"):
        resolve_source(tmp_path)
    with pytest.raises(MiaError, match=r"^data format must be one of auto, text, jsonl, parquet"):
        resolve_source(tmp_path, "csv")


def test_a_symlinked_subfolder_is_read_and_a_link_loop_ends(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "b.txt").write_text("linked in")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("here")
    (docs / "linked").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "back").symlink_to(docs, target_is_directory=True)  # a loop
    src = resolve_source(docs)
    assert src.fmt == "text"
    assert src.rels == ["a.txt", "linked/b.txt"]


def test_a_bucket_that_fails_names_it_without_its_credentials(bucket):
    with pytest.raises(MiaError) as e:
        resolve_source(bucket("absent/").replace("corpus", "no-such-bucket"))
    assert "mia-secret" not in str(e.value) and "s3://***@no-such-bucket/absent/" in str(e.value)


@pytest.fixture(scope="module")
def bucket():
    """moto's S3 server on 127.0.0.1 with one bucket; URIs carry the endpoint and fake
    credentials (so Ray's read tasks, in other processes, reach it too)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    boto3.client(
        "s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
        aws_access_key_id="mia", aws_secret_access_key="mia-secret",
    ).create_bucket(Bucket="corpus")  # fmt: skip
    query = f"?endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    yield lambda key: f"s3://mia:mia-secret@corpus/{key}{query}"
    server.stop()


def _put(uri: str, data: bytes) -> None:
    from mia_ray.storage import filesystem_of

    fs, path = filesystem_of(uri)
    with fs.open_output_stream(path, compression=None) as f:  # the bytes as given
        f.write(data)


def test_a_corpus_in_a_bucket_reads_in_the_formats_it_ships_in(ray_local, bucket, tmp_path):
    from mia_ray.demo.crawl import wet_record_id, write_wet

    _put(bucket("dolma/part-0.jsonl.zst"), _zstd(_jsonl(DOCS[:2])))
    _put(bucket("dolma/part-1.json.gz"), gzip.compress(_jsonl(DOCS[2:])))
    _put(bucket("dolma/.hidden/x.jsonl"), b"not a shard")
    write_wet(_pages(), tmp_path / "w.warc.wet.gz")
    _put(bucket("cc/CC-MAIN-0.warc.wet.gz"), (tmp_path / "w.warc.wet.gz").read_bytes())
    _put(bucket("cc/CC-MAIN-1.warc.wet.gz"), (tmp_path / "w.warc.wet.gz").read_bytes())
    src = resolve_source(bucket("dolma"))
    assert src.remote and src.fmt == "jsonl"
    assert src.rels == ["part-0.jsonl.zst", "part-1.json.gz"]
    assert _rows(read_documents(bucket("dolma"))) == [(d["id"], d["text"]) for d in DOCS]
    got = _rows(read_documents(bucket("cc/CC-MAIN-0.warc.wet.gz")))
    assert [i for i, _ in got] == sorted(wet_record_id(p) for p in ("p1", "p3"))
    # A glob of WET files: one shard per file, named by its file name.
    shards = shard_sources([bucket("cc/*.warc.wet.gz")])
    assert [name for name, _ in shards] == ["CC-MAIN-0.warc.wet.gz", "CC-MAIN-1.warc.wet.gz"]
    assert _rows(read_documents(shards[1][1])) == got
    # The key of a file in a bucket: its name, size and time, not a pass over its bytes.
    assert shards[0][1].identity() != shards[1][1].identity()
    ((_, alone),) = shard_sources([bucket("cc/CC-MAIN-0.warc.wet.gz")])
    assert alone.identity() == shards[0][1].identity()
    with pytest.raises(MiaError, match=r"^data path not found: s3://\*\*\*@corpus/nope\?endpoint"):
        resolve_source(bucket("nope"))
    with pytest.raises(
        MiaError, match=r"^no files match s3://\*\*\*@corpus/cc/\*\.jsonl\?endpoint"
    ):
        resolve_source(bucket("cc/*.jsonl"))
    with pytest.raises(MiaError, match=r"^data path not found: s3://\*\*\*@elsewhere/x"):
        resolve_source(bucket("x").replace("@corpus/", "@elsewhere/"))


def test_a_sample_of_parquet_in_a_bucket_draws_what_the_local_copy_draws(
    ray_local, bucket, tmp_path
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mia_ray.data.readers import read_shards

    ids = [f"r{i:02d}" for i in range(40)]
    table = pa.table({"id": ids, "text": [f"Row {i}, all of it." for i in ids]})
    pq.write_table(table, tmp_path / "fw.parquet", row_group_size=10)
    _put(bucket("fineweb/fw.parquet"), (tmp_path / "fw.parquet").read_bytes())

    def drawn(path) -> list[str]:
        ds = read_shards([("fw", resolve_source(path))], sample=(0.3, "1"))
        return sorted(ds.to_pandas()["doc_id"])

    local = drawn(tmp_path / "fw.parquet")
    assert 0 < len(local) < 40
    assert drawn(bucket("fineweb/fw.parquet")) == local
