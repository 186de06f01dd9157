"""cluster.yaml against Ray's own launcher schema, and the cluster job config against ours."""

import json
from importlib import resources
from pathlib import Path

import pytest
import yaml

from mia_ray.config import AttackJobConfig, load_config

ROOT = Path(__file__).resolve().parents[1]

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def cluster():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text(encoding="utf-8"))


def _ray_schema():
    # The schema Ray's launcher validates with (`ray up`), from the installed ray package;
    # ray is imported only as a file location, not started.
    ray_files = resources.files("ray")
    return json.loads((ray_files / "autoscaler" / "ray-schema.json").read_text(encoding="utf-8"))


def test_cluster_yaml_matches_rays_launcher_schema(cluster):
    jsonschema.validate(cluster, _ray_schema())


def test_cluster_has_a_cpu_head_and_gpu_workers_on_the_260_gpu_image(cluster):
    types = cluster["available_node_types"]
    head = cluster["head_node_type"]
    assert head in types and types[head]["resources"].get("GPU", 0) == 0
    gpu_types = {name: t for name, t in types.items() if t["resources"].get("GPU", 0) > 0}
    assert gpu_types and head not in gpu_types
    for t in gpu_types.values():
        assert 0 <= t.get("min_workers", 0) <= t["max_workers"] <= cluster["max_workers"]
    assert cluster["docker"]["image"] == "rayproject/ray:2.60.0-gpu"


def test_every_node_uses_one_auth_mode_and_installs_the_project(cluster):
    opts = " ".join(cluster["docker"]["run_options"])
    assert "RAY_AUTH_MODE=token" in opts
    token_path = opts.split("RAY_AUTH_TOKEN_PATH=")[1].split()[0]
    assert any(token_path.startswith(remote.rstrip("/") + "/") for remote in cluster["file_mounts"])
    setup = " ".join(cluster["setup_commands"])
    assert "pip install" in setup and "-e ." in setup and "torch" in setup
    assert any("--head" in c for c in cluster["head_start_ray_commands"])
    assert any("$RAY_HEAD_IP" in c for c in cluster["worker_start_ray_commands"])


def test_cluster_job_config_loads_with_every_key_valid():
    cfg = load_config(AttackJobConfig, str(ROOT / "jobs" / "attack_cluster.yaml"))
    assert cfg.model.name_or_path.startswith("EleutherAI/pythia-")
    assert cfg.model.reference == "EleutherAI/pythia-160m"
    assert (cfg.model.dtype, cfg.model.device) == ("bfloat16", "cuda")
    assert (cfg.resources.scorer_actors, cfg.resources.gpus_per_actor) == (4, 1.0)
    assert cfg.eval.blind_baseline and "ref" in cfg.attack.attacks
