"""cluster.yaml against Ray's own launcher schema, and the cluster job config against ours."""

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from mia_ray.config import load_config
from mia_ray.pipelines.attack.config import AttackJobConfig

ROOT = Path(__file__).resolve().parents[1]

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def cluster():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text(encoding="utf-8"))


def _ray_schema():
    # The schema `ray up` validates with, from the installed ray package. find_spec locates
    # the package without importing it (importing ray takes seconds).
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.submodule_search_locations, "ray is not installed"
    path = Path(spec.submodule_search_locations[0]) / "autoscaler" / "ray-schema.json"
    return json.loads(path.read_text(encoding="utf-8"))


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
    assert (cfg.resources.scorer.actors, cfg.resources.scorer.gpus) == (4, 1.0)
    assert cfg.eval.blind_baseline and "ref" in cfg.attack.attacks


def test_cluster_yaml_passes_rays_own_launcher_checks(cluster):
    # Beyond the schema: the cross-field checks `ray up` runs after filling in defaults
    # (private API, but ray is pinned to 2.60.x in pyproject.toml).
    util = pytest.importorskip("ray.autoscaler._private.util")
    util.validate_config(util.prepare_config(copy.deepcopy(cluster)))


def test_lumia_cluster_job_configs_load_with_every_key_valid():
    from mia_ray.pipelines.lumia.config import LumiaJobConfig

    text = load_config(LumiaJobConfig, str(ROOT / "jobs" / "lumia_cluster.yaml"))
    assert text.model.name_or_path == "EleutherAI/pythia-1.4b" and text.targets == []
    assert (text.resources.scorer.gpus, text.probe.repeats) == (1.0, 3)
    llava = load_config(LumiaJobConfig, str(ROOT / "jobs" / "lumia_llava_cluster.yaml"))
    assert llava.model.name_or_path.startswith("llava-hf/llava-onevision-")
    assert llava.data.image_field == "image" and llava.attacks == []
    demo = load_config(LumiaJobConfig, str(ROOT / "jobs" / "lumia_demo.yaml"))
    assert demo.targets == ["tiny", "smollm2"] and demo.probe.kinds == ["mlp", "logreg"]


def test_memhunter_job_configs_load_with_the_papers_settings_on_the_cluster():
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig

    c = load_config(MemHunterJobConfig, str(ROOT / "jobs" / "memhunter_cluster.yaml"))
    assert (c.model.name_or_path, c.hunter.model) == ("EleutherAI/pythia-1b", "gpt2")
    h = c.hunter
    assert (h.top_k, h.beams, h.pool_size, h.iterations) == (48, 4, 256, 10)
    assert (h.lora_r, h.lora_alpha, h.epochs, h.lr) == (8, 16, 8, 5e-4)
    assert c.extraction.trials == [5, 10, 20, 30] and c.resources.scorer.gpus == 1.0
    demo = load_config(MemHunterJobConfig, str(ROOT / "jobs" / "memhunter_demo.yaml"))
    assert demo.world.target == "smollm2" and demo.hunter.model == ""
    sweep = load_config(MemHunterJobConfig, str(ROOT / "jobs" / "memhunter_sweep_smollm2.yaml"))
    assert sweep.sweep.models == ["@world:smollm2", "@world:smollm2-control"]
    assert sweep.dataset_test.proxy == "@world:smollm2" and sweep.world.target == ""


def test_leakage_job_configs_load_with_the_papers_settings():
    from mia_ray.pipelines.leakage.config import LeakageJobConfig

    c = load_config(LeakageJobConfig, str(ROOT / "jobs" / "leakage_cluster.yaml"))
    assert c.scan.copyright_span == 300 and c.eval.shots == 16 and c.scan.workers == 32
    assert c.crawl.shards[0].startswith("s3://") and c.crawl.shards[0].endswith("*.warc.wet.gz")
    assert (c.crawl.sample, c.crawl.seed) == (0.01, 0)
    assert (c.backend.device, c.resources.scorer.gpus) == ("cuda", 1.0)
    assert c.eval.targets == ["EleutherAI/pythia-1.4b", "EleutherAI/pythia-1.4b-deduped"]
    demo = load_config(LeakageJobConfig, str(ROOT / "jobs" / "leakage_demo.yaml"))
    assert demo.crawl.demo and demo.eval.targets[0] == "@world:smollm2-crawl"
    assert demo.eval.few_shot_curve == [0, 4, 8, 16]
    from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig

    bb = load_config(CopyCheckJobConfig, str(ROOT / "jobs" / "copycheck_blackbox_demo.yaml"))
    assert bb.uncertainty.samplers == ["blackbox"] and bb.backend.serve


def test_every_node_reaches_storage_and_every_submitted_job_sets_it(cluster):
    # No shared disk between the nodes: each reaches the S3 storage through its role.
    for name, t in cluster["available_node_types"].items():
        assert t["node_config"]["IamInstanceProfile"]["Arn"].startswith("arn:aws:iam::"), name
    # docs/cluster.md holds every pipeline's submit command; README.md its one-line example.
    for doc, least in (("docs/cluster.md", 4), ("README.md", 1), ("cluster.yaml", 1)):
        text = (ROOT / doc).read_text(encoding="utf-8").replace("#   ", "").replace("#       ", "")
        submits = text.split("ray job submit --address")[1:]
        assert len(submits) >= least, doc
        for block in submits:
            command = block.split("\n\n")[0].split("```")[0].split("ray rsync-down")[0]
            assert "--set resources.storage=$MIA_RAY_STORAGE/" in command, (doc, command[:300])
        assert "export MIA_RAY_STORAGE=s3://" in text
