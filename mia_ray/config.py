"""Dataclass configs: YAML < ``--set a.b=c`` overrides. Unknown keys fail with the nearest valid one.

Here: the sections every pipeline shares (data, model, resources, eval, world, backend),
the :class:`JobConfig` base, and the loader. Each pipeline's own sections and job config
live in ``pipelines/<name>/config.py``. Cross-field checks live in the configs' ``check()``
methods, not in the CLI.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mia_ray.errors import MiaError


class JobConfig:
    """Base of every pipeline's config (a dataclass of sections). :meth:`validate` checks
    each section that has a ``validate()`` of its own, in field order, then the job's
    cross-field checks (:meth:`check`)."""

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if hasattr(section, "validate"):
                section.validate()
        self.check()
        if not self.world_pending():
            self.check_complete()

    def check(self) -> None:
        """Checks across sections (none by default) that hold whatever the world fills in."""

    def check_complete(self) -> None:
        """What the job must be given (paths, models; nothing by default), on the config as
        it will run: with the demo world still to fill it in (:meth:`world_pending`), the run
        checks it once the world has (``api.run_job``), so no check knows about the world."""

    def world_pending(self) -> bool:
        """Whether the demo world has yet to fill this config in (``world.target`` set)."""
        world = getattr(self, "world", None)
        return bool(world is not None and world.target)

    def input_paths(self) -> dict[str, str]:
        """The inputs the job reads, by config key (``data.path`` and ``data.labels`` by
        default): :func:`check_inputs_exist` looks for the local ones before Ray starts."""
        data = getattr(self, "data", None)
        return {"data.path": data.path, "data.labels": data.labels} if data else {}


def check_inputs_exist(paths: dict[str, str]) -> None:
    """Fail at once, naming the key, when a local input path does not exist. Object storage,
    hub datasets and globs are listed where they are read (they need credentials or Ray)."""
    for key, path in paths.items():
        text = str(path or "")
        if text.startswith("file://"):
            text = text[len("file://") :]
        if not text or "://" in text or set("*?[") & set(text):
            continue
        if not Path(text).expanduser().exists():
            what = "labels manifest" if key.endswith("labels") else "data path"
            raise MiaError(f"{what} not found: {path} ({key})")


@dataclass
class DataConfig:
    """Documents: a directory of text files, a .jsonl or a .parquet (file or directory)."""

    path: str = ""  # also hf://datasets/<owner>/<name>, a dataset on the Hugging Face hub
    format: str = "auto"  # auto | text | jsonl | parquet
    subset: str = ""  # a hub dataset's configuration (its subset), when it has several
    split: str = ""  # a hub dataset's split, e.g. WikiMIA_length32
    text_field: str = "text"
    # "id" may be absent (each doc_id is then a hash of its text, with a note); a field
    # named otherwise must be there (else an error: a typo must not become hashed ids)
    id_field: str = "id"
    label_field: str = "label"  # optional column: 1 = member, 0 = non-member
    date_field: str = "date"  # optional column, carried through
    # optional: records of one source (a book's chapters) share this field's value; text
    # folders: "folder" (a file's parent folder)
    group_field: str = ""
    image_field: str = "image"  # vision-language models: image path (relative to a jsonl's folder)
    labels: str = ""  # optional membership manifest (JSON doc_id -> 0/1), overrides label_field
    # documents the manifest lacks: error | skip (leave them out); manifest entries the data
    # lacks are left out with a note
    unlabelled: str = "error"
    snippet_unit: str = "words"  # words | tokens
    snippet_size: int = 512  # 0: as many tokens as the model reads (snippet_unit tokens)
    min_snippet_size: int = (
        32  # a shorter tail of a document is dropped (kept if it is the only one)
    )
    max_snippets_per_doc: int = 0  # 0 = all
    max_docs_per_class: int = 0  # 0 = all; an IID sample per class, seeded
    min_docs_per_class: int = 5
    seed: int = 0

    def validate(self) -> None:
        from mia_ray.data.formats import names

        if self.format not in names():
            raise MiaError(f"data.format must be one of {', '.join(names())}, not {self.format!r}")
        if self.unlabelled not in ("error", "skip"):
            raise MiaError(f"data.unlabelled must be error or skip, not {self.unlabelled!r}")
        if self.snippet_unit not in ("words", "tokens"):
            raise MiaError(f"data.snippet_unit must be words or tokens, not {self.snippet_unit!r}")
        if self.snippet_size < 0:
            raise MiaError(
                f"data.snippet_size must be 0 (the model's window) or more, not {self.snippet_size}"
            )
        if self.snippet_size == 0 and self.snippet_unit != "tokens":
            raise MiaError(
                "data.snippet_size 0 (the model's window) counts tokens: set data.snippet_unit "
                "to tokens, or give a size in words"
            )


@dataclass
class ModelConfig:
    """A Hugging Face causal LM: a hub name or a local folder. ``reference`` serves the ref attack."""

    name_or_path: str = ""
    reference: str = ""
    gguf_file: str = ""  # load weights from a GGUF file inside name_or_path
    revision: str = ""
    dtype: str = "auto"  # auto (GPU: bfloat16, or float16 without it; CPU: float32) | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_length: int = 512  # tokens per snippet fed to the model (longer snippets are cropped)
    batch_size: int = 8
    trust_remote_code: bool = False

    def validate(self) -> None:
        check_choice("model.dtype", self.dtype, DTYPES)
        check_choice("model.device", self.device, DEVICES)
        if self.max_length < 2:
            # A token's loss needs the token before it: fewer than 2 tokens score nothing.
            raise MiaError(f"model.max_length must be at least 2 tokens, not {self.max_length}")
        check_at_least_1({"model.batch_size": self.batch_size})


@dataclass
class PoolResources:
    """One role's pool of Ray actors: how many, and what each asks for."""

    actors: int = 1
    cpus: float = 1.0  # per actor
    gpus: float = 0.0  # per actor
    torch_threads: int = 0  # per actor; 0 = cpus rounded up

    def threads(self) -> int:
        return self.torch_threads or max(1, math.ceil(self.cpus))

    def check(self, section: str) -> None:
        check_at_least_1({f"{section}.actors": self.actors})
        check_cpus_gpus(section, self.cpus, self.gpus, "")
        if self.torch_threads < 0:
            raise MiaError(f"{section}.torch_threads must be 0 or more, not {self.torch_threads}")


@dataclass
class TrainerResources:
    """Fine-tunes (CopyCheck's members, MemHunter's hunter): each a Ray Tune trial or task."""

    cpus: float = 1.0  # per fine-tune (per worker with workers > 1)
    gpus: float = 0.0
    workers: int = 1  # > 1: a CopyCheck member trains on this many Ray Train workers
    concurrent: int = 0  # fine-tunes at once; 0 = as many as the cluster holds

    def threads(self) -> int:
        return max(1, math.ceil(self.cpus))

    def check(self, section: str) -> None:
        check_at_least_1({f"{section}.workers": self.workers})
        check_cpus_gpus(section, self.cpus, self.gpus, "")
        if self.concurrent < 0:
            raise MiaError(f"{section}.concurrent must be 0 or more, not {self.concurrent}")


@dataclass
class ResourcesConfig:
    """Where and how wide to run, one section per role. Empty address = a local Ray
    instance sized to this machine."""

    address: str = ""
    num_cpus: int = 0  # local instance only; 0 = all cores
    # Every model that reads the snippets: Scorers, LUMIA's activation readers, SaMIA's
    # samplers, the leakage survey's and MemHunter's target actors.
    scorer: PoolResources = field(default_factory=PoolResources)
    # CopyCheck's uncertainty samplers (its fine-tuned members read back).
    sampler: PoolResources = field(default_factory=PoolResources)
    trainer: TrainerResources = field(default_factory=TrainerResources)
    no_progress_timeout_s: float = 0.0  # 0 = Ray's default
    # Where artifacts that cross nodes live (adapters, staged models, parts, caches): a folder
    # every node mounts, or s3://bucket/prefix, gs://bucket/prefix. "" = --out itself.
    storage: str = ""
    # Ray custom resources every model actor, task and trial also asks for, e.g. {"a10g": 1}
    # to keep model work on the nodes started with `ray start --resources='{"a10g": 1}'`.
    custom_resources: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        _check_storage(self.storage)
        bad = {k: v for k, v in self.custom_resources.items() if not v > 0 or not str(k)}
        if bad:
            raise MiaError(
                f"resources.custom_resources must map resource names to amounts > 0, not {bad}"
            )
        self.scorer.check("resources.scorer")
        self.sampler.check("resources.sampler")
        self.trainer.check("resources.trainer")
        for key in ("num_cpus", "no_progress_timeout_s"):
            if getattr(self, key) < 0:
                raise MiaError(f"resources.{key} must be 0 or more, not {getattr(self, key)}")


# Keys that moved (section, key) -> their new dotted key: a config of an earlier version is
# told where each went, not only that it is unknown.
MOVED = {
    ("resources", "scorer_actors"): "resources.scorer.actors",
    ("resources", "cpus_per_actor"): "resources.scorer.cpus",
    ("resources", "gpus_per_actor"): "resources.scorer.gpus",
    ("resources", "torch_threads"): "resources.scorer.torch_threads",
    ("uncertainty", "sampler_actors"): "resources.sampler.actors",
    ("uncertainty", "cpus_per_actor"): "resources.sampler.cpus",
    ("uncertainty", "gpus_per_actor"): "resources.sampler.gpus",
    ("uncertainty", "train_cpus"): "resources.trainer.cpus",
    ("uncertainty", "train_gpus"): "resources.trainer.gpus",
    ("uncertainty", "train_workers"): "resources.trainer.workers",
    ("uncertainty", "max_concurrent_trials"): "resources.trainer.concurrent",
    ("hunter", "train_cpus"): "resources.trainer.cpus",
    ("hunter", "train_gpus"): "resources.trainer.gpus",
}


def unknown_key(where: str, key: str, valid: list[str]) -> MiaError:
    """The error for an unknown key ``key`` at dotted ``where`` (``a.b.key``)."""
    section = where.split(".")[-2] if "." in where else ""
    moved = MOVED.get((section, key))
    if moved:
        return MiaError(f"config key {where!r} is now {moved!r} (one resources section per role)")
    return MiaError(f"unknown config key {where!r}{hint(key, valid)}")


_STORAGE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "file")


def _check_storage(uri: str) -> None:
    if "://" not in uri:
        return
    from mia_ray.storage import redact

    scheme = uri.split("://", 1)[0].lower()
    if scheme not in _STORAGE_SCHEMES:
        raise MiaError(
            f"resources.storage {redact(uri)}: unknown scheme {scheme!r}; use a folder every "
            "node mounts, or s3://bucket/prefix or gs://bucket/prefix"
        )
    if not uri.split("://", 1)[1].strip("/"):
        raise MiaError(f"resources.storage {redact(uri)} names no bucket")


@dataclass
class EvalConfig:
    fprs: list[float] = field(default_factory=lambda: [0.001, 0.01, 0.05])
    bootstrap: int = 1000
    ci: float = 0.95
    threshold_folds: int = 5
    blind_baseline: bool = True
    ngram_n: list[int] = field(default_factory=lambda: [7, 13])
    ngram_p: float = 0.8
    seed: int = 0

    def validate(self) -> None:
        # A percentile interval's ends rest on its most extreme draws: with fewer than 100
        # the 95 % ends are the 2nd-3rd smallest and largest values, not an interval.
        if self.bootstrap != 0 and self.bootstrap < MIN_BOOTSTRAP:
            raise MiaError(
                f"eval.bootstrap must be 0 (no intervals) or at least {MIN_BOOTSTRAP} "
                f"resamples, not {self.bootstrap}"
            )
        if not 0 < self.ci < 1:
            raise MiaError(f"eval.ci must lie in (0, 1), e.g. 0.95, not {self.ci}")
        bad = [f for f in self.fprs if not 0 < f < 1]
        if bad or not self.fprs:
            raise MiaError(
                f"eval.fprs must list false-positive rates in (0, 1), e.g. [0.01, 0.05]; "
                f"got {bad[0] if bad else '[]'}"
            )
        if self.threshold_folds < 2:
            raise MiaError(
                f"eval.threshold_folds must be at least 2 (cross-validation), not "
                f"{self.threshold_folds}"
            )
        if not self.ngram_n or min(self.ngram_n) < 1 or not 0 < self.ngram_p <= 1:
            raise MiaError(
                "eval.ngram_n must list n-gram sizes >= 1 and eval.ngram_p lie in (0, 1]"
            )

    def check_classes(self, data: DataConfig) -> None:
        """Cross-validation needs 2 documents per class: fail here, not after the scoring."""
        if data.min_docs_per_class < 2:
            raise MiaError(
                f"data.min_docs_per_class must be at least 2, not {data.min_docs_per_class}: "
                f"the out-of-fold thresholds (eval.threshold_folds = {self.threshold_folds}, "
                "fewer when a class is smaller) need 2 documents of each class"
            )


@dataclass
class WorldConfig:
    """The offline demo world. With ``target`` set, data and model paths come from the world."""

    root: str = (
        ""  # default: $MIA_RAY_HOME/world-<scale> (MIA_RAY_HOME defaults to ~/.cache/mia-ray)
    )
    scale: str = "demo"  # demo | test
    target: str = ""  # tiny | tiny-random | smollm2 ; empty = no demo world
    seed: int = 0
    # Set by resolution, which fills the config's paths from the world once and empties
    # ``target``: the target they came from (a record; nothing reads it to decide).
    resolved: str = ""

    def resolved_root(self) -> Path:
        if self.root:
            return Path(self.root).expanduser().resolve()
        home = Path(os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")).expanduser()
        return (home / f"world-{self.scale}").resolve()


BACKEND_KINDS = ("local", "vllm", "openai")


@dataclass
class BackendConfig:
    """How to reach the models under audit. ``kind: local`` loads each of ``targets`` (a path,
    a hub name, or ``@world:<model>`` for a demo-world model, ``@world:smollm2-base`` for
    the base SmolLM2) with transformers in a Ray actor; ``kind: vllm`` loads it in vLLM's
    engine there instead (the ``vllm`` extra; docs/vllm.md); ``kind: openai`` sends each target
    name as ``model`` to an OpenAI-compatible ``/completions`` endpoint at ``base_url``
    (key: ``$MIA_RAY_API_KEY`` or ``$OPENAI_API_KEY``; answers cached under
    ``<out>/backend-cache`` so a rerun sends nothing twice). ``model``: the name the API
    knows the model by (empty: the job's model). ``serve: true`` starts ``mia-ray serve`` for
    the job's model on a free loopback port and sends to it: the HTTP path, end to end, on
    one machine."""

    kind: str = "local"
    base_url: str = ""
    model: str = ""
    serve: bool = False
    timeout_s: float = 60.0
    max_retries: int = 5
    rate_limit_rps: float = 0.0
    batch_size: int = 8
    bos_text: str = ""
    device: str = "auto"
    dtype: str = "auto"
    kv_cache_gib: float = 1.0  # kind vllm: the engine's KV cache (on a CPU, in RAM)

    @property
    def loads_model(self) -> bool:
        """Whether the model's weights load in our own actor (local, vllm), not behind an API."""
        return self.kind != "openai"

    def validate(self) -> None:
        if self.kind not in BACKEND_KINDS:
            raise MiaError(f"backend.kind must be local, vllm or openai, not {self.kind!r}")
        if self.kind == "vllm" and self.serve:
            raise MiaError("backend.serve serves the model with transformers: use kind local")
        if self.kv_cache_gib <= 0:
            raise MiaError(f"backend.kv_cache_gib must be more than 0, not {self.kv_cache_gib}")
        if self.kind == "openai" and not self.base_url and not self.serve:
            raise MiaError("backend.base_url is empty: give the endpoint, e.g. http://host:8000/v1")
        if self.batch_size < 1:
            raise MiaError("backend.batch_size must be at least 1")
        check_choice("backend.dtype", self.dtype, DTYPES)
        check_choice("backend.device", self.device, DEVICES)


@dataclass
class DemoWorldJobConfig(JobConfig):
    """`mia-ray demo`: build (or check) the offline demo world."""

    world: WorldConfig = field(default_factory=WorldConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    targets: list[str] = field(default_factory=lambda: ["tiny"])

    def check(self) -> None:
        if self.world.scale not in ("demo", "test"):
            raise MiaError(f"world.scale must be demo or test, not {self.world.scale!r}")


# ---------------------------------------------------------------- shared checks

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
MIN_BOOTSTRAP = 100


def check_attacks(section: str, attacks: list[str], min_k_ratios: list[float]) -> None:
    """Registered attack names (at least one) and Min-K ratios in (0, 1]."""
    from mia_ray import registry

    known = registry.names("attack")
    if not attacks:
        raise MiaError(f"{section}.attacks is empty (known: {', '.join(known)})")
    for name in attacks:
        if name not in known:
            raise MiaError(f"{section}.attacks: unknown attack {name!r}{hint(name, known)}")
    if not min_k_ratios:
        raise MiaError(f"{section}.min_k_ratios is empty")
    for r in min_k_ratios:
        if not 0 < r <= 1:
            raise MiaError(f"{section}.min_k_ratios must lie in (0, 1], got {r}")


def check_choice(key: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise MiaError(f"{key} must be one of {', '.join(valid)}, not {value!r}")


def check_at_least_1(counts: dict[str, int]) -> None:
    """Batch sizes and actor counts, by their dotted keys."""
    for key, n in counts.items():
        if n < 1:
            raise MiaError(f"{key} must be at least 1, not {n}")


def check_cpus_gpus(section: str, cpus: float, gpus: float, suffix: str) -> None:
    # Ray schedules an actor that asks for 0 CPUs anywhere, with no limit on how many share
    # a core: a worker pool sized from the config then means nothing.
    if cpus <= 0:
        raise MiaError(f"{section}.cpus{suffix} must be more than 0, not {cpus}")
    if gpus < 0:
        raise MiaError(f"{section}.gpus{suffix} must be 0 or more, not {gpus}")


# ---------------------------------------------------------------- loading and overrides


def hint(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f" (valid: {', '.join(valid)})"


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _coerce(value, args[0], where)
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
        if not isinstance(value, list):
            value = [value]
        return [_coerce(v, inner, where) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise MiaError(f"{where}: expected true or false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise MiaError(f"{where}: expected a number, got {value!r}")
        try:
            num = float(value)
        except (TypeError, ValueError):
            raise MiaError(f"{where}: expected a number, got {value!r}") from None
        if tp is int:
            if num != int(num):
                raise MiaError(f"{where}: expected a whole number, got {value!r}")
            return int(num)
        return num
    if tp is str:
        return "" if value is None else str(value)
    return value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "", base: Any = None) -> Any:
    """``cls`` from a mapping; a key left out keeps ``base``'s value (else the class's
    default). A section starts from its field's own default, which may differ from its
    class's (the audit's ``data`` counts tokens, its ``recall`` takes 4 shots)."""
    if not isinstance(data, dict):
        raise MiaError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise unknown_key(prefix + key, key, list(fields))
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            f = fields[key]
            own = (
                getattr(base, key)
                if base is not None
                else f.default_factory()
                if f.default_factory is not dataclasses.MISSING
                else None
            )
            kwargs[key] = from_dict(tp, value or {}, prefix + key + ".", own)
        else:
            kwargs[key] = _coerce(value, tp, prefix + key)
    return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)


def apply_override(raw: dict[str, Any], cls: type, assignment: str) -> None:
    """Apply one ``a.b=c`` to the raw dict, checking every key against the dataclass tree."""
    if "=" not in assignment:
        raise MiaError(f"--set expects key=value, got {assignment!r}")
    dotted, value = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    node, tp = raw, cls
    for i, part in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(tp)}
        if part not in names:
            raise unknown_key(".".join(parts[: i + 1]), part, list(names))
        sub = typing.get_type_hints(tp)[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(sub):
                raise MiaError(f"--set {dotted}: {dotted!r} is a section, set one of its keys")
            try:
                node[part] = yaml.safe_load(value) if value.strip() else ""
            except yaml.YAMLError as e:
                raise MiaError(
                    f"--set {dotted}: the value is not valid YAML ({str(e).splitlines()[0]}); "
                    "quote it, e.g. '[\"@target\"]'"
                ) from None
        else:
            if not dataclasses.is_dataclass(sub):
                raise MiaError(f"--set {dotted}: {'.'.join(parts[: i + 1])!r} is not a section")
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
            tp = sub


def load_config(cls: type, path: str | None, overrides: list[str] = ()) -> Any:
    raw: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise MiaError(f"config file not found: {path}")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise MiaError(
                f"config file {path} is not valid YAML: {str(e).splitlines()[0]}"
            ) from None
        if not isinstance(raw, dict):
            raise MiaError(f"config file {path} must hold a mapping at the top level")
        raw.pop("pipeline", None)
    for assignment in overrides:
        apply_override(raw, cls, assignment)
    cfg = from_dict(cls, raw)
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Any, pipeline: str) -> str:
    return yaml.safe_dump({"pipeline": pipeline, **to_dict(cfg)}, sort_keys=False)
