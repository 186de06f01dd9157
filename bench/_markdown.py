"""Replace (or append) one ``## `` section of BENCHMARKS.md, keeping the others."""

from __future__ import annotations

from pathlib import Path

HEAD = "# Benchmarks\n\nEach section is measured side by side in one run; rerun its command to refresh it.\n"


def update_section(path: str | Path, text: str) -> None:
    """``text`` starts with its ``## `` heading line; a section with that heading is replaced."""
    path = Path(path)
    old = path.read_text() if path.exists() else HEAD
    heading = text.splitlines()[0]
    if heading in old:
        start = old.index(heading)
        end = old.find("\n## ", start + 1)
        old = old[:start] + (old[end + 1 :] if end != -1 else "")
    path.write_text(old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")


def publish(text: str, out: str | Path) -> None:
    """Print a section, and replace it in ``out`` when given."""
    print(text)
    if out:
        update_section(out, text)
