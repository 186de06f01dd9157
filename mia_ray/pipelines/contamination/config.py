"""Config of `mia-ray contamination`."""

from __future__ import annotations

from dataclasses import dataclass, field

from mia_ray.config import (
    JobConfig,
    ModelConfig,
    ResourcesConfig,
    WorldConfig,
    check_at_least_1,
)
from mia_ray.errors import MiaError


@dataclass
class OrderTestConfig:
    """The benchmark in its published order, and how it is sharded and shuffled."""

    benchmark: str = ""  # a .jsonl (one example per line) or a .txt (one per line), in order
    fields: list[str] = field(default_factory=lambda: ["text"])  # jsonl: joined by a newline
    separator: str = "\n\n"  # between examples
    # consecutive examples per shard; 0: as many as fit model.max_length tokens together
    shard_size: int = 0
    permutations: int = 99  # shuffles per shard: its smallest p is 1 / (permutations + 1)
    draws: int = 9999  # Monte Carlo draws of the combined test's null
    seed: int = 0

    def validate(self) -> None:
        check_at_least_1({"contamination.permutations": self.permutations,
                          "contamination.draws": self.draws})  # fmt: skip
        if self.shard_size < 0 or self.shard_size == 1:
            raise MiaError(
                f"contamination.shard_size must be 0 (fit the window) or at least 2 examples "
                f"(one example has no order), not {self.shard_size}"
            )
        if not self.fields:
            raise MiaError("contamination.fields must name at least one field")


@dataclass
class ContaminationJobConfig(JobConfig):
    """`mia-ray contamination --benchmark FILE --model M [--reference R] --out DIR`; with
    ``world.target``, the demo world's model, its reference and its published benchmark."""

    contamination: OrderTestConfig = field(default_factory=OrderTestConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)

    def input_paths(self) -> dict[str, str]:
        return {"contamination.benchmark": self.contamination.benchmark}

    def check_complete(self) -> None:
        if not self.contamination.benchmark or not self.model.name_or_path:
            raise MiaError("contamination needs --benchmark (the file, in order) and --model")
