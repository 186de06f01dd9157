"""Randomized marks the owner inserts before publishing, and the key that regenerates them.

Data watermarks (Wei, Wang, Jia, ACL 2024) and canaries (Zhang, Das, Kamath, Tramèr 2025):
for each mark, ``K`` candidates are drawn from one keyed generator and one of them, chosen
uniformly at random, is inserted into the owner's files. A model that never trained on the
published files has no reason to prefer the published candidate to the ``K - 1`` it never
saw, so the published candidate's rank among them is uniform: the p-value
``(1 + #{alternatives scoring at least as high}) / K`` is exact whatever the text and the
model (:mod:`mia_ray.stats.ranks`).

The key (a JSON file) holds the secret, the settings and each mark's files and chosen index;
every candidate is regenerated from it bit for bit (HMAC-SHA256 of the secret seeds each
candidate's generator), and it holds none of the files' text. Candidates are random words
from the BIP-39 English list (2,048 public words, from the ``mnemonic`` package; the key
records the list's SHA-256), random hex characters (Wei et al.'s random sequences), or
fluent sentences from fixed templates (:mod:`mia_ray.data.canaries`; ``length`` counts
sentences, not words).
A mark is inserted as a line of its own at line or sentence boundaries, so that snippet
cutting and a scraper that collapses whitespace keep its words in order.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from functools import lru_cache
from pathlib import Path

import numpy as np

from mia_ray.data.canaries import grammar_sha256, sentences
from mia_ray.errors import MiaError

KEY_FORMAT = "mia-ray mark key"
KEY_VERSION = 1
KINDS = ("words", "hex", "sentences")
PER = ("file", "dataset")
WORDLIST = "bip39-english"
_HEX = "0123456789abcdef"
# Where a mark may go: after a line break, or after a sentence's end and its space.
_BOUNDARY = re.compile(r"\n|(?<=[.!?])[ \t]+")


@lru_cache(maxsize=1)
def wordlist() -> tuple[tuple[str, ...], str]:
    """The BIP-39 English words (2,048) and the SHA-256 of the file they come from."""
    try:
        import mnemonic
    except ImportError:
        raise MiaError(
            "marks of kind words need the mnemonic package (its BIP-39 word list): "
            "pip install mnemonic"
        ) from None
    path = Path(mnemonic.__file__).parent / "wordlist" / "english.txt"
    raw = path.read_bytes()
    words = tuple(w for w in raw.decode("utf-8").split() if w)
    if len(words) != 2048:
        raise MiaError(f"{path}: expected the 2,048 BIP-39 words, found {len(words)}")
    return words, hashlib.sha256(raw).hexdigest()


def _generator(secret: str, *parts: object) -> np.random.Generator:
    """A generator seeded by HMAC-SHA256 of ``secret`` over ``parts``: the same stream for
    the same key and parts on every machine, unpredictable without the secret."""
    msg = "\x1f".join(str(p) for p in parts).encode()
    digest = hmac.new(bytes.fromhex(secret), msg, hashlib.sha256).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little")))


def new_key(
    file_ids: list[str],
    kind: str = "words",
    length: int = 8,
    candidates: int = 1000,
    copies: int = 1,
    per: str = "file",
    entropy: int | None = None,
) -> dict:
    """A fresh key: a new secret, and per mark its files and the index of the candidate
    that gets published, drawn uniformly from ``candidates`` by the operating system's
    randomness. ``per="file"``: one mark per file (per-file verdicts); ``"dataset"``: one
    mark shared by every file. ``entropy`` seeds all of it instead (simulations and tests
    only: a key anyone can regenerate proves nothing)."""
    if kind not in KINDS:
        raise MiaError(f"mark.kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if per not in PER:
        raise MiaError(f"mark.per must be one of {', '.join(PER)}, not {per!r}")
    if candidates < 2:
        raise MiaError(
            f"mark.candidates must be at least 2 (the smallest p is 1/K), not {candidates}"
        )
    if length < 1 or copies < 1:
        raise MiaError(f"mark.length and mark.copies must be at least 1, not {length} and {copies}")
    if not file_ids:
        raise MiaError("no files to mark")
    groups = [[f] for f in file_ids] if per == "file" else [list(file_ids)]
    if entropy is None:
        token, below = secrets.token_hex, secrets.randbelow
    else:
        rng = np.random.default_rng(entropy)
        token = lambda n: rng.bytes(n).hex()  # noqa: E731
        below = lambda k: int(rng.integers(k))  # noqa: E731
    key = {
        "format": KEY_FORMAT,
        "version": KEY_VERSION,
        "run_id": token(8),
        "secret": token(32),
        "kind": kind,
        "length": int(length),
        "candidates": int(candidates),
        "copies": int(copies),
        "per": per,
        "marks": [
            {"mark_id": f"m{i:05d}", "files": g, "chosen": below(candidates)}
            for i, g in enumerate(groups)
        ],
    }
    if kind == "words":
        key["wordlist"] = {"name": WORDLIST, "sha256": wordlist()[1]}
    if kind == "sentences":
        key["grammar"] = {"name": "mia-ray canaries", "sha256": grammar_sha256()}
    key["check"] = _check(key)
    return key


def _check(key: dict) -> str:
    """HMAC of the key's content under its own secret: an edited key is refused."""
    body = json.dumps({k: v for k, v in key.items() if k != "check"}, sort_keys=True)
    return hmac.new(bytes.fromhex(key["secret"]), body.encode(), hashlib.sha256).hexdigest()


def read_key(path: str | Path) -> dict:
    """A key file, checked: its format, version, integrity and word list."""
    p = Path(path)
    try:
        key = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MiaError(f"key file not found: {p}") from None
    except (ValueError, UnicodeDecodeError):
        raise MiaError(f"{p} is not a mark key (not JSON)") from None
    if not isinstance(key, dict) or key.get("format") != KEY_FORMAT:
        raise MiaError(f"{p} is not a mark key (written by mia-ray mark)")
    if key.get("version") != KEY_VERSION:
        raise MiaError(f"{p}: key version {key.get('version')!r}, this mia-ray reads {KEY_VERSION}")
    try:
        ok = hmac.compare_digest(str(key.get("check", "")), _check(key))
    except (KeyError, ValueError, TypeError):
        ok = False
    if not ok:
        raise MiaError(
            f"{p}: the key's check does not match its content: it was edited or is damaged"
        )
    if key["kind"] == "words" and key["wordlist"]["sha256"] != wordlist()[1]:
        raise MiaError(
            f"{p}: the key's word list ({key['wordlist']['sha256'][:12]}…) is not this "
            f"machine's {WORDLIST} ({wordlist()[1][:12]}…): its candidates cannot be regenerated"
        )
    if key["kind"] == "sentences" and key["grammar"]["sha256"] != grammar_sha256():
        raise MiaError(
            f"{p}: the key's sentence grammar ({key['grammar']['sha256'][:12]}…) is not this "
            f"mia-ray's ({grammar_sha256()[:12]}…): its candidates cannot be regenerated"
        )
    return key


def candidate(key: dict, mark_id: str, j: int) -> str:
    """Candidate ``j`` of one mark, regenerated from the key alone."""
    g = _generator(key["secret"], key["run_id"], mark_id, j)
    if key["kind"] == "words":
        words = wordlist()[0]
        return " ".join(words[i] for i in g.integers(0, len(words), key["length"]))
    if key["kind"] == "sentences":
        return sentences(g, key["length"])
    return "".join(_HEX[i] for i in g.integers(0, 16, key["length"]))


def candidates_of(key: dict, mark_id: str) -> list[str]:
    """The ``K`` candidates of one mark, in their keyed order (the published one at the
    mark's ``chosen`` index)."""
    return [candidate(key, mark_id, j) for j in range(key["candidates"])]


def published(key: dict) -> dict[str, str]:
    """mark_id -> the candidate that was published (only that one is regenerated)."""
    return {m["mark_id"]: candidate(key, m["mark_id"], m["chosen"]) for m in key["marks"]}


def insert_mark(text: str, mark: str, copies: int, key: dict, file_id: str) -> str:
    """``text`` with ``mark`` inserted ``copies`` times, each as a line of its own at a line
    or sentence boundary drawn by the key's generator for this file (the end of the text
    when it has none)."""
    spots = [m.end() for m in _BOUNDARY.finditer(text)] or [len(text)]
    g = _generator(key["secret"], key["run_id"], "place", file_id)
    where = np.sort(g.choice(len(spots), copies, replace=copies > len(spots)))
    out, last = [], 0
    for i in where:
        at = spots[int(i)]
        out.append(text[last:at])
        before = "" if at == 0 or text[at - 1] == "\n" else "\n"
        out.append(f"{before}{mark}\n")
        last = at
    out.append(text[last:])
    return "".join(out)


def normalize(text: str) -> str:
    """Whitespace collapsed to single spaces, as a scraper or the word snippets leave it."""
    return " ".join(text.split())


def count_in(text: str, mark: str) -> int:
    """How many times ``mark`` occurs in ``text``, both whitespace-normalized."""
    return normalize(text).count(normalize(mark))
