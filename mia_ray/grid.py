"""Grids as Ray Tune trials: one mechanism for every grid a pipeline runs.

CopyCheck's fine-tunes (one trial per member) and MemHunter's sweep (one trial per dataset
and model) are grids: :func:`run_grid` runs the unfinished cells as trials of one
``tune.Tuner`` (``tune.grid_search`` over the cells, ``storage_path`` in the run's storage,
concurrency as resources and ``max_concurrent`` allow, a failed or lost trial run again up to
``max_failures`` times). What a cell produces is a stage of the run (its key and marker in
storage), so a rerun of the command resumes by launching only what has no marker: that is
the resume, not ``Tuner.restore`` (whose saved trials would hold the last run's configs).

Ctrl-C: Tune's own SIGINT handler ends the run quietly and returns a partial result, so the
pipeline would carry on (or fail later on the missing cells). :func:`run_grid` detects that
and raises ``KeyboardInterrupt`` once Tune has stopped its trials, as the other pipelines'
interrupts are; finished cells keep their markers and a rerun resumes.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from mia_ray.errors import MiaError, find_mia_error


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


def trial_failure(errors: list[BaseException], what: str) -> MiaError:
    """One clear error for failed trials: how many, and the first one's cause (its MiaError's
    message when bad input caused it, else the last line of its traceback)."""
    err = errors[0]
    mia = find_mia_error(err)
    first = str(mia) if mia else str(err).strip().splitlines()[-1][:300]
    return MiaError(f"{len(errors)} {what} trial(s) failed; first: {first}")


def run_grid(
    trainable: Callable[[dict[str, Any]], None],
    cells: list[Any],
    *,
    resources: dict[str, float],
    name: str,
    storage_path: str,
    what: str,
    max_concurrent: int = 0,
    dirname: Callable[[Any], str] | None = None,
    max_failures: int = 1,
    callbacks: list | None = None,
    params: dict[str, Any] | None = None,
    on_interrupt: Callable[[], None] | None = None,
):
    """Run ``trainable`` once per cell as Ray Tune trials; return Tune's ``ResultGrid``.

    ``trainable(config)`` gets ``config["cell"]`` (one of ``cells``) and the fixed ``params``;
    it ends with ``tune.report(...)``. ``resources``: one trial's bundle (``cpu``, ``gpu``,
    ``memory`` or custom resource names). ``dirname(cell)``: the trial's folder name (not
    Tune's default, which spells out every parameter). ``callbacks``: Tune callbacks on the
    driver (e.g. one that commits each cell as it completes). ``on_interrupt`` runs on Ctrl-C
    before ``KeyboardInterrupt`` is raised (to say what is kept). A failed trial (after its
    retries) raises :func:`trial_failure`'s error once every other trial has finished."""
    from ray import tune

    # Tune's newer console output prints an experiment box and a TensorBoard hint even at
    # verbose=0; the older one prints nothing there. A grid's progress is the cells' log lines.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    bundle = {k.upper() if k in ("cpu", "gpu") else k: v for k, v in resources.items()}
    tuner = tune.Tuner(
        tune.with_resources(trainable, tune.PlacementGroupFactory([bundle])),
        param_space={"cell": tune.grid_search(cells), **(params or {})},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=max_concurrent or None,
            trial_dirname_creator=(
                (lambda trial: f"{dirname(trial.config['cell'])}_{trial.trial_id}")
                if dirname
                else None
            ),
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path,
            verbose=0,
            callbacks=callbacks,
            failure_config=tune.FailureConfig(max_failures=max_failures),
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
            if on_interrupt:
                on_interrupt()
            raise KeyboardInterrupt
    errors = [r.error for r in grid if r.error is not None]
    if errors:
        raise trial_failure(errors, what)
    return grid
