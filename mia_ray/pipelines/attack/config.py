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
)
from mia_ray.errors import MiaError
from mia_ray.scoring.config import AttackConfig


@dataclass
class AttackJobConfig(JobConfig):
    """`mia-ray attack`: classic reference-free and reference-based attacks, evaluated honestly."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)

    def input_paths(self) -> dict[str, str]:
        a = self.attack
        return {
            **super().input_paths(),
            "attack.dc_pdd.corpus": a.dc_pdd.corpus if "dc_pdd" in a.attacks else "",
            "attack.recall.prefix": a.recall.prefix,
            "attack.recall.member_prefix": a.recall.member_prefix,
        }

    def check(self) -> None:
        self.eval.check_classes(self.data)

    def check_complete(self) -> None:
        if not self.data.path:
            raise MiaError("data.path is empty: give the documents to audit (or world.target)")
        if not self.model.name_or_path:
            raise MiaError("model.name_or_path is empty: give a hub name or a local folder")
        if "ref" in self.attack.attacks and not self.model.reference:
            raise MiaError("attack 'ref' needs model.reference (a reference model), or drop it")
        if "dc_pdd" in self.attack.attacks and not self.attack.dc_pdd.corpus:
            raise MiaError(
                "attack 'dc_pdd' needs attack.dc_pdd.corpus (documents to count token "
                "frequencies in, of the kind the model was trained on), or drop it"
            )
