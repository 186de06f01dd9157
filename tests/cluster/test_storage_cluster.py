"""Guard rails of the storage layer on the 3-node cluster: storage that some node cannot see
stops the run at start-up with one line (issue 15, item 6); storage every node sees lets it
go on; staged model folders reach workers that lack the driver's disk."""

import json

import pytest

pytestmark = pytest.mark.cluster


def _docs(cluster) -> str:
    path = cluster.data / "guard.jsonl"
    rows = [{"id": f"d{i}", "text": f"document number {i} " * 20, "label": i % 2} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _attack(cluster, out, *sets):
    args = ["attack", "--config", "jobs/attack_demo.yaml", "--set", "world.target="]
    args += ["--set", f"data.path={_docs(cluster)}", "--set", "attack.attacks=[loss]"]
    args += ["--set", f"model.name_or_path={cluster.data / 'no-such-model'}"]
    args += ["--set", "model.reference=", "--out", str(out)]
    for s in sets:
        args += ["--set", s]
    return cluster.run_driver(args, timeout=180)


def _one_error_line(r) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("mia-ray: error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_out_that_workers_cannot_see_stops_at_start_up(cluster):
    out = cluster.runs / "guard-default"
    line = _one_error_line(_attack(cluster, out))
    assert (
        f"this Ray cluster has 3 nodes and resources.storage is not set, so artifacts go to "
        f"--out {out}, which is not visible from 2 of them" in line
    )
    assert "set resources.storage to a URI every node reaches: s3://bucket/prefix" in line
    assert not (out / "report.json").exists()


def test_explicit_storage_on_the_drivers_disk_stops_too(cluster):
    store = cluster.runs / "store"
    line = _one_error_line(
        _attack(cluster, cluster.runs / "guard-explicit", f"resources.storage={store}")
    )
    assert f"resources.storage {store} is not visible from 2 of them" in line


def test_storage_every_node_sees_passes_the_guard(cluster):
    # The run goes on past the check and stops at the next one: the model does not exist.
    line = _one_error_line(
        _attack(cluster, cluster.runs / "guard-shared", f"resources.storage={cluster.shared / 's'}")
    )
    assert "not visible" not in line and "no-such-model" in line


def test_s3_storage_passes_the_guard_and_a_missing_bucket_does_not(cluster):
    line = _one_error_line(
        _attack(cluster, cluster.runs / "guard-s3", f"resources.storage={cluster.s3.uri('g')}")
    )
    assert "not visible" not in line and "no-such-model" in line
    line = _one_error_line(
        _attack(cluster, cluster.runs / "guard-s3b", "resources.storage=s3://no-such-bucket/x")
    )
    assert "resources.storage s3://no-such-bucket/x cannot be" in line


def test_a_model_folder_only_the_driver_has_loads_on_every_worker(cluster, test_world):
    """stage() on the driver, localize() on each worker: the tiny model's tokenizer loads on
    nodes whose disks lack the world (the world is copied under the hidden home)."""
    import shutil

    model = cluster.home / "staged-tiny"
    if not model.exists():
        shutil.copytree(test_world["model"], model)
    code = f"""
import ray
from pathlib import Path
from mia_ray import storage
ray.init()
ws = storage.open_workspace(Path({str(cluster.runs / "stage-run")!r}),
                            {cluster.s3.uri("stage")!r}, "job")
url = ws.stage({str(model)!r})
assert url.startswith("s3://"), url

@ray.remote(num_cpus=0)
def load(u):
    from mia_ray.models.hf import load_tokenizer
    import os
    seen = os.path.exists({str(model)!r})
    return ray.get_runtime_context().get_node_id(), seen, len(load_tokenizer(u))

refs = [load.options(resources={{w: 1}}).remote(url) for w in ("worker_0", "worker_1")]
print("RESULT", ray.get(refs))
"""
    r = cluster.run_python(code, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    result = eval(r.stdout.split("RESULT", 1)[1].strip())
    assert {node for node, _, _ in result} == {w.node_id for w in cluster.workers}
    assert all(seen is False for _, seen, _ in result)  # the workers lack the driver's folder
    assert len({n for _, _, n in result}) == 1 and result[0][2] > 100
