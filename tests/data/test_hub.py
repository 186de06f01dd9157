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
