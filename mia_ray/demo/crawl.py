"""The demo "web crawl" for the leakage survey: Wikipedia leads the demo world does not use,
written as shards in three formats, with known numbers of planted personal-information
records, benchmark items and book spans, and the truth about every one of them.

- pages: leads outside the world's own web sample (so no world document is in the crawl);
- benchmark ("wikicloze-demo", made here, since no public benchmark installs offline): items
  of a passage (the first sentences of another unused lead) and a fill-in-the-blank question
  on it; ``bench_planted`` of them are pasted whole into pages, as a site republishing a test
  set would;
- books: ``book_spans`` spans of ``span_words`` words copied from the world's scenes (the
  stand-in for copyrighted books) into pages;
- personal information: ``pii_records`` sentences from templates, one of the 20 types each,
  with values built here to pass their checks (Luhn, mod-97, check digits ...), most naming
  a person; the names come from a fixed list of many origins, not from the name detector's
  lists, so the scan's recall on names is measured, not given.

Files under ``<world>/crawl``: ``shards/part-NNN.{jsonl,parquet}`` and ``shards/part-NNN/``
(one ``.txt`` per page), ``benchmark.jsonl``, ``planted.jsonl`` (one row per planted thing:
``category``, ``type``, ``shard``, ``doc_id``, ``start``, ``end``, ``value``, ``ref``) and
``crawl.json`` (sizes, seed, counts).
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import string
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mia_ray.demo.corpora import Doc, web_docs, web_pool
from mia_ray.errors import MiaError
from mia_ray.features.shingles import words_with_offsets

CRAWL_FORMAT = 3  # bump when what build_crawl writes changes


@dataclass(frozen=True)
class CrawlScale:
    pages: int
    shards: int
    pii_records: int
    book_spans: int
    span_words: int  # copyright span length (the paper: about 300 words)
    bench_items: int
    bench_planted: int
    bench_span_words: int  # benchmark passages are shorter than 300 words


CRAWL_SCALES = {
    "demo": CrawlScale(1200, 6, 120, 30, 300, 200, 30, 40),
    "test": CrawlScale(60, 3, 24, 4, 100, 20, 4, 30),
}

# Names of many origins, written out here: the scanner's name lists (US Census 1990) know
# some of them and not others, which is what its recall on names should show.
PLANTED_NAMES = (
    "Mary Johnson", "James Miller", "Linda Garcia", "Robert Wilson", "Patricia Moore",
    "Michael Anderson", "Barbara Thompson", "David Martinez", "Susan Clark", "Thomas Lewis",
    "Karen Walker", "Daniel Young", "Nancy Allen", "Paul Wright", "Sandra King",
    "Aiko Tanaka", "Oluwaseun Adeyemi", "Priya Raghunathan", "Wei Zhang", "Mehmet Yilmaz",
    "Siobhan Ni Bhriain", "Bogdan Kowalczyk", "Fatima Al-Sayed", "Nguyen Van Anh",
    "Ingrid Johansson",
)  # fmt: skip

_STREETS = ("Maple", "Oak", "Cedar", "Pine", "Elm", "Washington", "Lake", "Hill", "Park")
_SUFFIXES = ("Street", "Avenue", "Road", "Lane", "Drive", "Boulevard", "Court", "Way")
_MONTHS = (
    "January February March April May June July August September October November December"
).split()


# ------------------------------------------------------------------------- PII values


def luhn_digit(digits: str) -> str:
    """The check digit that makes ``digits + d`` pass the Luhn test."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 == 0 else 1)
        total += d - 9 if d > 9 else d
    return str((10 - total % 10) % 10)


def iban_check(country: str, bban: str) -> str:
    moved = bban + country + "00"
    number = int("".join(str(int(c, 36)) for c in moved))
    return f"{98 - number % 97:02d}"


# ISO 3779 transliteration: A-H 1-8, J-N 1-5, P 7, R 9, S-Z 2-9; digits stand for themselves.
_VIN_VALUES = {str(d): d for d in range(10)}
for _letters, _first in (("ABCDEFGH", 1), ("JKLMN", 1), ("P", 7), ("R", 9), ("STUVWXYZ", 2)):
    _VIN_VALUES.update({c: _first + i for i, c in enumerate(_letters)})
_VIN_WEIGHTS = (8, 7, 6, 5, 4, 3, 2, 10, 0, 9, 8, 7, 6, 5, 4, 3, 2)


def vin_check(vin: str) -> str:
    """ISO 3779 (North America) check digit of a 17-character VIN (position 9 ignored)."""
    r = sum(_VIN_VALUES[c] * w for c, w in zip(vin, _VIN_WEIGHTS, strict=True)) % 11
    return "X" if r == 10 else str(r)


_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def base58check(payload: bytes) -> str:
    raw = payload + hashlib.sha256(hashlib.sha256(payload).digest()).digest()[:4]
    n, out = int.from_bytes(raw, "big"), ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(raw) - len(raw.lstrip(b"\0"))) + out


def _b64url(obj: Any) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def pii_value(kind: str, rng: random.Random) -> str:
    """A fresh value of one of the 20 types that passes that type's own checks."""
    digits = lambda n: "".join(rng.choice(string.digits) for _ in range(n))  # noqa: E731
    if kind == "email":
        return f"{rng.choice(['j.doe', 'contact', 'm.rossi', 'info'])}{digits(3)}@example.org"
    if kind == "phone_nanp":
        return f"({rng.randint(2, 9)}{digits(2)}) {rng.randint(2, 9)}{digits(2)}-{digits(4)}"
    if kind == "phone_intl":
        return f"+44 20 {digits(4)} {digits(4)}"
    if kind == "payment_card":
        body = "4" + digits(14)
        card = body + luhn_digit(body)
        return " ".join(card[i : i + 4] for i in range(0, 16, 4))
    if kind == "us_ssn":
        area = rng.choice([a for a in range(1, 900) if a != 666])
        return f"{area:03d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}"
    if kind == "uk_nino":
        first = rng.choice("ABCEGHJKLMNOPRSTWXYZ")
        second = rng.choice(
            [c for c in "ABCEGHJKLMNPRSTWXYZ" if first + c not in ("GB", "NK", "TN")]
        )
        return f"{first}{second} {digits(2)} {digits(2)} {digits(2)} {rng.choice('ABCD')}"
    if kind == "ca_sin":
        body = str(rng.choice([1, 2, 3, 4, 5, 6, 7, 9])) + digits(7)
        sin = body + luhn_digit(body)
        return f"{sin[:3]} {sin[3:6]} {sin[6:]}"
    if kind == "iban":
        bban = digits(18)
        iban = "DE" + iban_check("DE", bban) + bban
        return " ".join(iban[i : i + 4] for i in range(0, len(iban), 4))
    if kind == "ipv4":
        return f"{rng.randint(11, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    if kind == "ipv6":
        return ":".join(f"{rng.randint(0, 0xFFFF):x}" for _ in range(8))
    if kind == "mac_address":
        return ":".join(f"{rng.randint(0, 255):02X}" for _ in range(6))
    if kind == "street_address":
        return f"{rng.randint(10, 9999)} {rng.choice(_STREETS)} {rng.choice(_SUFFIXES)}"
    if kind == "date_of_birth":
        return f"{rng.choice(_MONTHS)} {rng.randint(1, 28)}, {rng.randint(1940, 2005)}"
    if kind == "url_credentials":
        return f"https://admin{digits(2)}:S3cr{digits(4)}t@intranet.example.com"
    if kind == "aws_access_key":
        return "AKIA" + "".join(rng.choice(string.ascii_uppercase + "234567") for _ in range(16))
    if kind == "private_key":
        return "-----BEGIN RSA PRIVATE KEY-----"
    if kind == "jwt":
        payload = {"sub": digits(8), "iat": 1700000000 + rng.randint(0, 10**7)}
        sig = bytes(rng.randint(0, 255) for _ in range(32))
        return ".".join([_b64url({"alg": "HS256", "typ": "JWT"}), _b64url(payload), _b64url(sig)])
    if kind == "bitcoin_address":
        return base58check(b"\0" + bytes(rng.randint(0, 255) for _ in range(20)))
    if kind == "vin":
        chars = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"
        vin = "1" + "".join(rng.choice(chars) for _ in range(16))
        # Position 10 is the model year, which is never U, Z or 0.
        vin = vin[:9] + rng.choice("ABCDEFGHJKLMNPRSTVWXY123456789") + vin[10:]
        return vin[:8] + vin_check(vin) + vin[9:]
    if kind == "passport_number":
        return rng.choice(string.ascii_uppercase) + digits(8)
    raise ValueError(kind)


# One sentence per type; {name} marks a planted person name, {value} the planted value.
TEMPLATES = {
    "email": "For questions write to {name} at {value} any weekday.",
    "phone_nanp": "You can call {name} on {value} after six.",
    "phone_intl": "The London office of {name} answers on {value} during the week.",
    "payment_card": "The card on file for {name} is {value} and it expires soon.",
    "us_ssn": "The form lists the social security number of {name} as {value} in full.",
    "uk_nino": "Her National Insurance number, {value}, was printed on the letter to {name}.",
    "ca_sin": "The payroll record of {name} shows the SIN {value} next to the salary.",
    "iban": "Please pay the invoice of {name} to the account {value} by Friday.",
    "ipv4": "The server log shows {name} connecting from {value} at noon.",
    "ipv6": "The router assigned {value} to the laptop of {name}.",
    "mac_address": "The device registered to {name} has the hardware address {value}.",
    "street_address": "{name} lives at {value} with two cats.",
    "date_of_birth": "{name} was born on {value} in a small town.",
    "url_credentials": "The old wiki of {name} is still open at {value}/login for anyone.",
    "aws_access_key": "The leaked config of {name} held the key {value} in plain text.",
    "private_key": "The repository of {name} contained a file starting with {value} and more.",
    "jwt": "A request from {name} carried the header Authorization: Bearer {value} today.",
    "bitcoin_address": "Donations for {name} go to {value} every month.",
    "vin": "The car of {name} has the vehicle identification number {value} on file.",
    "passport_number": "The passport number of {name} is {value} according to the scan.",
}
PII_KINDS = tuple(TEMPLATES)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def _insert(
    text: str, piece: str, rng: random.Random, keep: list[tuple[int, int]]
) -> tuple[str, int]:
    """``text`` with ``piece`` put at a random sentence boundary outside the ``keep`` ranges
    (pieces planted before), or at the end; returns the new text and the piece's offset."""
    cuts = [
        m.end()
        for m in _SENTENCE_END.finditer(text)
        if all(m.end() <= a or m.end() >= b for a, b in keep)
    ]
    if cuts:
        at = rng.choice(cuts)
        return text[:at] + piece + " " + text[at:], at
    at = len(text.rstrip("\n"))
    sep = " " if at and not text[at - 1].isspace() else ""
    return text[:at] + sep + piece + text[at:], at + len(sep)


def _passage(text: str, min_words: int) -> str:
    """The lead's first sentences, at least ``min_words`` words as the store counts them
    ("" if the lead is shorter)."""
    out: list[str] = []
    for sent in _SENTENCE_END.split(text.strip()):
        out.append(sent)
        if len(words_with_offsets(" ".join(out))[0]) >= min_words:
            return " ".join(out)
    return ""


def cloze(passage: str) -> tuple[str, str]:
    """A fill-in-the-blank question on the passage's first sentence: a year if it has one,
    else its last word of four letters or more."""
    first = _SENTENCE_END.split(passage)[0]
    year = re.search(r"\b(1[0-9]{3}|20[0-2][0-9])\b", first)
    if year:
        answer, start = year.group(), year.start()
    else:
        words = list(re.finditer(r"\b[A-Za-z]{4,}\b", first))
        answer, start = words[-1].group(), words[-1].start()
    return first[:start] + "____" + first[start + len(answer) :], answer


def build_crawl(scale: str, seed: int, world_web_ids: set[str], books: list[Doc]) -> dict[str, Any]:
    """Pages, benchmark and plants (pure; nothing written). ``world_web_ids``: the world's
    own web documents, kept out of the crawl and the benchmark."""
    s = CRAWL_SCALES[scale]
    rng = random.Random(f"crawl-{seed}")
    leads = [d for d in web_docs(web_pool(60, 0)) if d.id not in world_web_ids]
    need = s.pages + s.bench_items
    if len(leads) < need:
        raise MiaError(f"only {len(leads)} unused Wikipedia leads; the crawl needs {need}")
    picked = rng.sample(leads, need)
    pages = sorted(picked[: s.pages], key=lambda d: d.id)
    bench = []
    for d in sorted(picked[s.pages :], key=lambda d: d.id):
        passage = _passage(d.text, s.bench_span_words)
        if passage:
            question, answer = cloze(passage)
            item_id = f"wikicloze-{len(bench):04d}"
            bench.append(
                {"id": item_id, "passage": passage, "question": question, "answer": answer}
            )
    texts = {p.id: p.text for p in pages}
    order = [p.id for p in pages]
    shard_of = {doc_id: i % s.shards for i, doc_id in enumerate(order)}
    planted: list[dict[str, Any]] = []
    pieces: dict[str, list[tuple[int, int]]] = {}

    def plant(doc_id: str, piece: str, rows: list[dict[str, Any]]) -> None:
        keep = pieces.setdefault(doc_id, [])
        text, at = _insert(texts[doc_id], piece, rng, keep)
        shift = len(text) - len(texts[doc_id])
        for r in planted:  # what was planted after this point in the page moves right
            if r["doc_id"] == doc_id and r["start"] >= at:
                r["start"] += shift
                r["end"] += shift
        keep[:] = [(a + shift, b + shift) if a >= at else (a, b) for a, b in keep]
        keep.append((at, at + len(piece)))
        texts[doc_id] = text
        for r in rows:
            planted.append(
                {**r, "doc_id": doc_id, "shard": shard_of[doc_id], "start": r["start"] + at,
                 "end": r["end"] + at}
            )  # fmt: skip

    eligible_books = [b for b in books if len(words_with_offsets(b.text)[0]) >= s.span_words]
    for b in rng.sample(eligible_books, min(s.book_spans, len(eligible_books))):
        # Exactly span_words words as the store counts them, in the scene's own layout.
        _, starts, ends = words_with_offsets(b.text)
        first = rng.randint(0, len(starts) - s.span_words)
        span = b.text[starts[first] : ends[first + s.span_words - 1]]
        plant(
            rng.choice(order),
            span,
            [{"category": "copyright", "type": "book_span", "value": span, "ref": b.id.removeprefix("books/"),
              "start": 0, "end": len(span)}],
        )  # fmt: skip
    for item in rng.sample(bench, min(s.bench_planted, len(bench))):
        piece = f"{item['passage']} Question: {item['question']} Answer: {item['answer']}."
        plant(
            rng.choice(order),
            piece,
            [{"category": "benchmark", "type": "benchmark_item", "value": piece,
              "ref": item["id"], "start": 0, "end": len(piece)}],
        )  # fmt: skip
    for i in range(s.pii_records):
        kind = PII_KINDS[i % len(PII_KINDS)]
        name, value = rng.choice(PLANTED_NAMES), pii_value(kind, rng)
        sentence = TEMPLATES[kind].format(name=name, value=value)
        rows = [
            {"category": "pii", "type": kind, "value": value, "ref": "",
             "start": sentence.index(value), "end": sentence.index(value) + len(value)},
            {"category": "pii", "type": "person_name", "value": name, "ref": "",
             "start": sentence.index(name), "end": sentence.index(name) + len(name)},
        ]  # fmt: skip
        plant(rng.choice(order), sentence, rows)
    return {
        "scale": scale,
        "seed": seed,
        "settings": asdict(s),
        "pages": [{"id": i, "text": texts[i], "shard": shard_of[i]} for i in order],
        "benchmark": bench,
        "planted": planted,
    }


def planted_instances(crawl: dict[str, Any], instance_words: int) -> list[str]:
    """The instance of every planted record (not names), cut from its page as the leakage
    survey cuts a match's instance (:func:`mia_ray.features.leaks.instance_span`), in
    planting order: what the world's ``smollm2-crawl`` is fine-tuned on."""
    from mia_ray.features.leaks import instance_span

    texts = {p["id"]: p["text"] for p in crawl["pages"]}
    out: dict[str, None] = {}
    for r in crawl["planted"]:
        if r["type"] != "person_name":
            text = texts[r["doc_id"]]
            a, b = instance_span(text, r["start"], r["end"], r["category"], instance_words)
            out.setdefault(text[a:b])
    return list(out)


def write_crawl(crawl: dict[str, Any], out: Path) -> dict[str, Any]:
    """Shards in turn as jsonl, parquet and a folder of text files; the truth beside them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards_dir = out / "shards"
    shards_dir.mkdir(parents=True, exist_ok=True)
    n = crawl["settings"]["shards"]
    names, kinds = [], []
    for k in range(n):
        rows = [p for p in crawl["pages"] if p["shard"] == k]
        kind = ("jsonl", "parquet", "text")[k % 3]
        name = f"part-{k:03d}" + {"jsonl": ".jsonl", "parquet": ".parquet", "text": ""}[kind]
        kinds.append(kind)
        path = shards_dir / name
        if kind == "jsonl":
            with path.open("w", encoding="utf-8") as f:
                for r in rows:
                    f.write(
                        json.dumps({"id": r["id"], "text": r["text"]}, ensure_ascii=False) + "\n"
                    )
        elif kind == "parquet":
            table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]})
            pq.write_table(table, path)
        else:
            for r in rows:
                f = path / (r["id"] + ".txt")
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(r["text"], encoding="utf-8")
        names.append(name)
    # A text-file shard names a page by its path inside the shard folder.
    planted = [
        {**r, "shard": names[r["shard"]],
         "doc_id": r["doc_id"] + (".txt" if kinds[r["shard"]] == "text" else "")}
        for r in crawl["planted"]
    ]  # fmt: skip
    with (out / "planted.jsonl").open("w", encoding="utf-8") as f:
        for r in planted:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with (out / "benchmark.jsonl").open("w", encoding="utf-8") as f:
        for item in crawl["benchmark"]:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    counts: dict[str, int] = {}
    for r in planted:
        counts[r["category"]] = counts.get(r["category"], 0) + (r["type"] != "person_name")
    meta = {
        "format": CRAWL_FORMAT,
        "scale": crawl["scale"],
        "seed": crawl["seed"],
        "settings": crawl["settings"],
        "shards": names,
        "pages": len(crawl["pages"]),
        "bytes": sum(len(p["text"].encode()) for p in crawl["pages"]),
        "planted": counts,
        "planted_names": sum(r["type"] == "person_name" for r in planted),
        "benchmark_items": len(crawl["benchmark"]),
    }
    (out / "crawl.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


def wet_url(page_id: str) -> str:
    """The demo URL of a page: one of eight demo sites, chosen by the page's id."""
    site = int(hashlib.sha256(page_id.encode()).hexdigest(), 16) % 8
    return f"https://site-{site}.demo.example/{page_id}"


def wet_record_id(page_id: str) -> str:
    import uuid

    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, wet_url(page_id))}"


def write_wet(pages: list[dict[str, Any]], path: Path, date: str = "2026-01-01T00:00:00Z") -> None:
    """Pages (``id``, ``text``) as a Common Crawl WET file (``.warc.wet.gz``): a ``warcinfo``
    record, then one ``conversion`` record per page (its ``WARC-Target-URI`` from
    :func:`wet_url`, its ``WARC-Record-ID`` from :func:`wet_record_id`), each record its own
    gzip member as Common Crawl writes them; a page whose text is empty stays, as WET files
    have such records."""
    import gzip

    def record(kind: str, headers: dict[str, str], body: bytes) -> bytes:
        head = ["WARC/1.0", f"WARC-Type: {kind}", f"WARC-Date: {date}",
                *(f"{k}: {v}" for k, v in headers.items()),
                f"Content-Length: {len(body)}"]  # fmt: skip
        return gzip.compress(("\r\n".join(head) + "\r\n\r\n").encode() + body + b"\r\n\r\n")

    info = b"software: mia-ray demo world\r\nformat: WARC file version 1.0\r\n"
    with path.open("wb") as f:
        f.write(record("warcinfo", {"WARC-Record-ID": f"<urn:uuid:{'0' * 8}-0000-0000-0000-{'0' * 12}>",
                                    "Content-Type": "application/warc-fields"}, info))  # fmt: skip
        for p in pages:
            f.write(
                record(
                    "conversion",
                    {"WARC-Target-URI": wet_url(p["id"]),
                     "WARC-Record-ID": f"<{wet_record_id(p['id'])}>",
                     "Content-Type": "text/plain"},
                    p["text"].encode("utf-8"),
                )
            )  # fmt: skip
