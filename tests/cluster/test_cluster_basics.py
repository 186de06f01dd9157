"""The local 3-node cluster itself: placement, private disks, the driver's node, node death, S3."""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest

pytestmark = pytest.mark.cluster


def _drive(cluster, body: str, timeout: float = 120, **kw) -> dict:
    """Run ``body`` in a driver attached to the cluster; it sets ``out`` (JSON-able)."""
    code = "import json, os, ray\nray.init()\n" + textwrap.dedent(body)
    code += "\nprint('RESULT ' + json.dumps(out), flush=True)\n"
    r = cluster.run_python(code, timeout=timeout, **kw)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_three_nodes_and_worker_placement(cluster):
    alive = cluster.alive_nodes()
    assert len(alive) == 3
    assert [n["node_id"] for n in alive if n["is_head"]] == [cluster.head_node_id]
    worker_ids = {w.node_id for w in cluster.workers}
    assert len(worker_ids) == 2 and cluster.head_node_id not in worker_ids
    out = _drive(
        cluster,
        """
        @ray.remote(resources={"mia_worker": 1})
        def where():
            return ray.get_runtime_context().get_node_id()

        out = {
            "nodes": len([n for n in ray.nodes() if n["Alive"]]),
            "where": ray.get([where.remote() for _ in range(4)]),
        }
        """,
    )
    assert out["nodes"] == 3
    assert set(out["where"]) <= worker_ids, (out, cluster.workers)


def test_private_dirs_hidden_on_workers_shared_visible(cluster):
    tag = uuid.uuid4().hex[:8]
    files = {
        name: getattr(cluster, name) / f"probe-{tag}.txt"
        for name in ("runs", "home", "data", "shared")
    }
    for path in files.values():
        path.write_text("from the driver")
    paths = {k: str(v) for k, v in files.items()}
    out = _drive(
        cluster,
        f"""
        paths = {paths!r}

        def look():
            return {{
                "node": ray.get_runtime_context().get_node_id(),
                "seen": {{k: os.path.exists(p) for k, p in paths.items()}},
                # the hidden folders exist on the worker, empty (its own local disk)
                "dirs": {{k: os.path.isdir(os.path.dirname(p)) for k, p in paths.items()}},
            }}

        out = {{
            r: ray.get(ray.remote(resources={{r: 1}})(look).remote())
            for r in ("worker_0", "worker_1")
        }}
        """,
    )
    for i, w in enumerate(cluster.workers):
        got = out[f"worker_{i}"]
        assert got["node"] == w.node_id
        assert got["seen"] == {"runs": False, "home": False, "data": False, "shared": True}
        assert all(got["dirs"].values())


def test_driver_attaches_to_head(cluster):
    out = _drive(
        cluster,
        """
        from mia_ray.runtime import connect

        mode = connect()
        out = {
            "mode": mode,
            "node": ray.get_runtime_context().get_node_id(),
            "home": os.environ["MIA_RAY_HOME"],
        }
        """,
    )
    assert out["node"] == cluster.head_node_id
    assert out["mode"] in ("job", "attached")
    assert out["home"] == str(cluster.home)
    r = cluster.run_driver(["--help"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_kill_and_restart_worker(cluster):
    old = cluster.workers[1]
    cluster.kill_worker(1)
    alive = {n["node_id"] for n in cluster.alive_nodes()}
    assert old.node_id not in alive and len(alive) == 2
    cluster.restart_worker(1)
    new = cluster.workers[1]
    assert new.node_id != old.node_id and new.raylet_pid != old.raylet_pid
    out = _drive(
        cluster,
        """
        @ray.remote(resources={"worker_1": 1})
        def where():
            return ray.get_runtime_context().get_node_id()

        out = {"where": ray.get(where.remote(), timeout=60)}
        """,
    )
    assert out["where"] == new.node_id


def test_s3_from_a_worker_through_node_env(cluster, s3_server):
    import boto3

    key = f"cluster-test/{uuid.uuid4().hex[:8]}/x.txt"
    uri = s3_server.uri(key)
    out = _drive(
        cluster,
        f"""
        import pyarrow.fs as pafs

        @ray.remote(resources={{"mia_worker": 1}})
        def put(uri):
            # no endpoint, no credentials: only the node's environment (as on a cluster)
            fs, path = pafs.FileSystem.from_uri(uri)
            with fs.open_output_stream(path) as f:
                f.write(b"written on a worker")
            return ray.get_runtime_context().get_node_id()

        node = ray.get(put.remote({uri!r}))
        fs, path = pafs.FileSystem.from_uri({uri!r})
        with fs.open_input_stream(path) as f:
            out = {{"node": node, "read": f.read().decode()}}
        """,
    )
    assert out["node"] in {w.node_id for w in cluster.workers}
    assert out["read"] == "written on a worker"
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name=s3_server.env["AWS_DEFAULT_REGION"],
        aws_access_key_id=s3_server.env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=s3_server.env["AWS_SECRET_ACCESS_KEY"],
    )
    body = s3.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
    assert body == b"written on a worker"
