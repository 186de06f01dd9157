"""The Python API's contract before any run: cheap to import, the CLI's flags as keyword
arguments, ``settings`` as ``--set``, and bad input refused with the CLI's one-line errors
before Ray starts. The runs themselves: tests/pipelines/test_audit.py (the same numbers as
the CLI) and notebooks/audit.ipynb."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import mia_ray
from mia_ray.api import build_config


def test_importing_mia_ray_naming_its_functions_and_bad_input_load_no_heavy_library():
    # Bad input fails before torch, Ray or transformers loads: Ray never starts for it.
    heavy = (
        "print(sorted(m for m in ('torch', 'ray', 'transformers', 'pandas') if m in sys.modules))"
    )
    code = (
        f"import sys, mia_ray; f = mia_ray.audit, mia_ray.verify, mia_ray.Result\n{heavy}\n"
        "try: mia_ray.audit(model='m', suspected='/no/such/files', unseen='/tmp')\n"
        f"except mia_ray.MiaError: pass\n{heavy}"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split("\n")[:2] == ["[]", "['pandas']"], res.stderr


def test_flags_settings_and_the_yaml_build_the_cli_config(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("audit:\n  permutations: 499\nmodel:\n  batch_size: 3\n")
    cfg = build_config(
        "audit",
        config=job,
        settings={"audit.permutations": 199, "audit.fdr": 0.1},
        flags={"model": "m", "suspected": tmp_path / "s", "unseen": "u", "group_by": "source"},
    )
    assert (cfg.model.name_or_path, cfg.audit.suspected, cfg.audit.unseen) == (
        "m",
        str(tmp_path / "s"),
        "u",
    )
    assert cfg.audit.permutations == 199 and cfg.audit.fdr == 0.1 and cfg.model.batch_size == 3
    # mark's --in is a Python keyword: in_ names it.
    assert build_config("mark", flags={"in_": "docs/", "key": "k.json"}).mark.input == "docs/"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: mia_ray.attack(model="m"), "attack: unknown argument 'model' (its flags: none; use settings)"),
        (lambda: mia_ray.audit(settings={"audit.permutatons": 9}), "unknown config key 'audit.permutatons'; did you mean 'permutations'?"),
        (lambda: mia_ray.audit(model="m", suspected="/no/such/files", unseen="/tmp"), "data path not found: /no/such/files (audit.suspected)"),
        (lambda: mia_ray.run("audits"), "unknown pipeline 'audits'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_clear_error_before_ray_starts(call, message):
    with pytest.raises(mia_ray.MiaError) as err:
        call()
    assert str(err.value).startswith(message), str(err.value)


def test_the_result_reads_its_run_folder(tmp_path):
    # A run folder as a pipeline leaves it: the Result's properties read the report's own
    # fields and its tables, by name.
    import pandas as pd

    report = {
        "verdict": {"text": "Evidence that m trained on the suspected files."},
        "dataset_test": {"p_value": 0.0005},
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    pd.DataFrame({"file_id": ["a", "b"], "flagged": [True, False]}).to_parquet(
        tmp_path / "files.parquet"
    )
    r = mia_ray.Result("audit", tmp_path, report, 1.0, "local")
    assert r.verdict.startswith("Evidence") and r.p_value == 0.0005
    assert list(r.files["file_id"]) == ["a", "b"] and r.snippets is None and r.html is None
    assert mia_ray.Result("leakage", tmp_path, {"files": [{"x": 1}]}, 1.0, "local").p_value is None


def test_a_config_is_resolved_once_and_its_checks_never_see_the_world(test_world):
    # What api.run_job does before the pipeline runs: the world fills the config in once.
    from mia_ray import registry
    from mia_ray.config import load_config

    spec = registry.get("pipeline", "attack")
    world = [f"world.root={test_world['root']}", "world.scale=test", "world.target=tiny"]
    cfg = load_config(spec.config_cls, None, world)  # loads: what it must be given waits
    assert cfg.world_pending() and cfg.data.path == ""
    ready = spec.resolve(cfg)
    assert (ready.world.target, ready.world.resolved) == ("", "tiny") and not ready.world_pending()
    assert ready.data.path == str(test_world["documents"])
    assert ready.model.name_or_path == str(test_world["targets"]["tiny"]["model"])
    ready.check_complete()  # on the config as it will run
    assert spec.resolve(ready) is ready  # resolving again changes nothing
    # Without a world, what it must be given is checked when it loads.
    with pytest.raises(mia_ray.MiaError, match=r"^data.path is empty: give the documents"):
        load_config(spec.config_cls, None, [])
