"""The demo crawl: check digits of the planted values, the truth's offsets, the shards."""

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from mia_ray.demo.crawl import (
    PII_KINDS,
    TEMPLATES,
    base58check,
    iban_check,
    luhn_digit,
    pii_value,
    vin_check,
)


def test_check_digits_match_the_published_examples():
    assert luhn_digit("7992739871") == "3"  # 79927398713, the Luhn example
    assert iban_check("DE", "370400440532013000") == "89"  # DE89 3704 0044 0532 0130 00
    assert iban_check("GB", "WEST12345698765432") == "82"  # GB82 WEST 1234 5698 7654 32
    assert vin_check("1M8GDM9AXKP042788") == "X"  # the ISO 3779 worked example
    assert base58check(bytes(21)) == "1111111111111111111114oLvT2"


def test_every_planted_value_is_found_by_its_own_scanner_type():
    from mia_ray.features.pii import scan_pii

    rng = random.Random(0)
    for kind in PII_KINDS:
        for _ in range(50):  # enough draws to hit the rare cases (a VIN's year letter)
            value = pii_value(kind, rng)
            text = TEMPLATES[kind].format(name="Mary Johnson", value=value)
            got = [(m.type, m.value) for m in scan_pii(text, names=False)]
            assert (kind, value) in got, (kind, value, got)


@pytest.fixture(scope="module")
def crawl(test_world):
    from mia_ray.config import WorldConfig
    from mia_ray.demo.world import ensure_world

    cfg = WorldConfig(root=test_world["root"], scale="test")
    return ensure_world(cfg, [], crawl=True)["crawl"]


def _pages(crawl) -> dict[tuple[str, str], str]:
    pages = {}
    for shard in map(Path, crawl["shards"]):
        if shard.suffix == ".jsonl":
            rows = [json.loads(x) for x in shard.read_text().splitlines()]
        elif shard.suffix == ".parquet":
            rows = pd.read_parquet(shard).to_dict("records")
        else:
            rows = [
                {"id": str(p.relative_to(shard)), "text": p.read_text()}
                for p in shard.rglob("*.txt")
            ]
        pages.update({(shard.name, r["id"]): r["text"] for r in rows})
    return pages


def test_truth_points_at_the_planted_text_in_every_shard_format(crawl):
    pages = _pages(crawl)
    truth = [json.loads(x) for x in Path(crawl["planted"]).read_text().splitlines()]
    meta = crawl["meta"]
    assert len(pages) == meta["pages"] == 60 and len(crawl["shards"]) == 3
    assert {Path(s).suffix for s in crawl["shards"]} == {".jsonl", ".parquet", ""}
    assert meta["planted"] == {"copyright": 4, "benchmark": 4, "pii": 24}
    for r in truth:
        assert pages[(r["shard"], r["doc_id"])][r["start"] : r["end"]] == r["value"], r
    # Every PII kind is planted at this scale (24 records, 20 kinds).
    assert {r["type"] for r in truth if r["category"] == "pii"} >= set(PII_KINDS)


def test_crawl_pages_are_not_world_documents(crawl, test_world):
    world = {json.loads(x)["id"] for x in open(test_world["documents"])}
    bench = [json.loads(x) for x in Path(crawl["benchmark"]).read_text().splitlines()]
    ids = {doc_id.removesuffix(".txt") for _, doc_id in _pages(crawl)}
    assert not ids & world
    assert all(b["question"].count("____") == 1 for b in bench)
