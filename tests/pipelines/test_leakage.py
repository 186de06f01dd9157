"""The leakage survey's scan end to end on the test world's crawl (real shards, real Ray)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mia_ray.cli import main
from mia_ray.pipelines.leak_eval import CATEGORIES, METHODS

pytestmark = [pytest.mark.ray]


# The model side at test scale: the crawl's 4 book spans and 4 benchmark items leave one
# leaked/non-leaked pair of few-shot examples and 3 instances to score.
EVAL = [
    "--set", 'eval.targets=["@world:smollm2-crawl", "@world:smollm2-base"]',
    "--set", "eval.shots=2", "--set", "eval.few_shot_curve=[0,2]", "--set", "eval.instances=6",
    "--set", "resources.cpus_per_actor=1",
]  # fmt: skip


def _args(test_world, out, *extra):
    return [
        "leakage", "--config", "jobs/leakage_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        *EVAL, *extra, "--out", str(out),
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


def _pages(test_world):
    crawl = Path(test_world["root"]) / "crawl" / "shards"
    pages = {}
    for row in (crawl / "part-000.jsonl").read_text().splitlines():
        r = json.loads(row)
        pages[("part-000.jsonl", r["id"])] = r["text"]
    for r in pd.read_parquet(crawl / "part-001.parquet").to_dict("records"):
        pages[("part-001.parquet", r["id"])] = r["text"]
    for p in (crawl / "part-002").rglob("*.txt"):
        pages[("part-002", str(p.relative_to(crawl / "part-002")))] = p.read_text()
    return pages


def test_every_match_points_at_its_text_in_the_shard(run, test_world):
    out, _ = run
    found = pd.read_parquet(out / "matches.parquet")
    pages = _pages(test_world)
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
    # One worker, and the 3 shards in two passes (2 + 1) rather than one.
    extra = [
        "--set",
        "scan.workers=1",
        "--set",
        "scan.shards_per_pass=2",
        "--set",
        "eval.targets=[]",
    ]
    assert main(_args(test_world, one, *extra)) == 0
    cols = ["shard", "doc_id", "category", "type", "start", "end", "ref"]
    a = pd.read_parquet(out / "matches.parquet")[cols].sort_values(cols).reset_index(drop=True)
    b = pd.read_parquet(one / "matches.parquet")[cols].sort_values(cols).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)


def test_model_side_report_keys_cover_every_category_and_method(run):
    _, report = run
    assert set(report["output_rate"]) == set(report["detection_rate"]) == set(CATEGORIES)
    for c in CATEGORIES:
        assert set(report["detection_rate"][c]) == set(METHODS)
        for r in [report["output_rate"][c], *report["detection_rate"][c].values()]:
            assert r["ci"][0] <= r["rate"] <= r["ci"][1] and r["n"] > 0
    curve = {(r["category"], r["shots"]) for r in report["few_shot_curve"]}
    assert curve == {(c, k) for c in CATEGORIES for k in (0, 2)}
    assert report["eval"]["instances"] == {"pii": 7, "copyright": 4, "benchmark": 4}
    assert set(report["eval"]["models"]) == {"@world:smollm2-crawl", "@world:smollm2-base"}
    assert "MiniLM embedding neighbours" in report["eval"]["method"]
    html = (run[0] / "report.html").read_text()
    assert "Output rate (Table 3)" in html and "Few-shot curve (Figure 2)" in html


def _rows(out, model):
    d = out / "eval" / model.strip("@").replace(":", "-")
    return {k: pd.read_parquet(d / f"{k}.parquet") for k in ("output", "scores", "self_detection")}


def test_rates_recompute_from_the_rows(run):
    from mia_ray.features.leaks import best_threshold, majority_vote
    from mia_ray.stats.metrics import wilson_interval

    out, report = run
    for name, model in report["eval"]["models"].items():
        rows = _rows(out, name)
        o = rows["output"]
        assert (o["emitted"] == (o["leaked_logprob"] > o["refusal_logprob"])).all()
        for c, r in model["output_rate"].items():
            part = o[o["category"] == c]
            assert r["n"] == len(part) and r["rate"] == pytest.approx(part["emitted"].mean())
            assert r["ci"] == pytest.approx(
                list(wilson_interval(int(part["emitted"].sum()), len(part)))
            )
        s, sd = rows["scores"], rows["self_detection"]
        for c, methods in model["detection_rate"].items():
            part = s[s["category"] == c]
            shots = part[part["role"] == "shot"]
            test = part[part["role"] == "eval"].sort_values(["item", "label"])
            y = test["label"].to_numpy()
            votes = [
                sd[(sd["category"] == c) & (sd["shots"] == 2)]
                .sort_values(["item", "label"])["answer"]
                .to_numpy()
            ]
            for m in ("loss", "zlib", "min_k"):
                t = best_threshold(shots[m], shots["label"])
                assert methods[m]["threshold"] == pytest.approx(t)
                votes.append((test[m].to_numpy() > t).astype(int))
                assert methods[m]["rate"] == pytest.approx(np.mean(votes[-1] == y))
            assert methods["self_detection"]["rate"] == pytest.approx(np.mean(votes[0] == y))
            vote = majority_vote(np.column_stack(votes))
            assert methods["majority_vote"]["rate"] == pytest.approx(np.mean(vote == y))
            assert methods["loss"]["n"] == len(y) == 2 * (report["eval"]["instances"][c] - 1)


def test_counterparts_differ_from_their_instance_and_are_nowhere_in_the_crawl(run, test_world):
    out, _ = run
    inst = pd.read_parquet(out / "eval" / "instances.parquet")
    pages = _pages(test_world)
    for (c, _), pair in inst.groupby(["category", "item"]):
        leaked, clean = pair[pair["label"] == 1].iloc[0], pair[pair["label"] == 0].iloc[0]
        assert leaked["text"] != clean["text"]
        assert leaked["text"] in pages[(leaked["shard"], leaked["doc_id"])]
        assert not any(clean["text"] in p for p in pages.values()), clean["text"]
        assert leaked["prompt"].startswith("Please ") and clean["prompt"] == ""
        if c == "pii":  # digits, letters and names replaced: same shape, another value
            assert len(clean["text"].split()) == len(leaked["text"].split())


def test_the_trained_model_tells_leaked_from_non_leaked_better_than_its_base(run):
    _, report = run
    models = report["eval"]["models"]
    trained, base = models["@world:smollm2-crawl"], models["@world:smollm2-base"]
    # PII counterparts change only the value and the name, so a model that never saw the
    # crawl has no reason to prefer the leaked record; the one trained on it does.
    assert (
        trained["detection_rate"]["pii"]["loss"]["auc"]
        > base["detection_rate"]["pii"]["loss"]["auc"]
    )


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


def test_notebook_redraws_the_rates_from_the_run(run, run_notebook):
    out, report = run
    nb, text = run_notebook("leakage.ipynb", out)
    rate = round(100 * report["leakage_rate"]["copyright"]["rate"], 2)
    assert f"{rate}" in text and "recomputed from matches: True" in text
    assert "60 documents" in text
    png = out / "leakage_pii_types.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 3000
