"""Run CopyCheck's fine-tunings as Ray Tune trials: concurrent as resources allow, resumable.

Every member (MC dropout, BLoB, each ensemble member, for every experiment) is one trial of
one Tune run. A member that finished before (its ``done.json`` carries the same
fingerprint) is not launched again, so rerunning the command retrains nothing. With
``train_workers > 1`` a trial trains its member with Ray Train's ``TorchTrainer`` (HF Trainer
prepared for data parallelism; DeepSpeed ZeRO comes from the member's config).

Ctrl-C: Tune's own SIGINT handler ends the run quietly and returns a partial result, so the
pipeline would carry on (or fail later on the missing members). :func:`train_members` detects
that and raises ``KeyboardInterrupt`` once Tune has stopped its trials, as the other
pipelines' interrupts are; finished members keep their ``done.json`` and a rerun resumes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mia_ray.errors import MiaError
from mia_ray.train.copycheck import DONE, train_member


def finished(job: dict[str, Any]) -> bool:
    done = Path(job["out_dir"]) / DONE
    return done.exists() and json.loads(done.read_text()).get("fingerprint") == job["fingerprint"]


def _spec(job: dict[str, Any]):
    from mia_ray.config import FinetuneConfig, from_dict

    return from_dict(FinetuneConfig, job["spec"])


def _texts(job: dict[str, Any]) -> tuple[list[str], list[int]]:
    import pandas as pd

    df = pd.read_parquet(job["train_file"]).sort_values("snippet_id")
    return df["text"].tolist(), df["label"].astype(int).tolist()


def run_job(
    job: dict[str, Any], threads: int, prepare=None, save: bool = True, world_size: int = 1
) -> dict[str, Any]:
    texts, labels = _texts(job)
    return train_member(
        job["member"],
        job["base"],
        texts,
        labels,
        job["out_dir"],
        _spec(job),
        device=job["device"],
        dtype=job["dtype"],
        threads=threads,
        fingerprint=job["fingerprint"],
        prepare=prepare,
        save=save,
        world_size=world_size,
    )


def _worker_loop(config: dict[str, Any]) -> None:
    import ray.train
    from ray.train.huggingface.transformers import prepare_trainer

    def prepare(trainer):
        return prepare_trainer(trainer)

    ctx = ray.train.get_context()
    run_job(
        config["job"],
        config["threads"],
        prepare=prepare,
        save=ctx.get_world_rank() == 0,
        world_size=ctx.get_world_size(),
    )


def _trial(config: dict[str, Any]) -> None:
    from ray import tune

    job, threads, workers = config["job"], config["threads"], config["workers"]
    if workers > 1:
        from ray.train import ScalingConfig
        from ray.train.torch import TorchTrainer

        # Rank 0 saves the adapter into out_dir: on several nodes out_dir must be shared storage.
        TorchTrainer(
            _worker_loop,
            train_loop_config={"job": job, "threads": threads},
            scaling_config=ScalingConfig(
                num_workers=workers,
                use_gpu=config["gpus"] > 0,
                resources_per_worker={"CPU": config["cpus"], "GPU": config["gpus"]},
            ),
        ).fit()
        record = json.loads((Path(job["out_dir"]) / DONE).read_text())
    else:
        record = run_job(job, threads)
    tune.report({"final_loss": record.get("final_loss") or 0.0, "elapsed_s": record["elapsed_s"]})


@contextmanager
def interrupt_guard():
    """Yield ``interrupted(returned)``: whether Ctrl-C came while ``tuner.fit()`` ran in the
    block (``returned``: fit() returned rather than raised).

    ``tuner.fit()`` puts its own SIGINT handler in place of the one it finds and, on the first
    Ctrl-C, stops the trials gracefully, puts the one it found back and returns as if done.
    So we set ours before ``fit()``: finding it in place once fit() has returned means Tune
    was interrupted; and ours raises ``KeyboardInterrupt`` on a second Ctrl-C (or the first,
    with TUNE_DISABLE_SIGINT_HANDLER set), which Tune no longer catches. Off the main thread
    no handler can be set and Tune's own handling stays."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda returned=True: False
        return
    previous = signal.getsignal(signal.SIGINT)
    tune_catches = not int(os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0") or 0)
    hits: list[int] = []

    def handler(signum, frame):
        hits.append(signum)
        raise KeyboardInterrupt

    def interrupted(returned: bool = True) -> bool:
        handed_back = tune_catches and signal.getsignal(signal.SIGINT) is handler
        return bool(hits) or (returned and handed_back)

    signal.signal(signal.SIGINT, handler)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def train_members(
    jobs: list[dict[str, Any]],
    storage: Path,
    cpus: float = 1.0,
    gpus: float = 0.0,
    workers: int = 1,
    max_concurrent: int = 0,
    name: str = "finetune",
    log=print,
) -> list[dict[str, Any]]:
    """Train every unfinished job as a Tune trial; return every job's ``done.json`` record.

    ``jobs``: dicts with member, base, train_file (parquet of snippet_id, text, label),
    out_dir, spec (FinetuneConfig as a dict), device, dtype, fingerprint. Ctrl-C (SIGINT)
    while trials run raises ``KeyboardInterrupt`` once Tune has stopped them.
    """
    pending = [j for j in jobs if not finished(j)]
    if len(pending) < len(jobs):
        log(f"fine-tuning: {len(jobs) - len(pending)} of {len(jobs)} members already trained")
    if pending:
        from ray import tune

        threads = max(1, math.ceil(cpus))
        # With workers > 1 the trial itself only coordinates; its workers hold the resources.
        trial_res = {"cpu": 0.01, "gpu": 0} if workers > 1 else {"cpu": cpus, "gpu": gpus}
        log(
            f"fine-tuning {len(pending)} members as Ray Tune trials "
            f"({cpus:g} CPU, {gpus:g} GPU, {workers} worker(s) each)"
        )
        tuner = tune.Tuner(
            tune.with_resources(_trial, trial_res),
            param_space={
                "job": tune.grid_search(pending),
                "threads": threads,
                "workers": workers,
                "cpus": cpus,
                "gpus": gpus,
            },
            tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent or None),
            run_config=tune.RunConfig(
                name=name,
                storage_path=str(Path(storage).resolve()),
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=1),
            ),
        )
        with interrupt_guard() as interrupted:
            try:
                grid = tuner.fit()
            except Exception:
                # A second Ctrl-C inside Ray's C code can surface as another exception.
                if interrupted(returned=False):
                    raise KeyboardInterrupt from None
                raise
            if interrupted():  # Tune stopped the trials and returned a partial result
                kept = sum(finished(j) for j in jobs)
                log(
                    f"fine-tuning interrupted: {kept} of {len(jobs)} members trained and kept "
                    "(not Tune's Tuner.restore: rerun the same command to resume)"
                )
                raise KeyboardInterrupt
        errors = [r.error for r in grid if r.error is not None]
        if errors:
            from mia_ray.errors import find_mia_error

            err = errors[0]
            mia = find_mia_error(err)
            raise MiaError(
                f"{len(errors)} fine-tuning trial(s) failed; first: "
                + (str(mia) if mia else str(err).strip().splitlines()[-1][:300])
            )
    missing = [j["member"] for j in jobs if not finished(j)]
    if missing:
        raise MiaError(f"fine-tuning did not finish members {missing}")
    return [json.loads((Path(j["out_dir"]) / DONE).read_text()) for j in jobs]
