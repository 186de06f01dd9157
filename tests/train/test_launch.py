"""Fine-tunes as Ray Tune trials: concurrent, resumable, and data-parallel with Ray Train."""

import json

import pandas as pd
import pytest

from mia_ray.train.config import FinetuneConfig
from mia_ray.train.launch import finished, train_members

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _jobs(tmp_path, test_world, members):
    from dataclasses import asdict

    texts = [f"snippet {i} " + "to be or not to be " * (1 + i % 3) for i in range(16)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    train = tmp_path / "train.parquet"
    pd.DataFrame(
        {
            "snippet_id": [f"s{i:02d}" for i in range(16)],
            "text": texts,
            "label": [i % 2 for i in range(16)],
        }
    ).to_parquet(train)
    spec = asdict(FinetuneConfig(lr=5e-3, batch_size=4, max_length=96))
    return [
        {
            "member": m,
            "base": test_world["model"],
            "train_file": str(train),
            "out_dir": str(tmp_path / m),
            "spec": spec,
            "device": "cpu",
            "dtype": "float32",
            "fingerprint": f"fp-{m}",
        }  # fmt: skip
        for m in members
    ]


def test_members_train_as_trials_and_a_rerun_trains_nothing(tmp_path, ray_local, test_world):
    jobs = _jobs(tmp_path, test_world, ["mcd", "ens-0", "ens-1"])
    logs = []
    records = train_members(jobs, tmp_path / "tune", cpus=1, log=logs.append)
    assert [r["member"] for r in records] == ["mcd", "ens-0", "ens-1"]
    assert all(finished(j) for j in jobs)
    assert [r["seed"] for r in records] == [0, 1, 2]
    assert all(r["steps"] == 4 for r in records)  # 16 snippets, batch 4, one epoch
    stamps = [
        (tmp_path / m / ".complete.json").stat().st_mtime_ns for m in ("mcd", "ens-0", "ens-1")
    ]
    again = train_members(jobs, tmp_path / "tune", cpus=1, log=logs.append)
    assert again == records and logs[-1] == "fine-tuning: 3 of 3 members already trained"
    assert [
        (tmp_path / m / ".complete.json").stat().st_mtime_ns for m in ("mcd", "ens-0", "ens-1")
    ] == stamps


def test_a_member_on_two_workers_trains_data_parallel_with_ray_train(
    tmp_path, ray_local, test_world
):
    jobs = _jobs(tmp_path, test_world, ["ens-3", "blob"])
    record, blob = train_members(jobs, tmp_path / "tune", cpus=0.5, workers=2)
    # Each step consumes a batch of 4 on both workers: 16 snippets take 2 steps, not 4.
    assert record["steps"] == 2 and record["n_train"] == 16 and record["world_size"] == 2
    saved = json.loads((tmp_path / "ens-3" / "adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 8 and saved["target_modules"] == ["c_attn"]
    # BLoB's KL step runs once per optimizer step: 2 steps an epoch, each weighs 1/2.
    assert blob["steps"] == 2 and blob["world_size"] == 2 and blob["kl_pi"] == 0.5


def test_a_ctrl_c_that_tune_does_not_catch_raises_and_the_handler_comes_back(monkeypatch):
    import signal

    from mia_ray.grid import interrupt_guard

    monkeypatch.delenv("TUNE_DISABLE_SIGINT_HANDLER", raising=False)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), interrupt_guard() as interrupted:
        assert not interrupted(returned=False)  # an error of fit() is no interruption
        signal.raise_signal(signal.SIGINT)  # (the real Ctrl-C through Tune: tests/pipelines)
    assert interrupted(returned=False)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_failing_member_fails_the_run_with_its_message(tmp_path, ray_local, test_world):
    from mia_ray.errors import MiaError

    (job,) = _jobs(tmp_path, test_world, ["mcd"])
    pd.DataFrame({"snippet_id": ["a", "b"], "text": ["x", "y"], "label": [1, 1]}).to_parquet(
        job["train_file"]
    )
    with pytest.raises(MiaError, match="needs snippets with both pseudo-labels 0 and 1"):
        train_members([job], tmp_path / "tune", cpus=1)


def test_with_storage_trials_get_urls_commit_there_and_the_driver_pulls_the_members(
    tmp_path, ray_local, test_world
):
    """A run with a storage workspace (no shared disk): the trial reads its snippets and base
    model from storage, commits adapter then done.json there, and --out gets a copy; the
    adapter is byte for byte the one a plain run trains, and a new driver with a new --out
    and the same storage retrains nothing."""
    from mia_ray import storage
    from mia_ray.storage import COMPLETE, Workspace, open_storage

    (plain,) = _jobs(tmp_path / "plain", test_world, ["ens-1"])
    (ref,) = train_members([plain], tmp_path / "plain" / "tune", cpus=1)

    out, store = tmp_path / "out", tmp_path / "store"
    (job,) = _jobs(out, test_world, ["ens-1"])
    storage.set_current(Workspace(out, str(store), distributed=True))
    try:
        (record,) = train_members([job], out / "tune", cpus=1)
    finally:
        storage.set_current(None)
    s = open_storage(str(store))
    assert s.read_json("ens-1/.complete.json") == record
    assert s.complete("ens-1/adapter")
    assert s.read_json(f"ens-1/adapter/{COMPLETE}")["content_sha256"] == record["adapter_sha256"]
    assert s.files("train.parquet") == {} and s.exists("train.parquet")  # pushed for the trial
    (staged,) = [n.split("/")[0] for n in s.files("inputs") if n.endswith(COMPLETE)]
    assert record["base"] == s.url(f"inputs/{staged}")  # the base model, staged by content
    assert record["node_id"] == ray_local.get_runtime_context().get_node_id()
    # Nothing the trial was given names a driver path of --out or the base model's folder.
    tune_files = [p for p in (store / "tune").rglob("*") if p.is_file()]
    assert any(p.name == "params.json" for p in tune_files)
    for p in tune_files:
        text = p.read_text(errors="replace")
        assert str(out) not in text and test_world["model"] not in text, p
    # --out holds the members as before: done.json and the adapter, pulled from storage.
    assert json.loads((out / "ens-1" / ".complete.json").read_text()) == record
    weights = "adapter/adapter_model.safetensors"
    assert (out / "ens-1" / weights).read_bytes() == (store / "ens-1" / weights).read_bytes()
    # Seeded: the same adapter and losses as the plain run's.
    assert (out / "ens-1" / weights).read_bytes() == (
        tmp_path / "plain" / "ens-1" / weights
    ).read_bytes()
    assert (record["first_loss"], record["final_loss"]) == (ref["first_loss"], ref["final_loss"])

    # A new driver, a new empty --out, the same storage: it pulls and retrains nothing.
    out2 = tmp_path / "out2"
    ws2 = Workspace(out2, str(store), distributed=True)
    ws2.pull()
    (job2,) = _jobs(out2, test_world, ["ens-1"])
    stamp = (store / "ens-1" / ".complete.json").stat().st_mtime_ns
    logs = []
    storage.set_current(ws2)
    try:
        (again,) = train_members([job2], out2 / "tune", cpus=1, log=logs.append)
    finally:
        storage.set_current(None)
    assert again == record and logs == ["fine-tuning: 1 of 1 members already trained"]
    assert (store / "ens-1" / ".complete.json").stat().st_mtime_ns == stamp
    assert (out2 / "ens-1" / weights).read_bytes() == (out / "ens-1" / weights).read_bytes()
