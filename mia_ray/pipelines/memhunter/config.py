"""MemHunter's config: pairs, the hunter, extraction, the dataset test, the sweep."""

from __future__ import annotations

from dataclasses import dataclass, field

from mia_ray.config import (
    DataConfig,
    JobConfig,
    ModelConfig,
    ResourcesConfig,
    WorldConfig,
)
from mia_ray.errors import MiaError
from mia_ray.train.config import HunterConfig


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
class MemHunterJobConfig(JobConfig):
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

    def check_complete(self) -> None:
        if not self.sweep.datasets:
            if not self.data.path:
                raise MiaError("data.path is empty: give the target dataset (or world.target)")
            if not self.model.name_or_path:
                raise MiaError("model.name_or_path is empty: give a hub name or a local folder")
            if not self.hunter.model:
                raise MiaError("hunter.model is empty: give a small LM to train as the hunter")
