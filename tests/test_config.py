import pytest
import yaml

from mia_ray.config import dump_yaml, load_config
from mia_ray.errors import MiaError
from mia_ray.pipelines.attack.config import AttackJobConfig


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
    """Every job in jobs/ passes the whole-config validation of the pipeline it names."""
    from pathlib import Path

    from mia_ray import registry

    paths = sorted(Path(__file__).resolve().parents[1].glob("jobs/*.yaml"))
    assert len(paths) > 10
    for path in paths:
        verb = yaml.safe_load(path.read_text())["pipeline"]
        load_config(registry.get("pipeline", verb).config_cls, str(path))


COPYCHECK_ERRORS = [
    (
        ["uncertainty.samplers=[mcd,gauss]"],
        "non-empty subset of mcd, blob, ensemble, blackbox; got \\['gauss'\\]",
    ),
    (["backend.kind=grpc"], "backend.kind must be local, vllm or openai, not 'grpc'"),
    (["backend.kind=openai"], "backend.base_url is empty"),
    (
        ["backend.kind=vllm", "backend.serve=true"],
        "backend.serve serves the model with transformers",
    ),
    (["backend.kv_cache_gib=0"], "backend.kv_cache_gib must be more than 0, not 0.0"),
    (["uncertainty.placement=nodes"], "placement must be adapters or members, not 'nodes'"),
    (["uncertainty.placement_strategy=RANDOM"], "placement_strategy must be PACK, SPREAD"),
    (["uncertainty.n_samples=1"], "n_samples and uncertainty.ensemble_size must be at least 2"),
    (["experiment.mode=audit"], "audit needs experiment.suspected and experiment.unseen"),
    (["experiment.mode=random"], "experiment.mode must be sweep or audit, not 'random'"),
    (["finetune.lora_dropout=1.5"], "lora_dropout must lie in \\[0, 1\\), not 1.5"),
    (["finetune.template=no placeholder"], "must contain \\{text\\} exactly once"),
    (["finetune.deepspeed=missing.json"], "no such DeepSpeed config file: missing.json"),
    (["detect.baselines=[prob_tool,lira]"], "unknown 'lira'"),
    (["detect.min_k_ratios=[0.2]"], "at least two ratios"),
]


@pytest.mark.parametrize("overrides,message", COPYCHECK_ERRORS)
def test_copycheck_config_errors_name_the_problem(overrides, message):
    from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig

    with pytest.raises(MiaError, match=message):
        load_config(CopyCheckJobConfig, "jobs/copycheck_demo.yaml", overrides)


def test_copycheck_demo_and_cluster_configs_load():
    from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig

    demo = load_config(CopyCheckJobConfig, "jobs/copycheck_demo.yaml")
    assert demo.world.target == "tiny" and demo.experiment.n_unseen_in_suspected == [10, 20, 30, 40]
    assert demo.uncertainty.ensemble_size == 10 and demo.uncertainty.n_samples == 10
    cluster = load_config(CopyCheckJobConfig, "jobs/copycheck_cluster.yaml")
    assert cluster.finetune.lr == 1e-4 and cluster.finetune.deepspeed == "jobs/deepspeed_zero2.json"
    assert cluster.uncertainty.placement == "members" and cluster.resources.trainer.gpus == 1


LUMIA_ERRORS = [
    (
        ["probe.kinds=[mlp,svm]"],
        "probe.kinds must be a non-empty subset of mlp, logreg; got \\['svm'\\]",
    ),
    (["probe.repeats=0"], "probe.repeats must be at least 1, not 0"),
    (["probe.test_size=1.2"], "probe.test_size and probe.val_fraction must lie in \\(0, 1\\)"),
    (["probe.dropout=1"], "probe.dropout must lie in \\[0, 1\\), not 1"),
    (
        ["attacks=[loss,lira]"],
        "attacks: unknown 'lira' \\(LUMIA compares with: loss, ref, zlib, min_k\\)",
    ),
    (["targets=[tiny,tiny]"], "targets lists a target twice"),
    (["targets=[]"], "data.path is empty: give the samples to probe"),
]


@pytest.mark.parametrize("overrides,message", LUMIA_ERRORS)
def test_lumia_config_errors_name_the_problem(overrides, message):
    from mia_ray.pipelines.lumia.config import LumiaJobConfig

    with pytest.raises(MiaError, match=message):
        load_config(LumiaJobConfig, "jobs/lumia_demo.yaml", overrides)


def test_set_value_that_is_not_yaml_is_a_clear_error():
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig

    with pytest.raises(MiaError, match=r"--set dataset_test.suspects: the value is not valid YAML"):
        load_config(MemHunterJobConfig, None, ["dataset_test.suspects=[@target]"])
    cfg = load_config(
        MemHunterJobConfig,
        None,
        ['dataset_test.suspects=["@target", "@finetune:nonmembers"]', "world.target=smollm2"],
    )
    assert cfg.dataset_test.suspects == ["@target", "@finetune:nonmembers"]


def test_memhunter_config_errors_name_the_key():
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig

    with pytest.raises(MiaError, match=r"hunter.prompt_tokens must be at least 2"):
        load_config(MemHunterJobConfig, None, ["world.target=tiny", "hunter.prompt_tokens=1"])
    with pytest.raises(MiaError, match=r"extraction.splits must be a non-empty subset"):
        load_config(MemHunterJobConfig, None, ["world.target=tiny", "extraction.splits=[dev]"])
    with pytest.raises(MiaError, match=r"pairs.splits must be three positive shares"):
        load_config(MemHunterJobConfig, None, ["world.target=tiny", "pairs.splits=[0.5,0.5]"])
    with pytest.raises(MiaError, match=r"margin, trials and finetune_lr must be positive"):
        load_config(MemHunterJobConfig, None, ["world.target=tiny", "dataset_test.finetune_lr=0"])
    with pytest.raises(MiaError, match=r"hunter.model is empty"):
        load_config(MemHunterJobConfig, None, ["data.path=x", "model.name_or_path=y"])


def test_audit_statistics_settings_are_checked():
    from mia_ray.pipelines.audit.config import AuditConfig

    def bad(message, **kw):
        with pytest.raises(MiaError, match=message):
            AuditConfig(**kw).validate()

    bad("audit.permutations must be at least 1, not 0", permutations=0)
    bad("audit.fdr_method must be one of bh, by, not 'holm'", fdr_method="holm")
    bad(r"audit.snippets_per_file must be 0 \(chosen from the files' lengths\) or more, not -1",
        snippets_per_file=-1)  # fmt: skip
    bad(r"audit.short_files \(the share of files, shortest first, that the snippet count may "
        r"leave out\) must lie in \[0, 0.5\), not 0.5", short_files=0.5)  # fmt: skip
    AuditConfig(fdr_method="by", snippets_per_file=4).validate()


def test_a_section_set_in_part_keeps_its_fields_own_defaults(tmp_path):
    """The audit's data section counts tokens and its ReCaLL takes 4 shots, unlike the classes'
    defaults: setting one key of such a section keeps the rest of the field's defaults (a
    `--set audit.recall.gamma` once reset the shots to 10)."""
    from mia_ray.pipelines.audit.config import AuditJobConfig

    need = ["audit.suspected=s", "audit.unseen=u", "model.name_or_path=m"]
    cfg = load_config(AuditJobConfig, None, need)
    assert (cfg.data.snippet_unit, cfg.data.snippet_size, cfg.audit.recall.shots) == (
        "tokens",
        0,
        4,
    )
    path = _write(
        tmp_path, "pipeline: audit\ndata:\n  labels: l.json\naudit:\n  recall:\n    gamma: 0.3\n"
    )
    cfg = load_config(AuditJobConfig, path, [*need, "data.max_snippets_per_doc=8"])
    assert (cfg.data.snippet_unit, cfg.data.snippet_size, cfg.data.labels) == (
        "tokens",
        0,
        "l.json",
    )
    assert cfg.data.max_snippets_per_doc == 8
    assert (cfg.audit.recall.shots, cfg.audit.recall.gamma) == (4, 0.3)
    # Another pipeline's data section keeps the class's words.
    attack = load_config(
        AttackJobConfig, None, ["data.path=d", "model.name_or_path=m", "model.reference=r"]
    )
    assert (attack.data.snippet_unit, attack.data.snippet_size) == ("words", 512)


def test_a_key_of_an_earlier_version_says_where_it_went(tmp_path):
    from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig

    path = _write(tmp_path, "resources:\n  scorer_actors: 4\n")
    with pytest.raises(MiaError) as err:
        load_config(AttackJobConfig, path)
    assert str(err.value) == (
        "config key 'resources.scorer_actors' is now 'resources.scorer.actors' "
        "(one resources section per role)"
    )
    path = _write(tmp_path, "uncertainty:\n  max_concurrent_trials: 2\n")
    with pytest.raises(MiaError) as err:
        load_config(CopyCheckJobConfig, path)
    assert "is now 'resources.trainer.concurrent'" in str(err.value)
    # Each role's section: its own numbers, checked under its own name.
    cfg = load_config(CopyCheckJobConfig, None, ["world.target=tiny", "resources.sampler.cpus=0.5",
                                                 "resources.trainer.concurrent=3"])  # fmt: skip
    assert (cfg.resources.sampler.cpus, cfg.resources.sampler.threads()) == (0.5, 1)
    assert (cfg.resources.trainer.concurrent, cfg.resources.scorer.cpus) == (3, 1.0)
    with pytest.raises(MiaError, match=r"^resources.trainer.concurrent must be 0 or more, not -1$"):
        load_config(AttackJobConfig, None, ["resources.trainer.concurrent=-1"])
