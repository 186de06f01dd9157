"""Dataclass configs: YAML < ``--set a.b=c`` overrides. Unknown keys fail with the nearest valid one.

One dataclass per pipeline, built from the shared sub-configs below. Cross-field checks
live in ``validate()`` methods here, not in the CLI.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mia_ray.errors import MiaError


@dataclass
class DataConfig:
    """Documents: a directory of text files, a .jsonl or a .parquet (file or directory)."""

    path: str = ""
    format: str = "auto"  # auto | text | jsonl | parquet
    text_field: str = "text"
    id_field: str = "id"
    label_field: str = "label"  # optional column: 1 = member, 0 = non-member
    date_field: str = "date"  # optional column, carried through
    labels: str = ""  # optional membership manifest (JSON doc_id -> 0/1), overrides label_field
    snippet_unit: str = "words"  # words | tokens
    snippet_size: int = 512
    min_snippet_size: int = (
        32  # a shorter tail of a document is dropped (kept if it is the only one)
    )
    max_snippets_per_doc: int = 0  # 0 = all
    max_docs_per_class: int = 0  # 0 = all; an IID sample per class, seeded
    min_docs_per_class: int = 5
    seed: int = 0

    def validate(self) -> None:
        if self.format not in ("auto", "text", "jsonl", "parquet"):
            raise MiaError(f"data.format must be auto, text, jsonl or parquet, not {self.format!r}")
        if self.snippet_unit not in ("words", "tokens"):
            raise MiaError(f"data.snippet_unit must be words or tokens, not {self.snippet_unit!r}")
        if self.snippet_size < 1:
            raise MiaError(f"data.snippet_size must be at least 1, not {self.snippet_size}")


@dataclass
class ModelConfig:
    """A Hugging Face causal LM: a hub name or a local folder. ``reference`` serves the ref attack."""

    name_or_path: str = ""
    reference: str = ""
    gguf_file: str = ""  # load weights from a GGUF file inside name_or_path
    revision: str = ""
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_length: int = 512  # tokens per snippet fed to the model (longer snippets are cropped)
    batch_size: int = 8
    trust_remote_code: bool = False


@dataclass
class ResourcesConfig:
    """Where and how wide to run. Empty address = a local Ray instance sized to this machine."""

    address: str = ""
    num_cpus: int = 0  # local instance only; 0 = all cores
    scorer_actors: int = 1
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    torch_threads: int = 0  # per actor; 0 = cpus_per_actor rounded up
    no_progress_timeout_s: float = 0.0  # 0 = Ray's default


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


@dataclass
class WorldConfig:
    """The offline demo world. With ``target`` set, data and model paths come from the world."""

    root: str = (
        ""  # default: $MIA_RAY_HOME/world-<scale> (MIA_RAY_HOME defaults to ~/.cache/mia-ray)
    )
    scale: str = "demo"  # demo | test
    target: str = ""  # tiny | tiny-random | smollm2 ; empty = no demo world
    seed: int = 0

    def resolved_root(self) -> Path:
        if self.root:
            return Path(self.root).expanduser().resolve()
        home = Path(os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")).expanduser()
        return (home / f"world-{self.scale}").resolve()


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
        if self.level not in ("document", "snippet"):
            raise MiaError(f"attack.level must be document or snippet, not {self.level!r}")
        if self.aggregate not in ("mean", "median", "max"):
            raise MiaError(f"attack.aggregate must be mean, median or max, not {self.aggregate!r}")
        if self.min_k_ratio not in self.min_k_ratios:
            raise MiaError(
                f"attack.min_k_ratio {self.min_k_ratio} must be one of attack.min_k_ratios "
                f"{self.min_k_ratios}"
            )
        for r in self.min_k_ratios:
            if not 0 < r <= 1:
                raise MiaError(f"attack.min_k_ratios must lie in (0, 1], got {r}")


@dataclass
class AttackJobConfig:
    """`mia-ray attack`: classic reference-free and reference-based attacks, evaluated honestly."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)

    def validate(self) -> None:
        self.data.validate()
        self.attack.validate()
        if not self.world.target:
            if not self.data.path:
                raise MiaError("data.path is empty: give the documents to audit (or world.target)")
            if not self.model.name_or_path:
                raise MiaError("model.name_or_path is empty: give a hub name or a local folder")
        if "ref" in self.attack.attacks and not (self.model.reference or self.world.target):
            raise MiaError("attack 'ref' needs model.reference (a reference model), or drop it")


@dataclass
class DemoWorldJobConfig:
    """`mia-ray demo`: build (or check) the offline demo world."""

    world: WorldConfig = field(default_factory=WorldConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    targets: list[str] = field(default_factory=lambda: ["tiny"])

    def validate(self) -> None:
        if self.world.scale not in ("demo", "test"):
            raise MiaError(f"world.scale must be demo or test, not {self.world.scale!r}")


# ---------------------------------------------------------------- loading and overrides


def _hint(key: str, valid: list[str]) -> str:
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


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    if not isinstance(data, dict):
        raise MiaError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise MiaError(f"unknown config key {prefix + key!r}{_hint(key, list(fields))}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value or {}, prefix + key + ".")
        else:
            kwargs[key] = _coerce(value, tp, prefix + key)
    return cls(**kwargs)


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
            where = ".".join(parts[: i + 1])
            raise MiaError(f"unknown config key {where!r}{_hint(part, list(names))}")
        sub = typing.get_type_hints(tp)[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(sub):
                raise MiaError(f"--set {dotted}: {dotted!r} is a section, set one of its keys")
            node[part] = yaml.safe_load(value) if value.strip() else ""
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
