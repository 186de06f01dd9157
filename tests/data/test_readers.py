import datetime
import json

import pytest

from mia_ray.data.readers import attach_labels, load_manifest, read_documents
from mia_ray.errors import MiaError


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def write_jsonl(path, records, extra_lines=()):
    lines = [json.dumps(r, ensure_ascii=False) for r in records] + list(extra_lines)
    return write(path, "\n".join(lines) + "\n")


def write_parquet(path, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def rows_by_id(ds):
    return {r["doc_id"]: r for r in ds.take_all()}


# ---------------------------------------------------------------- driver-side checks (no Ray)


def test_driver_side_errors(tmp_path):
    with pytest.raises(MiaError, match=r"^data path not found: .*nope$"):
        read_documents(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    write(tmp_path / "empty" / ".hidden", "x")
    with pytest.raises(MiaError, match=r"^data directory .*empty has no files"):
        read_documents(tmp_path / "empty")
    write(tmp_path / "docs" / "a.txt", "hello")
    write(tmp_path / "docs" / "b.txt", "")
    with pytest.raises(MiaError, match=r"^document b.txt is empty$"):
        read_documents(tmp_path / "docs")
    with pytest.raises(MiaError, match=r"^data format must be"):
        read_documents(tmp_path / "docs", format="csv")
    with pytest.raises(MiaError, match=r"cannot tell the format"):
        read_documents(write(tmp_path / "x.csv", "a,b"))
    write_jsonl(tmp_path / "mixed" / "a.jsonl", [{"text": "t"}])
    write(tmp_path / "mixed" / "notes.md", "n")
    with pytest.raises(MiaError, match=r"mixes jsonl files with other files \(notes.md\)"):
        read_documents(tmp_path / "mixed")
    with pytest.raises(MiaError, match=r"has no parquet files"):
        read_documents(tmp_path / "mixed", format="parquet")


def test_missing_text_field_is_found_before_reading(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": 1, "body": "x", "label": 0}])
    with pytest.raises(
        MiaError, match=r"^field 'text' not in line 1 of d.jsonl; columns: id, body, label$"
    ):
        read_documents(path)
    pq_path = write_parquet(tmp_path / "p" / "d.parquet", {"id": ["a"], "body": ["x"]})
    with pytest.raises(MiaError, match=r"^field 'text' not in d.parquet; columns: id, body$"):
        read_documents(pq_path.parent)
    with pytest.raises(MiaError, match=r"^line 1 of bad.jsonl is not valid JSON"):
        read_documents(write(tmp_path / "bad.jsonl", "{oops\n"))


def test_load_manifest(tmp_path):
    path = write(tmp_path / "m.json", json.dumps({"a": 1, "b": False, "c": 0}))
    assert load_manifest(path) == {"a": 1, "b": 0, "c": 0}
    with pytest.raises(MiaError, match=r"^labels manifest not found"):
        load_manifest(tmp_path / "none.json")
    with pytest.raises(MiaError, match=r"is not valid JSON: .* \(line 1, column"):
        load_manifest(write(tmp_path / "bad.json", "{"))
    with pytest.raises(MiaError, match=r"must be a JSON object .* not a list"):
        load_manifest(write(tmp_path / "list.json", "[1]"))
    with pytest.raises(
        MiaError, match=r"the label of 'b' is 2; labels must be 0, 1, false or true"
    ):
        load_manifest(write(tmp_path / "two.json", '{"a": 1, "b": 2}'))
    with pytest.raises(MiaError, match=r"is empty$"):
        load_manifest(write(tmp_path / "empty.json", "{}"))


# ---------------------------------------------------------------- Ray reads


@pytest.mark.ray
def test_text_directory(ray_local, tmp_path):
    write(tmp_path / "a.txt", "first document\n")
    write(tmp_path / "sub" / "b.md", "\ufeffsecond one".encode())
    write(tmp_path / ".hidden", "skip me")
    write(tmp_path / ".git" / "config", "skip me too")
    ds = read_documents(tmp_path)
    assert ds.columns() == ["doc_id", "text"]
    rows = rows_by_id(ds)
    assert rows == {
        "a.txt": {"doc_id": "a.txt", "text": "first document\n"},
        "sub/b.md": {"doc_id": "sub/b.md", "text": "second one"},
    }


@pytest.mark.ray
def test_jsonl_file_and_directory(ray_local, tmp_path):
    records = [
        {"id": 1, "text": "alpha\u2028beta", "label": True, "date": "2023-01-01"},
        {"id": "two", "text": "gamma", "label": 0},
    ]
    write_jsonl(tmp_path / "one" / "docs.jsonl", records, extra_lines=["", "  "])
    ds = read_documents(tmp_path / "one" / "docs.jsonl")
    assert ds.columns() == ["doc_id", "text", "label", "date"]
    rows = rows_by_id(ds)
    assert rows["1"] == {"doc_id": "1", "text": "alpha\u2028beta", "label": 1, "date": "2023-01-01"}
    assert rows["two"] == {"doc_id": "two", "text": "gamma", "label": 0, "date": None}
    # a directory of shards, custom field names, no id -> hash ids, writer markers ignored
    write_jsonl(tmp_path / "many" / "part-0.jsonl", [{"body": "x y"}])
    write_jsonl(tmp_path / "many" / "sub" / "part-1.jsonl", [{"body": "z"}])
    write(tmp_path / "many" / "_SUCCESS", "")
    notes = []
    rows = rows_by_id(read_documents(tmp_path / "many", text_field="body", note=notes.append))
    assert sorted(r["text"] for r in rows.values()) == ["x y", "z"]
    assert all(d.startswith("text-") and len(d) == 21 for d in rows)
    assert notes == [
        f"{tmp_path / 'many'}: its records have no 'id' field, so each doc_id is a hash of the "
        "text (text-...); set data.id_field to the field that holds the ids"
    ]
    # An id field named on purpose that the records lack is a typo, not a cue to hash.
    with pytest.raises(
        MiaError,
        match=r"^id field 'uuid' \(data.id_field\) is not in the first record of part-0.jsonl",
    ):
        read_documents(tmp_path / "many", text_field="body", id_field="uuid")


@pytest.mark.ray
def test_parquet_file(ray_local, tmp_path):
    import pyarrow as pa

    path = write_parquet(
        tmp_path / "d.parquet",
        {
            "doc": ["a", "b"],
            "text": ["one", "two"],
            "member": pa.array([True, False]),
            "when": pa.array([datetime.date(2020, 1, 2), None], pa.date32()),
            "unused": [1, 2],
        },
    )
    ds = read_documents(path, id_field="doc", label_field="member", date_field="when")
    assert ds.columns() == ["doc_id", "text", "label", "date"]
    assert rows_by_id(ds) == {
        "a": {"doc_id": "a", "text": "one", "label": 1, "date": "2020-01-02"},
        "b": {"doc_id": "b", "text": "two", "label": 0, "date": None},
    }


BAD_INPUTS = {
    "whitespace": ("docs/w.txt", b" \n\t ", r"^document w.txt is empty$"),
    "binary": ("docs/img.bin", b"GIF\x00\x01", r"^document img.bin looks binary"),
    "utf8": (
        "docs/u.txt",
        b"caf\xc3\xa9 \xff!",
        r"^document u.txt is not valid UTF-8 \(byte offset 6\)$",
    ),
    "duplicate": (
        "d.jsonl",
        b'{"id": "x", "text": "a"}\n{"id": "x", "text": "b"}\n',
        r"^duplicate doc_ids in .*: 1 ids appear more than once: x$",
    ),
    "label": (
        "d.jsonl",
        b'{"id": "x", "text": "a", "label": 2}\n',
        r"^label of document x is 2; labels must be 0 or 1$",
    ),
    "json": (
        "d.jsonl",
        b'{"id": "x", "text": "a"}\n{"id": "y", "text": "b"}\n{"id": "z", text}\n',
        r"^line 3 of d.jsonl is not valid JSON: .*\(column 13\)$",
    ),
}


@pytest.mark.ray
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_documents(ray_local, tmp_path, case):
    rel, data, message = BAD_INPUTS[case]
    path = write(tmp_path / rel, data)
    if rel.startswith("docs/"):
        write(tmp_path / "docs" / "good.txt", "fine")
        path = path.parent
    with pytest.raises(MiaError, match=message):
        read_documents(path)


@pytest.mark.ray
def test_parquet_bad_label_and_attach_labels(ray_local, tmp_path):
    path = write_parquet(
        tmp_path / "d.parquet", {"id": ["a", "b"], "text": ["x", "y"], "label": [1, 5]}
    )
    with pytest.raises(MiaError, match=r"^label of document b is 5; labels must be 0 or 1$"):
        read_documents(path)
    path = write_parquet(
        tmp_path / "ok.parquet",
        {"id": ["a", "b", "c"], "text": ["x", "y", "z"], "label": [1, 1, 1]},
    )
    ds = read_documents(path)
    labelled = attach_labels(ds, {"a": 0, "b": 1, "c": 0, "zzz": 1})
    assert {r["doc_id"]: r["label"] for r in labelled.take_all()} == {"a": 0, "b": 1, "c": 0}
    with pytest.raises(
        MiaError,
        match=r"^labels manifest lacks 2 of 3 documents: b, c \(set data.unlabelled=skip to "
        r"leave unlabelled documents out\)$",
    ):
        attach_labels(ds, {"a": 1})
    # A manifest that picks its documents out of a larger corpus (a demo target's sample).
    picked = attach_labels(ds, {"a": 1, "c": 0}, unlabelled="skip")
    assert {r["doc_id"]: r["label"] for r in picked.take_all()} == {"a": 1, "c": 0}
    with pytest.raises(
        MiaError,
        match=r"^labels manifest names none of the 3 documents \(its ids look like zzz, the "
        r"documents' like a, b, \.\.\.\)$",
    ):
        attach_labels(ds, {"zzz": 1}, unlabelled="skip")
    # Manifest entries the data lacks are left out, and said so.
    notes = []
    attach_labels(ds, {"a": 0, "b": 1, "c": 0, "zzz": 1, "yyy": 0}, note=notes.append)
    assert notes == [
        "labels manifest names 2 of its 5 documents that the data does not have (yyy, zzz); "
        "they are left out"
    ]


# ---------------------------------------------------------------- group_field


def test_group_field_errors_before_reading(tmp_path):
    write_jsonl(
        tmp_path / "d.jsonl", [{"id": "a", "text": "x"}, {"id": "b", "text": "y", "book": 1}]
    )
    with pytest.raises(MiaError) as e:
        read_documents(tmp_path / "d.jsonl", group_field="book")
    assert (
        str(e.value)
        == "group field 'book' (data.group_field) is not in the first record of d.jsonl"
    )
    write_parquet(tmp_path / "p" / "d.parquet", {"id": ["a"], "text": ["x"]})
    with pytest.raises(MiaError) as e:
        read_documents(tmp_path / "p", group_field="book")
    assert (
        str(e.value) == "group field 'book' (data.group_field) is not in the columns of d.parquet"
    )
    write(tmp_path / "docs" / "a.txt", "hello")
    with pytest.raises(MiaError) as e:
        read_documents(tmp_path / "docs", group_field="book")
    assert str(e.value) == (
        "data.group_field 'book': a folder of text files has no fields; use \"folder\" to group "
        "files by their parent folder"
    )


@pytest.mark.ray
def test_group_field(ray_local, tmp_path):
    import pyarrow as pa

    records = [
        {"id": "a", "text": "one", "book": "hamlet"},
        {"id": "b", "text": "two", "book": 7},
        {"id": "c", "text": "three", "book": "hamlet"},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", records)
    ds = read_documents(path, group_field="book")
    assert ds.columns() == ["doc_id", "text", "group"]
    assert {d: r["group"] for d, r in rows_by_id(ds).items()} == {
        "a": "hamlet",
        "b": "7",
        "c": "hamlet",
    }
    assert read_documents(path).columns() == ["doc_id", "text"]  # no group_field, no group
    # A record without a value fails as one without an id does, all problems counted.
    bad = [records[0], {"id": "b", "text": "x"}, {"id": "c", "text": "y", "book": None}]
    bad.append({"id": "d", "text": "z", "book": ""})
    with pytest.raises(MiaError) as e:
        read_documents(write_jsonl(tmp_path / "bad.jsonl", bad), group_field="book")
    assert str(e.value) == (
        "document b has no group field 'book' (data.group_field) (and 2 more problems)"
    )

    path = write_parquet(
        tmp_path / "d.parquet",
        {"id": ["a", "b"], "text": ["x", "y"], "label": [1, 0], "book": [3, 4]},
    )
    ds = read_documents(path, group_field="book")
    assert ds.columns() == ["doc_id", "text", "label", "group"]
    assert rows_by_id(ds) == {
        "a": {"doc_id": "a", "text": "x", "label": 1, "group": "3"},
        "b": {"doc_id": "b", "text": "y", "label": 0, "group": "4"},
    }
    assert read_documents(path).columns() == ["doc_id", "text", "label"]
    path = write_parquet(
        tmp_path / "n.parquet",
        {"id": ["a", "b"], "text": ["x", "y"], "book": pa.array(["s", None], pa.string())},
    )
    with pytest.raises(MiaError) as e:
        read_documents(path, group_field="book")
    assert str(e.value) == "document b has no group field 'book' (data.group_field)"

    docs = tmp_path / "docs"
    write(docs / "hamlet" / "act1.txt", "to be")
    write(docs / "hamlet" / "act2.txt", "or not")
    write(docs / "plays" / "lear" / "act1.txt", "nothing")
    write(docs / "sonnet.txt", "shall I")
    ds = read_documents(docs, group_field="folder")
    assert ds.columns() == ["doc_id", "text", "group"]
    assert {d: r["group"] for d, r in rows_by_id(ds).items()} == {
        "hamlet/act1.txt": "hamlet",
        "hamlet/act2.txt": "hamlet",
        "plays/lear/act1.txt": "plays/lear",
        "sonnet.txt": "sonnet.txt",  # a file at the top is its own group
    }
    assert read_documents(docs).columns() == ["doc_id", "text"]
