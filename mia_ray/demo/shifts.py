"""Text shifts users bring: the suspected files differ from the unseen ones in a way that is
not training. Each is ``shift(text, rng) -> text`` on real documents, for the validity suite
at token level (``bench/validity_tokens.py``) and the premise checks' tests.

Each changes one thing and keeps the rest (whitespace included, unless layout is the point):

- ``casing``: 4 % of the words in capitals (headings, emphasis, a scraper's styling);
- ``lowercased``: the whole text in lower case (a pipeline that lowercases);
- ``layout``: lines hard-wrapped at 60 characters (a PDF or e-mail export);
- ``repetition``: a span of 12 words repeated right after itself (internal repetition);
- ``boilerplate``: a fixed notice line appended (a site's or a publisher's footer);
- ``typography``: straight quotes and hyphens made typographic (another editor or scraper);
- ``simpler``: parentheticals dropped and semicolons made full stops (a plainer register);
- ``ocr``: 3 % of the letters swapped for look-alikes (OCR noise: harder text).

Pure Python; every shift is seeded by ``rng`` (a ``random.Random``) only.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

_WORD = re.compile(r"\S+")
CASING_SHARE = 0.04
WRAP = 60
REPEAT_WORDS = 12
BOILERPLATE = "All rights reserved. Reproduced with permission of the copyright holder."
OCR_SHARE = 0.03
_LOOKALIKE = {"l": "1", "o": "0", "e": "c", "i": "l", "m": "rn", "a": "o", "s": "5", "b": "h"}


def casing(text: str, rng: random.Random) -> str:
    return _WORD.sub(lambda m: m.group().upper() if rng.random() < CASING_SHARE else m.group(),
                     text)  # fmt: skip


def lowercased(text: str, rng: random.Random) -> str:
    return text.lower()


def layout(text: str, rng: random.Random) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > WRAP:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


def repetition(text: str, rng: random.Random) -> str:
    spans = list(_WORD.finditer(text))
    if len(spans) <= REPEAT_WORDS:
        return text
    i = rng.randrange(0, len(spans) - REPEAT_WORDS)
    a, b = spans[i].start(), spans[i + REPEAT_WORDS - 1].end()
    return f"{text[:b]} {text[a:b]}{text[b:]}"


def boilerplate(text: str, rng: random.Random) -> str:
    return f"{text.rstrip()}\n{BOILERPLATE}"


def typography(text: str, rng: random.Random) -> str:
    text = re.sub(r'"(\S)', "\u201c\\1", text)
    text = text.replace('"', "\u201d").replace("'", "\u2019")
    return re.sub(r" - |--", " \u2014 ", text)


def simpler(text: str, rng: random.Random) -> str:
    text = re.sub(r"\s*\([^()]*\)", "", text)
    return re.sub(r";\s*(\w)", lambda m: ". " + m.group(1).upper(), text)


def ocr(text: str, rng: random.Random) -> str:
    return "".join(
        _LOOKALIKE[c] if c in _LOOKALIKE and rng.random() < OCR_SHARE * 2 else c for c in text
    )


SHIFTS: dict[str, Callable[[str, random.Random], str]] = {
    "casing": casing,
    "lowercased": lowercased,
    "layout": layout,
    "repetition": repetition,
    "boilerplate": boilerplate,
    "typography": typography,
    "simpler": simpler,
    "ocr": ocr,
}


def shifted(name: str, text: str, seed: str) -> str:
    """``SHIFTS[name]`` applied to ``text`` with its own seeded generator."""
    return SHIFTS[name](text, random.Random(f"{name}:{seed}"))
