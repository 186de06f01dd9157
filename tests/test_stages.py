"""The stage layer: reuse by key, recompute on another key, markers last, storage, manifest,
and rows kept when a pass is interrupted."""

import json
import time
import uuid

import pandas as pd
import pytest
import ray

from mia_ray import stages, storage


def _count(calls, value):
    def compute(*_):
        calls.append(1)
        return value

    return compute


def test_json_and_frame_stages_reuse_their_key_and_recompute_another(tmp_path, capsys):
    calls = []
    assert stages.json_stage(tmp_path, "a/b", "k1", _count(calls, {"x": 1})) == {"x": 1}
    assert stages.json_stage(tmp_path, "a/b", "k1", _count(calls, {"x": 2}), "reused") == {"x": 1}
    assert "reused" in capsys.readouterr().err
    assert stages.json_stage(tmp_path, "a/b", "k2", _count(calls, {"x": 3})) == {"x": 3}
    assert len(calls) == 2
    marker = json.loads((tmp_path / "a" / "b" / ".complete.json").read_text())
    assert marker["key"] == "k2" and marker["kind"] == "json" and marker["complete"]
    frame = pd.DataFrame({"v": [0.1, 0.2]})
    got = stages.frame_stage(tmp_path, "f", "k", _count(calls, frame))
    pd.testing.assert_frame_equal(got, frame)
    stages.frame_stage(tmp_path, "f", "k", _count(calls, None))  # not computed again
    assert len(calls) == 3


def test_a_folder_without_its_marker_is_computed_afresh(tmp_path):
    """A computation stopped half-way leaves files but no marker: never reused."""

    def fill(d):
        (d / "half.bin").write_bytes(b"x")
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):
        stages.folder_stage(tmp_path, "m", "k", fill)
    assert (tmp_path / "m" / "half.bin").exists() and stages.marker(tmp_path / "m") is None

    def full(d):
        (d / "model.bin").write_bytes(b"weights")
        return {"steps": 3}

    path, marker = stages.folder_stage(tmp_path, "m", "k", full)
    assert sorted(p.name for p in path.iterdir()) == [".complete.json", "model.bin"]
    assert marker["steps"] == 3 and stages.holds(marker, "k") and not stages.holds(marker, "j")


def test_stages_go_to_storage_and_a_new_driver_reuses_them(tmp_path):
    """With storage elsewhere (pyarrow's in-memory mock://), a stage is pushed with its
    marker and recorded in the manifest; a driver with an empty --out and the same storage
    pulls it and computes nothing."""
    uri = f"mock:///bucket-{uuid.uuid4().hex[:8]}/run"
    first = storage.Workspace(tmp_path / "one", uri, distributed=True)
    storage.set_current(first)
    try:
        stages.json_stage(first.local, "probes/l1", "k", lambda: [1, 2])
    finally:
        storage.set_current(None)
    assert set(first.storage.files()) == {"probes/l1/value.json", "probes/l1/.complete.json"}
    manifest = json.loads((first.local / "manifest.json").read_text())
    assert manifest["run"] == first.run_id
    assert manifest["stages"]["probes/l1"] == {"key": "k", "kind": "json", "reused": False}
    second = storage.Workspace(tmp_path / "two", uri, distributed=True)
    storage.set_current(second)
    try:
        assert stages.json_stage(second.local, "probes/l1", "k", _count([], None)) == [1, 2]
    finally:
        storage.set_current(None)
    manifest = json.loads((second.local / "manifest.json").read_text())
    assert manifest["stages"]["probes/l1"]["reused"] is True


def test_remote_folder_stage_commits_in_storage_and_is_pulled(tmp_path):
    uri = f"mock:///bucket-{uuid.uuid4().hex[:8]}/run"
    ws = storage.Workspace(tmp_path / "out", uri, distributed=True)
    launched = []

    def launch(root, rel, marker):  # what a task on another node does
        launched.append(rel)
        src = tmp_path / "node-tmp"
        src.mkdir(exist_ok=True)
        (src / "config.json").write_text("{}")
        storage.open_storage(root).put_dir(src, rel, marker)

    storage.set_current(ws)
    try:
        path, marker = stages.remote_folder_stage(ws.local, "models/ft", "k1", launch)
        again, _ = stages.remote_folder_stage(ws.local, "models/ft", "k1", launch)
        assert launched == ["models/ft"] and (path / "config.json").is_file()
        assert marker["key"] == "k1" and "content_sha256" in marker
        stages.remote_folder_stage(ws.local, "models/ft", "k2", launch)
        assert launched == ["models/ft", "models/ft"]
    finally:
        storage.set_current(None)


def test_a_stage_committed_by_hand_on_a_node_is_found_by_its_key_only(tmp_path):
    # What train/ does for a CopyCheck member: on the node's disk and in storage alike.
    info = stages.record("member-0", "k1", "folder", {"final_loss": 0.5})
    assert stages.done_at(tmp_path / "m", "k1") is None
    assert stages.commit_at(tmp_path / "m", info) == info
    assert (
        stages.done_at(tmp_path / "m", "k1") == info
        and stages.done_at(tmp_path / "m", "k2") is None
    )
    half = {**info, "complete": False}
    stages.commit_at(tmp_path / "h", half)
    assert stages.done_at(tmp_path / "h", "k1") is None  # written, but not a finished stage
    store = storage.open_storage(f"mock:///bucket-{uuid.uuid4().hex[:8]}/member")
    assert stages.done(store, "", "k1") is None
    stages.commit_record(store, "", info)
    assert stages.done(store, "", "k1") == info and stages.done(store, "", "k2") is None


def test_a_push_cut_short_never_leaves_a_marker_without_its_files(tmp_path, monkeypatch):
    """A node lost while it pushes a stage (the cluster's MemHunter cell): storage holds a
    marker only once every file of its folder is there, so a new driver computes the stage
    afresh instead of reusing a folder with its table missing."""
    uri = f"mock:///bucket-{uuid.uuid4().hex[:8]}/run"
    first = storage.Workspace(tmp_path / "one", uri, distributed=True)
    put = storage.Storage.put_file

    def dies_after_one(self, local, rel):
        if self.files():
            raise ConnectionError("node lost")
        put(self, local, rel)

    monkeypatch.setattr(storage.Storage, "put_file", dies_after_one)
    storage.set_current(first)
    try:
        with pytest.raises(ConnectionError, match="node lost"):
            stages.frame_stage(
                first.local, "hunter/search-01", "k", lambda: pd.DataFrame({"mu": [0.5]})
            )
    finally:
        storage.set_current(None)
    assert set(first.storage.files()) == {"hunter/search-01/frame.parquet"}
    monkeypatch.setattr(storage.Storage, "put_file", put)
    second = storage.Workspace(tmp_path / "two", uri, distributed=True)
    storage.set_current(second)
    try:
        got = stages.frame_stage(
            second.local, "hunter/search-01", "k", lambda: pd.DataFrame({"mu": [0.7]})
        )
    finally:
        storage.set_current(None)
    assert list(got["mu"]) == [0.7]
    assert set(second.storage.files()) == {
        "hunter/search-01/frame.parquet",
        "hunter/search-01/.complete.json",
    }


class _Interrupted:
    """A mapper's output whose stream stops with Ctrl-C after its first block."""

    def __init__(self, rows):
        self.rows = rows

    def iter_batches(self, **_):
        time.sleep(0.3)  # the first run's work, which its marker counts
        yield self.rows.iloc[:3].assign(loss=1.0)
        raise KeyboardInterrupt


@pytest.mark.ray
def test_rows_that_arrived_before_an_interrupt_are_kept(tmp_path, ray_local, capsys):
    rows = pd.DataFrame({"snippet_id": [f"s{i}" for i in range(6)], "text": ["t"] * 6})
    inputs = {"model": "m"}
    with pytest.raises(KeyboardInterrupt):
        stages.parts_stage(tmp_path, "rows/target", rows, lambda ds: _Interrupted(rows), 2,
                           inputs=inputs)  # fmt: skip
    parts = sorted((tmp_path / "rows" / "target").glob("part-*.parquet"))
    assert len(parts) == 1 and len(pd.read_parquet(parts[0])) == 3
    marker = stages.marker(tmp_path / "rows" / "target")
    key = stages.parts_key(rows, 2, inputs)
    assert marker["key"] == key and not marker["complete"]
    first = marker["seconds"]
    assert first >= 0.3
    seen = []

    def score(ds):  # the rest, scored for real through Ray Data
        def one(b):
            time.sleep(0.3)
            return b.assign(loss=2.0)

        got = ds.map_batches(one, batch_format="pandas").to_pandas()
        seen.extend(sorted(zip(got["_batch"], got["snippet_id"], strict=True)))
        return ray.data.from_pandas(got)

    got = stages.parts_stage(tmp_path, "rows/target", rows, score, 2, inputs=inputs)
    assert "target: reusing 3 of 6 rows" in capsys.readouterr().err
    # s2's batch was cut by the interrupt: it is scored again whole, with its mate s3, so
    # s2's numbers are those of an uninterrupted run; the part's row of s2 is the one kept.
    assert seen == [(1, "s2"), (1, "s3"), (2, "s4"), (2, "s5")]
    assert sorted(got["snippet_id"]) == list(rows["snippet_id"])
    assert got.set_index("snippet_id")["loss"].to_dict() == {
        "s0": 1.0, "s1": 1.0, "s2": 1.0, "s3": 2.0, "s4": 2.0, "s5": 2.0,
    }  # fmt: skip
    assert stages.holds(stages.marker(tmp_path / "rows" / "target"), key)
    # The pass's seconds are both runs': a resumed run reports the whole pass.
    assert stages.stage_seconds(tmp_path / "rows" / "target") >= first + 0.3


def test_a_parts_key_follows_the_rows_content_the_batch_size_and_the_inputs():
    rows = pd.DataFrame({"snippet_id": ["a", "b", "c"], "text": ["x", "yy", "zzz"]})
    key = stages.parts_key(rows, 2, {"model": "m"})
    assert stages.parts_key(rows.iloc[::-1], 2, {"model": "m"}) == key  # order is no input
    assert stages.parts_key(rows, 3, {"model": "m"}) != key  # other batch mates, other bits
    assert stages.parts_key(rows, 2, {"model": "n"}) != key
    assert stages.parts_key(rows.assign(text=["x", "yy", "zz"]), 2, {"model": "m"}) != key
    assert stages.parts_key(rows.iloc[:2], 2, {"model": "m"}) != key
    # Every column the mapper may read is content (a LUMIA image path, say), lists too.
    assert stages.parts_key(rows.assign(image=["p", "q", "r"]), 2, {"model": "m"}) != key
    listed = rows.assign(ids=[[1], [2], [3]])
    assert stages.parts_key(listed, 2, {}) != stages.parts_key(
        listed.assign(ids=[[1], [2], [4]]), 2, {}
    )
