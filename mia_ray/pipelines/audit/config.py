"""The audit's config."""

from __future__ import annotations

from dataclasses import dataclass, field

from mia_ray.config import (
    DataConfig,
    JobConfig,
    ModelConfig,
    ResourcesConfig,
    WorldConfig,
    check_at_least_1,
    check_attacks,
    check_choice,
    hint,
)
from mia_ray.detectors.dataset_inference import check_permutations
from mia_ray.errors import MiaError
from mia_ray.scoring.config import (
    AttackConfig,
    DcPddConfig,
    NeighbourhoodConfig,
    PacConfig,
    RecallConfig,
    SamiaConfig,
)

AUDIT_METHODS = ("copycheck", "memhunter", "leakage")
DESIGNS = ("observational", "randomized")


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
    seed: int = 0
    # random permutations of the sources' sides for each test: p >= 1 / (permutations + 1)
    permutations: int = 1999
    # full-size snippets scored per file, drawn (seeded) from each file's; files with fewer
    # are left out and listed. 0: the most that all but the shortest `short_files` of the
    # files have (both sides pooled: blind to the sides), at most data.max_snippets_per_doc
    # (16 when that is 0)
    snippets_per_file: int = 0
    short_files: float = 0.1
    # group files that share long word spans (8-grams; data/neardup.py) as one source
    near_duplicates: bool = True
    # features for the linear model (any attack; "ref" joins with model.reference). ReCaLL's
    # prefix: audit.recall.prefix, or else unseen files of whole sources held out of the
    # audit (never calibrated on), so every p-value stays valid
    attacks: list[str] = field(
        default_factory=lambda: ["loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "recall"]
    )
    min_k_ratios: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.3, 0.5])
    # the attacks' settings, as in `mia-ray attack` (Con-ReCall needs recall.member_prefix)
    # 4 shots, not the attack's 10: each held-out unseen file is one less to calibrate with
    recall: RecallConfig = field(default_factory=lambda: RecallConfig(shots=4))
    dc_pdd: DcPddConfig = field(default_factory=DcPddConfig)
    pac: PacConfig = field(default_factory=PacConfig)
    neighbourhood: NeighbourhoodConfig = field(default_factory=NeighbourhoodConfig)
    samia: SamiaConfig = field(default_factory=SamiaConfig)
    C: float = 1.0  # inverse ridge strength of the discriminant on standardized file features
    # how suspected and unseen came to differ. observational (the default): as found (newer
    # files, other authors'...); the verdict rests on the premise that they differ only by
    # training, which the checks below may falsify. randomized: YOU split the files at random
    # into the two sets before the model could have trained on them (a held-out split, a
    # random sample exposed); exact by that randomization, the checks are reported, not acted on
    design: str = "observational"
    # the premise's checks: the blind check reads the snippets' text (words, characters,
    # surface statistics); the reference check runs the dataset test on model.reference's own
    # scores of the same snippets (when a reference is given)
    blind_check: bool = True
    reference_check: bool = True
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
        check_at_least_1(
            {
                "audit.rounds": self.rounds,
                "audit.permutations": self.permutations,
            }
        )
        check_permutations("audit.permutations", self.permutations, self.alpha)
        check_choice("audit.fdr_method", self.fdr_method, ("bh", "by"))
        check_choice("audit.design", self.design, DESIGNS)
        if self.snippets_per_file < 0:
            raise MiaError(
                f"audit.snippets_per_file must be 0 (chosen from the files' lengths) or more, "
                f"not {self.snippets_per_file}"
            )
        if not 0 <= self.short_files < 0.5:
            raise MiaError(
                f"audit.short_files (the share of files, shortest first, that the snippet "
                f"count may leave out) must lie in [0, 0.5), not {self.short_files}"
            )
        if self.C <= 0:
            raise MiaError(f"audit.C must be > 0, not {self.C}")
        check_attacks("audit", self.attacks, self.min_k_ratios)
        if "ref" in self.attacks:
            raise MiaError("audit.attacks: leave 'ref' out; it joins when model.reference is set")
        for section in (self.recall, self.dc_pdd, self.pac, self.neighbourhood, self.samia):
            section.validate("audit")
        if "con_recall" in self.attacks and not self.recall.member_prefix:
            raise MiaError(
                "audit.attacks: con_recall needs audit.recall.member_prefix, files the model "
                "surely trained on (the suspected files cannot serve: their membership is the "
                "question)"
            )

    def attack_config(self, with_reference: bool) -> AttackConfig:
        """The features as the attack pipeline computes them."""
        attacks = [*self.attacks, *(["ref"] if with_reference else [])]
        return AttackConfig(
            attacks=attacks, min_k_ratios=list(self.min_k_ratios),
            min_k_ratio=self.min_k_ratios[0], recall=self.recall, dc_pdd=self.dc_pdd,
            pac=self.pac, neighbourhood=self.neighbourhood, samia=self.samia,
            seed=self.seed,
        )  # fmt: skip
        for m in self.method_settings:
            if m not in self.methods:
                raise MiaError(
                    f"audit.method_settings names {m!r}, which audit.methods does not run "
                    f"(audit.methods: {self.methods})"
                )
        for m in self.methods:
            if m not in AUDIT_METHODS:
                raise MiaError(
                    f"audit.methods: unknown method {m!r}{hint(m, list(AUDIT_METHODS))} "
                    f"(known: {', '.join(AUDIT_METHODS)})"
                )


@dataclass
class AuditJobConfig(JobConfig):
    """`mia-ray audit --model M --suspected PATH --unseen PATH [--reference R] --out DIR`."""

    audit: AuditConfig = field(default_factory=AuditConfig)
    # Snippets of as many tokens as the models read, half the context left to ReCaLL's
    # prefix (measured on the demo world: held-out AUC 0.88 against 0.84 for 128-word
    # snippets, which lost their layout and 82 of 312 were cropped; docs/audit.md).
    data: DataConfig = field(
        default_factory=lambda: DataConfig(snippet_unit="tokens", snippet_size=0)
    )
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    world: WorldConfig = field(default_factory=WorldConfig)

    def input_paths(self) -> dict[str, str]:
        a = self.audit
        return {
            "audit.suspected": a.suspected,
            "audit.unseen": a.unseen,
            "data.labels": self.data.labels,
            "audit.dc_pdd.corpus": a.dc_pdd.corpus if "dc_pdd" in a.attacks else "",
            "audit.recall.prefix": a.recall.prefix,
            "audit.recall.member_prefix": a.recall.member_prefix,
        }

    def check(self) -> None:
        if self.data.path:
            raise MiaError(
                "data.path is not read by audit: give --suspected and --unseen "
                "(audit.suspected, audit.unseen)"
            )

    def check_complete(self) -> None:
        if "dc_pdd" in self.audit.attacks and not self.audit.dc_pdd.corpus:
            raise MiaError(
                "audit.attacks: dc_pdd needs audit.dc_pdd.corpus (documents to count token "
                "frequencies in, of the kind the model was trained on)"
            )
        if not (self.audit.suspected and self.audit.unseen):
            raise MiaError(
                "audit needs --suspected (the files you think the model trained on) and "
                "--unseen (files of the same kind it surely never saw)"
            )
        if not self.model.name_or_path:
            raise MiaError("audit needs --model: a hub name or a local folder")
