"""`audit.methods`: the other pipelines' configs built from an audit's (unit, no Ray), and
MemHunter and the leakage scan run on an audit's folders of the test world (CopyCheck's run
through the audit, with storage of its own: tests/pipelines/test_audit.py)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mia_ray.errors import MiaError
from mia_ray.pipelines.audit.config import AuditJobConfig
from mia_ray.pipelines.audit.methods import method_configs, run_methods
from mia_ray.train.config import FinetuneConfig


def _audit_cfg(tmp_path, methods, **model):
    cfg = AuditJobConfig()
    cfg.audit.suspected = str(tmp_path / "suspected")
    cfg.audit.unseen = str(tmp_path / "unseen")
    cfg.audit.methods = list(methods)
    cfg.data.labels = str(tmp_path / "labels.json")
    cfg.data.snippet_size = 48
    cfg.data.text_field, cfg.data.id_field = "body", "key"
    cfg.model.name_or_path = str(tmp_path / "target")
    cfg.model.reference = str(tmp_path / "ref")
    cfg.model.max_length = 128
    cfg.model.dtype, cfg.model.batch_size = "float32", 4
    cfg.resources.scorer.cpus, cfg.resources.scorer.torch_threads = 0.5, 1
    cfg.resources.sampler.cpus = cfg.resources.trainer.cpus = 0.25
    for k, v in model.items():
        setattr(cfg.model, k, v)
    cfg.validate()
    return cfg


def test_copycheck_audits_the_same_folders_with_the_same_model(tmp_path):
    cfg = _audit_cfg(tmp_path, ["copycheck"])
    (name, sub), *_ = method_configs(cfg).items()
    assert name == "copycheck"
    ex = sub.experiment
    assert (ex.mode, ex.suspected, ex.unseen) == ("audit", cfg.audit.suspected, cfg.audit.unseen)
    assert sub.model == cfg.model and sub.model is not cfg.model
    assert sub.resources == cfg.resources and sub.data == cfg.data
    assert sub.data.labels == cfg.data.labels and sub.world.target == ""
    # The model's usable context (model.max_length) caps CopyCheck's prompt.
    assert sub.finetune.max_length == 128 < FinetuneConfig.max_length
    # One resources section per role, handed over whole: samplers and fine-tunes as asked.
    assert (sub.resources.sampler.cpus, sub.resources.trainer.cpus) == (0.25, 0.25)
    # Labels score the verdicts: the cheap Prob-Tool baseline; without labels none (their
    # rows are only reported when labels score them).
    assert sub.detect.baselines == ["prob_tool"]
    cfg.data.labels = ""
    assert method_configs(cfg)["copycheck"].detect.baselines == []


def test_memhunter_measures_extraction_on_the_suspected_files_with_the_reference(tmp_path):
    cfg = _audit_cfg(tmp_path, ["memhunter"])
    sub = method_configs(cfg)["memhunter"]
    assert sub.model == cfg.model and sub.resources == cfg.resources
    assert sub.data.path == cfg.audit.suspected and sub.data.labels == ""
    assert (sub.data.text_field, sub.data.id_field) == ("body", "key")
    assert sub.hunter.model == cfg.model.reference
    assert sub.extraction.methods == ["manual"]
    assert sub.extraction.splits == ["test", "nonmember"]
    d = sub.dataset_test
    assert (d.suspects, d.reference, d.proxy) == (["@target"], "@reference", "@finetune:members")
    assert sub.world.target == ""


def test_leakage_scans_the_suspected_files_and_asks_the_audited_model(tmp_path):
    cfg = _audit_cfg(tmp_path, ["leakage"])
    sub = method_configs(cfg)["leakage"]
    assert sub.crawl.shards == [cfg.audit.suspected] and not sub.crawl.demo
    assert (sub.crawl.text_field, sub.crawl.id_field) == ("body", "key")
    assert sub.eval.targets == [cfg.model.name_or_path]
    b = sub.backend
    assert (b.kind, b.device, b.dtype, b.batch_size) == ("local", "auto", "float32", 4)
    assert sub.resources == cfg.resources and sub.scan.cpus_per_worker == 0.5
    assert not sub.scan.copyright and not sub.scan.benchmark
    # A model the local backend cannot load as the audit does: the scan only.
    gguf = _audit_cfg(tmp_path, ["leakage"], gguf_file="model.gguf")
    assert method_configs(gguf)["leakage"].eval.targets == []


def test_all_three_at_once_and_none(tmp_path):
    cfg = _audit_cfg(tmp_path, ["leakage", "copycheck", "memhunter"])
    assert list(method_configs(cfg)) == ["leakage", "copycheck", "memhunter"]
    cfg.audit.methods = []
    assert method_configs(cfg) == {}


@pytest.mark.parametrize(
    ("methods", "change", "message"),
    [
        (["memhunter"], {"reference": ""}, "audit.methods memhunter: needs model.reference"),
        (["copycheck"], {"name_or_path": ""}, "audit.methods copycheck: model.name_or_path is empty"),
        (["copycheck"], {"unseen": ""}, "audit.methods copycheck: experiment.mode audit needs"),
        (["leakage"], {"suspected": ""}, "audit.methods leakage: crawl.shards is empty"),
        (["lumia"], {}, "audit.methods lumia: unknown method (known: copycheck, memhunter, leakage)"),
    ],
)  # fmt: skip
def test_a_method_the_audit_cannot_serve_fails_naming_it(tmp_path, methods, change, message):
    cfg = _audit_cfg(tmp_path, [])
    cfg.audit.methods = methods  # unvalidated: method_configs checks the names itself
    for k, v in change.items():
        setattr(cfg.model if hasattr(cfg.model, k) else cfg.audit, k, v)
    with pytest.raises(MiaError) as err:
        method_configs(cfg)
    assert str(err.value).startswith(message), str(err.value)


def test_an_invalid_sub_config_fails_with_its_own_message_prefixed(tmp_path):
    cfg = _audit_cfg(tmp_path, ["copycheck"])
    cfg.resources.scorer.actors = 0  # the audit's validate is not called again here
    with pytest.raises(MiaError) as err:
        method_configs(cfg)
    assert (
        str(err.value)
        == "audit.methods copycheck: resources.scorer.actors must be at least 1, not 0"
    )


def test_building_the_configs_loads_neither_ray_nor_torch(tmp_path):
    code = (
        "import sys; from pathlib import Path\n"
        "from mia_ray.pipelines.audit.config import AuditJobConfig\n"
        "from mia_ray.pipelines.audit.methods import method_configs\n"
        "cfg = AuditJobConfig()\n"
        f"cfg.audit.suspected, cfg.audit.unseen = {str(tmp_path)!r}, {str(tmp_path)!r}\n"
        "cfg.model.name_or_path = cfg.model.reference = 'm'\n"
        "cfg.audit.methods = ['copycheck', 'memhunter', 'leakage']\n"
        "assert len(method_configs(cfg)) == 3\n"
        "print(sorted(m for m in ('ray', 'torch', 'transformers') if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]", res.stderr


# ----------------------------------------------------------------------- on the test world


@pytest.fixture(scope="module")
def audit_folders(tmp_path_factory, test_world):
    """suspected = 4 member books of tiny + 2 non-members (ids file<i>.txt); unseen = 6 other
    non-member books (ids new<i>.txt); labels over the suspected files."""
    root = Path(test_world["root"])
    manifest = json.loads((root / "manifests" / "tiny.json").read_text())
    books = sorted(d for d in manifest if d.startswith("books/"))
    seen = [d for d in books if manifest[d] == 1][:4]
    unseen = [d for d in books if manifest[d] == 0]
    d = tmp_path_factory.mktemp("audit-methods")
    labels = {}
    for side, prefix, picked in (
        ("suspected", "file", seen + unseen[:2]),
        ("unseen", "new", unseen[2:8]),
    ):
        (d / side).mkdir()
        for i, book in enumerate(picked):
            shutil.copy(root / book, d / side / f"{prefix}{i}.txt")
            if side == "suspected":
                labels[f"{prefix}{i}.txt"] = manifest[book]
    (d / "labels.json").write_text(json.dumps(labels))
    return {"dir": d, "root": root, "labels": labels}


def _world_cfg(folders, methods) -> AuditJobConfig:
    d, models = folders["dir"], folders["root"] / "models"
    cfg = AuditJobConfig()
    cfg.audit.suspected, cfg.audit.unseen = str(d / "suspected"), str(d / "unseen")
    cfg.audit.methods = methods
    cfg.data.labels = str(d / "labels.json")
    cfg.data.snippet_size, cfg.data.max_snippets_per_doc = 48, 2
    cfg.model.name_or_path, cfg.model.reference = str(models / "tiny"), str(models / "tiny-ref")
    cfg.model.max_length = 128  # the test world's tiny has 128 positions
    cfg.resources.scorer.torch_threads = 1
    cfg.validate()
    return cfg


@pytest.mark.ray
@pytest.mark.slow
def test_memhunter_extracts_from_the_suspected_files_and_tests_against_the_unseen(
    tmp_path, ray_local, audit_folders
):
    cfg = _world_cfg(audit_folders, ["memhunter"])
    configs = method_configs(cfg)
    mh = configs["memhunter"]  # test scale, as the sweep test of test_memhunter.py
    mh.pairs.prefix_tokens = mh.pairs.target_tokens = 16
    mh.pairs.per_doc, mh.pairs.max_per_split = 2, 3  # 6 suspected files: 2 test pairs
    mh.hunter.iterations, mh.hunter.prompt_tokens, mh.hunter.epochs = 1, 2, 1
    mh.hunter.top_k, mh.hunter.beams, mh.hunter.pool_size = 4, 1, 16
    mh.extraction.trials = [1, 2]
    mh.dataset_test.trials, mh.dataset_test.finetune_epochs = 1, 1.0
    got = run_methods(cfg, tmp_path / "audit", configs)["memhunter"]
    d = Path(got["out"])
    docs = [json.loads(x) for x in (d / "documents.jsonl").read_text().splitlines()]
    assert {x["id"]: x["label"] for x in docs} == {
        **{f"suspected/file{i}.txt": 1 for i in range(6)},
        **{f"unseen/new{i}.txt": 0 for i in range(6)},
    }
    rows = {(r["method"], r["split"], r["trials"]) for r in got["extraction"]}
    assert rows == {
        *(("memhunter", s, k) for s in ("test", "nonmember") for k in (1, 2)),
        ("manual", "test", 1),
        ("manual", "nonmember", 1),
    }
    for r in got["extraction"]:
        assert 0 <= r["hit_rate"] <= r["avg_lcss"] <= 1  # whole recoveries count in the mean
    assert set(got["dataset_test"]) == {
        "paper",
        "paired_greater",
        "paired_tost",
        "gap_vs_nonmember",
    }
    assert all("h0" in t and "p_value" in t for t in got["dataset_test"].values())
    assert set(got["mean_lcss"]) == {"@target", "@reference", "@finetune:members"}
    assert got["power_check"]["test"]


@pytest.mark.ray
@pytest.mark.slow
def test_leakage_scans_the_suspected_files_and_says_why_the_model_side_did_not_run(
    tmp_path, ray_local, audit_folders
):
    cfg = _world_cfg(audit_folders, ["leakage"])
    got = run_methods(cfg, tmp_path / "audit", method_configs(cfg))["leakage"]
    assert got["documents"] == 6 and set(got["leakage_rate"]) == {"pii"}
    pii = got["leakage_rate"]["pii"]
    assert 0 <= pii["rate"] <= 1 and pii["eligible"] == 6
    # Plays hold names but no personal-data records: no instance to ask the model about.
    assert "output_rate" not in got and "instances" in got["eval_skipped"]
    report = json.loads((Path(got["out"]) / "report.json").read_text())
    assert report["crawl"]["shards"] == [cfg.audit.suspected]
    # The survey says so itself (eval.too_few = skip), in its report and its page.
    assert report["eval_skipped"] == got["eval_skipped"] and "eval" not in report
    page = (Path(got["out"]) / "report.html").read_text()
    assert "The model side did not run: the scan found fewer than" in page


PLANTED = [
    "Please write to jane.doe@example.com by Friday.",
    "Call our office at (212) 555-0147 today.",
    "Reservations: 415-555-0199.",
    "Our London office: +44 20 7946 0958.",
    "CC tom.harris@example.org, thanks.",
    "Text STOP to 312.555.0123 to quit.",
]


@pytest.mark.ray
@pytest.mark.slow
def test_leakage_asks_the_audited_model_about_the_personal_data_it_found(
    tmp_path, ray_local, audit_folders
):
    """Suspected files with a personal-data sentence each: the model side runs on the audited
    model through the local backend (at test scale: one few-shot pair, 3 instances)."""
    cfg = _world_cfg(audit_folders, ["leakage"])
    pii = tmp_path / "suspected"
    pii.mkdir()
    for path, line in zip(sorted(Path(cfg.audit.suspected).iterdir()), PLANTED, strict=True):
        (pii / path.name).write_text(path.read_text() + "\n\n" + line + "\n")
    cfg.audit.suspected = str(pii)
    configs = method_configs(cfg)
    e = configs["leakage"].eval
    e.shots, e.few_shot_curve, e.instances = 2, [0, 2], 3
    got = run_methods(cfg, tmp_path / "audit", configs)["leakage"]
    assert "eval_skipped" not in got
    assert got["leakage_rate"]["pii"]["rate"] == 1.0 and got["documents"] == 6
    assert got["output_rate"]["pii"]["n"] == 3 and 0 <= got["output_rate"]["pii"]["rate"] <= 1
    det = got["detection_rate"]["pii"]
    assert set(det) == {"self_detection", "loss", "zlib", "min_k", "majority_vote"}
    assert all(v["n"] == 6 for v in det.values())  # 3 leaked instances and their counterparts
    report = json.loads((Path(got["out"]) / "report.json").read_text())
    assert report["eval"]["target"] == cfg.model.name_or_path
