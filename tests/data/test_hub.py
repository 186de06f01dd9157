"""Benchmarks by their hub names (hf://datasets/...), read through `datasets.load_dataset`,
tested offline on folders written in the hub repositories' own layouts (WikiMIA's parquet
splits named in its card, BookMIA's one JSON Lines file)."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mia_ray.data.readers import read_documents
from mia_ray.errors import MiaError

CARD = """---
configs:
- config_name: default
  data_files:
  - split: WikiMIA_length32
    path: data/WikiMIA_length32-*
  - split: WikiMIA_length64
    path: data/WikiMIA_length64-*
---
# WikiMIA (a test copy in the hub's layout)
"""


def wikimia(root, rows32, rows64):
    """swj0419/WikiMIA's layout: a card naming the splits, one parquet file per split."""
    (root / "data").mkdir(parents=True)
    (root / "README.md").write_text(CARD)
    for name, rows in (("WikiMIA_length32", rows32), ("WikiMIA_length64", rows64)):
        table = pa.table({"input": [r[0] for r in rows], "label": [r[1] for r in rows]})
        pq.write_table(table, root / "data" / f"{name}-00000-of-00001-0a1b2c3d.parquet")
    return root


ROWS = [("The Eiffel Tower was finished in 1889.", 1), ("A 2024 storm named Zed.", 0),
        ("Paris is the capital of France.", 1)]  # fmt: skip


def _frame(ds):
    return ds.to_pandas().sort_values("doc_id").reset_index(drop=True)


def test_wikimia_by_hub_name_reads_a_split_with_labels(ray_local, tmp_path):
    root = wikimia(tmp_path / "WikiMIA", ROWS, [("Longer text " * 8, 0)] * 1)
    notes = []
    got = _frame(read_documents(f"hf://datasets/{root}", split="WikiMIA_length32",
                                text_field="input", note=notes.append))  # fmt: skip
    want = sorted(("text-" + hashlib.blake2b(t.encode(), digest_size=8).hexdigest(), t, y)
                  for t, y in ROWS)  # fmt: skip
    assert list(zip(got["doc_id"], got["text"], got["label"], strict=True)) == want
    assert notes and "no 'id' field, so each doc_id is a hash of the text" in notes[0]
    other = _frame(read_documents(f"hf://datasets/{root}", split="WikiMIA_length64",
                                  text_field="input"))  # fmt: skip
    assert len(other) == 1 and other["label"].tolist() == [0]


def test_bookmia_by_hub_name_keeps_ids_and_books(ray_local, tmp_path):
    root = tmp_path / "BookMIA"
    root.mkdir()
    rows = [{"book_id": 0, "book": "Dune.txt", "snippet_id": i, "snippet": f"Spice {i} flows.",
             "label": 1} for i in range(3)]  # fmt: skip
    rows.append({"book_id": 1, "book": "New.txt", "snippet_id": 9, "snippet": "Fresh.", "label": 0})
    (root / "book_data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = _frame(read_documents(f"hf://datasets/{root}", split="train", text_field="snippet",
                                id_field="snippet_id", group_field="book"))  # fmt: skip
    assert got["doc_id"].tolist() == ["0", "1", "2", "9"]
    assert got["group"].tolist() == ["Dune.txt"] * 3 + ["New.txt"]
    assert got["label"].tolist() == [1, 1, 1, 0]


def test_hub_errors_are_clear(ray_local, tmp_path):
    root = wikimia(tmp_path / "WikiMIA", ROWS, ROWS)
    path = f"hf://datasets/{root}"
    with pytest.raises(MiaError, match=r"name the split to read \(data.split\), e.g. train$"):
        read_documents(path, text_field="input")
    with pytest.raises(MiaError, match=rf"^cannot load {path} \(subset -, split nope\): "):
        read_documents(path, split="nope", text_field="input")
    with pytest.raises(
        MiaError, match=r"field 'text' not in .* split WikiMIA_length32; columns: input, label"
    ):
        read_documents(path, split="WikiMIA_length32")


def mimir(root, source, split, members, nonmembers, cache="cache_100_200_1000_512"):
    """iamgroot42/mimir's layout: its loading script, and per source and split one JSON
    string per line, members under train/, non-members under test/ (plus neighbour files,
    which the reader does not need)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "mimir.py").write_text("# the dataset's loading script, which datasets>=4 won't run\n")
    name = source if split == "none" else f"{source}_{split}"
    for part, texts in (("train", members), ("test", nonmembers)):
        (root / cache / part).mkdir(parents=True, exist_ok=True)
        (root / cache / part / f"{name}.jsonl").write_text(
            "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts)
        )
        (root / cache / f"{part}_neighbors").mkdir(exist_ok=True)
    return root


def test_mimir_by_hub_name_reads_members_and_nonmembers(ray_local, tmp_path):
    members = ['\\begin{abstract} We prove "it".\nTwo lines.', "def f():\n    return 1"]
    nonmembers = ["A later arXiv paper.", "Another one, ünïcode,\u2028a separator\x85."]
    root = mimir(tmp_path / "mimir", "arxiv", "ngram_13_0.8", members, nonmembers)
    mimir(root, "arxiv", "ngram_7_0.2", ["other"], ["cut"])
    got = _frame(read_documents(f"hf://datasets/{root}", subset="arxiv", split="ngram_13_0.8"))
    assert list(zip(got["doc_id"], got["text"], got["label"], strict=True)) == [
        ("member/0", members[0], 1), ("member/1", members[1], 1),
        ("nonmember/0", nonmembers[0], 0), ("nonmember/1", nonmembers[1], 0)]  # fmt: skip
    full = mimir(tmp_path / "full" / "mimir", "full_pile", "none", ["m"], ["n", "o"],
                 cache="cache_100_200_10000_512")  # fmt: skip
    got = _frame(read_documents(f"hf://datasets/{full}", subset="full_pile", split="none"))
    assert got["label"].tolist() == [1, 0, 0]


def test_mimir_errors_name_its_sources_and_splits(ray_local, tmp_path):
    root = mimir(tmp_path / "mimir", "github", "ngram_13_0.2", ["a"], ["b"])
    path = f"hf://datasets/{root}"
    with pytest.raises(MiaError, match=r"^MIMIR has no source 'Github' \(data.subset\); its "
                       r"sources: arxiv, dm_mathematics, github, "):  # fmt: skip
        read_documents(path, subset="Github", split="ngram_13_0.2")
    with pytest.raises(MiaError, match=r"^MIMIR's github has no split '' \(data.split\); its "
                       r"splits: ngram_7_0.2, ngram_13_0.2, ngram_13_0.8$"):  # fmt: skip
        read_documents(path, subset="github")
    with pytest.raises(MiaError, match=rf"^cannot load {path} \(subset github, split "
                       r"ngram_13_0.8\): "):  # fmt: skip
        read_documents(path, subset="github", split="ngram_13_0.8")
    bad = root / "cache_100_200_1000_512" / "test" / "github_ngram_13_0.2.jsonl"
    bad.write_text('"fine"\n{"text": "an object"}\n')
    with pytest.raises(MiaError, match=r"^cache_100_200_1000_512/test/github_ngram_13_0.2.jsonl "
                       r"line 2 in .* is not a JSON string: '\{\"text\": \"an object\"\}'$"):  # fmt: skip
        read_documents(path, subset="github", split="ngram_13_0.2")
