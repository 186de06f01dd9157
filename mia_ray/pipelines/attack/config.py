"""The attack pipeline's config."""

from __future__ import annotations

from dataclasses import dataclass, field

from mia_ray.config import (
    DataConfig,
    EvalConfig,
    JobConfig,
    ModelConfig,
    ResourcesConfig,
    WorldConfig,
    check_attacks,
)
from mia_ray.errors import MiaError


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
        check_attacks("attack", self.attacks, self.min_k_ratios)
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
class AttackJobConfig(JobConfig):
    """`mia-ray attack`: classic reference-free and reference-based attacks, evaluated honestly."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)

    def check(self) -> None:
        self.eval.check_classes(self.data)
        if not self.world.target:
            if not self.data.path:
                raise MiaError("data.path is empty: give the documents to audit (or world.target)")
            if not self.model.name_or_path:
                raise MiaError("model.name_or_path is empty: give a hub name or a local folder")
        if "ref" in self.attack.attacks and not (self.model.reference or self.world.target):
            raise MiaError("attack 'ref' needs model.reference (a reference model), or drop it")
