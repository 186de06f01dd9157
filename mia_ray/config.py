"""Dataclass configs: YAML < ``--set a.b=c`` overrides. Unknown keys fail with the nearest valid one.

One dataclass per pipeline, built from the shared sub-configs below. Cross-field checks
live in ``validate()`` methods here, not in the CLI.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mia_ray.errors import MiaError
from mia_ray.models.prompt import DEFAULT_TEMPLATE


@dataclass
class DataConfig:
    """Documents: a directory of text files, a .jsonl or a .parquet (file or directory)."""

    path: str = ""
    format: str = "auto"  # auto | text | jsonl | parquet
    text_field: str = "text"
    # "id" may be absent (each doc_id is then a hash of its text, with a note); a field
    # named otherwise must be there (else an error: a typo must not become hashed ids)
    id_field: str = "id"
    label_field: str = "label"  # optional column: 1 = member, 0 = non-member
    date_field: str = "date"  # optional column, carried through
    # optional: records of one source (a book's chapters) share this field's value; text
    # folders: "folder" (a file's parent folder)
    group_field: str = ""
    image_field: str = "image"  # vision-language models: image path (relative to a jsonl's folder)
    labels: str = ""  # optional membership manifest (JSON doc_id -> 0/1), overrides label_field
    # documents the manifest lacks: error | skip (leave them out); manifest entries the data
    # lacks are left out with a note
    unlabelled: str = "error"
    snippet_unit: str = "words"  # words | tokens
    snippet_size: int = 512
    min_snippet_size: int = (
        32  # a shorter tail of a document is dropped (kept if it is the only one)
    )
    max_snippets_per_doc: int = 0  # 0 = all
    max_docs_per_class: int = 0  # 0 = all; an IID sample per class, seeded
    min_docs_per_class: int = 5
    seed: int = 0

    def validate(self) -> None:
        if self.format not in ("auto", "text", "jsonl", "parquet"):
            raise MiaError(f"data.format must be auto, text, jsonl or parquet, not {self.format!r}")
        if self.unlabelled not in ("error", "skip"):
            raise MiaError(f"data.unlabelled must be error or skip, not {self.unlabelled!r}")
        if self.snippet_unit not in ("words", "tokens"):
            raise MiaError(f"data.snippet_unit must be words or tokens, not {self.snippet_unit!r}")
        if self.snippet_size < 1:
            raise MiaError(f"data.snippet_size must be at least 1, not {self.snippet_size}")


@dataclass
class ModelConfig:
    """A Hugging Face causal LM: a hub name or a local folder. ``reference`` serves the ref attack."""

    name_or_path: str = ""
    reference: str = ""
    gguf_file: str = ""  # load weights from a GGUF file inside name_or_path
    revision: str = ""
    dtype: str = "auto"  # auto (GPU: bfloat16, or float16 without it; CPU: float32) | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_length: int = 512  # tokens per snippet fed to the model (longer snippets are cropped)
    batch_size: int = 8
    trust_remote_code: bool = False

    def validate(self) -> None:
        _check_choice("model.dtype", self.dtype, DTYPES)
        _check_choice("model.device", self.device, DEVICES)
        if self.max_length < 2:
            # A token's loss needs the token before it: fewer than 2 tokens score nothing.
            raise MiaError(f"model.max_length must be at least 2 tokens, not {self.max_length}")
        _check_at_least_1({"model.batch_size": self.batch_size})


@dataclass
class ResourcesConfig:
    """Where and how wide to run. Empty address = a local Ray instance sized to this machine."""

    address: str = ""
    num_cpus: int = 0  # local instance only; 0 = all cores
    scorer_actors: int = 1
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    torch_threads: int = 0  # per actor; 0 = cpus_per_actor rounded up
    no_progress_timeout_s: float = 0.0  # 0 = Ray's default
    # Where artifacts that cross nodes live (adapters, staged models, parts, caches): a folder
    # every node mounts, or s3://bucket/prefix, gs://bucket/prefix. "" = --out itself.
    storage: str = ""
    # Ray custom resources every model actor, task and trial also asks for, e.g. {"a10g": 1}
    # to keep model work on the nodes started with `ray start --resources='{"a10g": 1}'`.
    custom_resources: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        _check_at_least_1({"resources.scorer_actors": self.scorer_actors})
        _check_storage(self.storage)
        bad = {k: v for k, v in self.custom_resources.items() if not v > 0 or not str(k)}
        if bad:
            raise MiaError(
                f"resources.custom_resources must map resource names to amounts > 0, not {bad}"
            )
        _check_cpus_gpus("resources", self.cpus_per_actor, self.gpus_per_actor, "_per_actor")
        for key in ("num_cpus", "torch_threads", "no_progress_timeout_s"):
            if getattr(self, key) < 0:
                raise MiaError(f"resources.{key} must be 0 or more, not {getattr(self, key)}")


_STORAGE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "file")


def _check_storage(uri: str) -> None:
    if "://" not in uri:
        return
    from mia_ray.storage import redact

    scheme = uri.split("://", 1)[0].lower()
    if scheme not in _STORAGE_SCHEMES:
        raise MiaError(
            f"resources.storage {redact(uri)}: unknown scheme {scheme!r}; use a folder every "
            "node mounts, or s3://bucket/prefix or gs://bucket/prefix"
        )
    if not uri.split("://", 1)[1].strip("/"):
        raise MiaError(f"resources.storage {redact(uri)} names no bucket")


@dataclass
class EvalConfig:
    fprs: list[float] = field(default_factory=lambda: [0.001, 0.01, 0.05])
    bootstrap: int = 1000
    ci: float = 0.95
    threshold_folds: int = 5
    blind_baseline: bool = True
    ngram_n: list[int] = field(default_factory=lambda: [7, 13])
    ngram_p: float = 0.8
    seed: int = 0

    def validate(self) -> None:
        # A percentile interval's ends rest on its most extreme draws: with fewer than 100
        # the 95 % ends are the 2nd-3rd smallest and largest values, not an interval.
        if self.bootstrap != 0 and self.bootstrap < MIN_BOOTSTRAP:
            raise MiaError(
                f"eval.bootstrap must be 0 (no intervals) or at least {MIN_BOOTSTRAP} "
                f"resamples, not {self.bootstrap}"
            )
        if not 0 < self.ci < 1:
            raise MiaError(f"eval.ci must lie in (0, 1), e.g. 0.95, not {self.ci}")
        bad = [f for f in self.fprs if not 0 < f < 1]
        if bad or not self.fprs:
            raise MiaError(
                f"eval.fprs must list false-positive rates in (0, 1), e.g. [0.01, 0.05]; "
                f"got {bad[0] if bad else '[]'}"
            )
        if self.threshold_folds < 2:
            raise MiaError(
                f"eval.threshold_folds must be at least 2 (cross-validation), not "
                f"{self.threshold_folds}"
            )
        if not self.ngram_n or min(self.ngram_n) < 1 or not 0 < self.ngram_p <= 1:
            raise MiaError(
                "eval.ngram_n must list n-gram sizes >= 1 and eval.ngram_p lie in (0, 1]"
            )

    def check_classes(self, data: DataConfig) -> None:
        """Cross-validation needs 2 documents per class: fail here, not after the scoring."""
        if data.min_docs_per_class < 2:
            raise MiaError(
                f"data.min_docs_per_class must be at least 2, not {data.min_docs_per_class}: "
                f"the out-of-fold thresholds (eval.threshold_folds = {self.threshold_folds}, "
                "fewer when a class is smaller) need 2 documents of each class"
            )


@dataclass
class WorldConfig:
    """The offline demo world. With ``target`` set, data and model paths come from the world."""

    root: str = (
        ""  # default: $MIA_RAY_HOME/world-<scale> (MIA_RAY_HOME defaults to ~/.cache/mia-ray)
    )
    scale: str = "demo"  # demo | test
    target: str = ""  # tiny | tiny-random | smollm2 ; empty = no demo world
    seed: int = 0

    def resolved_root(self) -> Path:
        if self.root:
            return Path(self.root).expanduser().resolve()
        home = Path(os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")).expanduser()
        return (home / f"world-{self.scale}").resolve()


@dataclass
class AttackConfig:
    attacks: list[str] = field(
        default_factory=lambda: ["loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "ref"]
    )
    min_k_ratios: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.3, 0.5])
    min_k_ratio: float = 0.2  # the k reported as `min_k` / `min_k_plus_plus`
    level: str = "document"  # document | snippet: the unit that is evaluated
    aggregate: str = "mean"  # how snippet scores make a document score: mean | median | max

    def validate(self) -> None:
        _check_attacks("attack", self.attacks, self.min_k_ratios)
        if self.level not in ("document", "snippet"):
            raise MiaError(f"attack.level must be document or snippet, not {self.level!r}")
        if self.aggregate not in ("mean", "median", "max"):
            raise MiaError(f"attack.aggregate must be mean, median or max, not {self.aggregate!r}")
        if self.min_k_ratio not in self.min_k_ratios:
            raise MiaError(
                f"attack.min_k_ratio {self.min_k_ratio} must be one of attack.min_k_ratios "
                f"{self.min_k_ratios}"
            )


@dataclass
class AttackJobConfig:
    """`mia-ray attack`: classic reference-free and reference-based attacks, evaluated honestly."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)

    def validate(self) -> None:
        self.data.validate()
        self.model.validate()
        self.resources.validate()
        self.eval.validate()
        self.eval.check_classes(self.data)
        self.attack.validate()
        if not self.world.target:
            if not self.data.path:
                raise MiaError("data.path is empty: give the documents to audit (or world.target)")
            if not self.model.name_or_path:
                raise MiaError("model.name_or_path is empty: give a hub name or a local folder")
        if "ref" in self.attack.attacks and not (self.model.reference or self.world.target):
            raise MiaError("attack 'ref' needs model.reference (a reference model), or drop it")


@dataclass
class FinetuneConfig:
    """CopyCheck's fine-tuning recipe, shared by MC dropout, BLoB and the ensemble members.

    Defaults are those of the BLoB reference code that CopyCheck builds on (LoRA r 8,
    alpha 16, dropout 0.1, lr 1e-4, batch 4, 300 tokens) and CopyCheck's one epoch (§III-B3:
    more epochs blur seen vs unseen).
    """

    epochs: float = 1.0
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.06  # linear warmup share of the steps, as in CopyCheck's scripts
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.1
    target_modules: list[str] = field(default_factory=list)  # empty = by architecture
    max_length: int = 300  # prompt tokens; the snippet is cropped to fit
    template: str = DEFAULT_TEMPLATE
    blob_prior_std: float = 0.2
    blob_init_std: float = 0.0025  # BLoB: G ~ U[eps/sqrt2, eps], eps 0.05; sigma = G^2
    # multiplies pi = 1 / optimizer steps per epoch (BLoB's KL reweighting): the KL step runs
    # once per optimizer step, so grad_accum and the Ray Train workers count
    blob_kl_weight: float = 1.0
    blob_kl_lr: float = 0.01  # BLoB steps pi * KL with its own SGD after each CE step
    deepspeed: str = (
        ""  # a DeepSpeed JSON config for the HF Trainer (GPUs; ZeRO also runs on CPU with gloo)
    )
    seed: int = 0

    def validate(self) -> None:
        if self.epochs <= 0 or self.batch_size < 1 or self.lr <= 0:
            raise MiaError("finetune.epochs, finetune.batch_size and finetune.lr must be positive")
        if not 0 <= self.lora_dropout < 1:
            raise MiaError(f"finetune.lora_dropout must lie in [0, 1), not {self.lora_dropout}")
        if self.template.count("{text}") != 1:
            raise MiaError("finetune.template must contain {text} exactly once")
        if self.deepspeed and not Path(self.deepspeed).is_file():
            raise MiaError(f"finetune.deepspeed: no such DeepSpeed config file: {self.deepspeed}")


@dataclass
class UncertaintyConfig:
    """The three uncertainty models and how their samplers are placed (CopyCheck §IV-A2).
    ``blackbox`` (§V-E) fine-tunes nothing: the target itself answers 10 differently worded
    "seen this text? 0 or 1" prompts per snippet through ``backend``."""

    samplers: list[str] = field(default_factory=lambda: ["mcd", "blob", "ensemble"])
    n_samples: int = 10  # stochastic passes (MC dropout) and weight draws (BLoB)
    ensemble_size: int = 10
    # adapters: one actor per GPU holds the base once and switches among the member adapters;
    # members: one actor per member, its bundle placed by a placement group (big models).
    placement: str = "adapters"
    placement_strategy: str = "SPREAD"  # for placement=members: PACK | SPREAD | STRICT_SPREAD
    sampler_actors: int = 1  # per sampler (placement=adapters)
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    batch_size: int = 8
    train_cpus: float = 1.0  # per fine-tuning trial
    train_gpus: float = 0.0
    train_workers: int = 1  # >1: a member trains on several workers with Ray Train
    max_concurrent_trials: int = 0  # 0 = as many as the resources allow
    eps: float = 1e-6  # probability clip inside logs
    # MC dropout at sampling time: "all" switches on every dropout of the model (model.train(),
    # as the CopyCheck and BLoB reference code do); "lora" only the LoRA layers' dropout.
    mc_dropout: str = "all"

    def validate(self) -> None:
        if self.mc_dropout not in ("all", "lora"):
            raise MiaError(f"uncertainty.mc_dropout must be all or lora, not {self.mc_dropout!r}")
        bad = sorted(set(self.samplers) - {"mcd", "blob", "ensemble", "blackbox"})
        if bad or not self.samplers:
            raise MiaError(
                "uncertainty.samplers must be a non-empty subset of mcd, blob, ensemble, "
                f"blackbox; got {bad or '[]'}"
            )
        if self.placement not in ("adapters", "members"):
            raise MiaError(
                f"uncertainty.placement must be adapters or members, not {self.placement!r}"
            )
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise MiaError(
                "uncertainty.placement_strategy must be PACK, SPREAD, STRICT_PACK or "
                f"STRICT_SPREAD, not {self.placement_strategy!r}"
            )
        if self.n_samples < 2 or self.ensemble_size < 2:
            raise MiaError("uncertainty.n_samples and uncertainty.ensemble_size must be at least 2")
        _check_at_least_1(
            {
                "uncertainty.batch_size": self.batch_size,
                "uncertainty.sampler_actors": self.sampler_actors,
                "uncertainty.train_workers": self.train_workers,
            }
        )
        _check_cpus_gpus("uncertainty", self.cpus_per_actor, self.gpus_per_actor, "_per_actor")
        _check_cpus_gpus("uncertainty", self.train_cpus, self.train_gpus, "")


@dataclass
class ExperimentConfig:
    """Which files are audited.

    ``sweep``: the paper's experiment (§III-B1) from labelled documents (data.path + labels,
    or the demo world's books): for each N_unseen, 50 suspected files of which N_unseen are
    unseen, plus 50 surely-unseen files. ``audit``: a user's own folders, ``suspected`` (the
    files to decide) and ``unseen`` (files the model surely never saw, e.g. published after
    its release); labels, if given in data.labels, only score the verdicts.
    """

    mode: str = "sweep"  # sweep | audit
    n_unseen_in_suspected: list[int] = field(default_factory=lambda: [10, 20, 30, 40])
    n_suspected: int = 50
    n_unseen: int = 50
    source: str = "books"  # sweep on the demo world: which source's files (books | web)
    suspected: str = ""  # audit: folder (or jsonl/parquet) of suspected files
    unseen: str = ""  # audit: folder of surely-unseen files
    seed: int = 0

    def validate(self) -> None:
        if self.mode not in ("sweep", "audit"):
            raise MiaError(f"experiment.mode must be sweep or audit, not {self.mode!r}")
        if self.mode == "audit" and not (self.suspected and self.unseen):
            raise MiaError(
                "experiment.mode audit needs experiment.suspected and experiment.unseen "
                "(folders of suspected and surely-unseen files)"
            )
        if self.mode == "sweep" and not self.n_unseen_in_suspected:
            raise MiaError("experiment.n_unseen_in_suspected is empty")


# CopyCheck's clustering (§IV-C2) and anomaly-detection ablations (§V-B3), in table order.
CLUSTER_METHODS = ("gmm", "hierarchical", "kmeans", "isolation_forest", "one_class_svm", "dbscan")


@dataclass
class DetectConfig:
    """File-level detection (§IV-C) and the baselines that go through the same pipeline."""

    methods: list[str] = field(default_factory=lambda: list(CLUSTER_METHODS))
    pca_components: int = 10
    baselines: list[str] = field(
        default_factory=lambda: ["prob_tool", "neighbor_loss", "neighbor_ppl", "meeus"]
    )
    baseline_method: str = "gmm"  # the clustering that probability features go through
    min_k_ratios: list[float] = field(
        default_factory=lambda: [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 1.0]
    )
    n_neighbors: int = 10
    neighbor_rate: float = 0.1  # share of a snippet's eligible words replaced per neighbour
    # Meeus et al. is supervised: it trains on labelled files disjoint from the audited ones.
    meeus_source: str = "web"  # demo world: train on this source's members / non-members
    meeus_data: str = ""  # own data: a labelled jsonl/parquet/folder (+ meeus_labels)
    meeus_labels: str = ""
    meeus_max_docs_per_class: int = 100
    seed: int = 0

    def validate(self) -> None:
        for name in [*self.methods, self.baseline_method]:
            if name not in CLUSTER_METHODS:
                raise MiaError(
                    f"detect: unknown method {name!r}{_hint(name, list(CLUSTER_METHODS))}"
                )
        bad = sorted(set(self.baselines) - {"prob_tool", "neighbor_loss", "neighbor_ppl", "meeus"})
        if bad:
            raise MiaError(
                f"detect.baselines: unknown {bad[0]!r} (known: prob_tool, neighbor_loss, "
                "neighbor_ppl, meeus)"
            )
        if len(self.min_k_ratios) < 2 or not all(0 < r <= 1 for r in self.min_k_ratios):
            raise MiaError("detect.min_k_ratios needs at least two ratios in (0, 1]")


@dataclass
class BackendConfig:
    """How to reach the models under audit. ``kind: local`` loads each of ``targets`` (a path,
    a hub name, or ``@world:<model>`` for a demo-world model, ``@world:smollm2-base`` for
    the base SmolLM2) with transformers in a Ray actor; ``kind: openai`` sends each target
    name as ``model`` to an OpenAI-compatible ``/completions`` endpoint at ``base_url``
    (key: ``$MIA_RAY_API_KEY`` or ``$OPENAI_API_KEY``; answers cached under
    ``<out>/backend-cache`` so a rerun sends nothing twice). ``model``: the name the API
    knows the model by (empty: the job's model). ``serve: true`` starts ``mia-ray serve`` for
    the job's model on a free loopback port and sends to it: the HTTP path, end to end, on
    one machine."""

    kind: str = "local"
    base_url: str = ""
    model: str = ""
    serve: bool = False
    timeout_s: float = 60.0
    max_retries: int = 5
    rate_limit_rps: float = 0.0
    batch_size: int = 8
    bos_text: str = ""
    device: str = "auto"
    dtype: str = "auto"

    def validate(self) -> None:
        if self.kind not in ("local", "openai"):
            raise MiaError(f"backend.kind must be local or openai, not {self.kind!r}")
        if self.kind == "openai" and not self.base_url and not self.serve:
            raise MiaError("backend.base_url is empty: give the endpoint, e.g. http://host:8000/v1")
        if self.batch_size < 1:
            raise MiaError("backend.batch_size must be at least 1")
        _check_choice("backend.dtype", self.dtype, DTYPES)
        _check_choice("backend.device", self.device, DEVICES)


@dataclass
class CopyCheckJobConfig:
    """`mia-ray copycheck`: file-level seen/unseen from fine-tuning uncertainty (Li et al.)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    uncertainty: UncertaintyConfig = field(default_factory=UncertaintyConfig)
    detect: DetectConfig = field(default_factory=DetectConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)  # the blackbox sampler's

    def validate(self) -> None:
        self.backend.validate()
        self.data.validate()
        self.model.validate()
        self.resources.validate()
        self.eval.validate()
        self.experiment.validate()
        self.finetune.validate()
        self.uncertainty.validate()
        self.detect.validate()
        if not self.world.target:
            if self.experiment.mode == "sweep" and not self.data.path:
                raise MiaError(
                    "data.path is empty: a sweep needs labelled documents (or world.target)"
                )
            if not self.model.name_or_path:
                raise MiaError("model.name_or_path is empty: give a hub name or a local folder")


PROBE_KINDS = ("mlp", "logreg")
LUMIA_ATTACKS = ("loss", "ref", "zlib", "min_k")


@dataclass
class ProbeConfig:
    """LUMIA's per-layer probes (§4.3): an MLP (Adam, lr 1e-3, up to 100 epochs, dropout, early
    stopping) and a logistic regression, on repeated grouped 80/20 splits. Early stopping and
    model selection use a validation fold carved from the training part, never the test part."""

    kinds: list[str] = field(default_factory=lambda: list(PROBE_KINDS))
    repeats: int = 3
    test_size: float = 0.2
    val_fraction: float = 0.2  # of the training part
    hidden: int = 256  # the paper does not state the MLP's width: our choice
    dropout: float = 0.2
    lr: float = 1e-3
    max_epochs: int = 100
    patience: int = 10
    batch_size: int = 32
    parallel: bool = True  # one Ray task per layer; false = the layers one after another
    cpus_per_task: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        bad = sorted(set(self.kinds) - set(PROBE_KINDS))
        if bad or not self.kinds:
            raise MiaError(
                f"probe.kinds must be a non-empty subset of mlp, logreg; got {bad or '[]'}"
            )
        if self.repeats < 1:
            raise MiaError(f"probe.repeats must be at least 1, not {self.repeats}")
        if not 0 < self.test_size < 1 or not 0 < self.val_fraction < 1:
            raise MiaError("probe.test_size and probe.val_fraction must lie in (0, 1)")
        if self.max_epochs < 1 or self.patience < 1 or self.hidden < 1 or self.batch_size < 1:
            raise MiaError(
                "probe.max_epochs, probe.patience, probe.hidden and probe.batch_size must be "
                "at least 1"
            )
        if not 0 <= self.dropout < 1:
            raise MiaError(f"probe.dropout must lie in [0, 1), not {self.dropout}")
        if self.cpus_per_task <= 0:
            raise MiaError(f"probe.cpus_per_task must be more than 0, not {self.cpus_per_task}")


@dataclass
class LumiaJobConfig:
    """`mia-ray lumia`: membership signal per layer from linear probes on hidden states
    (González-Manzano et al., LUMIA), compared with the classic attacks and the blind baseline.

    ``targets``: demo-world targets probed one after another (the first is the primary one,
    whose results sit at the top of report.json). Empty: ``world.target`` if set, else
    ``model.name_or_path`` on ``data.path``. A vision-language model (a config with a
    ``vision_config``) reads a jsonl of ``{id, text, image, label}`` records.
    """

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    targets: list[str] = field(default_factory=list)
    attacks: list[str] = field(default_factory=lambda: list(LUMIA_ATTACKS))
    min_k_ratio: float = 0.2

    def validate(self) -> None:
        self.data.validate()
        self.model.validate()
        self.resources.validate()
        self.eval.validate()
        self.eval.check_classes(self.data)
        self.probe.validate()
        bad = sorted(set(self.attacks) - set(LUMIA_ATTACKS))
        if bad:
            raise MiaError(
                f"attacks: unknown {bad[0]!r} (LUMIA compares with: {', '.join(LUMIA_ATTACKS)})"
            )
        if not 0 < self.min_k_ratio <= 1:
            raise MiaError(f"min_k_ratio must lie in (0, 1], not {self.min_k_ratio}")
        if not (self.targets or self.world.target):
            if not self.data.path:
                raise MiaError("data.path is empty: give the samples to probe (or targets)")
            if not self.model.name_or_path:
                raise MiaError("model.name_or_path is empty: give a hub name or a local folder")
        if len(set(self.targets)) != len(self.targets):
            raise MiaError(f"targets lists a target twice: {self.targets}")


@dataclass
class PairsConfig:
    """MemHunter's (x, y) pairs: prefix x and continuation y, in the target's tokens."""

    prefix_tokens: int = 32
    target_tokens: int = 32
    per_doc: int = 1  # pairs from consecutive windows at a document's start
    splits: list[float] = field(default_factory=lambda: [0.6, 0.2, 0.2])  # train/test/val docs
    max_per_split: int = 0  # 0 = all; else the first N pairs (by id) of each split
    seed: int = 0

    def validate(self) -> None:
        if min(self.prefix_tokens, self.target_tokens, self.per_doc) < 1:
            raise MiaError(
                "pairs.prefix_tokens, pairs.target_tokens and pairs.per_doc must be >= 1"
            )
        if len(self.splits) != 3 or min(self.splits) <= 0 or abs(sum(self.splits) - 1) > 1e-9:
            raise MiaError(
                f"pairs.splits must be three positive shares summing to 1, not {self.splits}"
            )


@dataclass
class HunterConfig:
    """The prompt-writing hunter and its training (Algorithm 1; Appendix A's defaults)."""

    model: str = ""  # hub name or folder; demo: the world's tiny-ref (trained on non-members)
    prompt_tokens: int = 8
    top_k: int = 48
    beams: int = 4
    temperature: float = 0.1  # beam selection: softmax((mu - loss_weight * loss) / temperature)
    loss_weight: float = 0.1
    pool_size: int = 256
    rejection: bool = True
    iterations: int = 10
    lora_r: int = 8
    lora_alpha: int = 16
    epochs: int = 8
    lr: float = 5e-4
    batch_size: int = 8
    separator: str = "\n"
    max_x_tokens: int = 64
    sample_top_k: int = 48  # extraction: prompts sampled from the hunter's top-k ...
    sample_temperature: float = 1.0  # ... at this temperature, one per trial
    train_cpus: float = 1.0  # the LoRA fine-tune of each iteration is a Ray task
    train_gpus: float = 0.0
    seed: int = 0

    def validate(self) -> None:
        if self.prompt_tokens < 2 or self.top_k < 1 or self.beams < 1 or self.iterations < 1:
            raise MiaError(
                "hunter.prompt_tokens must be at least 2; hunter.top_k, hunter.beams and "
                "hunter.iterations at least 1"
            )
        if self.pool_size < 1 or self.epochs < 1 or self.lr <= 0 or self.sample_top_k < 1:
            raise MiaError("hunter.pool_size, epochs, lr and sample_top_k must be positive")
        _check_at_least_1({"hunter.batch_size": self.batch_size})
        _check_cpus_gpus("hunter", self.train_cpus, self.train_gpus, "")


@dataclass
class ExtractionConfig:
    """Extraction at use (Tables 1-3), the baselines at the same wall-clock budget, the plug-in."""

    trials: list[int] = field(default_factory=lambda: [5, 10, 20, 30])
    splits: list[str] = field(default_factory=lambda: ["test", "val", "nonmember"])
    methods: list[str] = field(default_factory=lambda: ["manual", "miniprompt", "plugin"])
    # MiniPrompt costs MemHunter's whole wall clock again: run it where the comparison matters.
    miniprompt_splits: list[str] = field(default_factory=lambda: ["test"])
    gcg_prompt_tokens: int = 8  # MiniPrompt / GCG: prompt length in the target's tokens
    gcg_top_k: int = 64  # substitutes per position from the gradient (Zou et al.: 256)
    gcg_candidates: int = 32  # candidates per step (Zou et al.: 512)
    plugin_pairs: int = 4  # test pairs run to full recovery, from hunter / random starts
    plugin_max_s: float = 60.0  # per pair and start; unrecovered pairs are censored here
    plugin_check_every: int = 2  # GCG steps between checks of mu
    seed: int = 0

    def validate(self) -> None:
        if not self.trials or min(self.trials) < 1:
            raise MiaError(
                "extraction.trials must list positive trial counts, e.g. [5, 10, 20, 30]"
            )
        bad = sorted(set(self.splits) - {"train", "test", "val", "nonmember"})
        if bad or not self.splits:
            raise MiaError(
                f"extraction.splits must be a non-empty subset of train, test, val, nonmember; "
                f"got {bad or '[]'}"
            )
        bad = sorted(set(self.methods) - {"manual", "miniprompt", "plugin"})
        if bad:
            raise MiaError(
                f"extraction.methods: unknown {bad[0]!r} (known: manual, miniprompt, plugin)"
            )
        extra = sorted(set(self.miniprompt_splits) - set(self.splits))
        if extra:
            raise MiaError(
                f"extraction.miniprompt_splits: {extra[0]!r} is not in extraction.splits"
            )
        if "plugin" in self.methods and "test" not in self.splits:
            raise MiaError(
                "extraction.methods has plugin, which runs on the test split: add test to extraction.splits"
            )


@dataclass
class DatasetTestConfig:
    """Did a suspect model train on the dataset as a whole? (MemHunter §4.4, done soundly.)

    Models are hub names or folders, or ``@target`` (model.name_or_path), ``@reference``
    (model.reference), ``@world:<model>`` (a demo-world model, e.g. ``smollm2-control``),
    ``@finetune:members`` / ``@finetune:nonmembers`` (a LoRA fine-tune of ``base`` on the
    dataset's own documents, or on documents outside it: a model that did, or did not,
    train on the data).
    """

    suspects: list[str] = field(default_factory=lambda: ["@target"])
    reference: str = "@reference"  # surely never saw the data: the one-sided Welch test's baseline
    proxy: str = "@finetune:members"  # trained on the data: the paper's t-test and the TOST
    base: str = "@reference"  # what @finetune:... fine-tunes
    trials: int = 5  # hunter prompts per pair: a model's LCSS on a pair is its best
    alpha: float = 0.05
    margin: float = 0.05  # TOST: |mean LCSS difference| below this counts as equivalent
    finetune_epochs: float = 3.0
    finetune_lr: float = 1e-3
    finetune_seed: int = 1
    split: str = "test"

    def validate(self) -> None:
        if self.split not in ("train", "test", "val"):
            raise MiaError(f"dataset_test.split must be train, test or val, not {self.split!r}")
        if not 0 < self.alpha < 1 or self.margin <= 0 or self.trials < 1 or self.finetune_lr <= 0:
            raise MiaError(
                "dataset_test.alpha must lie in (0, 1); margin, trials and finetune_lr must be "
                "positive"
            )


@dataclass
class SweepConfig:
    """A datasets x models sweep (the paper's 3 x 3 tables). Each cell trains a hunter for one
    model on one dataset, extracts and tests, in its own folder (``cells/<dataset>__<model>``);
    cells run as Ray tasks side by side as the resources allow, and a rerun skips finished cells.

    ``datasets``: data paths (as ``data.path``), or ``@world:books`` / ``@world:web`` (the demo
    world's documents of one source); ``labels``: one manifest per dataset ("" = labels in the
    data; demo sources use the first model's manifest). ``models``: targets (paths, hub names,
    ``@target``, or ``@world:<target>`` for a demo-world model)."""

    datasets: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    max_concurrent: int = 0  # 0 = as many cells as the cluster's CPUs and GPUs hold
    # Ray custom resources each cell's task asks for (its actors and fine-tunes ask for
    # resources.custom_resources): e.g. {"sweep_slot": 1}, with nodes started by `ray start
    # --resources='{"sweep_slot": 1}'`, runs one cell per node.
    cell_resources: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        bad = {k: v for k, v in self.cell_resources.items() if not v > 0 or not str(k)}
        if bad:
            raise MiaError(
                f"sweep.cell_resources must map resource names to amounts > 0, not {bad}"
            )
        if bool(self.datasets) != bool(self.models):
            raise MiaError("sweep needs both sweep.datasets and sweep.models (or neither)")
        if self.labels and len(self.labels) != len(self.datasets):
            raise MiaError(
                f"sweep.labels has {len(self.labels)} entries for {len(self.datasets)} datasets"
            )
        for name in (*self.datasets, *self.models):
            if name.startswith("@world:") and not name[7:]:
                raise MiaError(f"sweep: {name!r} names no demo-world part")
        if len(set(self.datasets)) != len(self.datasets) or len(set(self.models)) != len(
            self.models
        ):
            raise MiaError("sweep lists a dataset or a model twice")


@dataclass
class MemHunterJobConfig:
    """`mia-ray memhunter`: memorization extraction with a trained prompt writer and a
    dataset-level verdict (Wu et al., MemHunter). ``data`` holds the target dataset: its
    members (label 1) give the (x, y) pairs; non-members serve the controls."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    pairs: PairsConfig = field(default_factory=PairsConfig)
    hunter: HunterConfig = field(default_factory=HunterConfig)
    extraction: ExtractionConfig = field(default_factory=ExtractionConfig)
    dataset_test: DatasetTestConfig = field(default_factory=DatasetTestConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)

    def validate(self) -> None:
        self.data.validate()
        self.model.validate()
        self.resources.validate()
        self.sweep.validate()
        self.pairs.validate()
        self.hunter.validate()
        self.extraction.validate()
        self.dataset_test.validate()
        if not self.world.target and not self.sweep.datasets:
            if not self.data.path:
                raise MiaError("data.path is empty: give the target dataset (or world.target)")
            if not self.model.name_or_path:
                raise MiaError("model.name_or_path is empty: give a hub name or a local folder")
            if not self.hunter.model:
                raise MiaError("hunter.model is empty: give a small LM to train as the hunter")


@dataclass
class CrawlConfig:
    """The corpus sample to scan. ``shards``: files or folders (``.jsonl``, ``.parquet``, or
    a folder of text files), one shard each; ``truth``: a ``planted.jsonl`` of known records
    (``category``, ``type``, ``shard``, ``doc_id``, ``start``, ``end``, ``ref``) that scores the
    scan's precision and recall. ``demo: true`` builds the demo world's crawl and uses it
    (its shards, truth, the world's books as the copyright store, its benchmark)."""

    demo: bool = False
    shards: list[str] = field(default_factory=list)
    truth: str = ""
    text_field: str = "text"
    id_field: str = "id"

    def validate(self) -> None:
        if not self.demo and not self.shards:
            raise MiaError("crawl.shards is empty: give the corpus shards to scan (or crawl.demo)")


@dataclass
class ScanConfig:
    """Leakage-rate scanners (the survey's §2). PII: the 20 regular-expression types
    (``docs/pii.md``) and person names; copyright and benchmark: exact matches of
    ``*_span``-word spans against stores built from ``copyright`` (files or folders of
    reference texts) and ``benchmark`` (``.jsonl`` items; each of ``benchmark_fields`` is a
    text of its own, as in the paper)."""

    pii_types: list[str] = field(default_factory=list)  # empty = all 20
    names: bool = True
    copyright: list[str] = field(default_factory=list)
    benchmark: list[str] = field(default_factory=list)
    benchmark_fields: list[str] = field(default_factory=lambda: ["passage", "question"])
    copyright_span: int = 300  # words; the paper's ~300
    benchmark_span: int = 300
    workers: int = 2  # scanner actors
    cpus_per_worker: float = 1.0
    # documents per scanner call: Ray Data adds ~4 ms per call, a quarter of a 64-page call's
    # scan (measured); 512 pages (~1 MB) keep that under 5 %
    batch_size: int = 512
    ci: float = 0.95
    max_listed_matches: int = 500  # report.json lists this many; matches.parquet has all
    shards_per_pass: int = 8  # shards per Ray Data pass: the actors start once per pass
    instance_words: int = 64  # = features.leaks.INSTANCE_WORDS; a text match's instance: its first N words (PII: its sentence)

    def validate(self) -> None:
        from mia_ray.features.pii import PII_TYPE_NAMES

        unknown = [t for t in self.pii_types if t not in PII_TYPE_NAMES]
        if unknown:
            raise MiaError(
                f"scan.pii_types: unknown type {unknown[0]!r}{_hint(unknown[0], list(PII_TYPE_NAMES))}"
            )
        if self.copyright_span < 1 or self.benchmark_span < 1:
            raise MiaError("scan.copyright_span and scan.benchmark_span must be at least 1 word")
        if self.instance_words < 1 or self.shards_per_pass < 1:
            raise MiaError("scan.instance_words and scan.shards_per_pass must be at least 1")
        if self.workers < 1 or self.batch_size < 1 or not 0 < self.ci < 1:
            raise MiaError("scan.workers and scan.batch_size must be positive, scan.ci in (0, 1)")
        _check_cpus_gpus("scan", self.cpus_per_worker, 0.0, "_per_worker")


@dataclass
class LeakEvalConfig:
    """Output rate and detection rate (the survey's §3-4) on ``targets``; empty = the scan only.
    Per category, ``instances`` leaked instances (found by the scan) are evaluated, after
    ``max(shots, few_shot_curve) / 2`` more that serve, with their counterparts, as the
    few-shot examples and as the labelled set the score methods' thresholds are chosen on."""

    targets: list[str] = field(default_factory=list)
    instances: int = 24
    shots: int = 16  # the paper's 8 leaked + 8 non-leaked
    few_shot_curve: list[int] = field(default_factory=lambda: [0, 2, 4, 8, 16])
    paraphrase_rate: float = 0.3  # share of eligible words swapped in a text counterpart
    min_k_ratio: float = 0.2
    ci: float = 0.95
    seed: int = 0

    def validate(self) -> None:
        for n in [self.shots, *self.few_shot_curve]:
            if n < 0 or n % 2:
                raise MiaError(
                    f"eval: few-shot counts come in leaked/non-leaked pairs; {n} is not even"
                )
        if self.instances < 1:
            raise MiaError("eval.instances must be at least 1")
        if not 0 < self.paraphrase_rate <= 1 or not 0 < self.min_k_ratio <= 1:
            raise MiaError("eval.paraphrase_rate and eval.min_k_ratio must lie in (0, 1]")
        if not 0 < self.ci < 1:
            raise MiaError("eval.ci must lie in (0, 1)")


@dataclass
class LeakageJobConfig:
    """`mia-ray leakage`: how much personal data, copyrighted text and benchmark data sits
    in a corpus sample (the leakage survey's leakage rate), and, for ``eval.targets``, how
    readily each model emits it (output rate) and tells it from non-leaked text (detection)."""

    world: WorldConfig = field(default_factory=WorldConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    crawl: CrawlConfig = field(default_factory=CrawlConfig)
    scan: ScanConfig = field(default_factory=ScanConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    eval: LeakEvalConfig = field(default_factory=LeakEvalConfig)

    def validate(self) -> None:
        self.resources.validate()
        self.crawl.validate()
        self.scan.validate()
        self.backend.validate()
        self.eval.validate()


AUDIT_METHODS = ("copycheck", "memhunter", "leakage")


@dataclass
class AuditConfig:
    """`mia-ray audit`: did the model train on ``suspected``? ``unseen``: files of the same kind
    that it surely never saw (written after its cut-off, or held back)."""

    suspected: str = ""  # folder, .jsonl or .parquet (any format data.format reads)
    unseen: str = ""
    fdr: float = 0.05  # per-file verdicts: false-discovery rate of the step-up rule
    # bh: Benjamini-Hochberg; by: Benjamini-Yekutieli (valid under any dependence, stricter)
    fdr_method: str = "bh"
    alpha: float = 0.05  # the dataset-level test's level (and the null and blind checks')
    rounds: int = 5  # cross-fitting repeats (seeds seed .. seed + rounds - 1)
    # per-file p-values: the largest over the first N rounds' split-conformal p-values. 1: exact
    # with one calibration set per half; more: a verdict that holds under every one of N
    # splits (not one lucky seed), at a measured cost in power (VALIDITY.md)
    file_rounds: int = 1
    seed: int = 0
    # random permutations of the sources' sides for each test: p >= 1 / (permutations + 1)
    permutations: int = 1999
    # full-size snippets scored per file, drawn (seeded) from each file's; files with fewer
    # are left out and listed. 0: the fewest any file has (at most data.max_snippets_per_doc)
    snippets_per_file: int = 0
    # group files that share long word spans (8-grams; data/neardup.py) as one source
    near_duplicates: bool = True
    # features for the linear model (reference-free attacks; "ref" joins with model.reference)
    attacks: list[str] = field(
        default_factory=lambda: ["loss", "zlib", "min_k", "min_k_plus_plus", "lowercase"]
    )
    min_k_ratios: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.3, 0.5])
    C: float = 1.0  # inverse ridge strength of the discriminant on standardized file features
    blind_check: bool = True
    null_check: bool = True
    # more evidence, each by its own pipeline into --out/<name>: copycheck | memhunter | leakage
    methods: list[str] = field(default_factory=list)
    # --set style overrides of a method's own config, e.g.
    # {copycheck: ["uncertainty.n_ensemble=4"], memhunter: ["hunter.iterations=3"]}
    method_settings: dict[str, list[str]] = field(default_factory=dict)

    def validate(self) -> None:
        for key in ("fdr", "alpha"):
            v = getattr(self, key)
            if not 0 < v < 1:
                raise MiaError(f"audit.{key} must lie in (0, 1), e.g. 0.05, not {v}")
        _check_at_least_1(
            {
                "audit.rounds": self.rounds,
                "audit.permutations": self.permutations,
                "audit.file_rounds": self.file_rounds,
            }
        )
        if self.file_rounds > self.rounds:
            raise MiaError(
                f"audit.file_rounds ({self.file_rounds}) cannot exceed audit.rounds ({self.rounds})"
            )
        _check_choice("audit.fdr_method", self.fdr_method, ("bh", "by"))
        if self.snippets_per_file < 0:
            raise MiaError(
                f"audit.snippets_per_file must be 0 (the fewest any file has) or more, not "
                f"{self.snippets_per_file}"
            )
        if self.C <= 0:
            raise MiaError(f"audit.C must be > 0, not {self.C}")
        _check_attacks("audit", self.attacks, self.min_k_ratios)
        if "ref" in self.attacks:
            raise MiaError("audit.attacks: leave 'ref' out; it joins when model.reference is set")
        for m in self.method_settings:
            if m not in self.methods:
                raise MiaError(
                    f"audit.method_settings names {m!r}, which audit.methods does not run "
                    f"(audit.methods: {self.methods})"
                )
        for m in self.methods:
            if m not in AUDIT_METHODS:
                raise MiaError(
                    f"audit.methods: unknown method {m!r}{_hint(m, list(AUDIT_METHODS))} "
                    f"(known: {', '.join(AUDIT_METHODS)})"
                )


@dataclass
class AuditJobConfig:
    """`mia-ray audit --model M --suspected PATH --unseen PATH [--reference R] --out DIR`."""

    audit: AuditConfig = field(default_factory=AuditConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    world: WorldConfig = field(default_factory=WorldConfig)

    def validate(self) -> None:
        self.audit.validate()
        self.data.validate()
        self.model.validate()
        self.resources.validate()
        if self.data.path:
            raise MiaError(
                "data.path is not read by audit: give --suspected and --unseen "
                "(audit.suspected, audit.unseen)"
            )
        if not self.world.target:
            if not (self.audit.suspected and self.audit.unseen):
                raise MiaError(
                    "audit needs --suspected (the files you think the model trained on) and "
                    "--unseen (files of the same kind it surely never saw)"
                )
            if not self.model.name_or_path:
                raise MiaError("audit needs --model: a hub name or a local folder")
        elif self.world.target not in ("tiny", "tiny-random"):
            raise MiaError(
                f"world.target {self.world.target!r}: the audit demo runs on tiny or tiny-random"
            )


@dataclass
class DemoWorldJobConfig:
    """`mia-ray demo`: build (or check) the offline demo world."""

    world: WorldConfig = field(default_factory=WorldConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    targets: list[str] = field(default_factory=lambda: ["tiny"])

    def validate(self) -> None:
        self.resources.validate()
        if self.world.scale not in ("demo", "test"):
            raise MiaError(f"world.scale must be demo or test, not {self.world.scale!r}")


# ---------------------------------------------------------------- shared checks

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
MIN_BOOTSTRAP = 100


def _check_attacks(section: str, attacks: list[str], min_k_ratios: list[float]) -> None:
    """Registered attack names (at least one) and Min-K ratios in (0, 1]."""
    from mia_ray import registry

    known = registry.names("attack")
    if not attacks:
        raise MiaError(f"{section}.attacks is empty (known: {', '.join(known)})")
    for name in attacks:
        if name not in known:
            raise MiaError(f"{section}.attacks: unknown attack {name!r}{_hint(name, known)}")
    if not min_k_ratios:
        raise MiaError(f"{section}.min_k_ratios is empty")
    for r in min_k_ratios:
        if not 0 < r <= 1:
            raise MiaError(f"{section}.min_k_ratios must lie in (0, 1], got {r}")


def _check_choice(key: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise MiaError(f"{key} must be one of {', '.join(valid)}, not {value!r}")


def _check_at_least_1(counts: dict[str, int]) -> None:
    """Batch sizes and actor counts, by their dotted keys."""
    for key, n in counts.items():
        if n < 1:
            raise MiaError(f"{key} must be at least 1, not {n}")


def _check_cpus_gpus(section: str, cpus: float, gpus: float, suffix: str) -> None:
    # Ray schedules an actor that asks for 0 CPUs anywhere, with no limit on how many share
    # a core: a worker pool sized from the config then means nothing.
    if cpus <= 0:
        raise MiaError(f"{section}.cpus{suffix} must be more than 0, not {cpus}")
    if gpus < 0:
        raise MiaError(f"{section}.gpus{suffix} must be 0 or more, not {gpus}")


# ---------------------------------------------------------------- loading and overrides


def _hint(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f" (valid: {', '.join(valid)})"


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _coerce(value, args[0], where)
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
        if not isinstance(value, list):
            value = [value]
        return [_coerce(v, inner, where) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise MiaError(f"{where}: expected true or false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise MiaError(f"{where}: expected a number, got {value!r}")
        try:
            num = float(value)
        except (TypeError, ValueError):
            raise MiaError(f"{where}: expected a number, got {value!r}") from None
        if tp is int:
            if num != int(num):
                raise MiaError(f"{where}: expected a whole number, got {value!r}")
            return int(num)
        return num
    if tp is str:
        return "" if value is None else str(value)
    return value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    if not isinstance(data, dict):
        raise MiaError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise MiaError(f"unknown config key {prefix + key!r}{_hint(key, list(fields))}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value or {}, prefix + key + ".")
        else:
            kwargs[key] = _coerce(value, tp, prefix + key)
    return cls(**kwargs)


def apply_override(raw: dict[str, Any], cls: type, assignment: str) -> None:
    """Apply one ``a.b=c`` to the raw dict, checking every key against the dataclass tree."""
    if "=" not in assignment:
        raise MiaError(f"--set expects key=value, got {assignment!r}")
    dotted, value = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    node, tp = raw, cls
    for i, part in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(tp)}
        if part not in names:
            where = ".".join(parts[: i + 1])
            raise MiaError(f"unknown config key {where!r}{_hint(part, list(names))}")
        sub = typing.get_type_hints(tp)[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(sub):
                raise MiaError(f"--set {dotted}: {dotted!r} is a section, set one of its keys")
            try:
                node[part] = yaml.safe_load(value) if value.strip() else ""
            except yaml.YAMLError as e:
                raise MiaError(
                    f"--set {dotted}: the value is not valid YAML ({str(e).splitlines()[0]}); "
                    "quote it, e.g. '[\"@target\"]'"
                ) from None
        else:
            if not dataclasses.is_dataclass(sub):
                raise MiaError(f"--set {dotted}: {'.'.join(parts[: i + 1])!r} is not a section")
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
            tp = sub


def load_config(cls: type, path: str | None, overrides: list[str] = ()) -> Any:
    raw: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise MiaError(f"config file not found: {path}")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise MiaError(
                f"config file {path} is not valid YAML: {str(e).splitlines()[0]}"
            ) from None
        if not isinstance(raw, dict):
            raise MiaError(f"config file {path} must hold a mapping at the top level")
        raw.pop("pipeline", None)
    for assignment in overrides:
        apply_override(raw, cls, assignment)
    cfg = from_dict(cls, raw)
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Any, pipeline: str) -> str:
    return yaml.safe_dump({"pipeline": pipeline, **to_dict(cfg)}, sort_keys=False)
