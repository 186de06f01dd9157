"""One small registry: attacks, metrics, detectors and pipelines register where they are defined.

    @register("attack", "loss")
    def loss_score(...): ...

The CLI lists pipelines from here and never branches on a pipeline's name.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mia_ray.errors import MiaError

_REGISTRY: dict[str, dict[str, Any]] = {}

# Modules whose import registers entries of a kind; loaded on first lookup of that kind.
_PROVIDERS: dict[str, tuple[str, ...]] = {
    "attack": ("mia_ray.features.attacks",),
    "detector": ("mia_ray.detectors.filelevel",),
    "pipeline": (
        "mia_ray.pipelines.attack",
        "mia_ray.pipelines.audit",
        "mia_ray.pipelines.contamination",
        "mia_ray.pipelines.copycheck",
        "mia_ray.pipelines.demo_world",
        "mia_ray.pipelines.leakage",
        "mia_ray.pipelines.lumia",
        "mia_ray.pipelines.marks",
        "mia_ray.pipelines.memhunter",
    ),
    "uncertainty": ("mia_ray.features.uncertainty",),
}


def register(kind: str, name: str) -> Callable[[Any], Any]:
    def deco(obj: Any) -> Any:
        table = _REGISTRY.setdefault(kind, {})
        if name in table and table[name] is not obj:
            raise ValueError(f"{kind} {name!r} is registered twice")
        table[name] = obj
        return obj

    return deco


@dataclass(frozen=True)
class Pipeline:
    """A CLI verb: ``run(cfg, out_dir) -> dict`` (the report) with its config dataclass."""

    name: str
    config_cls: type
    run: Callable[[Any, Any], dict]
    help: str
    # Command-line flags that set one config key each, e.g. {"model": "model.name_or_path"}
    # makes `--model M` mean `--set model.name_or_path=M`.
    flags: tuple[tuple[str, str, str], ...] = ()  # (flag, config key, help)
    # ``resolve(cfg) -> cfg``: the config as it will run (the demo world's paths filled in),
    # a new config; the CLI writes it as the run's config.yaml. ``run`` resolves it too.
    resolve: Callable[[Any], Any] | None = None


def pipeline(
    name: str,
    config_cls: type,
    help: str,
    flags: tuple[tuple[str, str, str], ...] = (),
    resolve: Callable[[Any], Any] | None = None,
) -> Callable[[Any], Any]:
    def deco(fn: Callable[[Any, Any], dict]) -> Callable[[Any, Any], dict]:
        register("pipeline", name)(Pipeline(name, config_cls, fn, help, flags, resolve))
        return fn

    return deco


def _load(kind: str) -> dict[str, Any]:
    for mod in _PROVIDERS.get(kind, ()):
        importlib.import_module(mod)
    return _REGISTRY.get(kind, {})


def names(kind: str) -> list[str]:
    return sorted(_load(kind))


def get(kind: str, name: str) -> Any:
    table = _load(kind)
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise MiaError(f"unknown {kind} {name!r}{hint} (known: {', '.join(sorted(table))})")
    return table[name]
