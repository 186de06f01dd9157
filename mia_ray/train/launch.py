"""Run CopyCheck's fine-tunings as Ray Tune trials: concurrent as resources allow, resumable.

Every member (MC dropout, BLoB, each ensemble member, for every experiment) is one trial of
one Tune run. A member that finished before (its stage marker carries the same
fingerprint) is not launched again, so rerunning the command retrains nothing. With
``resources.trainer.workers > 1`` a trial trains its member with Ray Train's ``TorchTrainer`` (HF Trainer
prepared for data parallelism; DeepSpeed ZeRO comes from the member's config).

The grid itself, Ctrl-C included, is :func:`mia_ray.grid.run_grid`'s, as every grid's.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from mia_ray.errors import MiaError
from mia_ray.stages import commit_record, done, done_at, holds, marker
from mia_ray.train.copycheck import train_member


def _done_record(job: dict[str, Any]) -> dict[str, Any] | None:
    """The member's stage marker when it holds the job's key (through storage when the job
    has ``out_url``), or None."""
    if job.get("out_url"):
        from mia_ray.storage import open_storage

        return done(open_storage(job["out_url"]), "", job["fingerprint"])
    return done_at(Path(job["out_dir"]), job["fingerprint"])


def finished(job: dict[str, Any]) -> bool:
    return _done_record(job) is not None


def _spec(job: dict[str, Any]):
    from mia_ray.config import from_dict
    from mia_ray.train.config import FinetuneConfig

    return from_dict(FinetuneConfig, job["spec"])


def _texts(job: dict[str, Any]) -> tuple[list[str], list[int]]:
    import pandas as pd

    if job.get("train_url"):
        from mia_ray.storage import open_storage

        plain, _, query = job["train_url"].partition("?")
        folder, _, name = plain.rpartition("/")
        store = open_storage(folder + (f"?{query}" if query else ""))
        df = pd.read_parquet(io.BytesIO(store.read_bytes(name)))
    else:
        df = pd.read_parquet(job["train_file"])
    df = df.sort_values("snippet_id")
    return df["text"].tolist(), df["label"].astype(int).tolist()


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def run_job(
    job: dict[str, Any],
    threads: int,
    prepare=None,
    save: bool = True,
    world_size: int = 1,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``job``'s member; return its done record. A job with storage URLs trains in a
    node-local temp folder and commits the adapter, then its stage marker, to storage; the
    record also tells where it trained (``node_id``, ``extra``) and every node where this
    member's training started (``attempts``: more than one when a trial was retried)."""
    texts, labels = _texts(job)

    def train(out_dir) -> dict[str, Any]:
        return train_member(
            job["member"],
            job["base"],
            texts,
            labels,
            out_dir,
            _spec(job),
            device=job["device"],
            dtype=job["dtype"],
            threads=threads,
            fingerprint=job["fingerprint"],
            prepare=prepare,
            save=save,
            world_size=world_size,
            deepspeed=job.get("deepspeed_config"),
        )

    if not job.get("out_url"):
        return train(job["out_dir"])
    from mia_ray.storage import open_storage, redact

    store = open_storage(job["out_url"])
    if world_size == 1:  # (several workers: the trial checked before it started them)
        record = _done_record(job)
        if record is not None:
            return {**record, "skipped": True}  # a retried trial whose member was committed
    attempts: list[dict[str, Any]] = []
    if save:
        # One writer per member at a time (its one trial), so read-modify-write is safe.
        try:
            attempts = list(store.read_json("attempts.json"))
        except (OSError, ValueError):
            attempts = []
        attempts.append({"node_id": _node_id(), "pid": os.getpid(), "started": time.time()})
        store.write_json("attempts.json", attempts)
    with tempfile.TemporaryDirectory(prefix="mia-ray-member-") as tmp:
        local = Path(tmp) / job.get("experiment", "member") / job["member"]
        record = train(local)
        if not save:
            return record
        record["base"] = redact(job["base"])
        record["node_id"] = _node_id()
        record["attempts"] = attempts
        record.update(extra or {})
        record["adapter_sha256"] = store.put_dir(
            local / "adapter", "adapter", {"member": job["member"]}
        )
        commit_record(store, "", record)  # the commit point: written after the whole adapter
    return record


def _worker_loop(config: dict[str, Any]) -> None:
    import ray.train
    from ray.train.huggingface.transformers import prepare_trainer

    def prepare(trainer):
        return prepare_trainer(trainer)

    ctx = ray.train.get_context()
    extra = {}
    if config["job"].get("out_url"):
        import torch.distributed as dist

        # Where every worker ran, for the record (Ray Train set up the process group).
        nodes: list[Any] = [None] * ctx.get_world_size()
        dist.all_gather_object(nodes, _node_id())
        extra["worker_nodes"] = nodes
    run_job(
        config["job"],
        config["threads"],
        prepare=prepare,
        save=ctx.get_world_rank() == 0,
        world_size=ctx.get_world_size(),
        extra=extra,
    )


def _trial(config: dict[str, Any]) -> None:
    from ray import tune

    job, threads, workers = config["cell"], config["threads"], config["workers"]
    if workers > 1 and not finished(job):
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        # Rank 0 commits the adapter: to storage when the job has URLs, else into out_dir
        # (which on several nodes must then be a shared folder).
        storage_path = config.get("storage_path")
        TorchTrainer(
            _worker_loop,
            train_loop_config={"job": job, "threads": threads},
            scaling_config=ScalingConfig(
                num_workers=workers,
                use_gpu=config["gpus"] > 0,
                resources_per_worker={
                    "CPU": config["cpus"],
                    "GPU": config["gpus"],
                    **config.get("custom", {}),
                },
            ),
            run_config=RunConfig(storage_path=storage_path) if storage_path else None,
        ).fit()
        record = _done_record(job)
        if record is None:
            raise MiaError(f"member {job['member']}: Ray Train finished without its done record")
    elif workers > 1:
        record = _done_record(job)
    else:
        record = run_job(job, threads)
    tune.report({"final_loss": record.get("final_loss") or 0.0, "elapsed_s": record["elapsed_s"]})


def _member_dirname(job: dict[str, Any]) -> str:
    return f"{job.get('experiment', 'member')}-{job['member']}"


def jobs_for_nodes(ws, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs as remote trials get them on a run with workspace ``ws``: the training
    snippets pushed to storage and given as ``train_url``, the member's folder as ``out_url``,
    the base model staged (:meth:`Workspace.stage`); no driver path left in them."""
    staged: dict[str, str] = {}
    ds_configs: dict[str, dict] = {}
    out = []
    for job in jobs:
        ws.push(job["train_file"])
        base = job["base"]
        if base not in staged:
            staged[base] = ws.stage(base)
        remote = {k: v for k, v in job.items() if k not in ("train_file", "out_dir")}
        remote |= {
            "train_url": ws.url(job["train_file"]),
            "out_url": ws.url(job["out_dir"]),
            "base": staged[base],
        }
        ds = job["spec"].get("deepspeed")
        if ds:  # the config file is the driver's: trials get its content
            if ds not in ds_configs:
                ds_configs[ds] = json.loads(Path(ds).read_text())
            remote["deepspeed_config"] = ds_configs[ds]
        out.append(remote)
    return out


def _pull_members(ws, jobs: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """Bring every member's folder from storage into ``--out`` (the driver's mirror); a local
    copy whose done record is not storage's (another run's member) is replaced whole."""
    if not ws.mirrored:
        return
    for job, record in zip(jobs, records, strict=True):
        out_dir = Path(job["out_dir"])
        if out_dir.exists() and marker(out_dir) != record:
            shutil.rmtree(out_dir)
        ws.pull(out_dir)


def train_members(
    jobs: list[dict[str, Any]],
    storage: Path,
    cpus: float = 1.0,
    gpus: float = 0.0,
    workers: int = 1,
    max_concurrent: int = 0,
    name: str = "finetune",
    log=print,
    res_cfg=None,
) -> list[dict[str, Any]]:
    """Train every unfinished job as a Tune trial; return every job's stage marker.

    ``jobs``: dicts with member, base, train_file (parquet of snippet_id, text, label),
    out_dir, spec (FinetuneConfig as a dict), device, dtype, fingerprint; the paths are the
    driver's (inside ``--out`` on a run with a storage workspace, when trials get URLs
    instead). ``storage``: Tune's folder (in ``--out``; on a run, its place in storage).
    ``res_cfg``: the job's ResourcesConfig, whose custom resources every trial (and Ray
    Train worker) asks for. Ctrl-C (SIGINT) while trials run raises ``KeyboardInterrupt``
    once Tune has stopped them.
    """
    from mia_ray import storage as store
    from mia_ray.runtime import ray_options

    ws = store.current()
    local_jobs = jobs
    if ws is not None:
        jobs = jobs_for_nodes(ws, jobs)
        storage_path = ws.url(storage)
    else:
        storage_path = str(Path(storage).resolve())
    pending = [j for j in jobs if not finished(j)]
    if len(pending) < len(jobs):
        log(f"fine-tuning: {len(jobs) - len(pending)} of {len(jobs)} members already trained")
    if pending:
        from mia_ray.grid import run_grid

        threads = max(1, math.ceil(cpus))
        opts = ray_options(res_cfg, cpus, gpus)
        custom = opts.get("resources", {})
        # With workers > 1 the trial itself only coordinates (no model, storage reads only):
        # its Ray Train workers hold the resources, custom ones included; the trial holds a
        # token of memory (a bundle cannot be empty).
        if workers > 1:
            trial_res = {"memory": 1}
        else:
            trial_res = {"cpu": opts["num_cpus"], "gpu": opts["num_gpus"], **custom}
        log(
            f"fine-tuning {len(pending)} members as Ray Tune trials "
            f"({cpus:g} CPU, {gpus:g} GPU, {workers} worker(s) each)"
        )

        def say_kept():
            kept = sum(finished(j) for j in jobs)
            log(
                f"fine-tuning interrupted: {kept} of {len(jobs)} members trained and kept "
                "(not Tune's Tuner.restore: rerun the same command to resume)"
            )

        # A trial whose node died (or that failed) trains again from the start, on any
        # node: its member is seeded, so the adapter is the same.
        run_grid(
            _trial,
            pending,
            resources=trial_res,
            name=name,
            storage_path=storage_path,
            what="fine-tuning",
            max_concurrent=max_concurrent,
            dirname=_member_dirname,
            params={"threads": threads, "workers": workers, "cpus": cpus, "gpus": gpus,
                    "custom": custom, "storage_path": storage_path if ws is not None else ""},
            on_interrupt=say_kept,
        )  # fmt: skip
    records = [_done_record(j) for j in jobs]
    missing = [
        j["member"] for j, r in zip(jobs, records, strict=True) if not holds(r, j["fingerprint"])
    ]
    if missing:
        raise MiaError(f"fine-tuning did not finish members {missing}")
    if ws is not None:
        _pull_members(ws, local_jobs, records)
    return records
