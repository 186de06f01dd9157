"""MemHunter on the 3-node cluster without a shared disk: the hunter's fine-tunes, the target
actors and the sweep cells on the workers, every input and artifact through storage.

The test world sits in the cluster's ``home`` folder, which the workers do not see: a worker
finds a model, an adapter or a cell's documents only through storage. Every run's numbers
must equal a one-node run's on the same inputs (this pytest process, its local Ray
instance), exactly: the same models by content, the same seeds, the same torch threads.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from mia_ray.cli import main

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"

# The smallest MemHunter the single-node tests run (tests/pipelines/test_memhunter.py's
# sweep), with two hunter iterations: the second fine-tune continues the first one's adapter,
# which it finds in storage. Manual is the only baseline: MiniPrompt and the plug-in are
# budgeted in wall-clock seconds, so their numbers differ from run to run.
SMALL = [
    "--set", "pairs.prefix_tokens=16", "--set", "pairs.target_tokens=16",
    "--set", "pairs.max_per_split=3", "--set", "hunter.iterations=2",
    "--set", "hunter.prompt_tokens=2", "--set", "extraction.trials=[1,2]",
    "--set", "extraction.splits=[test, nonmember]", "--set", "extraction.methods=[manual]",
    "--set", "dataset_test.trials=1", "--set", 'dataset_test.suspects=["@target"]',
]  # fmt: skip
# One run: the proxy is fine-tuned here (a task on a worker), one short epoch.
SINGLE = [
    "--set", "world.target=tiny", "--set", 'dataset_test.proxy="@finetune:members"',
    "--set", "dataset_test.finetune_epochs=1",
]  # fmt: skip
# Two cells (books x tiny, web x tiny), each at most one CPU, as in the single-node sweep test.
SWEEP = [
    "--set", "world.target=", "--set", 'sweep.datasets=["@world:books", "@world:web"]',
    "--set", 'sweep.models=["@world:tiny"]', "--set", 'dataset_test.proxy="@target"',
    "--set", "resources.scorer.cpus=0.5", "--set", "resources.trainer.cpus=0.5",
    "--set", "resources.scorer.torch_threads=1",
]  # fmt: skip
# Model actors and fine-tunes on the workers only (they hold 100 "mia_worker" each).
ON_WORKERS = ["--set", "resources.custom_resources={mia_worker: 1}"]
# One cell per worker: a cell's task takes 60 of its node's 100, so no two share a node,
# and its actors and fine-tunes (1 each) still fit beside it.
CELL_PER_WORKER = ["--set", "sweep.cell_resources={mia_worker: 60}"]


@pytest.fixture(scope="module")
def world(local_cluster, test_world) -> Path:
    """The test world, copied into the cluster's ``home`` (hidden from the workers)."""
    return local_cluster.copy_world(test_world, local_cluster.home / "memhunter-world")


def _args(world: Path, out: Path, *extra: str) -> list[str]:
    return [
        "memhunter", "--config", "jobs/memhunter_demo.yaml", "--set", "world.scale=test",
        "--set", f"world.root={world}", *SMALL, *extra, "--out", str(out),
    ]  # fmt: skip


def _one_node(args: list[str]) -> dict:
    """The pipeline in this process on the session's local Ray (one node, storage = --out)."""
    assert main(args) == 0
    return json.loads((Path(args[-1]) / "report.json").read_text())


def _s3(s3_server, name: str) -> str:
    return s3_server.uri(f"{name}-{uuid.uuid4().hex[:8]}")


class _Driver:
    """``python -m mia_ray <args>`` as a driver on the head, not waited for; its output goes
    to files (a pipe nobody reads while the test waits would fill and stall it)."""

    def __init__(self, cluster, args: list[str], storage: str, logs: Path):
        logs.mkdir(parents=True, exist_ok=True)
        self.out = Path(args[-1])
        self.log = logs / f"{self.out.name}.log"
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [str(PYTHON), "-m", "mia_ray", *args, "--set", f"resources.storage={storage}"],
                env=cluster.driver_env(),
                cwd=str(REPO),
                stdout=f,
                stderr=subprocess.STDOUT,
            )

    def running(self) -> bool:
        return self.proc.poll() is None

    def finish(self, timeout: float = 900) -> tuple[dict, str]:
        """The run's report and its driver's output, once it ended well."""
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        text = self.log.read_text(errors="replace")
        assert self.proc.returncode == 0, text[-8000:]
        return json.loads((self.out / "report.json").read_text()), text


def _no_seconds(rows: list[dict]) -> list[dict]:
    """Rows without their wall-clock seconds (the only number that is not the inputs')."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def _numbers(report: dict) -> dict:
    """Every number of a single run's report that the inputs decide."""
    its = [
        {k: v for k, v in r.items() if not k.endswith("_s")}
        for r in report["training"]["iterations"]
    ]
    return {
        "pairs": report["pairs"],
        "training": {**report["training"], "iterations": its, "adapter": None},
        "extraction": _no_seconds(report["extraction"]),
        "hypothesis": report["hypothesis"],
        "dataset_test": report["dataset_test"],
        "lcss_by_method": report["lcss_by_method"],
        "examples": report["examples"],
    }


def _sweep_numbers(report: dict) -> dict:
    return {
        "sweep": report["sweep"],
        "extraction": _no_seconds(report["extraction"]),
        "hypothesis": report["hypothesis"],
        "power_check": report["power_check"],
    }


def _tasks(cluster, name: str) -> list:
    """Every attempt of every task of function ``name`` the cluster ran (state API)."""
    from ray.util.state import list_tasks

    rows = list_tasks(address=cluster.dashboard_url, limit=10000, raise_on_missing_output=False)
    return [t for t in rows if (t.func_or_class_name or "").endswith(name)]


def _workers(cluster) -> set[str]:
    return {w.node_id for w in cluster.workers}


@pytest.fixture(scope="module")
def single_one_node(ray_local, world, tmp_path_factory):
    out = tmp_path_factory.mktemp("mh-one") / "run"
    return _one_node(_args(world, out, *SINGLE))


@pytest.fixture(scope="module")
def sweep_one_node(ray_local, world, tmp_path_factory):
    out = tmp_path_factory.mktemp("mh-sweep-one") / "run"
    report = _one_node(_args(world, out, *SWEEP))
    cells = {
        n: json.loads((out / "cells" / n / "report.json").read_text())
        for n in report["sweep"]["cells"]
    }
    return report, cells


def test_hunter_fine_tunes_on_a_worker_give_the_one_node_numbers(
    cluster, world, s3_server, single_one_node, monkeypatch, tmp_path
):
    from mia_ray.storage import open_storage

    seen = {t.task_id for t in _tasks(cluster, "finetune_task")}
    out = cluster.runs / f"mh-{uuid.uuid4().hex[:8]}"
    store = _s3(s3_server, "mh")
    args = _args(world, out, *SINGLE, *ON_WORKERS)
    report, _ = _Driver(cluster, args, store, tmp_path).finish()
    assert report["runtime"]["nodes"] == 3
    assert _numbers(report) == _numbers(single_one_node)
    # Both iterations' fine-tunes ran on workers; the driver pulled their adapters.
    fts = [t for t in _tasks(cluster, "finetune_task") if t.task_id not in seen]
    assert len(fts) == 2 and {t.node_id for t in fts} <= _workers(cluster), fts
    (hdir,) = (out / "hunter").iterdir()
    for i in range(2):
        assert (hdir / f"iter-{i:02d}" / "adapter" / "adapter_config.json").is_file()
    (proxy,) = (out / "models").iterdir()  # the dataset test's proxy, fine-tuned on a worker
    assert (proxy / "training.json").is_file() and (proxy / ".complete.json").is_file()
    # The target and the hunter's base went through storage (the workers cannot see home/).
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    assert any(name.endswith("config.json") for name in open_storage(store).files("inputs"))


def test_sweep_cells_one_per_worker_give_the_one_node_numbers(
    cluster, world, sweep_one_node, tmp_path
):
    one, one_cells = sweep_one_node
    out = cluster.runs / f"mh-sweep-{uuid.uuid4().hex[:8]}"
    # Storage a folder every node mounts: the cells work in it, the driver copies them out.
    store = str(cluster.shared / f"mh-sweep-{uuid.uuid4().hex[:8]}")
    args = _args(world, out, *SWEEP, *ON_WORKERS, *CELL_PER_WORKER)
    report, err = _Driver(cluster, args, store, tmp_path).finish()
    assert "sweep: 2 cells, 0 done, 2 at a time" in err
    assert _sweep_numbers(report) == _sweep_numbers(one)
    nodes = []
    for name in report["sweep"]["cells"]:
        cell = json.loads((out / "cells" / name / "report.json").read_text())
        assert _numbers(cell) == _numbers(one_cells[name]), name
        nodes.append(json.loads((out / "cells" / name / ".complete.json").read_text())["node"])
    # Each cell ran on a worker of its own.
    assert len(set(nodes)) == 2 and set(nodes) == _workers(cluster), nodes


def test_a_cell_whose_worker_dies_runs_again_and_gives_the_same_numbers(
    cluster, world, s3_server, sweep_one_node, monkeypatch, tmp_path
):
    from mia_ray.storage import open_storage

    one, one_cells = sweep_one_node
    out = cluster.runs / f"mh-kill-{uuid.uuid4().hex[:8]}"
    store = _s3(s3_server, "mh-kill")
    seen = {t.task_id for t in _tasks(cluster, "cell_task")}
    args = _args(world, out, *SWEEP, *ON_WORKERS, *CELL_PER_WORKER)
    driver = _Driver(cluster, args, store, tmp_path)
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    storage = open_storage(store)
    # Wait until a cell has finished its first hunter iteration (in storage), then kill the
    # worker that runs it.
    deadline, victim = time.time() + 600, None
    while victim is None:
        assert driver.running() and time.time() < deadline, "no cell reached iteration 1"
        for name in one["sweep"]["cells"]:
            if any(f.endswith("iter-00/.complete.json") for f in storage.files(f"cells/{name}")):
                victim = name
                break
        time.sleep(0.2)
    (task,) = [
        t
        for t in _tasks(cluster, "cell_task")
        if t.task_id not in seen and t.name == f"memhunter cell {victim}" and t.state == "RUNNING"
    ]
    (dead,) = [i for i, w in enumerate(cluster.workers) if w.node_id == task.node_id]
    cluster.kill_worker(dead)
    # A fresh node in its place (a new node id, an empty disk), as an autoscaler would bring:
    # the cell runs again there or on the other worker, whichever frees up first.
    cluster.restart_worker(dead)
    report, err = driver.finish()
    # The cell ran again (Tune ran its trial again: a new task of the same name), on another
    # node, and resumed from what its first attempt had put into storage.
    attempts = [
        t for t in _tasks(cluster, "cell_task")
        if t.task_id not in seen and t.name == f"memhunter cell {victim}"
    ]  # fmt: skip
    assert len({t.task_id for t in attempts}) >= 2, attempts
    assert re.search(r"hunter: iteration [12]/2: reusing an earlier run's", err), err[-6000:]
    again = json.loads((out / "cells" / victim / ".complete.json").read_text())["node"]
    assert again != task.node_id and again in _workers(cluster)
    # ... and every number is the unbroken run's.
    assert _sweep_numbers(report) == _sweep_numbers(one)
    for name in report["sweep"]["cells"]:
        cell = json.loads((out / "cells" / name / "report.json").read_text())
        assert _numbers(cell) == _numbers(one_cells[name]), name
