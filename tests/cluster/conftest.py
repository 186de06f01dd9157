"""A real local multi-node Ray cluster for the ``cluster`` tier: a head and two workers.

Every node is a ``ray start --block`` process of its own on this machine (loopback address,
ports all chosen here). Each worker runs in a private mount namespace where tmpfs mounts
hide the driver's ``runs/``, ``home/`` (``MIA_RAY_HOME``) and ``data/`` folders, so a task
on a worker sees what a task on another machine would: empty local folders at the driver's
paths. ``shared/`` stays visible everywhere, like a shared mount (NFS, EFS), and a moto S3
server stands in for object storage, reached through the nodes' environment as on a real
cluster (credentials from the node's environment or instance role).

Coexistence with the session's local Ray instance (``ray_local``, tests/conftest.py):
- every listening port is chosen here (Ray's defaults, e.g. the dashboard agent's 52365,
  may already be held by ``ray_local``), and worker processes take OS-assigned ports;
- every node has its own short ``--temp-dir`` (Ray allows one per node), so ``ray start``
  writes its ``ray_current_cluster`` address file there, never /tmp/ray/ray_current_cluster,
  which a later plain ``ray.init()`` elsewhere in the suite would otherwise attach to;
- no ``ray stop`` (it stops every Ray process on the machine): each node is a ``--block``
  child started in a new session (its own process group), torn down by SIGTERM to that
  ``ray start`` process (which stops and reaps the node's processes), then SIGKILL to
  whatever is left in its process group;
- the pytest process never calls ``ray.init`` for the cluster (it may already be connected
  to ``ray_local``): tests drive the cluster from driver subprocesses, and the fixture reads
  the node table straight from the GCS.

Ray registers every node under the machine's own IP even when started with
``--node-ip-address=127.0.0.1`` (``node:<ip>`` is the same resource on all three): tell nodes
apart by node id or by the ``worker_<i>`` resources, never by IP.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
RAY = VENV_BIN / "ray"
PYTHON = VENV_BIN / "python"
HERE = Path(__file__).resolve().parent

OBJECT_STORE_BYTES = 300 * 1024**2
NODE_CPUS = 2
N_WORKERS = 2
# Folders of the driver that a worker node does not see (its own empty tmpfs instead).
PRIVATE_DIRS = ("runs", "home", "data")
# Environment variables of the test process that must not leak into the nodes or drivers:
# they would point them at another cluster or job.
_STRIP_ENV = (
    "RAY_ADDRESS",
    "RAY_JOB_ID",
    "RAY_RUNTIME_ENV",
    "RAY_NAMESPACE",
    "PYTEST_CURRENT_TEST",
)


def pytest_collection_modifyitems(config, items):
    # Every test under tests/cluster/ is in the `cluster` tier.
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.cluster)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _stop_nodes(procs: list[subprocess.Popen], grace: float = 15.0) -> None:
    """Stop nodes: SIGTERM each ``ray start --block`` process, which stops and reaps its
    node's processes, then SIGKILL whatever is left in their process groups or below them."""
    import psutil

    trees = []
    for proc in procs:
        try:
            trees += psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        if proc.poll() is None:
            proc.terminate()
    deadline = time.time() + grace
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in trees:  # anything that left its group (none expected)
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
    psutil.wait_procs(trees, timeout=10)


class WorkerNode(NamedTuple):
    node_id: str
    raylet_pid: int
    resource: str  # "worker_<i>": request {resource: 1} to run on this node only


@dataclass
class S3Server:
    endpoint_url: str
    bucket: str
    env: dict[str, str]  # credentials, region and endpoint, as a node's environment holds them

    def uri(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"


class Driver:
    """A driver subprocess on the cluster whose output lines are read as they come, so a
    test can act in the middle of a run (kill a node, kill the driver)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str):
        import threading

        self.proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float):
        """The first ``re.Match`` of ``pattern`` in an output line (AssertionError if none
        came before ``timeout`` or the driver's end)."""
        import re

        deadline = time.time() + timeout
        seen = 0
        while time.time() < deadline:
            while seen < len(self.lines):
                m = re.search(pattern, self.lines[seen])
                seen += 1
                if m:
                    return m
            if self.proc.poll() is not None and seen == len(self.lines):
                break
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r}:\n{self.log[-4000:]}")

    def finish(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(10)
        return self.proc.returncode


@dataclass
class LocalCluster:
    """A head and ``N_WORKERS`` worker nodes on this machine; see the module docstring."""

    address: str  # "127.0.0.1:PORT", the GCS
    dashboard_url: str  # the head's dashboard, for the Jobs API
    base: Path
    runs: Path  # hidden on workers
    home: Path  # MIA_RAY_HOME, hidden on workers
    data: Path  # hidden on workers
    shared: Path  # visible on every node
    head_node_id: str = ""
    workers: list[WorkerNode] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)  # for every node and driver
    s3: S3Server | None = None
    logs: Path = Path()
    _ray_tmp: Path = Path()
    _ports: dict[str, int] = field(default_factory=dict)
    _head: subprocess.Popen | None = None
    _worker_procs: list[subprocess.Popen | None] = field(default_factory=list)
    _starts: int = 0

    # -- environments --------------------------------------------------------------------

    def node_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _STRIP_ENV}
        env.update(
            RAY_AUTH_MODE="disabled",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
            MIA_RAY_HOME=str(self.home),
            RAY_USAGE_STATS_ENABLED="0",
            # SIGTERM stops a node at once (by default Ray 2.60 first drains it for up
            # to 30 s, waiting on the GCS, which made teardown slow)
            RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
        )
        env.update(self.extra_env)
        return env

    def driver_env(self, extra_env: dict[str, str] | None = None) -> dict[str, str]:
        """Environment of a driver process attached to this cluster.

        RAY_ADDRESS makes ``ray.init()`` (and mia-ray's ``connect``) attach to this cluster.
        Which raylet a driver joins: Ray 2.60 looks for raylet processes on this host, keeps
        those that are alive in the cluster (and match ``_node_ip_address``, ``_temp_dir``
        if given) and, when several match, takes the head node
        (``ray._private.services.get_node_to_connect_for_driver``). All three nodes share one
        IP, so no address could single one out; that rule puts every driver on the head,
        deterministically, with nothing to set (tested in test_cluster_basics.py).
        """
        env = self.node_env()
        env["RAY_ADDRESS"] = self.address
        env.update(extra_env or {})
        return env

    # -- drivers -------------------------------------------------------------------------

    def run_driver(
        self,
        args: list[str],
        timeout: float,
        extra_env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.CompletedProcess:
        """``python -m mia_ray <args>`` as a driver on this cluster (attached to the head)."""
        return subprocess.run(
            [str(PYTHON), "-m", "mia_ray", *args],
            env=self.driver_env(extra_env),
            cwd=str(cwd or REPO),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run_python(
        self,
        code: str,
        timeout: float = 120,
        extra_env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.CompletedProcess:
        """``python -c <code>`` as a driver on this cluster; ``ray.init()`` in it attaches."""
        return subprocess.run(
            [str(PYTHON), "-c", code],
            env=self.driver_env(extra_env),
            cwd=str(cwd or REPO),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def spawn_driver(self, args: list[str], extra_env: dict[str, str] | None = None) -> Driver:
        """``python -m mia_ray <args>`` as a driver on this cluster, running in the background."""
        return Driver([str(PYTHON), "-m", "mia_ray", *args], self.driver_env(extra_env), str(REPO))

    def copy_world(self, test_world: dict, dest: Path) -> Path:
        """The suite's test world copied to ``dest`` once (a folder the workers cannot see)."""
        if not dest.exists():
            shutil.copytree(test_world["root"], dest, ignore=shutil.ignore_patterns(".lock"))
        return dest

    def worker_ids(self) -> set[str]:
        return {w.node_id for w in self.workers}

    def actors(self, class_part: str) -> dict[str, str | None]:
        """actor_id -> node_id of every actor (alive or dead) whose class name has
        ``class_part`` (Ray's state API, through the head's dashboard)."""
        from ray.util.state import list_actors

        rows = list_actors(address=self.dashboard_url, limit=10000, raise_on_missing_output=False)
        return {a.actor_id: a.node_id for a in rows if class_part in (a.class_name or "")}

    # -- node table (from the GCS, without ray.init in this process) -----------------------

    def nodes(self) -> list[dict]:
        """Every node the GCS knows (dead ones too): node_id, alive, is_head, resources."""
        from ray._raylet import GcsClient
        from ray.core.generated.gcs_pb2 import GcsNodeInfo

        client = GcsClient(address=self.address)
        out = []
        for node_id, info in client.get_all_node_info(timeout=10).items():
            out.append(
                {
                    "node_id": node_id.hex(),
                    "alive": info.state == GcsNodeInfo.ALIVE,
                    "is_head": bool(info.is_head_node),
                    "resources": dict(info.resources_total),
                }
            )
        return out

    def alive_nodes(self) -> list[dict]:
        try:
            return [n for n in self.nodes() if n["alive"]]
        except Exception:  # GCS not up yet
            return []

    def wait_for_nodes(self, n: int = 1 + N_WORKERS, timeout: float = 60) -> list[dict]:
        deadline = time.time() + timeout
        while True:
            alive = self.alive_nodes()
            if len(alive) == n:
                return alive
            self._check_processes()
            if time.time() > deadline:
                raise RuntimeError(
                    f"cluster has {len(alive)} alive nodes, not {n}, after {timeout} s; "
                    f"logs under {self.logs}:\n{self._log_tails()}"
                )
            time.sleep(0.25)

    # -- nodes ---------------------------------------------------------------------------

    def _common_args(self, name: str) -> list[str]:
        agent_http, agent_grpc, metrics, runtime_env = _free_ports(4)
        tmp = self._ray_tmp / name
        tmp.mkdir(parents=True, exist_ok=True)
        return [
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={NODE_CPUS}",
            "--num-gpus=0",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--temp-dir={tmp}",
            f"--dashboard-agent-listen-port={agent_http}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}",
            # 0/0: worker processes take OS-assigned ports (the default range is shared
            # by every node and instance on the machine)
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--disable-usage-stats",
            "--block",
        ]

    def _popen(self, argv: list[str], name: str, env: dict[str, str]) -> subprocess.Popen:
        self._starts += 1
        log = open(self.logs / f"{name}-{self._starts}.log", "wb")  # noqa: SIM115
        try:
            # A new session: the node's processes form one process group that teardown
            # can kill without touching any other Ray on the machine.
            return subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()

    def start_head(self) -> None:
        env = self.node_env()
        # Node death is noticed by the GCS's health checks (defaults: 3 s x 5 failures);
        # faster checks keep kill_worker() tests short.
        env.update(
            RAY_health_check_period_ms="500",
            RAY_health_check_timeout_ms="1000",
            RAY_health_check_failure_threshold="3",
        )
        argv = [
            str(RAY),
            "start",
            "--head",
            f"--port={self._ports['gcs']}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self._ports['dashboard']}",
            f"--ray-client-server-port={self._ports['client']}",
            f"--resources={json.dumps({'head': 1})}",
            *self._common_args("head"),
        ]
        self._head = self._popen(argv, "head", env)

    def start_worker(self, i: int) -> None:
        """Start worker ``i`` (fresh private tmpfs over runs/, home/, data/) without waiting."""
        resources = {"mia_worker": 100, f"worker_{i}": 100}
        ray_argv = [
            str(RAY),
            "start",
            f"--address={self.address}",
            f"--resources={json.dumps(resources)}",
            *self._common_args(f"w{i}"),
        ]
        mounts = " && ".join(f"mount -t tmpfs none {getattr(self, d)}" for d in PRIVATE_DIRS)
        script = f"mount --make-rprivate / 2>/dev/null; {mounts} && exec {shlex.join(ray_argv)}"
        proc = self._popen(["unshare", "-m", "sh", "-c", script], f"w{i}", self.node_env())
        while len(self._worker_procs) <= i:
            self._worker_procs.append(None)
            self.workers.append(WorkerNode("", 0, f"worker_{i}"))
        self._worker_procs[i] = proc

    def _identify_workers(self, indices) -> None:
        import psutil

        by_resource = {}
        for n in self.alive_nodes():
            for r in n["resources"]:
                if r.startswith("worker_"):
                    by_resource[r] = n["node_id"]
        for i in indices:
            resource = f"worker_{i}"
            node_id = by_resource[resource]
            proc = self._worker_procs[i]
            pid = 0
            for p in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if p.name() == "raylet" and f"--node_id={node_id}" in " ".join(p.cmdline()):
                        pid = p.pid
                except psutil.NoSuchProcess:
                    continue
            if not pid:
                raise RuntimeError(f"no raylet process for worker {i} (node {node_id})")
            self.workers[i] = WorkerNode(node_id, pid, resource)

    def kill_worker(self, i: int, wait: bool = True, timeout: float = 30) -> None:
        """SIGKILL worker ``i``'s raylet: the node dies (its ``ray start --block`` then stops
        the node's other processes). With ``wait``, return once the GCS reports it dead."""
        node_id, pid, _ = self.workers[i]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not wait:
            return
        deadline = time.time() + timeout
        while any(n["node_id"] == node_id for n in self.alive_nodes()):
            if time.time() > deadline:
                raise RuntimeError(
                    f"worker {i} (node {node_id}) still alive {timeout} s after kill"
                )
            time.sleep(0.25)
        _stop_nodes([self._worker_procs[i]], grace=5)

    def restart_worker(self, i: int, timeout: float = 60) -> None:
        """Start worker ``i`` again (killing it first if it still runs), in a new private
        namespace with the same layout, and wait for ``1 + N_WORKERS`` alive nodes."""
        proc = self._worker_procs[i]
        if proc is not None and proc.poll() is None:
            self.kill_worker(i)
        self.start_worker(i)
        self.wait_for_nodes(timeout=timeout)
        self._identify_workers([i])

    def ensure_healthy(self) -> None:
        """Restart every worker that is dead or dying (e.g. a test killed it)."""
        import psutil

        alive = {n["node_id"] for n in self.alive_nodes()}
        if self.head_node_id not in alive:
            raise RuntimeError(f"the head node died; logs under {self.logs}")
        for i, w in enumerate(self.workers):
            try:
                raylet_ok = psutil.Process(w.raylet_pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                raylet_ok = False
            # a raylet killed a moment ago may still count as alive in the GCS
            if w.node_id not in alive or not raylet_ok or self._worker_procs[i].poll() is not None:
                self.restart_worker(i)

    def start(self, timeout: float = 60) -> None:
        self.start_head()
        deadline = time.time() + timeout
        while not (heads := [n for n in self.alive_nodes() if n["is_head"]]):
            self._check_processes()
            if time.time() > deadline:
                raise RuntimeError(f"head did not come up; logs:\n{self._log_tails()}")
            time.sleep(0.25)
        self.head_node_id = heads[0]["node_id"]
        for i in range(N_WORKERS):
            self.start_worker(i)
        self.wait_for_nodes(timeout=max(5.0, deadline - time.time()))
        self._identify_workers(range(N_WORKERS))

    def shutdown(self) -> None:
        # workers first (they drain through the head's GCS), then the head
        _stop_nodes([p for p in self._worker_procs if p is not None])
        if self._head is not None:
            _stop_nodes([self._head])

    def _check_processes(self) -> None:
        """Fail fast when a node process exited while we wait for the cluster."""
        if self._head is not None and self._head.poll() is not None:
            raise RuntimeError(f"the head exited; logs:\n{self._log_tails()}")
        for i, proc in enumerate(self._worker_procs):
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"worker {i} exited; logs:\n{self._log_tails()}")

    def _log_tails(self, n: int = 1500) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-n:]}"
            for p in sorted(self.logs.glob("*.log"))
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3-compatible server on 127.0.0.1 with one bucket; ``env`` is what a node needs
    (fake credentials, region, ``AWS_ENDPOINT_URL``) for pyarrow.fs / boto3 to reach it."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "mia-test-key",
        "AWS_SECRET_ACCESS_KEY": "mia-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        # no instance-metadata lookups (they time out slowly off EC2)
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    bucket = "mia-cluster-test"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    ).create_bucket(Bucket=bucket)
    yield S3Server(endpoint_url=endpoint, bucket=bucket, env=env)
    server.stop()


def start_cluster(s3: S3Server | None = None) -> LocalCluster:
    """Start a head and ``N_WORKERS`` workers (see the module docstring) and return them;
    the caller calls ``shutdown()`` and removes ``base``. Also used by bench/cluster_bench.py."""
    # Short: Ray's unix socket paths (temp dir + session name + sockets/plasma_store) must
    # stay under 108 bytes, which pytest's tmp_path would exceed.
    base = Path(tempfile.mkdtemp(prefix="mia-cl-", dir="/tmp"))
    dirs = {name: base / name for name in (*PRIVATE_DIRS, "shared", "logs", "ray")}
    for d in dirs.values():
        d.mkdir()
    gcs, dashboard, client = _free_ports(3)
    cluster = LocalCluster(
        address=f"127.0.0.1:{gcs}",
        dashboard_url=f"http://127.0.0.1:{dashboard}",
        base=base,
        runs=dirs["runs"],
        home=dirs["home"],
        data=dirs["data"],
        shared=dirs["shared"],
        extra_env=dict(s3.env) if s3 else {},
        s3=s3,
        logs=dirs["logs"],
        _ray_tmp=dirs["ray"],
        _ports={"gcs": gcs, "dashboard": dashboard, "client": client},
    )
    try:
        cluster.start()
    except BaseException:
        cluster.shutdown()
        shutil.rmtree(base, ignore_errors=True)
        raise
    return cluster


def can_unshare() -> bool:
    """Worker nodes need private mount namespaces: root (CAP_SYS_ADMIN) and util-linux."""
    probe = "mount --make-rprivate / 2>/dev/null; mount -t tmpfs none /mnt"
    return shutil.which("unshare") is not None and not (
        subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True).returncode
    )


@pytest.fixture(scope="session")
def local_cluster(s3_server) -> Iterator[LocalCluster]:
    """The session's 3-node cluster (head + 2 workers); torn down at the end of the session."""
    if not RAY.exists():
        pytest.skip(f"{RAY} missing (make setup)")
    if not can_unshare():
        pytest.skip("cannot mount a tmpfs in a private mount namespace (unshare -m; needs root)")
    cluster = start_cluster(s3_server)
    try:
        yield cluster
    finally:
        cluster.shutdown()
        shutil.rmtree(cluster.base, ignore_errors=True)


@pytest.fixture(scope="session")
def world(local_cluster, test_world) -> Path:
    """The test world, copied into the cluster's ``data`` folder (hidden from the workers)."""
    return local_cluster.copy_world(test_world, local_cluster.data / "world")


@pytest.fixture
def cluster(local_cluster) -> LocalCluster:
    """``local_cluster``, with any worker that an earlier test killed started again."""
    local_cluster.ensure_healthy()
    return local_cluster
