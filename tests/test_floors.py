"""The layering of docs/architecture.md, checked: every import of a mia_ray module (at the top
of a file or inside a function) goes to a strictly lower floor, and no pipeline imports
another pipeline. The pipelines are found by name through the registry instead."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mia_ray"

# Bottom to top; a unit is a folder of mia_ray/ or a module at its top (``api`` holds
# __init__.py too, whose names load api.py lazily).
FLOORS: list[tuple[str, ...]] = [
    ("errors", "redact", "keys"),
    ("log", "packages", "registry", "grid", "reaper", "reports", "stats"),
    ("storage", "runtime", "features"),
    ("models", "detectors"),
    ("data", "backends"),
    ("config", "serve"),
    ("actors",),
    ("stages",),
    ("train", "scoring"),
    ("demo",),
    ("pipelines",),
    ("validity", "api"),
    ("cli",),
    ("__main__",),
]
FLOOR = {unit: i for i, units in enumerate(FLOORS) for unit in units}


def _unit(module: str) -> str:
    parts = module.split(".")
    return "api" if len(parts) == 1 else parts[1]


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every mia_ray module ``path`` imports; ``from mia_ray import x``
    counts as importing ``mia_ray.x``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "mia_ray":
                found += [(node.lineno, f"mia_ray.{a.name}") for a in node.names]
            elif node.module.startswith("mia_ray."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("mia_ray")]
    return found


def _edges():
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_of(path)
        for line, target in _imports(path):
            yield f"{path.relative_to(PACKAGE.parent)}:{line}", module, target


def test_every_unit_has_a_floor():
    units = {_unit(_module_of(p)) for p in PACKAGE.rglob("*.py")}
    assert units - set(FLOOR) == set(), "place the new folder or module in FLOORS"
    assert set(FLOOR) - units == set(), "FLOORS names a unit that no longer exists"


def test_imports_go_down_the_floors():
    wrong = [
        f"{where}: {_unit(src)} (floor {FLOOR[_unit(src)]}) imports {dst} "
        f"(floor {FLOOR[_unit(dst)]})"
        for where, src, dst in _edges()
        if _unit(src) != _unit(dst) and FLOOR[_unit(src)] <= FLOOR[_unit(dst)]
    ]
    assert wrong == []


def test_no_pipeline_imports_another():
    def pipeline_of(module: str) -> str:
        parts = module.split(".")
        # mia_ray.pipelines.<name>.<module>: a pipeline package; pipelines/common.py is shared.
        return parts[2] if len(parts) > 3 and parts[1] == "pipelines" else ""

    wrong = [
        f"{where}: {src} imports {dst}"
        for where, src, dst in _edges()
        if pipeline_of(src) and pipeline_of(dst) and pipeline_of(src) != pipeline_of(dst)
    ]
    assert wrong == []


def test_the_checks_see_a_wrong_import(tmp_path, monkeypatch):
    # The checker itself: an upward import and a pipeline-to-pipeline import are both caught.
    root = tmp_path / "mia_ray"
    (root / "pipelines" / "one").mkdir(parents=True)
    (root / "keys.py").write_text("def f():\n    from mia_ray.pipelines.one import x\n")
    (root / "pipelines" / "one" / "run.py").write_text("from mia_ray.pipelines.two.run import y\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", root)
    edges = {(src, dst) for _, src, dst in _edges()}
    assert edges == {
        ("mia_ray.keys", "mia_ray.pipelines.one"),
        ("mia_ray.pipelines.one.run", "mia_ray.pipelines.two.run"),
    }
    assert FLOOR[_unit("mia_ray.keys")] < FLOOR[_unit("mia_ray.pipelines.one")]
