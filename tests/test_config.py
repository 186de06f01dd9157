import pytest
import yaml

from mia_ray.config import AttackJobConfig, dump_yaml, load_config
from mia_ray.errors import MiaError


def _write(tmp_path, text):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return str(p)


def test_yaml_then_overrides(tmp_path):
    path = _write(
        tmp_path,
        "pipeline: attack\ndata:\n  path: docs\n  snippet_size: 64\nmodel:\n  name_or_path: m\n  reference: r\n",
    )
    cfg = load_config(
        AttackJobConfig,
        path,
        ["data.snippet_size=32", "eval.fprs=[0.01, 0.1]", "attack.attacks=loss,zlib"],
    )
    assert cfg.data.snippet_size == 32
    assert cfg.eval.fprs == [0.01, 0.1]
    assert cfg.attack.attacks == ["loss", "zlib"]
    assert cfg.model.name_or_path == "m"


def test_unknown_key_names_key_and_closest(tmp_path):
    path = _write(tmp_path, "data:\n  snipet_size: 64\n")
    with pytest.raises(
        MiaError, match=r"unknown config key 'data.snipet_size'; did you mean 'snippet_size'\?"
    ):
        load_config(AttackJobConfig, path)
    with pytest.raises(MiaError, match=r"unknown config key 'modle'; did you mean 'model'\?"):
        load_config(AttackJobConfig, None, ["modle.batch_size=4"])
    with pytest.raises(
        MiaError, match=r"unknown config key 'model.batchsize'; did you mean 'batch_size'\?"
    ):
        load_config(AttackJobConfig, None, ["model.batchsize=4"])


def test_type_errors_and_cross_field_checks(tmp_path):
    with pytest.raises(MiaError, match=r"data.snippet_size: expected a number, got 'many'"):
        load_config(AttackJobConfig, None, ["data.snippet_size=many", "world.target=tiny"])
    with pytest.raises(MiaError, match=r"data.path is empty"):
        load_config(AttackJobConfig, None, ["model.name_or_path=x"])
    with pytest.raises(MiaError, match=r"attack 'ref' needs model.reference"):
        load_config(AttackJobConfig, None, ["data.path=d", "model.name_or_path=x"])
    with pytest.raises(MiaError, match=r"attack.min_k_ratio 0.7 must be one of"):
        load_config(AttackJobConfig, None, ["world.target=tiny", "attack.min_k_ratio=0.7"])
    with pytest.raises(MiaError, match=r"--set expects key=value, got 'model'"):
        load_config(AttackJobConfig, None, ["model"])
    with pytest.raises(MiaError, match=r"config file not found: nope.yaml"):
        load_config(AttackJobConfig, "nope.yaml")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(AttackJobConfig, None, ["world.target=tiny", "data.snippet_size=100"])
    text = dump_yaml(cfg, "attack")
    assert yaml.safe_load(text)["data"]["snippet_size"] == 100
    again = load_config(AttackJobConfig, _write(tmp_path, text))
    assert again == cfg


def test_shipped_job_configs_are_valid():
    from pathlib import Path

    for path in sorted(Path(__file__).resolve().parents[1].glob("jobs/attack_*.yaml")):
        load_config(AttackJobConfig, str(path))
