"""CopyCheck on the 3-node cluster, whose workers do not see the driver's disk.

The test world and every run folder sit in the cluster's ``data`` and ``runs`` folders, which
the workers do not see: a trial finds its training snippets and base model, and a sampler its
adapters, only through storage. Every fine-tuning trial, sampler actor and the ``members``
placement group asks for ``mia_worker``, so all the model work runs on the two workers. Each
run's report must give exactly the numbers of a one-node run of the same config (this pytest
process, its local Ray instance): every member is seeded and every prediction is seeded per
snippet, on the same thread counts.

Scale: one experiment (10 suspected files, 4 of them unseen, 8 surely-unseen files, 2
snippets of 48 words each), three members (MC dropout and a 2-member ensemble) of 9 steps,
4 MC-dropout passes, no probability baseline (the Scorer's staging is tested with the attack
pipeline).
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from mia_ray.cli import main

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster

EXPERIMENT = "n4"
MEMBERS = ["mcd", "ens-0", "ens-1"]
CONFIG = [
    "--set", "world.scale=test",
    "--set", "experiment.n_suspected=10", "--set", "experiment.n_unseen=8",
    "--set", "experiment.n_unseen_in_suspected=[4]",
    "--set", "uncertainty.samplers=[mcd,ensemble]", "--set", "uncertainty.ensemble_size=2",
    "--set", "uncertainty.n_samples=4",
    # one sampler actor per ensemble member, SPREAD over the nodes by a placement group
    "--set", "uncertainty.placement=members", "--set", "resources.sampler.cpus=0.5",
    "--set", "data.snippet_size=48", "--set", "data.max_snippets_per_doc=2",
    "--set", "finetune.max_length=128", "--set", "finetune.lr=1e-3",
    "--set", "detect.baselines=[]",
]  # fmt: skip
ON_WORKERS = ["--set", "resources.custom_resources={mia_worker: 1}"]


def _args(world: Path, out: Path, *extra: str) -> list[str]:
    return [
        "copycheck", "--config", "jobs/copycheck_demo.yaml", "--set", f"world.root={world}",
        *CONFIG, *extra, "--out", str(out),
    ]  # fmt: skip


def _numbers(report: dict) -> dict:
    """Everything in the report that is computed from the fine-tunes and the samples."""
    cols = ("experiment", "member", "seed", "n_train", "steps", "first_loss", "final_loss")
    return {
        **{k: report[k] for k in ("data", "results", "summary", "files", "blind_baseline")},
        "diagnostics": report["diagnostics"],
        "finetune": [{k: r[k] for k in cols} for r in report["finetune"]["records"]],
        "blob_kl_pi": report["finetune"]["blob_kl_pi"],
    }


def _predictions(out: Path) -> pd.DataFrame:
    df = pd.read_parquet(out / "uncertainty.parquet")
    return df.sort_values("snippet_id").reset_index(drop=True)


@pytest.fixture(scope="module")
def one_node(ray_local, world, tmp_path_factory) -> tuple[Path, dict]:
    """The same config in this process on the session's local Ray (one node, storage --out)."""
    out = tmp_path_factory.mktemp("copycheck-one") / "run"
    assert main(_args(world, out)) == 0
    return out, json.loads((out / "report.json").read_text())


def _same_as_one_node(out: Path, one_node) -> dict:
    out1, one = one_node
    report = json.loads((out / "report.json").read_text())
    # Attached to the cluster (its node count depends on whether a killed node is listed).
    assert report["runtime"]["mode"] != "local" and report["runtime"]["nodes"] >= 2
    # Exactly: the same adapters (seeded members) and predictions (seeded per snippet).
    assert _numbers(report) == _numbers(one)
    pd.testing.assert_frame_equal(_predictions(out), _predictions(out1), check_exact=True)
    return report


def _records(out: Path) -> dict[str, dict]:
    """Each member's done record, as the driver pulled it into ``--out``."""
    return {
        m: json.loads((out / "train" / EXPERIMENT / m / ".complete.json").read_text())
        for m in MEMBERS
    }


def _placement_groups(cluster) -> dict[str, dict]:
    from ray.util.state import list_placement_groups

    rows = list_placement_groups(
        address=cluster.dashboard_url, limit=10000, detail=True, raise_on_missing_output=False
    )
    return {g.placement_group_id: g for g in rows}


def _wait(what: str, check, driver, timeout: float = 300, every: float = 0.2):
    """Poll ``check()`` until it returns something truthy (while the driver runs)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        if driver.proc.poll() is not None:
            break
        time.sleep(every)
    raise AssertionError(f"never saw {what}:\n{driver.log[-4000:]}")


def test_on_both_workers_a_killed_driver_and_a_new_driver_give_the_one_node_numbers(
    cluster, world, one_node
):
    """(a) Storage in the shared folder: the trials read their snippets and the staged base
    model from it and commit their adapters to it, on both workers; the samplers localize
    the adapters there. (d) The driver is SIGKILLed once a member is committed; a new driver
    with a new, empty --out and the same storage keeps every committed member (not trained
    again), trains the others and ends with the one-node numbers. (One run for both: the
    resumed run is a whole CopyCheck run on the cluster.)"""
    before_actors = set(cluster.actors("Sampler"))
    before_pgs = set(_placement_groups(cluster))
    storage = cluster.shared / f"cc-{uuid.uuid4().hex[:8]}"
    first = cluster.runs / f"cc-{uuid.uuid4().hex[:8]}"
    with_storage = [*ON_WORKERS, "--set", f"resources.storage={storage}"]
    driver = cluster.spawn_driver(_args(world, first, *with_storage))
    members = storage / "train" / EXPERIMENT
    try:
        _wait("a committed member", lambda: list(members.glob("*/.complete.json")), driver)
        driver.proc.kill()
        driver.finish(timeout=60)
    finally:
        if driver.proc.poll() is None:
            driver.proc.kill()
    assert re.search(r"staged \S+/models/tiny in storage", driver.log), driver.log[-4000:]
    time.sleep(3)  # Ray ends the dead driver's trials
    kept = {
        p.parent.name: (p.read_bytes(), p.stat().st_mtime_ns)
        for p in members.glob("*/.complete.json")
    }
    assert kept and not (first / "report.json").exists()

    out = cluster.runs / f"cc-resumed-{uuid.uuid4().hex[:8]}"
    r = cluster.run_driver(_args(world, out, *with_storage), timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    assert re.search(r"resumed \d+ files from storage", r.stderr), r.stderr[-4000:]
    n = len(MEMBERS)
    assert f"fine-tuning: {len(kept)} of {n} members already trained" in r.stderr, r.stderr
    if len(kept) < n:
        assert f"fine-tuning {n - len(kept)} members as Ray Tune trials" in r.stderr
    else:
        assert "as Ray Tune trials" not in r.stderr
    # The committed members were not trained again: their done records are untouched.
    for m, (data, mtime) in kept.items():
        p = members / m / ".complete.json"
        assert (p.read_bytes(), p.stat().st_mtime_ns) == (data, mtime), m
    _same_as_one_node(out, one_node)

    # The trials ran on the workers (not one on the head), on both of them: the three the
    # first driver started at once (at most two fit on a worker) and those of the second.
    records = _records(out)
    where = {m: rec["node_id"] for m, rec in records.items()}
    assert set(where.values()) <= cluster.worker_ids(), where
    started = {a["node_id"] for rec in records.values() for a in rec["attempts"]}
    assert started == cluster.worker_ids(), records
    for m, rec in records.items():
        # Committed to storage: the adapter whole (its marker), then the member's marker; --out a copy.
        assert json.loads((members / m / ".complete.json").read_text()) == rec
        marker = json.loads((members / m / "adapter" / ".complete.json").read_text())
        assert marker["content_sha256"] == rec["adapter_sha256"]
        starts = [a["node_id"] for a in rec["attempts"]]
        assert starts[-1] == rec["node_id"], starts
        if m in kept:  # started once: the new driver did not train it again
            assert len(starts) == 1, starts
    # The samplers ran on the workers; the ensemble's two actors one on each (SPREAD) ...
    samplers = {a: n for a, n in cluster.actors("Sampler").items() if a not in before_actors}
    assert len(samplers) == 3 and set(samplers.values()) == cluster.worker_ids(), samplers
    # ... from a placement group whose bundles hold the custom resource the actors ask for.
    groups = [g for i, g in _placement_groups(cluster).items() if i not in before_pgs]
    members_pg = [g for g in groups if len(g.bundles) == 2]
    assert len(members_pg) == 1, groups
    for bundle in members_pg[0].bundles:
        assert bundle["unit_resources"] == {"CPU": 0.5, "mia_worker": 1.0}, bundle


def _s3(s3_server):
    import boto3

    env = s3_server.env
    return boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def test_s3_storage_and_a_worker_lost_mid_fine_tuning(cluster, world, one_node, s3_server):
    """(b) Storage in S3, credentials from the nodes' environment only; (c) SIGKILL of the
    raylet of a worker where a member has started training and not committed: Tune starts
    that trial again on the other worker, the run finishes with the unbroken run's numbers."""
    s3 = _s3(s3_server)
    prefix = f"cc-{uuid.uuid4().hex[:8]}"
    out = cluster.runs / prefix
    args = _args(world, out, *ON_WORKERS, "--set", f"resources.storage={s3_server.uri(prefix)}")
    driver = cluster.spawn_driver(args)

    def started_not_done():
        """A member whose training started (attempts.json) and has no marker yet."""
        found = s3.list_objects_v2(Bucket=s3_server.bucket, Prefix=f"{prefix}/train/")
        keys = {o["Key"] for o in found.get("Contents", [])}
        for key in sorted(keys):
            member = key.rsplit("/", 1)[0]
            if key.endswith("/attempts.json") and f"{member}/.complete.json" not in keys:
                body = s3.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
                return member.rsplit("/", 1)[1], json.loads(body)[-1]["node_id"]
        return None

    killed = None
    try:
        member, node = _wait("a member in training", started_not_done, driver)
        killed = next(i for i, w in enumerate(cluster.workers) if w.node_id == node)
        cluster.kill_worker(killed)
        assert driver.finish(timeout=900) == 0, driver.log[-6000:]
    finally:
        if driver.proc.poll() is None:
            driver.proc.kill()
        if killed is not None:
            cluster.restart_worker(killed)
    lost = node
    _same_as_one_node(out, one_node)
    records = _records(out)
    # The member that was training on the lost node started twice and ended elsewhere.
    starts = [a["node_id"] for a in records[member]["attempts"]]
    assert starts[0] == lost and len(starts) == 2 and records[member]["node_id"] != lost, starts
    assert all(rec["node_id"] != lost for rec in records.values())  # none committed from it
    # Storage is S3: the adapters and the staged model are objects there.
    found = s3.list_objects_v2(Bucket=s3_server.bucket, Prefix=f"{prefix}/")
    keys = {o["Key"] for o in found.get("Contents", [])}
    for m in MEMBERS:
        assert f"{prefix}/train/{EXPERIMENT}/{m}/adapter/.complete.json" in keys
    assert any(re.match(rf"{prefix}/inputs/\w+/\.complete\.json$", k) for k in keys), keys
    # The credentials came from the environment: in no file of the run, nor in its output.
    secrets = [s3_server.env["AWS_SECRET_ACCESS_KEY"], s3_server.env["AWS_ACCESS_KEY_ID"]]
    for path in (p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        assert not any(s.encode() in data for s in secrets), path
    assert not any(s in driver.log for s in secrets)


def test_a_deepspeed_zero2_member_on_two_workers(cluster, world):
    """(e) One member trained by 2 Ray Train workers, one on each worker node (1.5 CPUs each,
    so no node holds two), through the HF Trainer with DeepSpeed ZeRO-2 (CPU, gloo); rank 0
    commits the one adapter to storage and the MC-dropout sampler loads it from there."""
    pytest.importorskip("deepspeed")
    storage = cluster.shared / f"cc-ds-{uuid.uuid4().hex[:8]}"
    out = cluster.runs / f"cc-ds-{uuid.uuid4().hex[:8]}"
    args = _args(
        world, out, *ON_WORKERS,
        "--set", f"resources.storage={storage}", "--set", "uncertainty.samplers=[mcd]",
        "--set", "resources.trainer.workers=2", "--set", "resources.trainer.cpus=1.5",
        "--set", "finetune.deepspeed=jobs/deepspeed_zero2.json",
    )  # fmt: skip
    r = cluster.run_driver(args, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    rec = json.loads((out / "train" / EXPERIMENT / "mcd" / ".complete.json").read_text())
    assert rec["zero_stage"] == 2 and rec["world_size"] == 2
    assert sorted(rec["worker_nodes"]) == sorted(cluster.worker_ids()), rec["worker_nodes"]
    assert rec["node_id"] == rec["worker_nodes"][0]  # rank 0 committed it
    # Each optimizer step takes a batch of 4 on both workers.
    assert rec["steps"] == math.ceil(rec["n_train"] / 8) and rec["spec"]["deepspeed"]
    # One adapter committed (its marker); the member's own marker beside it.
    adapters = [p.parent for p in (storage / "train").rglob("adapter/.complete.json")]
    assert adapters == [storage / "train" / EXPERIMENT / "mcd" / "adapter"]
    # DeepSpeed's optimizer stepped the LoRA weights (B starts at zero).
    from safetensors.torch import load_file

    weights = load_file(adapters[0] / "adapter_model.safetensors")
    assert any("lora_B" in k and float(w.abs().max()) > 0 for k, w in weights.items())
    report = json.loads((out / "report.json").read_text())
    preds = _predictions(out)
    assert len(report["files"]) == 10 and set(preds["doc_id"]) == {
        f["file_id"] for f in report["files"]
    }
    p = [x for row in preds["p_mcd"] for x in row]
    assert len(p) == 4 * len(preds) and all(0 < x < 1 for x in p)
    assert {r["method"] for r in report["results"]} >= {"gmm", "kmeans"}
