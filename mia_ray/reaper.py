"""The local Ray instance a run starts must not outlive the run.

``ray.init()`` starts the instance's processes (GCS, raylet, dashboard, log monitor) as
children of the driver, and the raylet starts the agents and the workers. Killed with
SIGKILL, the driver never runs ``ray.shutdown()``, and measured here (Ray 2.60) the
``DashboardAgent`` and ``RuntimeEnvAgent`` (and, on a busy machine, workers) live on with
parent 1. :func:`watch` starts a small process in a session of its own that keeps the list
of the driver's descendants (pid and start time, from ``/proc``) while the driver lives, and
once it is gone stops those that remain: SIGTERM, then SIGKILL after a grace period. A pid
is signalled only while its start time is the one recorded, so a reused pid is left alone.
Linux only (``/proc``); elsewhere :func:`watch` does nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 1.0
GRACE_S = 3.0


def _stat(pid: int) -> tuple[int, int] | None:
    """``(ppid, start time)`` of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = raw.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    if rest[0] == "Z":
        return None  # a zombie is gone already
    return int(rest[1]), int(rest[19])


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: pid -> start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            got = _stat(int(name))
            if got is not None:
                children.setdefault(got[0], []).append(int(name))
                starts[int(name)] = got[1]
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in starts and pid not in out:
            out[pid] = starts[pid]
            todo.extend(children.get(pid, []))
    return out


def is_alive(pid: int, start: int) -> bool:
    got = _stat(pid)
    return got is not None and got[1] == start


def reap(known: dict[int, int], grace_s: float = GRACE_S) -> list[int]:
    """Stop the processes in ``known`` (pid -> start time) that still run; return the pids
    it stopped."""
    left = [p for p, s in known.items() if is_alive(p, s)]
    signalled = list(left)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(is_alive(p, known[p]) for p in left):
            time.sleep(0.1)
        left = [p for p in left if is_alive(p, known[p])]
        if not left:
            break
    return [p for p in signalled if not is_alive(p, known[p])]


def run(driver: int, driver_start: int, poll_s: float = POLL_S) -> None:
    """The reaper's loop (in its own process): follow ``driver``'s descendants until it is
    gone, then stop them."""
    known: dict[int, int] = {}
    while is_alive(driver, driver_start):
        known.update(descendants(driver))
        known.pop(os.getpid(), None)  # the reaper is the driver's child too
        time.sleep(poll_s)
    known.update(descendants(driver))  # reparented ones are not its children any more
    known.pop(os.getpid(), None)
    reap(known)


def watch() -> subprocess.Popen | None:
    """In the driver, after it started a local Ray instance: start the reaper (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    me = os.getpid()
    got = _stat(me)
    if got is None:
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "mia_ray.reaper", str(me), str(got[1])],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the driver's process group: a Ctrl-C spares it
        close_fds=True,
    )


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]))
