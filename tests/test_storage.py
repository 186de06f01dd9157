"""The storage layer (mia_ray/storage.py) on a local folder and on pyarrow's in-memory
filesystem (``mock://``, which goes through the same non-local code path as ``s3://``; a
real S3-compatible server is exercised in tests/cluster)."""

import time
import uuid
from pathlib import Path

import pytest

from mia_ray import storage
from mia_ray.config import ResourcesConfig
from mia_ray.errors import MiaError
from mia_ray.storage import COMPLETE, Workspace, localize, open_storage, redact


def _mock() -> str:
    return f"mock:///bucket-{uuid.uuid4().hex[:8]}/prefix"


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.mark.parametrize("kind", ["local", "mock"])
def test_storage_round_trip(tmp_path, kind):
    uri = str(tmp_path / "store") if kind == "local" else _mock()
    s = open_storage(uri)
    s.write_json("a/b.json", {"x": 1})
    assert s.read_json("a/b.json") == {"x": 1}
    assert s.exists("a") and s.exists("a/b.json") and not s.exists("a/c.json")
    src = _folder(tmp_path / "src", {"w.bin": b"\0\1\2", "sub/t.txt": b"hi"})
    digest = s.put_dir(src, "dir")
    assert s.files("dir") == {"w.bin": 3, "sub/t.txt": 2, COMPLETE: s.files("dir")[COMPLETE]}
    assert s.complete("dir") and s.read_json(f"dir/{COMPLETE}")["content_sha256"] == digest
    got = s.get_dir("dir", tmp_path / "back")
    assert (got / "w.bin").read_bytes() == b"\0\1\2" and (got / "sub/t.txt").read_text() == "hi"
    s.delete("dir")
    assert not s.exists("dir") and s.files("dir") == {}
    if kind == "local":
        # A local file is written through a temp file and a rename: no temp file is left.
        assert sorted(p.name for p in (tmp_path / "store" / "a").iterdir()) == ["b.json"]


def test_put_dir_digest_follows_content(tmp_path):
    s = open_storage(_mock())
    a = _folder(tmp_path / "a", {"w": b"1"})
    b = _folder(tmp_path / "b", {"w": b"1"})
    c = _folder(tmp_path / "c", {"w": b"2"})
    assert s.put_dir(a, "a") == s.put_dir(b, "b") != s.put_dir(c, "c")


def test_localize_copies_once_per_node_keyed_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("MIA_RAY_HOME", str(tmp_path / "home"))
    s = open_storage(_mock())
    s.put_dir(_folder(tmp_path / "m1", {"config.json": b"{}", "w": b"old"}), "adapter")
    first = localize(s.url("adapter"))
    assert Path(first).parent == tmp_path / "home" / "node-cache"
    assert (Path(first) / "w").read_bytes() == b"old"
    assert localize(s.url("adapter")) == first  # cached: the same folder
    # New weights at the same URL: a new content key, a new local copy (never the stale one).
    s.put_dir(_folder(tmp_path / "m2", {"config.json": b"{}", "w": b"new"}), "adapter")
    second = localize(s.url("adapter"))
    assert second != first and (Path(second) / "w").read_bytes() == b"new"
    # Hub names and local paths pass through.
    assert localize("EleutherAI/pythia-160m") == "EleutherAI/pythia-160m"
    assert localize(str(tmp_path)) == str(tmp_path)


def test_localize_refuses_a_folder_without_its_marker(tmp_path):
    s = open_storage(_mock())
    s.write_bytes("half/w", b"x")  # a copy that stopped before its marker
    with pytest.raises(MiaError, match=r"mock:///.*/half is not a complete folder in storage"):
        localize(s.url("half"))


def test_workspace_pushes_changes_and_a_new_driver_pulls_them(tmp_path):
    uri = _mock()
    out = _folder(
        tmp_path / "out",
        {"parts/part-00000.parquet": b"p0", "report.json": b"{}", "config.yaml": b"a: 1"},
    )
    (out / "previous").mkdir()
    (out / "previous" / "report.json").write_text("{}")
    ws = Workspace(out, uri, distributed=True)
    assert ws.mirrored
    assert ws.push() == 1  # the part only: report files and previous/ stay on the driver
    assert ws.push() == 0  # nothing changed
    (out / "parts" / "part-00001.parquet").write_bytes(b"p1")
    assert ws.push("parts") == 1
    assert sorted(ws.storage.files()) == ["parts/part-00000.parquet", "parts/part-00001.parquet"]
    # A new driver, on another machine, with an empty --out and the same storage.
    new = Workspace(tmp_path / "elsewhere", uri)
    assert new.pull() == 2
    assert (tmp_path / "elsewhere" / "parts" / "part-00001.parquet").read_bytes() == b"p1"
    assert new.pull() == 0 and new.push() == 0  # pulled files are not pushed back
    assert not (tmp_path / "elsewhere" / "report.json").exists()


def test_a_new_driver_leaves_the_scanners_parts_in_storage(tmp_path):
    """The leakage scanners' findings and per-document parts stay in storage (they can be a
    fifth of a corpus); the shard's marker and every other stage come to the new driver."""
    uri = _mock()
    ws = Workspace(tmp_path / "out", uri, distributed=True)
    for name in ("scan/s.jsonl/findings/part-a.parquet", "scan/s.jsonl/documents/part-a.parquet",
                 "leakage/scan/s.jsonl/findings/part-b.parquet", "scan/s.jsonl/.complete.json",
                 "rows/target/part-00000.parquet", "findings/part-c.parquet"):  # fmt: skip
        ws.storage.write_bytes(name, b"x")
    new = Workspace(tmp_path / "elsewhere", uri)
    assert new.pull() == 3
    got = sorted(p.relative_to(tmp_path / "elsewhere").as_posix()
                 for p in (tmp_path / "elsewhere").rglob("*") if p.is_file())  # fmt: skip
    assert got == ["findings/part-c.parquet", "rows/target/part-00000.parquet",
                   "scan/s.jsonl/.complete.json"]  # fmt: skip


def test_workspace_on_out_itself_is_a_no_op(tmp_path):
    out = _folder(tmp_path / "out", {"x/y": b"1"})
    ws = Workspace(out)
    assert not ws.mirrored and ws.push() == 0 and ws.pull() == 0
    assert ws.url("x/y") == str((out / "x" / "y").resolve())
    assert ws.url(out / "x" / "y") == ws.url("x/y")
    with pytest.raises(MiaError, match="is not inside the run folder"):
        ws.url(tmp_path / "elsewhere")


def test_stage_puts_a_driver_folder_once_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("MIA_RAY_HOME", str(tmp_path / "home"))
    model = _folder(tmp_path / "model", {"config.json": b"{}", "model.safetensors": b"w"})
    one_machine = Workspace(tmp_path / "out", _mock(), distributed=False)
    assert one_machine.stage(str(model)) == str(model)
    ws = Workspace(tmp_path / "out", _mock(), distributed=True)
    url = ws.stage(str(model))
    assert url.startswith("mock:///") and "/inputs/" in url
    assert ws.stage(str(model)) == url  # the same content: the same copy, not put again
    assert (Path(localize(url)) / "model.safetensors").read_bytes() == b"w"
    assert ws.stage("EleutherAI/pythia-160m") == "EleutherAI/pythia-160m"
    # On a shared mount the staged copy is a plain folder that every node opens in place.
    shared = Workspace(tmp_path / "out", str(tmp_path / "shared"), distributed=True)
    assert Path(shared.stage(str(model))).is_relative_to(tmp_path / "shared" / "inputs")


def test_module_helpers_outside_a_run_change_nothing(tmp_path):
    assert storage.current() is None
    assert storage.stage(str(tmp_path)) == str(tmp_path)
    assert storage.node_affinity() == {}
    storage.push(tmp_path)  # no run: nothing to do, no error


def test_redact_masks_user_info_and_credential_parameters():
    assert (
        redact("s3://AKIA:SECRET@bucket/p/q?secret_key=S&x=1")
        == "s3://***@bucket/p/q?secret_key=***&x=1"
    )
    assert redact("/mnt/efs/runs") == "/mnt/efs/runs"


def test_config_checks_storage_and_custom_resources():
    ResourcesConfig(storage="s3://bucket/prefix").validate()
    ResourcesConfig(storage="/mnt/efs/mia").validate()
    with pytest.raises(MiaError, match=r"unknown scheme 'ftp'"):
        ResourcesConfig(storage="ftp://host/x").validate()
    with pytest.raises(MiaError, match=r"s3:// names no bucket"):
        ResourcesConfig(storage="s3://").validate()
    with pytest.raises(MiaError, match=r"amounts > 0, not \{'gpu_node': 0\}"):
        ResourcesConfig(custom_resources={"gpu_node": 0}).validate()


def test_storage_that_cannot_open_is_one_line():
    with pytest.raises(MiaError, match=r"resources.storage nosuch://x cannot be opened"):
        open_storage("nosuch://x")


def test_gcs_gives_up_after_seconds_not_fifteen_minutes():
    """pyarrow's GCS client retries for 15 minutes by default, also a request that no
    credentials can authorize: the filesystem of any gs:// URI gets a 10 s limit unless the
    URI sets its own, and a bucket without credentials ends in the credentials message."""
    import datetime

    from mia_ray.data.sources import resolve_source
    from mia_ray.storage import GCS_RETRY_LIMIT_S, filesystem_of, with_retry_limit

    assert with_retry_limit("gs://b/p") == "gs://b/p?retry_limit_seconds=10"
    assert with_retry_limit("gs://b/p?x=1") == "gs://b/p?x=1&retry_limit_seconds=10"
    assert (
        with_retry_limit("gs://b/p?retry_limit_seconds=600") == "gs://b/p?retry_limit_seconds=600"
    )
    assert with_retry_limit("s3://b/p") == "s3://b/p"
    fs, _ = filesystem_of("gs://mia-ray-test-no-such-bucket/docs")
    limit = fs.__reduce__()[1][0]["retry_time_limit"]
    assert limit == datetime.timedelta(seconds=GCS_RETRY_LIMIT_S)
    # No credentials on this machine (and no network): refused, named, with the remedy; the
    # URI's own limit (1 s) wins over the default, and the refusal comes within seconds.
    started = time.monotonic()
    with pytest.raises(
        MiaError,
        match=r"^cannot read gs://mia-ray-test-no-such-bucket/docs\?retry_limit_seconds=1: the "
        r"storage refused this machine's credentials .* GOOGLE_APPLICATION_CRED",
    ):
        resolve_source("gs://mia-ray-test-no-such-bucket/docs?retry_limit_seconds=1")
    assert time.monotonic() - started < 2 * GCS_RETRY_LIMIT_S
