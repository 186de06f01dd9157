"""Whether this machine is idle enough to time something on it."""

from __future__ import annotations

import sys
import time


def others_busy(seconds: float = 2.0) -> float:
    """The machine's busy share over ``seconds`` (/proc/stat), this process idle meanwhile."""

    def ticks():
        f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return sum(f), f[3] + f[4]  # all, idle + iowait

    t0, i0 = ticks()
    time.sleep(seconds)
    t1, i1 = ticks()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def wait_idle(limit: float = 0.1, tries: int = 120) -> float:
    """Wait until other work uses under ``limit`` of the machine (an idle cell must be idle)."""
    for _ in range(tries):
        share = others_busy()
        if share < limit:
            return share
        print(f"machine {share:.0%} busy: waiting to measure idle", file=sys.stderr)
        time.sleep(10)
    sys.exit("the machine never went idle: no idle numbers")
