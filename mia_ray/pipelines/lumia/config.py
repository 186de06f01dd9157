"""LUMIA's config: the probes."""

from __future__ import annotations

from dataclasses import dataclass, field

from mia_ray.config import (
    DataConfig,
    EvalConfig,
    JobConfig,
    ModelConfig,
    ResourcesConfig,
    WorldConfig,
)
from mia_ray.errors import MiaError

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
class LumiaJobConfig(JobConfig):
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
    # Filled by resolution: each target's documents, manifest, model and reference.
    target_paths: dict[str, dict[str, str]] = field(default_factory=dict)
    attacks: list[str] = field(default_factory=lambda: list(LUMIA_ATTACKS))
    min_k_ratio: float = 0.2

    def world_pending(self) -> bool:
        # Targets are demo-world models: their paths come with resolution, as world.target's.
        return super().world_pending() or (bool(self.targets) and not self.target_paths)

    def check(self) -> None:
        self.eval.check_classes(self.data)
        bad = sorted(set(self.attacks) - set(LUMIA_ATTACKS))
        if bad:
            raise MiaError(
                f"attacks: unknown {bad[0]!r} (LUMIA compares with: {', '.join(LUMIA_ATTACKS)})"
            )
        if not 0 < self.min_k_ratio <= 1:
            raise MiaError(f"min_k_ratio must lie in (0, 1], not {self.min_k_ratio}")
        if len(set(self.targets)) != len(self.targets):
            raise MiaError(f"targets lists a target twice: {self.targets}")

    def check_complete(self) -> None:
        if not self.targets:  # demo-world targets bring their own data and models
            if not self.data.path:
                raise MiaError("data.path is empty: give the samples to probe (or targets)")
            if not self.model.name_or_path:
                raise MiaError("model.name_or_path is empty: give a hub name or a local folder")
        elif set(self.target_paths) != set(self.targets):
            raise MiaError(f"targets {self.targets}: the demo world did not resolve them")
