"""The cluster path for real: a Ray head on loopback, `ray job submit --working-dir .`."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.extra]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def ray_head():
    # Ray's socket paths must stay under 108 bytes: a short temp dir, not pytest's deep one.
    temp_dir = tempfile.mkdtemp(prefix="mia-head-", dir="/tmp")
    ray_bin = str(Path(sys.executable).parent / "ray")
    # Every listening port is chosen here: the session's local instance (`ray_local`) already
    # holds Ray's defaults, e.g. the dashboard agent's 52365, and a head whose agent cannot
    # bind answers every job submission with "No available agent".
    port, dash, agent_http, agent_grpc, metrics, runtime_env, client = _free_ports(7)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    # --block keeps the head as our child: terminating it stops this head only, never the
    # session's other local Ray instance (as `ray stop` would).
    head = subprocess.Popen(
        [
            ray_bin,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            f"--dashboard-agent-listen-port={agent_http}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--ray-client-server-port={client}",
            "--num-cpus=2",
            "--include-dashboard=true",
            f"--temp-dir={temp_dir}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{dash}"
    deadline = time.time() + 120
    while time.time() < deadline:
        r = subprocess.run(
            [ray_bin, "job", "list", "--address", url], env=env, capture_output=True, text=True
        )
        if r.returncode == 0:
            break
        if head.poll() is not None:
            raise RuntimeError("ray head exited: " + head.stdout.read().decode()[-2000:])
        time.sleep(2)
    else:
        raise RuntimeError("ray head did not come up")
    yield url, env, port
    # A graceful stop of the whole head took 33 s in CI; it is a throwaway: 5 s, then every
    # process of its group and any other that names its temp dir (workers, agents) is killed.
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(10)
    subprocess.run(["pkill", "-9", "-f", temp_dir], check=False)
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_attack_demo_via_ray_job_submit(ray_head, test_world, tmp_path):
    url, env, _ = ray_head
    ray_bin = str(Path(sys.executable).parent / "ray")
    out = tmp_path / "job-run"
    cmd = [
        ray_bin,
        "job",
        "submit",
        "--address",
        url,
        "--working-dir",
        str(REPO),
        "--",
        sys.executable,
        "-m",
        "mia_ray",
        "attack",
        "--config",
        "jobs/attack_demo.yaml",
        "--set",
        "world.scale=test",
        "--set",
        f"world.root={test_world['root']}",
        "--set",
        "eval.bootstrap=200",
        "--set",  # the one-pass attacks: this tests the job path, not the attacks
        "attack.attacks=[loss,zlib,min_k,min_k_plus_plus,lowercase,ref]",
        "--out",
        str(out),
    ]
    # The dashboard answers a few seconds before the head's job agent registers: Ray then
    # refuses with "No available agent" and asks to try again, which is what a user would do.
    for _ in range(15):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
        if "No available agent" not in r.stdout + r.stderr:
            break
        time.sleep(2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    job_id = re.search(r"raysubmit_\w+", r.stdout + r.stderr).group(0)
    from ray.job_submission import JobStatus, JobSubmissionClient

    assert JobSubmissionClient(url).get_job_status(job_id) == JobStatus.SUCCEEDED
    report = json.loads((out / "report.json").read_text())
    assert report["pipeline"] == "attack"
    assert report["metrics"]["loss"]["auc"] >= 0.9
    assert (out / "report.html").stat().st_size > 1000
    # The driver attached to the job's cluster instead of starting its own instance.
    assert report["runtime"]["mode"] == "job"


def test_address_attaches_to_a_running_cluster(ray_head):
    _, env, port = ray_head
    code = (
        "from mia_ray.runtime import connect, describe; "
        f"mode = connect(address='127.0.0.1:{port}'); d = describe(); print(mode, d['cpus'], d['nodes'])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-3:] == ["cluster", "2.0", "1"]
