"""CopyCheck's config: its experiments, fine-tuning recipe, samplers and detectors."""

from __future__ import annotations

from dataclasses import dataclass, field

from mia_ray.config import (
    BackendConfig,
    DataConfig,
    EvalConfig,
    JobConfig,
    ModelConfig,
    ResourcesConfig,
    WorldConfig,
    check_at_least_1,
    hint,
)
from mia_ray.errors import MiaError
from mia_ray.train.config import FinetuneConfig


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
    # (resources.sampler: the samplers' actors, per sampler with placement=adapters;
    # resources.trainer: the members' fine-tunes.)
    batch_size: int = 8
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
        check_at_least_1({"uncertainty.batch_size": self.batch_size})


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
    # a sweep on these files only: the ids under this source (a top folder, e.g. books);
    # "": every file (the demo world's sweep runs on its books: its resolution sets it)
    source: str = ""
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
    # Meeus et al.'s training files: only the ids under this source ("": all); the demo
    # world's resolution trains it on its web leads (data and labels as the run's)
    meeus_source: str = ""
    meeus_data: str = ""  # own data: a labelled jsonl/parquet/folder (+ meeus_labels)
    meeus_labels: str = ""
    meeus_max_docs_per_class: int = 100
    seed: int = 0

    def validate(self) -> None:
        for name in [*self.methods, self.baseline_method]:
            if name not in CLUSTER_METHODS:
                raise MiaError(
                    f"detect: unknown method {name!r}{hint(name, list(CLUSTER_METHODS))}"
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
class CopyCheckJobConfig(JobConfig):
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

    def check_complete(self) -> None:
        if self.experiment.mode == "sweep" and not self.data.path:
            raise MiaError("data.path is empty: a sweep needs labelled documents (or world.target)")
        if not self.model.name_or_path:
            raise MiaError("model.name_or_path is empty: give a hub name or a local folder")
