"""The leakage survey's scan end to end on the test world's crawl (real shards, real Ray)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mia_ray.cli import main
from mia_ray.pipelines.leakage.evaluation import CATEGORIES, METHODS

pytestmark = [pytest.mark.ray]


# The model side at test scale: the crawl's 4 book spans and 4 benchmark items leave one
# leaked/non-leaked pair of few-shot examples and 3 instances to score.
EVAL = [
    "--set", 'eval.targets=["@world:smollm2-crawl", "@world:smollm2-base"]',
    "--set", "eval.shots=2", "--set", "eval.few_shot_curve=[0,2]", "--set", "eval.instances=6",
    "--set", "resources.scorer.cpus=1",
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


def test_rates_and_intervals_recompute_from_the_matches(run, test_world):
    from mia_ray.features.shingles import words_with_offsets
    from mia_ray.stats.metrics import wilson_interval

    out, report = run
    found = _found(out)
    n = report["crawl"]["documents"]
    assert n == 60
    words = [len(words_with_offsets(t)[0]) for t in _pages(test_world).values()]
    spans = {"pii": 0, "copyright": 100, "benchmark": 30}  # the test crawl's span lengths
    assert report["config"]["scan"]["copyright_span"] == spans["copyright"]
    assert report["config"]["scan"]["benchmark_span"] == spans["benchmark"]
    for category in ("pii", "copyright", "benchmark"):
        docs = found[found["category"] == category][["shard", "doc_id"]].drop_duplicates()
        r = report["leakage_rate"][category]
        # Only pages of at least a span's words can hold a copied span: they are the
        # denominator; the raw rate beside it divides by every page.
        eligible = sum(w >= spans[category] for w in words)
        assert r["eligible"] == eligible and r["min_words"] == spans[category]
        assert r["documents"] == len(docs) and r["rate"] == pytest.approx(len(docs) / eligible)
        assert r["ci"] == pytest.approx(list(wilson_interval(len(docs), eligible, 0.95)))
        assert r["raw_rate"] == pytest.approx(len(docs) / n)
        assert r["raw_ci"] == pytest.approx(list(wilson_interval(len(docs), n, 0.95)))
    # The test crawl's Wikipedia leads are short: most cannot hold a 100-word span.
    assert report["leakage_rate"]["copyright"]["eligible"] < n
    assert report["leakage_rate"]["pii"]["eligible"] == n
    assert sum(s["documents"] for s in report["shards"].values()) == n
    assert sum(s["copyright"]["eligible"] for s in report["shards"].values()) == sum(
        w >= 100 for w in words
    )
    html = (out / "report.html").read_text()
    assert "raw rate" in html and "eligible" in html


def _found(out: Path) -> pd.DataFrame:
    """The findings the scanners wrote for a run's shards."""
    from mia_ray.pipelines.leakage.scan import read_findings

    return read_findings(out, list(json.loads((out / "report.json").read_text())["shards"]))


def _docs(words: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {"shard": "s", "doc_id": [f"d{i}" for i in range(len(words))], "bytes": 1, "words": words}
    )


def _finding(doc_id: str, category: str) -> dict:
    return {"shard": "s", "doc_id": doc_id, "category": category, "type": category,
            "start": 0, "end": 1, "value": "x", "ref": "r"}  # fmt: skip


def test_a_text_shorter_than_the_span_is_not_in_the_denominator():
    from mia_ray.pipelines.leakage.rates import leak_rates

    # 5 documents, 2 of them long enough for a 300-word span, one of those copies a book.
    docs = _docs([50, 299, 300, 1000, 10])
    found = pd.DataFrame([_finding("d3", "copyright"), _finding("d0", "pii")])
    r = leak_rates(docs, found, 0.95, {"copyright": 300, "benchmark": 300})
    assert r["copyright"]["documents"] == 1 and r["copyright"]["eligible"] == 2
    assert r["copyright"]["rate"] == 0.5 and r["copyright"]["raw_rate"] == 0.2
    assert r["benchmark"]["rate"] == 0.0 and r["benchmark"]["eligible"] == 2
    assert r["pii"]["rate"] == r["pii"]["raw_rate"] == 0.2 and r["pii"]["eligible"] == 5
    assert r["shards"]["s"]["copyright"]["rate"] == 0.5


def test_a_category_without_a_match_in_a_large_crawl_still_gets_its_report(tmp_path):
    from mia_ray.pipelines.leakage.rates import leak_rates
    from mia_ray.reports.leakage import write_report

    # 0 of 100 documents: the Wilson bound in floats was a rounding error (3.5e-18) above the
    # rate 0, which crashed the rate figure's error bars; it is exact now.
    docs = _docs([400] * 100)
    found = pd.DataFrame([_finding(f"d{i}", "pii") for i in range(100)])
    r = leak_rates(docs, found, 0.95, {"copyright": 300, "benchmark": 300})
    assert r["copyright"]["ci"][0] == 0.0 and r["copyright"]["raw_ci"][0] == 0.0
    assert r["pii"]["ci"][1] == 1.0 and r["pii"]["rate"] == 1.0
    report = {
        "crawl": {"shards": ["s"], "documents": 100, "megabytes": 0.1},
        "leakage_rate": {c: r[c] for c in ("pii", "copyright", "benchmark")},
        "pii_types": r["pii_types"], "pii_without_names": r["pii_without_names"],
        "shards": r["shards"], "truth": None, "matches": [], "matches_total": 100,
    }  # fmt: skip
    write_report(report, tmp_path)
    assert "data:image/png" in (tmp_path / "report.html").read_text()
    # A figure fed an interval that misses its rate by a rounding error draws it too.
    from mia_ray.reports.leakage import rates_figure

    ci = [3.5e-18, 0.0038]  # as an older report.json may hold it
    assert rates_figure({"benchmark": {"rate": 0.0, "ci": ci}})[:4] == b"\x89PNG"


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
    found = _found(out)
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
    a = _found(out)[cols].sort_values(cols).reset_index(drop=True)
    b = _found(one)[cols].sort_values(cols).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)


def test_a_rerun_that_reads_the_shards_otherwise_scans_them_again(ray_local, tmp_path, capfd):
    shard = tmp_path / "shard.jsonl"
    rows = [{"id": "a", "text": "Write to mary.johnson@example.com today.", "body": "Hello."},
            {"id": "b", "text": "Nothing here.", "body": "Or call +44 20 7946 0958 now."}]  # fmt: skip
    shard.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"

    def scan(*extra):
        args = ["leakage", "--set", f"crawl.shards=[{shard}]", "--set", "scan.workers=1",
                "--set", "scan.names=false", *extra, "--out", str(out)]  # fmt: skip
        assert main(args) == 0
        return _found(out)

    assert list(scan()[["doc_id", "type"]].itertuples(index=False)) == [("a", "email")]
    # No copyright or benchmark store: those categories were not scanned, which is not a
    # rate of 0 % (of any interval).
    report = json.loads((out / "report.json").read_text())
    assert report["leakage_rate"]["benchmark"] == {
        "scanned": False, "why": "not scanned: scan.benchmark is empty"
    }  # fmt: skip
    assert report["leakage_rate"]["copyright"]["scanned"] is False
    assert report["leakage_rate"]["pii"]["documents"] == 1
    assert set(report["shards"]["shard.jsonl"]) == {"documents", "bytes", "pii"}
    html = (out / "report.html").read_text()
    assert "not scanned: scan.copyright is empty" in html
    # Another text field: rows of the earlier scan, keyed on the shard alone, would be
    # findings in a text this run does not read.
    capfd.readouterr()
    found = scan("--set", "crawl.text_field=body")
    assert "reusing the earlier scan" not in capfd.readouterr().err
    assert list(found[["doc_id", "type"]].itertuples(index=False)) == [("b", "phone_intl")]


def test_a_crawl_of_compressed_and_wet_shards_named_by_a_glob(ray_local, tmp_path):
    """crawl.shards as corpora ship: a glob over a .jsonl.zst shard and a WET file, one shard
    per file; the WET pages are named by their WARC-Record-ID."""
    import gzip

    from mia_ray.demo.crawl import wet_record_id, write_wet

    crawl = tmp_path / "crawl"
    crawl.mkdir()
    rows = [{"id": "a", "text": "Write to mary.johnson@example.com today."},
            {"id": "b", "text": "Nothing here."}]  # fmt: skip
    (crawl / "part-0.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    )
    write_wet([{"id": "w1", "text": "Or call +44 20 7946 0958 now."}, {"id": "w2", "text": ""}],
              crawl / "CC-0.warc.wet.gz")  # fmt: skip
    out = tmp_path / "out"
    args = ["leakage", "--set", f"crawl.shards=[{crawl}/*.gz]", "--set", "scan.workers=1",
            "--set", "scan.names=false", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    found = _found(out).sort_values("shard")
    assert list(found[["shard", "doc_id", "type"]].itertuples(index=False)) == [
        ("CC-0.warc.wet.gz", wet_record_id("w1"), "phone_intl"),
        ("part-0.jsonl.gz", "a", "email"),
    ]
    report = json.loads((out / "report.json").read_text())
    assert report["crawl"]["documents"] == 3
    assert sorted(report["shards"]) == ["CC-0.warc.wet.gz", "part-0.jsonl.gz"]


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
    err = capsys.readouterr().err
    assert f"data path not found: {tmp_path / 'missing.jsonl'} (crawl.shards[0])" in err
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


def test_a_model_that_never_saw_an_instance_gets_no_credit_from_the_quote():
    from mia_ray.backends import LoglikRequest
    from mia_ray.backends.local import LocalHFBackend
    from mia_ray.demo.world import ensure_smollm2_base
    from mia_ray.features.leaks import eliciting_prompt, given_spans
    from mia_ray.pipelines.leakage.evaluation import output_rows

    # Word salads nobody wrote before: no model saw them. The prompt quotes their first 8
    # words, which SmolLM2 copies readily; scored whole, two of the three beat the refusals.
    texts = [
        "willow amber falcon glacier quill cobalt ember dune orchid",
        "saffron meadow lantern basalt tundra fern velvet mosaic copper thistle harbor",
        "ember quill harbor velvet dune glacier amber orchid willow fern cobalt tundra",
    ]
    leaked = pd.DataFrame(
        [{"category": "copyright", "item": i, "role": "eval", "text": t,
          "prompt": eliciting_prompt(t, "copyright", source="the-book"),
          "given": json.dumps(given_spans(t, "copyright"))} for i, t in enumerate(texts)]
    )  # fmt: skip
    backend = LocalHFBackend(str(ensure_smollm2_base()), device="cpu", batch_size=8)

    def ask(pairs):
        return [r.logprobs for r in backend.loglikelihood([LoglikRequest(*p) for p in pairs])]

    try:
        rows = output_rows(ask, leaked)
        whole = [np.mean(lp) for lp in ask(list(zip(leaked["prompt"], texts, strict=True)))]
    finally:
        backend.close()
    assert not rows["emitted"].any()
    # What was scored is the words after the quote, and the quote was worth a lot.
    words_after = [len(t.split()) - 8 for t in texts]
    assert list(rows["scored_tokens"] >= words_after) == [True] * 3
    assert (np.array(whole) > rows["leaked_logprob"].to_numpy() + 1).all()
    assert sum(np.array(whole) > rows["refusal_logprob"].to_numpy()) == 2


def _swap_weights(model_dir: Path, donor: Path) -> None:
    """New weights at the same path (what retraining into the same folder does)."""
    for f in donor.glob("*.safetensors"):
        (model_dir / f.name).write_bytes(f.read_bytes())


def test_new_weights_at_the_same_path_get_a_new_key_and_cache_scope(test_world, tmp_path):
    import shutil

    from mia_ray.pipelines.leakage.config import LeakageJobConfig
    from mia_ray.pipelines.leakage.evaluation import backend_spec, target_key

    model = tmp_path / "model"
    shutil.copytree(test_world["model"], model)
    cfg = LeakageJobConfig()
    cfg.backend.serve, cfg.backend.device = True, "cpu"
    before = target_key(cfg, str(model))
    scope = backend_spec(cfg, str(model), before, tmp_path)["cache_scope"]
    assert scope == f"mia-ray-serve:{before}" and str(model) not in scope
    cfg.backend.dtype = "bfloat16"
    assert target_key(cfg, str(model)) != before
    cfg.backend.dtype = "auto"
    _swap_weights(model, Path(test_world["root"]) / "models" / "tiny-random")
    after = target_key(cfg, str(model))
    assert after != before
    assert backend_spec(cfg, str(model), after, tmp_path)["cache_scope"] != scope
    # A remote API is known by its endpoint and the model's name there.
    cfg.backend.serve, cfg.backend.kind, cfg.backend.base_url = False, "openai", "http://a/v1"
    api = target_key(cfg, "m")
    cfg.backend.base_url = "http://b/v1"
    assert target_key(cfg, "m") != api and target_key(cfg, "m2") != target_key(cfg, "m")
    assert backend_spec(cfg, "m", api, tmp_path)["cache_scope"] == ""


def test_a_rerun_after_new_weights_at_the_same_path_scores_afresh(
    ray_local, test_world, tmp_path, capfd
):
    import shutil

    from mia_ray.pipelines.leakage.evaluation import summarize

    model = tmp_path / "model"
    shutil.copytree(test_world["model"], model)
    out = tmp_path / "run"
    # The tiny model's 128 positions: 20-word instances, two examples.
    extra = ["--set", f"eval.targets=[{model}]", "--set", "scan.instance_words=20",
             "--set", "eval.instances=3", "--set", "backend.device=cpu"]  # fmt: skip
    assert main(_args(test_world, out, *extra)) == 0
    first = json.loads((out / "report.json").read_text())["eval"]["models"][str(model)]
    _swap_weights(model, Path(test_world["root"]) / "models" / "tiny-random")
    capfd.readouterr()
    assert main(_args(test_world, out, *extra)) == 0
    err = capfd.readouterr().err
    assert "reusing the earlier scan" in err and "reusing the results" not in err
    second = json.loads((out / "report.json").read_text())["eval"]["models"][str(model)]
    assert second["output_rate"] != first["output_rate"]
    # The numbers are the rows' written now, i.e. those of the new weights.
    d = out / "eval" / str(model).strip("@").replace(":", "-").replace("/", "_")
    rows = {k: pd.read_parquet(d / f"{k}.parquet") for k in ("output", "scores", "self_detection")}
    from mia_ray.pipelines.leakage.config import LeakageJobConfig

    cfg = LeakageJobConfig()
    cfg.eval.shots, cfg.eval.few_shot_curve, cfg.eval.instances = 2, [0, 2], 3
    assert json.dumps(summarize(cfg, rows), sort_keys=True) == json.dumps(
        {k: second[k] for k in ("output_rate", "detection_rate", "few_shot_curve")},
        sort_keys=True,
    )


def test_scanners_on_other_nodes_read_the_stores_from_storage(tmp_path):
    """On a cluster the scanner actors get each store's storage URL (``mock://`` goes through
    the same non-local code path as ``s3://``), pushed there first: they find what the
    store's file finds."""
    import uuid

    from mia_ray import storage
    from mia_ray.actors.scanner import LeakScanner
    from mia_ray.features.shingles import ShingleStore
    from mia_ray.pipelines.leakage.scan import store_urls

    book = " ".join(f"word{i}" for i in range(60))
    out = tmp_path / "run"
    ShingleStore.build([("book-1", book)], span=10).save(out / "stores" / "copyright-k.npz")
    stores = {"copyright": str(out / "stores" / "copyright-k.npz")}
    batch = pd.DataFrame(
        {"doc_id": ["d1", "d2"], "shard": ["s", "s"],
         "text": [f"intro {book[40:300]} outro", "nothing copied here"]}
    )  # fmt: skip
    assert store_urls(stores) == stores  # outside a run: the paths
    uri = f"mock:///bucket-{uuid.uuid4().hex[:8]}/prefix"
    ws = storage.Workspace(out, uri, distributed=True)
    storage.set_current(ws)
    try:
        urls = store_urls(stores)
    finally:
        storage.set_current(None)
    assert urls == {"copyright": f"{uri}/stores/copyright-k.npz"}
    want = LeakScanner(stores, [], names=False)(batch)
    got = LeakScanner(urls, [], names=False)(batch)
    pd.testing.assert_frame_equal(got, want)
    assert json.loads(got["findings"][0])[0]["ref"] == "book-1"


def test_a_parquet_shard_read_on_the_drivers_node_gives_the_same_documents(
    ray_local, tmp_path, monkeypatch, capfd
):
    """On a distributed run a shard that only the driver's disk has is read by tasks pinned
    to the driver's node (Ray Data's own read_parquet reads footers in actors it places
    anywhere): the same rows. One node sees its own disk, so the probe of the other nodes
    is told here that one of them does not (the cluster tier has real private disks)."""
    from mia_ray import storage
    from mia_ray.data import sources
    from mia_ray.data.readers import read_documents

    shard = tmp_path / "shard.parquet"
    pd.DataFrame(
        {"id": [f"p{i}" for i in range(30)], "text": [f"page {i} " * (i + 1) for i in range(30)],
         "date": [None] * 15 + ["2020-01-01"] * 15}
    ).to_parquet(shard, row_group_size=7)  # fmt: skip

    def read() -> pd.DataFrame:
        df = read_documents(shard, text_field="text", id_field="id").to_pandas()
        return df.sort_values("doc_id").reset_index(drop=True)

    plain = read()
    node = ray_local.get_runtime_context().get_node_id()
    storage.set_current(storage.Workspace(tmp_path / "run", distributed=True, driver_node=node))
    try:
        assert storage.node_affinity()
        assert read_documents(shard).count() == 30  # every node sees it: read anywhere
        assert "driver's disk alone" not in capfd.readouterr().err
        monkeypatch.setattr(sources, "seen_by_every_node", lambda paths, size: False)
        pinned = read()
    finally:
        storage.set_current(None)
    assert f"on the driver's disk alone: {shard}; its read tasks run" in capfd.readouterr().err
    pd.testing.assert_frame_equal(pinned, plain)
    assert len(plain) == 30 and set(plain.columns) >= {"doc_id", "text", "date"}


def test_report_numbers_match_the_snapshot(run, report_snapshot):
    report_snapshot(run[1], "leakage")


def _plain_crawl(tmp_path, n: int = 40) -> Path:
    shard = tmp_path / "crawl.jsonl"
    rows = [{"id": f"p{i:03d}", "text": f"Page {i}: write to user{i}@example.com now."}
            for i in range(n)]  # fmt: skip
    shard.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return shard


def _leakage(shard, out, *extra) -> dict:
    args = ["leakage", "--set", f"crawl.shards=[{shard}]", "--set", "scan.workers=1",
            "--set", "scan.names=false", *extra, "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    return json.loads((out / "report.json").read_text())


def test_a_sample_is_the_documents_whose_seeded_hash_falls_below_it(ray_local, tmp_path, capfd):
    import hashlib

    shard = _plain_crawl(tmp_path)
    report = _leakage(shard, tmp_path / "a", "--set", "crawl.sample=0.5", "--set", "crawl.seed=7")

    # The definition, written out here: blake2b-64 of "seed \x1f shard \x1f id" over 2^64.
    def point(doc_id: str) -> float:
        key = f"7\x1fcrawl.jsonl\x1f{doc_id}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64

    def drawn(doc_id: str) -> bool:
        return point(doc_id) < 0.5

    want = sorted(f"p{i:03d}" for i in range(40) if drawn(f"p{i:03d}"))
    assert 0 < len(want) < 40
    assert report["crawl"]["documents"] == len(want) and report["crawl"]["sample"] == 0.5
    assert sorted(_found(tmp_path / "a")["doc_id"]) == want  # every page has one e-mail
    # Another seed draws other pages; the same seed with two scanners the same ones.
    other = _leakage(shard, tmp_path / "b", "--set", "crawl.sample=0.5", "--set", "crawl.seed=8")
    assert sorted(_found(tmp_path / "b")["doc_id"]) != want and other["crawl"]["documents"] > 0
    _leakage(shard, tmp_path / "c", "--set", "crawl.sample=0.5", "--set", "crawl.seed=7",
             "--set", "scan.workers=1", "--set", "scan.batch_size=3")  # fmt: skip
    assert sorted(_found(tmp_path / "c")["doc_id"]) == want
    # A number of documents: the 10 with the smallest points, found by one read of the crawl.
    points = {f"p{i:03d}": point(f"p{i:03d}") for i in range(40)}
    ten = sorted(sorted(points, key=points.get)[:10])
    report = _leakage(shard, tmp_path / "d", "--set", "crawl.sample=10", "--set", "crawl.seed=7")
    assert report["crawl"]["documents"] == 10
    assert sorted(_found(tmp_path / "d")["doc_id"]) == ten
    capfd.readouterr()
    _leakage(shard, tmp_path / "d", "--set", "crawl.sample=10", "--set", "crawl.seed=7")
    err = capfd.readouterr().err
    assert "crawl.sample: reusing the draw" in err and "reusing the earlier scan" in err
    # More than the crawl holds: all of it.
    assert _leakage(shard, tmp_path / "e", "--set", "crawl.sample=1000")["crawl"]["documents"] == 40
    for bad in ("1.5", "0", "-3"):
        args = ["leakage", "--set", f"crawl.shards=[{shard}]", "--set", f"crawl.sample={bad}",
                "--out", str(tmp_path / "bad")]  # fmt: skip
        assert main(args) == 2
        assert "crawl.sample is the share of documents to scan" in capfd.readouterr().err


def test_the_scanners_write_the_rows_and_the_driver_only_sums_counts(ray_local, tmp_path, capfd):
    shard = _plain_crawl(tmp_path, 30)
    out = tmp_path / "out"
    report = _leakage(shard, out, "--set", "scan.batch_size=4")
    folder = out / "scan" / "crawl.jsonl"
    docs = pd.concat([pd.read_parquet(p) for p in (folder / "documents").glob("*.parquet")])
    # 30 pages in batches of 4: parts per batch, each page in one part.
    assert len(list((folder / "documents").glob("*.parquet"))) >= 8
    assert sorted(docs["doc_id"]) == [f"p{i:03d}" for i in range(30)]
    assert report["crawl"]["documents"] == 30 and report["matches_total"] == 30
    assert report["leakage_rate"]["pii"]["documents"] == 30
    marker = json.loads((folder / ".complete.json").read_text())
    assert marker["counts"]["documents"] == 30 and marker["counts"]["pii_types"] == {"email": 30}
    assert "on 1 node(s)" in capfd.readouterr().err
    # A pass that stopped before its marker: its parts go, the shard is scanned afresh.
    (folder / ".complete.json").unlink()
    (folder / "documents" / "part-stale.parquet").write_bytes(b"not parquet")
    again = _leakage(shard, out, "--set", "scan.batch_size=4")
    assert not (folder / "documents" / "part-stale.parquet").exists()
    assert again["leakage_rate"] == report["leakage_rate"]


def test_a_bad_record_mid_scan_is_one_clear_error(ray_local, tmp_path, capsys):
    shard = _plain_crawl(tmp_path, 5)
    with shard.open("a") as f:
        f.write(json.dumps({"id": "bad", "text": ""}) + "\n")
    args = ["leakage", "--set", f"crawl.shards=[{shard}]", "--set", "scan.workers=1",
            "--set", "scan.names=false", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(args) == 2  # the input's fault, as every MiaError
    err = capsys.readouterr().err
    assert "mia-ray: error: document bad is empty\n" in err
    assert "Traceback" not in err


def test_a_sample_is_scored_against_the_truth_planted_in_what_it_scanned(
    ray_local, test_world, tmp_path
):
    out = tmp_path / "half"
    args = _args(test_world, out, "--set", "eval.targets=[]", "--set", "crawl.sample=0.5")
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    scanned = {
        (p.parent.parent.name, d)
        for p in (out / "scan").glob("*/documents/*.parquet")
        for d in pd.read_parquet(p)["doc_id"]
    }
    assert 0 < len(scanned) == report["crawl"]["documents"] < 60
    truth = pd.read_json(
        report["config"]["crawl"]["truth"], lines=True, dtype={"doc_id": str, "shard": str}
    )
    inside = truth[[k in scanned for k in zip(truth["shard"], truth["doc_id"], strict=True)]]
    pii = inside[(inside["category"] == "pii") & (inside["type"] != "person_name")]
    assert 0 < len(pii) < 24
    # Every planted record of the scanned pages is found; those of pages not drawn are not
    # counted as missed.
    assert report["truth"]["pii"]["planted"] == len(pii) == report["truth"]["pii"]["found"]


def test_too_few_takes_error_or_skip_only():
    from mia_ray.pipelines.leakage.config import LeakEvalConfig

    LeakEvalConfig(too_few="skip").validate()
    with pytest.raises(Exception, match=r"^eval.too_few must be error or skip, not 'maybe'$"):
        LeakEvalConfig(too_few="maybe").validate()
