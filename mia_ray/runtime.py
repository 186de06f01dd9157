"""Connect to Ray: a local instance by default, ``--address`` for a cluster, or the job's cluster.

Inside ``ray job submit`` Ray sets RAY_ADDRESS for the entrypoint, so a plain ``ray.init()``
attaches to the cluster that runs the job; we never start a second instance there.
"""

from __future__ import annotations

import os
import re

from mia_ray.errors import MiaError


def in_ray_job() -> bool:
    return bool(os.environ.get("RAY_JOB_ID") or os.environ.get("RAY_ADDRESS"))


_MODE = ""


def connect(
    address: str = "", num_cpus: int = 0, quiet: bool = True, hide_known_noise: bool = False
) -> str:
    """Start or attach to Ray; return which mode was used: ``local``, ``cluster`` or ``job``.

    ``hide_known_noise`` (the CLI and the Python API, which own their process's stderr):
    drop the lines of :data:`KNOWN_HARMLESS` from this process's stderr from now on."""
    global _MODE
    import ray

    if ray.is_initialized():
        return _MODE or "attached"
    _MODE = _connect(ray, address, num_cpus, quiet)
    if hide_known_noise:
        filter_stderr()
    return _MODE


# Lines Ray prints on a run that succeeds, each known harmless, with why.
KNOWN_HARMLESS = {
    # Ray Data hands every pool actor its context and its transform as object refs and sets
    # max_restarts=-1, so Ray's core worker prints this ERROR once per actor (2.60; open
    # upstream as ray-project/ray#57733). The operator holds those refs until the dataset is
    # done, so the restart the line warns about still works for as long as the pool runs.
    "ray-data-actor-args": re.compile(
        rb"\[[0-9-]+ [0-9:,]+ E \d+ \d+\] core_worker\.cc:\d+: Actor with class name: "
        rb"'[^'\n]*' and ID: '[0-9a-f]+' has constructor arguments in the object store and "
        rb"max_restarts > 0\.[^\n]*\n"
    ),
}
# The start of a line of Ray's C++ log ("[2026-12-07 17:44:23,123 E ..."), held back until
# its end is seen so that a known line is dropped whole and never half printed.
_RAY_LOG_START = re.compile(rb"\[(?:\d{0,4}|\d{4}-[^\n]*)\Z")
_FILTER: dict = {}


def filter_stderr(known: dict | None = None) -> None:
    """Route this process's stderr (fd 2, so C++ writes too) through a thread that drops the
    ``known`` lines (default :data:`KNOWN_HARMLESS`) and passes everything else at once,
    progress bars' partial lines included. Undone at exit, after the last byte is passed."""
    import atexit
    import sys
    import threading

    if _FILTER:
        return
    patterns = list((known or KNOWN_HARMLESS).values())
    sys.stderr.flush()
    terminal = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward(data: bytes) -> None:
        try:
            while data:
                data = data[os.write(terminal, data) :]
        except OSError:
            pass  # a closed terminal: keep draining, so no writer ever blocks on the pipe

    def pump() -> None:
        held = b""
        while chunk := os.read(read_end, 65536):
            held += chunk
            for pattern in patterns:
                held = pattern.sub(b"", held)
            tail = _RAY_LOG_START.search(held)
            cut = tail.start() if tail else len(held)
            if cut:
                forward(held[:cut])
            held = held[cut:]
        if held:
            forward(held)
        os.close(read_end)

    thread = threading.Thread(target=pump, name="mia-ray-stderr", daemon=True)
    thread.start()

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(terminal, 2)  # closes the pipe's last write end: the pump drains and ends
        thread.join(timeout=2)  # a child that kept the pipe open

    atexit.register(restore)
    _FILTER.update(thread=thread, terminal=terminal)


def describe() -> dict:
    """What the run ran on, for the report."""
    import ray

    res = ray.cluster_resources() if ray.is_initialized() else {}
    return {
        "mode": _MODE or "attached",
        "ray_version": ray.__version__,
        "nodes": sum(n.get("Alive", False) for n in ray.nodes()) if ray.is_initialized() else 0,
        "cpus": float(res.get("CPU", 0)),
        "gpus": float(res.get("GPU", 0)),
    }


def _connect(ray, address: str, num_cpus: int, quiet: bool) -> str:
    # No runtime_env here: inside `ray job submit` it would replace the job's working_dir.
    # Worker logs reach the driver so training progress in Ray tasks stays visible.
    common = {"log_to_driver": True, "ignore_reinit_error": True}
    if quiet:
        common["logging_level"] = "WARNING"
    try:
        if address:
            ray.init(address=address, **common)
            return "cluster"
        if in_ray_job():
            ray.init(**common)
            return "job"
        cpus = num_cpus or os.cpu_count() or 1
        # A private local instance needs no token; a cluster keeps whatever mode it was started with.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, **common)
        from mia_ray.reaper import watch

        watch()  # the instance's processes go with this driver, however it ends
        return "local"
    except ConnectionError as e:
        raise MiaError(
            f"cannot reach the Ray cluster at {address or os.environ.get('RAY_ADDRESS')}: {e}"
        ) from None


def ray_options(res_cfg, num_cpus: float, num_gpus: float = 0.0) -> dict:
    """Ray options for a model actor, task or trial: its CPUs and GPUs plus the job's
    ``resources.custom_resources`` (which keep model work on the nodes that have them)."""
    opts: dict = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    custom = dict(getattr(res_cfg, "custom_resources", None) or {})
    if custom:
        opts["resources"] = custom
    return opts


def cluster_cpus() -> float:
    import ray

    return float(ray.cluster_resources().get("CPU", 1))


def configure_data_context(no_progress_timeout_s: float = 0.0, progress: bool = True) -> None:
    import logging
    import warnings

    import ray
    import ray.data  # sets up Ray Data's log handlers, which the filter below joins

    logging.getLogger("ray.data").setLevel(os.environ.get("RAY_DATA_LOG_LEVEL", "WARNING"))
    # Ray Data prints a failing task's whole traceback to the console (twice) before it
    # raises; the CLI says the cause in one line and keeps the traceback in error.log (Ray
    # Data's own log file still gets it: the filter sits on the console handlers only).
    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        ):
            handler.addFilter(_drop_failure_traces)
    # Ray Data warns once per process that it shows no progress bars when told not to.
    logging.getLogger("ray.data._internal.progress").addFilter(_drop_progress_notice)
    warnings.filterwarnings("ignore", message="Use 'expr' instead of 'fn'")
    warnings.filterwarnings("ignore", message="The minimum number of concurrent actors")

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = progress
    # Keep the user's exception type (e.g. MiaError from a map function) instead of
    # Ray Data's UserCodeException, so the CLI can print its one line.
    ctx.raise_original_map_exception = True
    if no_progress_timeout_s:
        ctx.execution_no_progress_timeout_s = no_progress_timeout_s


def _drop_progress_notice(record) -> bool:
    return not record.getMessage().startswith("Progress bars disabled")


def _drop_failure_traces(record) -> bool:
    return record.name != "ray.data.exceptions" and not record.exc_info
