"""grid.run_grid: the one way a pipeline runs a grid (Ray Tune trials)."""

from __future__ import annotations

import json

import pytest

from mia_ray.errors import MiaError


def _cell(config):
    from ray import tune

    cell = config["cell"]
    if cell["n"] == 2:
        raise MiaError(f"cell {cell['n']} has bad input")
    tune.report({"square": cell["n"] ** 2, "offset": config["offset"]})


def _orchestrator(config):
    """A trial that holds no CPU and runs its work in a task outside its placement group."""
    import ray
    from ray import tune

    @ray.remote(num_cpus=1)
    def work(n):
        return n + 1

    got = ray.get(work.options(scheduling_strategy="DEFAULT").remote(config["cell"]))
    tune.report({"got": got})


def test_each_cell_is_one_trial_and_a_failed_one_is_named(ray_local, tmp_path):
    from mia_ray.grid import run_grid

    cells = [{"n": 1}, {"n": 2}, {"n": 3}]
    with pytest.raises(MiaError, match=r"^1 demo trial\(s\) failed; first: cell 2 has bad input$"):
        run_grid(_cell, cells, resources={"cpu": 0.5}, name="g", storage_path=str(tmp_path),
                 what="demo", dirname=lambda c: f"cell-{c['n']}", params={"offset": 7},
                 max_failures=0)  # fmt: skip
    trials = sorted((tmp_path / "g").glob("cell-*"))
    assert [t.name.split("_")[0] for t in trials] == ["cell-1", "cell-2", "cell-3"]
    results = {}
    for t in trials:
        lines = (t / "result.json").read_text().splitlines() if (t / "result.json").exists() else []
        results[t.name.split("_")[0]] = [json.loads(x) for x in lines]
    # The other cells finished, with the fixed parameters beside their cell.
    assert [r["square"] for r in results["cell-1"]] == [1]
    assert [(r["square"], r["offset"]) for r in results["cell-3"]] == [(9, 7)]
    assert results["cell-2"] == []


def test_a_trial_holding_only_memory_runs_its_work_outside_its_bundle(ray_local, tmp_path):
    """The sweep's trials hold a token of memory; the work each starts asks for whole CPUs,
    which a bundle without CPU could never give it."""
    from mia_ray.grid import run_grid

    grid = run_grid(_orchestrator, [1, 2], resources={"memory": 1}, name="o",
                    storage_path=str(tmp_path), what="demo", max_concurrent=2)  # fmt: skip
    assert sorted(r.metrics["got"] for r in grid) == [2, 3]
