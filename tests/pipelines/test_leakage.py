"""The leakage survey's scan end to end on the test world's crawl (real shards, real Ray)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from mia_ray.cli import main

pytestmark = [pytest.mark.ray]


def _args(test_world, out, *extra):
    return [
        "leakage", "--config", "jobs/leakage_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        *extra, "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local, test_world):
    out = tmp_path_factory.mktemp("leakage") / "run"
    assert main(_args(test_world, out)) == 0
    return out, json.loads((out / "report.json").read_text())


def test_exact_match_stores_find_every_planted_span_and_nothing_else(run):
    _, report = run
    for category in ("copyright", "benchmark"):
        r = report["leakage_rate"][category]
        assert r["planted"] == 4 and r["found"] == 4, r
        assert r["precision"] == 1.0 and r["recall"] == 1.0
    # The spans were pasted into 4 pages at most each: the rate counts documents.
    assert 0 < report["leakage_rate"]["copyright"]["documents"] <= 4


def test_every_planted_pii_record_is_found(run):
    _, report = run
    pii = report["leakage_rate"]["pii"]
    assert pii["planted"] == 24 and pii["found"] == 24 and pii["recall"] == 1.0
    types = report["truth"]["pii"]["types"]
    assert all(t["found"] == t["planted"] for t in types.values())
    # Precision is measured against the plants: the real Wikipedia text may hold real dates
    # of birth or addresses nobody planted, and each of those is listed for checking.
    wrong = report["truth"]["pii"]["unplanted_matches"]
    assert pii["precision"] == pytest.approx(1 - len(wrong) / report["truth"]["pii"]["matches"])


def test_rates_and_intervals_recompute_from_the_matches(run):
    from mia_ray.stats.metrics import wilson_interval

    out, report = run
    found = pd.read_parquet(out / "matches.parquet")
    n = report["crawl"]["documents"]
    assert n == 60
    for category in ("pii", "copyright", "benchmark"):
        docs = found[found["category"] == category][["shard", "doc_id"]].drop_duplicates()
        r = report["leakage_rate"][category]
        assert r["documents"] == len(docs) and r["rate"] == pytest.approx(len(docs) / n)
        assert r["ci"] == pytest.approx(list(wilson_interval(len(docs), n, 0.95)))
    assert sum(s["documents"] for s in report["shards"].values()) == n


def test_every_match_points_at_its_text_in_the_shard(run, test_world):
    out, _ = run
    found = pd.read_parquet(out / "matches.parquet")
    crawl = Path(test_world["root"]) / "crawl" / "shards"
    pages = {}
    for row in (crawl / "part-000.jsonl").read_text().splitlines():
        r = json.loads(row)
        pages[("part-000.jsonl", r["id"])] = r["text"]
    for r in pd.read_parquet(crawl / "part-001.parquet").to_dict("records"):
        pages[("part-001.parquet", r["id"])] = r["text"]
    for p in (crawl / "part-002").rglob("*.txt"):
        pages[("part-002", str(p.relative_to(crawl / "part-002")))] = p.read_text()
    for m in found.to_dict("records"):
        assert pages[(m["shard"], m["doc_id"])][m["start"] : m["end"]] == m["value"]
    html = (out / "report.html").read_text()
    assert "data:image/png" in html and "Leakage rate (Table 2)" in html


def test_rerun_reuses_every_shard_and_gives_the_same_numbers(run, test_world, capfd):
    out, report = run
    capfd.readouterr()
    assert main(_args(test_world, out)) == 0
    err = capfd.readouterr().err
    assert err.count("reusing the earlier scan") == 3
    again = json.loads((out / "report.json").read_text())
    assert again["leakage_rate"] == report["leakage_rate"]


def test_one_worker_finds_what_two_find(run, test_world, tmp_path):
    out, _ = run
    one = tmp_path / "one"
    assert main(_args(test_world, one, "--set", "scan.workers=1")) == 0
    cols = ["shard", "doc_id", "category", "type", "start", "end", "ref"]
    a = pd.read_parquet(out / "matches.parquet")[cols].sort_values(cols).reset_index(drop=True)
    b = pd.read_parquet(one / "matches.parquet")[cols].sort_values(cols).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)


def test_bad_input_is_one_clear_error(tmp_path, capsys, ray_local):
    code = main(
        [
            "leakage",
            "--set",
            f"crawl.shards=[{tmp_path / 'missing.jsonl'}]",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 2
    assert f"crawl.shards: {tmp_path / 'missing.jsonl'} not found" in capsys.readouterr().err
    assert main(["leakage", "--out", str(tmp_path / "o")]) == 2
    assert "crawl.shards is empty" in capsys.readouterr().err
    assert main(["leakage", "--set", "crawl.demo=true", "--set", "scan.pii_types=[emial]",
                 "--out", str(tmp_path / "o")]) == 2  # fmt: skip
    assert "unknown type 'emial'; did you mean 'email'?" in capsys.readouterr().err


def test_notebook_redraws_the_rates_from_the_run(run, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    out, report = run
    monkeypatch.setenv("MIA_RAY_RUN", str(out))
    nb = nbformat.read("notebooks/leakage.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    text = "".join(
        o.get("text", "") + o.get("data", {}).get("text/plain", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )
    rate = round(100 * report["leakage_rate"]["copyright"]["rate"], 2)
    assert f"{rate}" in text and "recomputed from matches: True" in text
    assert "60 documents" in text
    png = out / "leakage_pii_types.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 3000
