"""Configs of `mia-ray mark` and `mia-ray verify`."""

from __future__ import annotations

from dataclasses import dataclass, field

from mia_ray.config import (
    DataConfig,
    JobConfig,
    ModelConfig,
    ResourcesConfig,
    WorldConfig,
    check_at_least_1,
    check_choice,
)
from mia_ray.data.marks import KINDS, PER
from mia_ray.errors import MiaError


@dataclass
class MarkConfig:
    """What `mia-ray mark` inserts: for each mark ``candidates`` draws of ``kind`` (``length``
    words or hex characters), one chosen at random, inserted ``copies`` times per file."""

    input: str = ""  # the owner's files (any format the data layer reads)
    key: str = ""  # where the secret key is written (never overwritten)
    kind: str = "words"  # words (BIP-39 list) | hex | sentences (fluent, from templates)
    length: int = 8  # words, hex characters, or (kind sentences) sentences
    candidates: int = 1000
    copies: int = 1
    per: str = "file"  # file (one mark per file: per-file verdicts) | dataset

    def validate(self) -> None:
        check_choice("mark.kind", self.kind, KINDS)
        check_choice("mark.per", self.per, PER)
        check_at_least_1({"mark.length": self.length, "mark.copies": self.copies})
        if self.candidates < 2:
            raise MiaError(
                f"mark.candidates must be at least 2 (the smallest p-value is 1/K), not "
                f"{self.candidates}"
            )


@dataclass
class MarkJobConfig(JobConfig):
    """`mia-ray mark --in DIR --key FILE --out DIR`."""

    mark: MarkConfig = field(default_factory=MarkConfig)
    data: DataConfig = field(default_factory=DataConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)

    def input_paths(self) -> dict[str, str]:
        return {"mark.input": self.mark.input}

    def check(self) -> None:
        if not self.mark.input or not self.mark.key:
            raise MiaError("mark needs --in (the files to mark) and --key (where the key goes)")
        if self.data.path:
            raise MiaError("data.path is not read by mark: give --in (mark.input)")


@dataclass
class VerifyConfig:
    """What `mia-ray verify` tests: each mark of ``key`` under the model; ``files``: a copy of
    the published files, to check that each mark is still there."""

    key: str = ""
    files: str = ""
    fdr: float = 0.05  # Benjamini-Hochberg over the marks (per file with mark.per: file)
    draws: int = 9999  # Monte Carlo draws of the combined test's null (smallest p: 1/(draws+1))
    seed: int = 0

    def validate(self) -> None:
        check_at_least_1({"verify.draws": self.draws})
        if not 0 < self.fdr < 1:
            raise MiaError(f"verify.fdr must lie in (0, 1), not {self.fdr}")


@dataclass
class VerifyJobConfig(JobConfig):
    """`mia-ray verify --model M --key FILE [--files DIR] --out DIR`; with ``world.target``,
    the demo world's model, key and marked books."""

    verify: VerifyConfig = field(default_factory=VerifyConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)

    def input_paths(self) -> dict[str, str]:
        return {"verify.key": self.verify.key, "verify.files": self.verify.files}

    def check_complete(self) -> None:
        if not self.verify.key or not self.model.name_or_path:
            raise MiaError("verify needs --model (the model to test) and --key (mark's key file)")
