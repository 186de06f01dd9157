"""The leakage survey's config: the crawl, the scan, the model evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field

from mia_ray.config import (
    BackendConfig,
    JobConfig,
    ResourcesConfig,
    WorldConfig,
    check_cpus_gpus,
    hint,
)
from mia_ray.errors import MiaError


@dataclass
class CrawlConfig:
    """The corpus sample to scan. ``shards``: files or folders (``.jsonl``, ``.parquet``, or
    a folder of text files), one shard each; ``truth``: a ``planted.jsonl`` of known records
    (``category``, ``type``, ``shard``, ``doc_id``, ``start``, ``end``, ``ref``) that scores the
    scan's precision and recall; ``sample``: a seeded share of the documents. ``demo: true`` builds the demo world's crawl and uses it
    (its shards, truth, the world's books as the copyright store, its benchmark)."""

    demo: bool = False
    shards: list[str] = field(default_factory=list)
    truth: str = ""
    text_field: str = "text"
    id_field: str = "id"
    # What the survey scans: a share of the documents (0 < sample <= 1), or a number of them
    # (a whole number > 1). A document is in when a hash of ``seed``, its shard and its id
    # falls below the share (for a number: below the number-th smallest such hash), so every
    # rerun and every cluster size draws the same documents.
    sample: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if not self.demo and not self.shards:
            raise MiaError("crawl.shards is empty: give the corpus shards to scan (or crawl.demo)")
        if not (0 < self.sample <= 1 or (self.sample > 1 and float(self.sample).is_integer())):
            raise MiaError(
                "crawl.sample is the share of documents to scan, in (0, 1], or a whole number "
                f"of documents; not {self.sample}"
            )


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
    max_listed_matches: int = 500  # report.json lists this many; scan/<shard>/findings/ has all
    shards_per_pass: int = 8  # shards per Ray Data pass: the actors start once per pass
    instance_words: int = 64  # = features.leaks.INSTANCE_WORDS; a text match's instance: its first N words (PII: its sentence)

    def validate(self) -> None:
        from mia_ray.features.pii import PII_TYPE_NAMES

        unknown = [t for t in self.pii_types if t not in PII_TYPE_NAMES]
        if unknown:
            raise MiaError(
                f"scan.pii_types: unknown type {unknown[0]!r}{hint(unknown[0], list(PII_TYPE_NAMES))}"
            )
        if self.copyright_span < 1 or self.benchmark_span < 1:
            raise MiaError("scan.copyright_span and scan.benchmark_span must be at least 1 word")
        if self.instance_words < 1 or self.shards_per_pass < 1:
            raise MiaError("scan.instance_words and scan.shards_per_pass must be at least 1")
        if self.workers < 1 or self.batch_size < 1 or not 0 < self.ci < 1:
            raise MiaError("scan.workers and scan.batch_size must be positive, scan.ci in (0, 1)")
        check_cpus_gpus("scan", self.cpus_per_worker, 0.0, "_per_worker")


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
    # When no category has enough instances for the few-shot pool and one more: `error`
    # stops the run; `skip` reports the scan alone with `eval_skipped` saying why (the audit).
    too_few: str = "error"

    def validate(self) -> None:
        if self.too_few not in ("error", "skip"):
            raise MiaError(f"eval.too_few must be error or skip, not {self.too_few!r}")
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
class LeakageJobConfig(JobConfig):
    """`mia-ray leakage`: how much personal data, copyrighted text and benchmark data sits
    in a corpus sample (the leakage survey's leakage rate), and, for ``eval.targets``, how
    readily each model emits it (output rate) and tells it from non-leaked text (detection)."""

    world: WorldConfig = field(default_factory=WorldConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    crawl: CrawlConfig = field(default_factory=CrawlConfig)
    scan: ScanConfig = field(default_factory=ScanConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    eval: LeakEvalConfig = field(default_factory=LeakEvalConfig)

    def input_paths(self) -> dict[str, str]:
        return {f"crawl.shards[{i}]": path for i, path in enumerate(self.crawl.shards)}
