"""The local Ray instance a run starts does not outlive its driver, even after SIGKILL."""

import os
import signal
import subprocess
import sys
import time

import pytest

from mia_ray.reaper import descendants, is_alive, reap

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = """
import os, sys, time
import ray
from mia_ray.runtime import connect
connect(address="", num_cpus=1)
@ray.remote(num_cpus=0)
class A:
    def pid(self):
        return os.getpid()
a = A.remote()
print("ready", ray.get(a.pid.remote()), flush=True)
time.sleep(600)
"""


def test_a_killed_drivers_ray_processes_are_stopped(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.getcwd()}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    try:
        line = driver.stdout.readline()
        assert line.startswith("ready"), line
        actor = int(line.split()[1])
        time.sleep(2)  # the reaper's list is refreshed every second
        family = descendants(driver.pid)
        # GCS, raylet, the agents and the actor: the processes that outlived a killed driver.
        assert actor in family and len(family) >= 5, family
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(is_alive(p, s) for p, s in family.items()):
            time.sleep(0.5)
        left = [p for p, s in family.items() if is_alive(p, s)]
        assert not left, [open(f"/proc/{p}/cmdline").read() for p in left]
    finally:
        if driver.poll() is None:
            driver.kill()
        reap(descendants(driver.pid))


def test_reap_leaves_a_pid_whose_start_time_differs():
    """A pid the system gave to a new process since it was recorded is not signalled."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = descendants(os.getpid())[proc.pid]
        assert reap({proc.pid: start + 1}, grace_s=0.2) == []  # another start time: spared
        assert proc.poll() is None
        assert reap({proc.pid: start}, grace_s=5) == [proc.pid]
        assert proc.wait(timeout=5) == -signal.SIGTERM
    finally:
        proc.kill()
