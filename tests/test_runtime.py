"""The CLI's stderr: Ray's known-harmless lines dropped, everything else passed whole."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

KNOWN = (
    "[2026-12-07 17:44:23,123 E 2065 2071] core_worker.cc:2170: Actor with class name: "
    "'MapWorker(MapBatches(Scorer))' and ID: '9e175f8de7f8d1f2271c24e308000000' has constructor "
    "arguments in the object store and max_restarts > 0. If the arguments in the object store "
    "go out of scope or are lost, the actor restart will fail. See "
    "https://github.com/ray-project/ray/issues/53727 for more details."
)


def _stderr_of(code: str) -> str:
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr
    return res.stderr


def test_the_known_line_is_dropped_and_everything_else_passes_in_order():
    # Written at fd level (as Ray's C++ logger does), in pieces that split the known line, after
    # a progress bar's partial line, with a Python traceback-like line and an unfinished tail.
    err = _stderr_of(
        f"""
        import os, sys, time
        from mia_ray.runtime import filter_stderr
        filter_stderr()
        known = {KNOWN!r}.encode() + b"\\n"
        os.write(2, b"Running 0: 0.00 row [00:00, ? row/s]" + known[:30])
        time.sleep(0.2)
        os.write(2, known[30:] + b"[2026-12-07 17:44:24,001 E 1 1] core_worker.cc:9: a real error\\n")
        print("python line", file=sys.stderr)
        os.write(2, known + b"[00:01, 3 row/s] unfinished")
        """
    )
    assert err == (
        "Running 0: 0.00 row [00:00, ? row/s]"
        "[2026-12-07 17:44:24,001 E 1 1] core_worker.cc:9: a real error\n"
        "python line\n[00:01, 3 row/s] unfinished"
    )


@pytest.mark.ray
def test_a_ray_data_actor_pool_prints_the_line_and_the_filter_hides_it_and_only_it():
    # The line is Ray's (2.60): if a Ray upgrade stops printing it, the first assertion fails
    # and KNOWN_HARMLESS should lose its entry.
    code = """
        import sys
        import ray
        from mia_ray.runtime import connect
        connect(address="", num_cpus=1, hide_known_noise={hide})
        class Double:
            def __call__(self, batch):
                return {{"id": batch["id"] * 2}}
        rows = ray.data.range(4).map_batches(Double, compute=ray.data.ActorPoolStrategy(size=1)).take_all()
        print("sum", sum(r["id"] for r in rows), file=sys.stderr)
        """
    loud = _stderr_of(code.format(hide=False))
    assert "has constructor arguments in the object store and max_restarts > 0" in loud, loud
    quiet = _stderr_of(code.format(hide=True))
    assert "sum 12\n" in quiet
    assert "core_worker.cc" not in quiet and "max_restarts" not in quiet, quiet
