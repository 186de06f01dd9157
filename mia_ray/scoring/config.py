"""What scoring needs, apart from the pipelines that call it: the attacks' sections
(``attack:`` in every job that scores snippets) and :class:`Scoring`, the four sections a
scoring pass reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from mia_ray.config import (
    BackendConfig,
    DataConfig,
    ModelConfig,
    ResourcesConfig,
    check_at_least_1,
    check_attacks,
)
from mia_ray.errors import MiaError


@dataclass
class RecallConfig:
    """ReCaLL's and Con-ReCall's prefixes: the first snippet of each of ``shots`` documents."""

    # non-member documents (a path); "": `shots` non-members of the data, held out of the
    # evaluation (the audit holds out unseen files, never used for calibration)
    prefix: str = ""
    # Con-ReCall's member documents (a path); "": `shots` members of the data, held out
    member_prefix: str = ""
    shots: int = 10  # Fast-MIA's default (the ReCaLL authors': 12)
    gamma: float = 0.5  # Con-ReCall's weight of the member prefix (Fast-MIA's default)

    def validate(self, section: str = "attack") -> None:
        check_at_least_1({f"{section}.recall.shots": self.shots})
        if not 0 <= self.gamma <= 1:
            raise MiaError(f"{section}.recall.gamma must lie in [0, 1], not {self.gamma}")


@dataclass
class DcPddConfig:
    """DC-PDD's token frequencies: counted over a corpus the user names, cached by its key."""

    corpus: str = ""  # documents (any data path); the demo world: its reference pool
    max_tokens: int = 1024  # tokens counted per document (the authors' 1024)
    a: float = 0.01  # the bound on a token's score (the paper's)

    def validate(self, section: str = "attack") -> None:
        check_at_least_1({f"{section}.dc_pdd.max_tokens": self.max_tokens})
        if not self.a > 0:
            raise MiaError(f"{section}.dc_pdd.a must be > 0, not {self.a}")


@dataclass
class PacConfig:
    copies: int = 5  # augmented copies per snippet (the authors' N)
    swap_share: float = 0.3  # word swaps per copy: max(1, int(share * words))
    low: float = 0.3  # share of the lowest token log-probs in the polarized distance
    high: float = 0.05  # share of the highest

    def validate(self, section: str = "attack") -> None:
        check_at_least_1({f"{section}.pac.copies": self.copies})
        for key in ("swap_share", "low", "high"):
            v = getattr(self, key)
            if not 0 < v <= 1:
                raise MiaError(f"{section}.pac.{key} must lie in (0, 1], not {v}")


@dataclass
class NeighbourhoodConfig:
    n: int = 10  # neighbour texts per snippet
    rate: float = 0.1  # share of eligible words swapped in each

    def validate(self, section: str = "attack") -> None:
        check_at_least_1({f"{section}.neighbourhood.n": self.n})
        if not 0 < self.rate <= 1:
            raise MiaError(f"{section}.neighbourhood.rate must lie in (0, 1], not {self.rate}")


@dataclass
class SamiaConfig:
    """SaMIA's samples: continuations of each snippet's first half, from the target loaded
    here or through an OpenAI-compatible API (``backend``)."""

    samples: int = 10  # continuations per snippet (the authors' 10)
    prefix_ratio: float = 0.5  # share of the words given as the prompt
    temperature: float = 1.0
    top_k: int = 50  # 0: all tokens (OpenAI's own API takes no top_k)
    max_tokens: int = 0  # per sample; 0: as many as the true continuation has (local only)
    backend: BackendConfig = field(default_factory=BackendConfig)

    def validate(self, section: str = "attack") -> None:
        check_at_least_1({f"{section}.samia.samples": self.samples})
        if not 0 < self.prefix_ratio < 1:
            raise MiaError(
                f"{section}.samia.prefix_ratio must lie in (0, 1), not {self.prefix_ratio}"
            )
        if not 0 < self.temperature <= 2:
            raise MiaError(
                f"{section}.samia.temperature must lie in (0, 2], not {self.temperature}"
            )
        if self.top_k < 0 or self.max_tokens < 0:
            raise MiaError(f"{section}.samia.top_k and max_tokens must be 0 or more")
        self.backend.validate()
        if self.backend.kind == "openai" and not self.backend.serve and not self.max_tokens:
            raise MiaError(
                f"{section}.samia.max_tokens must be set for an API backend: without the model's "
                "tokenizer the true continuation's length in tokens is unknown"
            )


@dataclass
class AttackConfig:
    attacks: list[str] = field(
        default_factory=lambda: ["loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "ref"]
    )
    min_k_ratios: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.3, 0.5])
    min_k_ratio: float = 0.2  # the k reported as `min_k` / `min_k_plus_plus`
    level: str = "document"  # document | snippet: the unit that is evaluated
    aggregate: str = "mean"  # how snippet scores make a document score: mean | median | max
    recall: RecallConfig = field(default_factory=RecallConfig)
    dc_pdd: DcPddConfig = field(default_factory=DcPddConfig)
    pac: PacConfig = field(default_factory=PacConfig)
    neighbourhood: NeighbourhoodConfig = field(default_factory=NeighbourhoodConfig)
    samia: SamiaConfig = field(default_factory=SamiaConfig)
    seed: int = 0  # held-out prefix documents, neighbours and augmented copies

    def params(self) -> dict[str, dict]:
        """Each attack's keyword arguments (``features.attacks.score_table``)."""
        return {
            "con_recall": {"gamma": self.recall.gamma},
            "dc_pdd": {"a": self.dc_pdd.a},
            "pac": {"low": self.pac.low, "high": self.pac.high},
            "samia": {"prefix_ratio": self.samia.prefix_ratio},
        }

    def validate(self) -> None:
        check_attacks("attack", self.attacks, self.min_k_ratios)
        for section in (self.recall, self.dc_pdd, self.pac, self.neighbourhood, self.samia):
            section.validate()
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
class Scoring:
    """What :func:`mia_ray.scoring.attacks.score_attacks` and the passes read: where the
    documents and snippets come from, the target (and reference) model, the resources of its
    actors, and the attacks. A pipeline builds it from its own sections (:meth:`of`)."""

    data: DataConfig
    model: ModelConfig
    resources: ResourcesConfig
    attack: AttackConfig

    @classmethod
    def of(cls, cfg) -> Scoring:
        """The four sections of a job config that has them (the attack job's, the audit's)."""
        return cls(data=cfg.data, model=cfg.model, resources=cfg.resources, attack=cfg.attack)
