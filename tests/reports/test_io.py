import json
import math
import os

import numpy as np
import pytest

from mia_ray.reports.io import (
    read_json,
    to_jsonable,
    write_bytes,
    write_json,
    write_parquet,
    write_text,
)


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_json_keeps_order_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "report.json"  # parent folders are created
    write_json(path, {"zeta": 1, "alpha": 2, "mid": [1, 2]})
    assert _leftovers(path.parent) == []
    text = path.read_text()
    assert text.index('"zeta"') < text.index('"alpha"') < text.index('"mid"')
    assert text.endswith("\n") and '\n  "alpha": 2' in text  # indent 2
    assert read_json(path) == {"zeta": 1, "alpha": 2, "mid": [1, 2]}


def test_nan_and_inf_become_null_and_the_file_is_strict_json(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"auc": float("nan"), "ci": [np.nan, np.float32("inf")], "x": -math.inf})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=pytest.fail) == {
        "auc": None,
        "ci": [None, None],
        "x": None,
    }


def test_numpy_scalars_and_arrays_are_converted(tmp_path):
    obj = {
        "i": np.int64(3),
        "f": np.float32(0.5),
        "b": np.bool_(True),
        "arr": np.array([[1.0, np.nan], [2.0, 3.0]]),
        "ints": np.arange(3, dtype=np.int16),
        "tuple": (np.float64(1.5), "s"),
        np.int64(7): "numpy key",
        "path": tmp_path / "x",
    }
    path = tmp_path / "np.json"
    write_json(path, obj)
    back = read_json(path)
    assert back == {
        "i": 3,
        "f": 0.5,
        "b": True,
        "arr": [[1.0, None], [2.0, 3.0]],
        "ints": [0, 1, 2],
        "tuple": [1.5, "s"],
        "7": "numpy key",
        "path": str(tmp_path / "x"),
    }
    assert type(to_jsonable(np.float64(0.25))) is float
    assert type(to_jsonable(np.int32(2))) is int


def test_failed_write_keeps_the_old_file_and_removes_the_temp_file(tmp_path):
    path = tmp_path / "report.json"
    write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        write_json(path, {"v": object()})
    assert read_json(path) == {"v": 1}
    assert _leftovers(tmp_path) == []


def test_write_text_and_bytes_replace_atomically(tmp_path):
    path = tmp_path / "page.html"
    write_text(path, "first")
    write_text(path, "<p>é</p>\n")
    assert path.read_bytes() == "<p>é</p>\n".encode()
    write_bytes(tmp_path / "plot.png", b"\x89PNG")
    assert (tmp_path / "plot.png").read_bytes() == b"\x89PNG"
    assert _leftovers(tmp_path) == []


def test_written_files_follow_the_umask_not_owner_only(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_write_parquet_from_pandas_arrow_and_columns(tmp_path):
    pd = pytest.importorskip("pandas")
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    df = pd.DataFrame({"doc_id": ["a", "b"], "score": [0.1, 0.2]}, index=[5, 9])
    write_parquet(tmp_path / "df.parquet", df)
    back = pq.read_table(tmp_path / "df.parquet")
    assert back.column_names == ["doc_id", "score"]  # the index is dropped
    assert back.to_pydict() == {"doc_id": ["a", "b"], "score": [0.1, 0.2]}

    write_parquet(tmp_path / "t.parquet", pa.table({"x": [1, 2]}))
    write_parquet(tmp_path / "c.parquet", {"x": np.array([3, 4])})
    assert pq.read_table(tmp_path / "t.parquet").to_pydict() == {"x": [1, 2]}
    assert pq.read_table(tmp_path / "c.parquet").to_pydict() == {"x": [3, 4]}
    assert _leftovers(tmp_path) == []
    with pytest.raises(TypeError, match="pyarrow Table"):
        write_parquet(tmp_path / "bad.parquet", [1, 2])
