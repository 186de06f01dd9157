"""The sweep: datasets x models, each cell a whole MemHunter run on any node with its own workspace."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia_ray import storage
from mia_ray.config import to_dict
from mia_ray.errors import MiaError
from mia_ray.keys import file_sha256, listing_sha256
from mia_ray.models.identity import tree_sha256
from mia_ray.pipelines.common import (
    fingerprint,
    log,
)
from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
from mia_ray.pipelines.memhunter.dataset_test import named_model
from mia_ray.pipelines.memhunter.keys import SCORING, hunter_key, target_key
from mia_ray.pipelines.memhunter.single import run_one
from mia_ray.runtime import describe


def cell_name(name: str) -> str:
    base = name[7:] if name.startswith("@world:") else Path(name.rstrip("/")).name or name
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in base.lstrip("@"))


def sweep_cells(cfg: MemHunterJobConfig, out: Path) -> list[tuple[str, str, MemHunterJobConfig]]:
    """(dataset, model, cell config) for every cell; demo-world names resolved to paths."""
    from mia_ray.demo.world import ensure_world, model_dir, target_of_model
    from mia_ray.reports.io import read_json, write_json

    sw = cfg.sweep
    owner = {m[7:]: target_of_model(m[7:]) for m in sw.models if m.startswith("@world:")}
    world_targets = list(dict.fromkeys(owner.values()))
    info = None
    if world_targets or any(d.startswith("@world:") for d in sw.datasets):
        info = ensure_world(cfg.world, [*(world_targets or ["tiny"]), "tiny"])
    if not cfg.hunter.model:
        if info is None:
            raise MiaError("sweep: hunter.model is empty: give a small LM to train as the hunter")
        cfg.hunter.model = info["targets"]["tiny"]["reference"]
    cells = []
    for i, ds in enumerate(sw.datasets):
        labels = sw.labels[i] if sw.labels else ""
        path = ds
        if ds.startswith("@world:"):
            source = ds[7:]
            manifest = read_json(
                labels or info["targets"][world_targets[0] if world_targets else "tiny"]["manifest"]
            )
            sub = {k: v for k, v in manifest.items() if k.startswith(f"{source}/")}
            if not sub:
                raise MiaError(f"sweep: the demo world has no {source!r} documents")
            labels = str(out / "datasets" / f"{source}.json")
            write_json(Path(labels), sub)
            path = info["documents"]
        for m in sw.models:
            c = copy.deepcopy(cfg)
            c.sweep = type(cfg.sweep)()
            c.world.target = ""
            c.data.path, c.data.labels, c.data.unlabelled = path, labels, "skip"
            if m.startswith("@world:"):
                c.model.name_or_path = str(model_dir(info["root"], m[7:]))
                c.model.reference = (
                    cfg.model.reference or info["targets"][owner[m[7:]]]["reference"]
                )
            elif m != "@target":
                c.model.name_or_path = m
            cells.append((ds, m, c))
    return cells


def sweep_identity(cfg: MemHunterJobConfig) -> dict[str, Any]:
    """A run's inputs by content, beside its config: every model it loads (weights, dtype,
    device), its data and labels files, and how it scores."""
    d = cfg.dataset_test
    models = {}
    for name in dict.fromkeys([*d.suspects, d.reference, d.proxy, d.base]):
        path = named_model(cfg, name)
        if path is not None:
            models[name] = target_key(cfg, path)
    data = {
        k: tree_sha256(v) if v and Path(v).expanduser().exists() else v
        for k, v in (("path", cfg.data.path), ("labels", cfg.data.labels))
    }
    return {"target": target_key(cfg), "hunter": hunter_key(cfg), "models": models,
            "data": data, "scoring": SCORING}  # fmt: skip


def stage_input(path: str) -> tuple[str, str]:
    """A driver-local input of a sweep cell, for a cell on any node: ``(where, file name)``.
    A folder (a model, a data folder) is staged as :func:`storage.stage` does; a file (a
    documents file, a labels manifest) is put into storage as a folder holding just that
    file, by content, and the cell finds it at ``localize(where)/<file name>``. Hub names,
    URIs and anything on a one-machine run pass through (file name "")."""
    ws = storage.current()
    if ws is None or not ws.distributed or not path or storage.is_uri(path):
        return path, ""
    p = Path(path).expanduser()
    if not p.is_file():
        return ws.stage(path), ""
    # The hash tree_sha256 gives the folder holding just this file (and put_dir its marker).
    digest = listing_sha256([(p.name, file_sha256(p))])
    rel, store = f"inputs/{digest[:32]}", ws.storage
    if not store.complete(rel):
        with tempfile.TemporaryDirectory() as tmp:
            os.symlink(p.resolve(), Path(tmp) / p.name)
            store.put_dir(tmp, rel, {"source": p.name})
    return store.url(rel), p.name


def cell_inputs(c: MemHunterJobConfig) -> dict[str, Any]:
    """Every driver-local input of a cell, staged (:func:`stage_input`): its config's model
    and data fields, and the dataset test's models named by path or ``@world:``."""
    d = c.dataset_test
    fields = {
        "model.name_or_path": c.model.name_or_path,
        "model.reference": c.model.reference,
        "hunter.model": c.hunter.model,
        "data.path": c.data.path,
        "data.labels": c.data.labels,
    }
    named = {}
    for name in dict.fromkeys([*d.suspects, d.reference, d.proxy, d.base]):
        if name.startswith("@") and not name.startswith("@world:"):
            continue  # the model section's own models, or a fine-tune the cell trains
        named[name] = stage_input(named_model(c, name))
    return {"fields": {k: stage_input(v) for k, v in fields.items()}, "named": named}


def localize_cell(cfg: MemHunterJobConfig, inputs: dict[str, Any]):
    """On the cell's node: its inputs as local folders and files (``localize``, cached per
    node by content). Sets the config's fields; returns the dataset test's names -> folders
    and each local model folder -> what it was staged as (for the cell's workspace)."""
    staged: dict[str, str] = {}

    def local(where: str, name: str) -> str:
        if not where:
            return where
        here = storage.localize(where)
        if name:
            return str(Path(here) / name)
        staged[here] = where
        return here

    for key, (where, name) in inputs["fields"].items():
        section, attr = key.split(".")
        setattr(getattr(cfg, section), attr, local(where, name))
    named = {k: local(*v) for k, v in inputs["named"].items()}
    return named, staged


@dataclass
class CellWorkspace(storage.Workspace):
    """A sweep cell's workspace on its node: ``staged`` maps the cell's local copies of the
    driver's models to the storage URLs they came from, so that the cell's actors load those
    (never a second copy staged under the cell)."""

    staged: dict[str, str] = field(default_factory=dict)

    def stage(self, path: str) -> str:
        return self.staged.get(path) or super().stage(path)


def cell_key(c: MemHunterJobConfig) -> str:
    """A cell by its config and its inputs' contents, but not by where it runs (the
    cluster's address, storage, custom resources), which changes no number."""
    conf = to_dict(c)
    for key in ("address", "storage", "custom_resources"):
        conf["resources"].pop(key, None)
    return fingerprint(conf, sweep_identity(c))


def cell_task(cfg: MemHunterJobConfig, inputs: dict, url: str, distributed: bool) -> dict:
    """One sweep cell, a whole MemHunter run, on the node Ray gives it. Its workspace: storage
    ``url`` (``cells/<name>`` of the run's storage) and, as ``--out``, that folder itself
    when storage is a folder every node mounts (on one machine: the driver's
    ``--out/cells/<name>``, as always), else a temp folder of this node that starts from what
    storage holds (a cell run again resumes there) and goes back to storage at the end. The
    driver pulls the cell from storage. Returns the cell's report and this node's id."""
    import ray

    from mia_ray.runtime import configure_data_context

    # No Ray Data bars from a worker: they arrive interleaved with other cells' output and
    # fill a job's log; each cell's progress is in its log lines.
    configure_data_context(
        no_progress_timeout_s=cfg.resources.no_progress_timeout_s, progress=False
    )
    node = ray.get_runtime_context().get_node_id()
    named, staged = localize_cell(cfg, inputs)
    store = storage.open_storage(url)
    tmp = None if store.local else tempfile.mkdtemp(prefix="mia-cell-")
    local = Path(tmp or store.root)
    local.mkdir(parents=True, exist_ok=True)
    # The cell is the driver of its own run: reads of its (local) data stay on this node.
    ws = CellWorkspace(local, url, distributed, node, staged=staged)
    before = storage.current()
    storage.set_current(ws)
    try:
        ws.pull()
        try:
            report = run_one(cfg, local, named)
        except BaseException:
            with contextlib.suppress(Exception):
                ws.push()  # what finished is kept for the cell's next attempt
            raise
        ws.push()
        if ws.mirrored:  # the report files are the cell's results (push leaves reports out)
            for name in ("report.json", "report.html"):
                if (local / name).exists():
                    store.put_file(local / name, name)
    finally:
        storage.set_current(before)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"report": report, "node": node}


# A cell that raised because a node of its actors or fine-tunes died (and their own restarts
# and retries ran out) runs again, as one whose own node died does (Tune retries the trial).
# A cell's own errors (bad input: MiaError; a bug) are not retried.
RETRIED = ("RayActorError", "WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError",
           "ObjectLostError")  # fmt: skip


def retried(err: BaseException) -> bool:
    """Whether a cell that failed with ``err`` runs again: a node or worker was lost."""
    from ray import exceptions as rx

    kinds = tuple(getattr(rx, n) for n in RETRIED)  # ActorDiedError, OwnerDiedError within
    return isinstance(err, kinds) or isinstance(getattr(err, "cause", None), kinds)


def trial_resources(cfg: MemHunterJobConfig) -> dict[str, float]:
    """A cell trial's bundle: an orchestrator (no CPU; its work is in actors and tasks, which
    run outside the trial's placement group), holding a token of memory,
    ``resources.custom_resources`` and ``sweep.cell_resources`` (which decide which nodes
    cells run on and how many share one)."""
    return {"memory": 1, **(cfg.resources.custom_resources or {}), **cfg.sweep.cell_resources}


def cell_trial(config: dict[str, Any], cells: dict[str, tuple]) -> None:
    """One cell as a Tune trial: it runs :func:`cell_task` as a task on its own node, outside
    the trial's placement group (else Ray would place the cell's actors, fine-tunes and reads
    inside the trial's bundle, which holds no CPU), and reports the node it ran on, or the
    cell's own error (reported, not raised: Tune would retry it)."""
    import ray
    from ray import tune
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from mia_ray.errors import find_mia_error

    name = config["cell"]
    node = ray.get_runtime_context().get_node_id()
    task = ray.remote(cell_task).options(
        num_cpus=0,
        max_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        # Named by its cell: the dashboard and the state API tell which node runs which.
        name=f"memhunter cell {name}",
    )
    try:
        got = ray.get(task.remote(*cells[name]))
    except Exception as err:
        if retried(err):
            raise
        mia = find_mia_error(err)
        tune.report({"node": "", "error": str(mia or err).strip().splitlines()[-1][:500]})
        return
    tune.report({"node": got["node"], "error": ""})


def cell_slots(cell_resources: dict[str, float]) -> int | None:
    """How many cells ``sweep.cell_resources`` lets run at once across the alive nodes (None
    when it asks for nothing)."""
    import ray

    if not cell_resources:
        return None
    slots = 0
    for n in ray.nodes():
        own = n.get("Resources", {})
        if n.get("Alive"):
            slots += int(min(own.get(k, 0) // v for k, v in cell_resources.items()))
    return slots


def run_cells(cfg, ws, todo: dict[str, tuple], results: dict, parallel: int, out: Path) -> list:
    """The unfinished cells as Ray Tune trials (:func:`mia_ray.grid.run_grid`, Tune's folder
    in the run's storage). As each completes, the driver pulls its folder from storage and
    commits its marker (its key and the node it ran on), so that a cell done is kept even
    if others fail or Ctrl-C stops the sweep. Returns the cells that failed: (name, error)."""
    from ray import tune

    from mia_ray.grid import run_grid
    from mia_ray.reports.io import read_json
    from mia_ray.stages import commit, recorded

    total = len(todo) + len(results)
    failed: list[tuple[str, str]] = []

    class Commit(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            name, got = trial.config["cell"], trial.last_result
            if got.get("error"):
                failed.append((name, got["error"]))
                log(f"sweep: cell {name} failed: {got['error']}")
                return
            _, d, fp = todo[name]
            ws.pull(d)  # the cell's folder, from storage
            results[name] = read_json(d / "report.json")
            rel = storage.inside(d, ws.local)
            commit(ws.storage, rel, fp, "folder", {"node": got["node"]})  # done, for a rerun
            ws.pull(rel)
            recorded(out, f"cells/{name}", fp, "folder", reused=False)
            log(f"sweep: cell {name.replace('__', ' x ')} done ({len(results)}/{total})")

    cells = {}
    for name, (c, d, _) in todo.items():
        d.mkdir(parents=True, exist_ok=True)
        cells[name] = (c, cell_inputs(c), ws.url(d), ws.distributed)
    run_grid(
        tune.with_parameters(cell_trial, cells=cells),
        list(todo),
        resources=trial_resources(cfg),
        name="sweep",
        storage_path=ws.url(out / "tune"),
        what="sweep cell",
        max_concurrent=parallel,
        dirname=str,
        max_failures=3,
        callbacks=[Commit()],
        on_interrupt=lambda: log(
            f"sweep interrupted: {len(results)} of {total} cells done and kept "
            "(rerun the same command to resume; a cell resumes from its finished stages)"
        ),
    )
    return failed


def run_sweep(cfg: MemHunterJobConfig, out: Path) -> dict:
    """Every (dataset, model) cell as a Ray Tune trial (:func:`run_cells`); the cells' actors
    and tasks hold the resources, so as many cells run at once as those fit
    (``sweep.max_concurrent``, and ``sweep.cell_resources``: e.g. one cell per node). A cell
    may run on any node: its inputs go through storage (:func:`cell_inputs`), it works in
    ``cells/<name>`` of storage (:func:`cell_task`), and the driver pulls each finished cell
    into ``out/cells/<name>``: a folder stage whose marker (its key and the node it ran on)
    marks it done for a rerun, which launches only the cells without one."""
    import ray

    from mia_ray.reports.io import read_json, write_json
    from mia_ray.stages import done, recorded

    cells = sweep_cells(cfg, out)
    res = cfg.resources
    per_cell = res.scorer.actors * res.scorer.cpus + res.trainer.cpus
    total = ray.cluster_resources()
    fit = int(total.get("CPU", 1) // max(per_cell, 1e-9))
    gpus = res.scorer.actors * res.scorer.gpus + res.trainer.gpus
    if gpus:
        fit = min(fit, int(total.get("GPU", 0) // gpus))
    slots = cell_slots(cfg.sweep.cell_resources)
    if slots is not None:
        fit = min(fit, slots)
    parallel = cfg.sweep.max_concurrent or max(1, fit)
    ws = storage.workspace_of(out)
    results: dict[str, dict] = {}
    todo: dict[str, tuple] = {}
    for ds, m, c in cells:
        d = out / "cells" / f"{cell_name(ds)}__{cell_name(m)}"
        fp = cell_key(c)
        if done(ws.storage, storage.inside(d, ws.local), fp) is not None:
            ws.pull(d)
            recorded(out, f"cells/{d.name}", fp, "folder", reused=True)
            results[d.name] = read_json(d / "report.json")
            continue
        todo[d.name] = (c, d, fp)
    log(f"sweep: {len(cells)} cells, {len(results)} done, {parallel} at a time")
    if todo:
        failed = run_cells(cfg, ws, todo, results, parallel, out)
        if failed:
            name, msg = failed[0]
            raise MiaError(f"sweep: {len(failed)} cell(s) failed; first, {name}: {msg}")
    rows, verdicts, power = [], [], []
    for ds, m, _ in cells:
        r = results[f"{cell_name(ds)}__{cell_name(m)}"]
        for e in r["extraction"]:
            rows.append({"dataset": ds, "model": m, **e})
        for h in r["hypothesis"]:
            if h["suspect"] == "@target":
                verdicts.append({"dataset": ds, "model": m, **h})
        pc = r["dataset_test"]["power_check"]
        power.append({"dataset": ds, "model": m, "proxy": pc["proxy"], "p_value": pc["p_value"],
                      "passed": bool(pc["reject_h0"]), "mean_proxy": pc["mean_suspect"],
                      "mean_reference": pc["mean_reference"]})  # fmt: skip
    failed = [
        f"{cell_name(p['dataset'])} x {cell_name(p['model'])}" for p in power if not p["passed"]
    ]
    weak = (
        [
            f"Power check failed in {len(failed)} of {len(power)} cells ({', '.join(failed)}): "
            "there the proxy, which trained on the dataset, recovers no more than the "
            "reference, so those cells' 'no evidence of memorization' says nothing about "
            "whether the model trained on the data."
        ]
        if failed
        else []
    )
    report = {
        "pipeline": "memhunter",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sweep": {
            "datasets": list(cfg.sweep.datasets),
            "models": list(cfg.sweep.models),
            "cells": [f"{cell_name(d)}__{cell_name(m)}" for d, m, _ in cells],
        },  # fmt: skip
        "extraction": rows,
        "hypothesis": verdicts,
        "power_check": power,
        "model": {"target": "sweep", "hunter": cfg.hunter.model},
        "notes": [
            *weak,
            "One cell per dataset and model: a hunter trained for that model on that dataset, "
            "then extraction and the dataset-level tests (suspect: the cell's model). Rows "
            "carry their cell's dataset and model; each cell's own report is under cells/.",
        ],
        "runtime": describe(),
    }
    write_json(out / "report.json", report)
    from mia_ray.reports.memhunter import render_memhunter_report

    render_memhunter_report(report, out / "report.html")
    return report
