"""LUMIA end to end on the test world (text) and on a tiny random LLaVA (vision-language)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mia_ray.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _args(test_world, out, *extra):
    return [
        "lumia", "--config", "jobs/lumia_demo.yaml",
        "--set", "targets=[tiny]",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        "--set", "data.snippet_size=64", "--set", "data.max_snippets_per_doc=3",
        "--set", "model.max_length=128",
        *extra,
        "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local, test_world):
    out = tmp_path_factory.mktemp("lumia") / "run"
    assert main(_args(test_world, out)) == 0
    return out, json.loads((out / "report.json").read_text())


def test_report_has_every_layer_probe_and_the_comparison(run):
    out, report = run
    assert report["targets"] == ["tiny"] and report["runs"][0]["target"] == "tiny"
    rows = report["layers"]
    # The test world's tiny has 2 blocks; two probe kinds each.
    assert {(r["part"], r["probe"], r["layer"]) for r in rows} == {
        ("text", k, layer) for k in ("mlp", "logreg") for layer in (1, 2)
    }
    for r in rows:
        assert 0 <= r["auc_mean"] <= 1 and r["auc_std"] >= 0 and len(r["auc_repeats"]) == 3
        assert r["auc_mean"] == pytest.approx(sum(r["auc_repeats"]) / 3)
        assert 0 <= r["tpr_at_1pct_fpr"] <= 1
    best = report["best_layer"]
    # l* is chosen by validation AUC, never by the test AUC it reports.
    assert best["val_auc_mean"] == max(r["val_auc_mean"] for r in rows)
    assert best["auc_mean"] == next(
        r["auc_mean"] for r in rows if (r["probe"], r["layer"]) == (best["probe"], best["layer"])
    )
    # The test world's tiny memorised its few members hard (LOSS AUC ~1): the probes find it,
    # and no bag of words does.
    assert best["auc_mean"] >= 0.9 and report["blind_baseline"]["auc"] < 0.65
    assert set(report["baselines"]) == {"loss", "ref", "zlib", "min_k"}
    assert 0 <= report["blind_baseline"]["auc"] <= 1
    comp = {c["method"]: c for c in report["comparison"]}
    assert set(comp) == {"loss", "ref", "zlib", "min_k", "blind"}
    loss = comp["loss"]
    assert loss["improvement_pct"] == pytest.approx(
        100 * (best["auc_mean"] - loss["method_auc"]) / loss["method_auc"]
    )
    assert [g["n"] for g in report["ngram_overlap"]] == [7, 13]
    html = (out / "report.html").read_text()
    assert "data:image/png" in html
    layers = pd.read_parquet(out / "tiny" / "layers.parquet")
    assert len(layers) == len(rows)
    # Every probe's test scores are kept, and each repeat's AUC is recomputed from them.
    from mia_ray.stats.metrics import roc_auc

    scores = pd.read_parquet(out / "tiny" / "probe_scores.parquet")
    row = next(r for r in rows if r["probe"] == "mlp" and r["layer"] == 2)
    for rep in range(3):
        s = scores[(scores["probe"] == "mlp") & (scores["layer"] == 2) & (scores["repeat"] == rep)]
        assert roc_auc(s["score"], s["label"]) == pytest.approx(row["auc_repeats"][rep])


def test_samples_are_grouped_by_document_and_activations_keyed_by_sample(run):
    out, report = run
    samples = pd.read_parquet(out / "tiny" / "samples.parquet")
    assert samples["snippet_id"].is_unique
    assert samples.groupby("doc_id")["label"].nunique().max() == 1
    assert len(samples) == report["data"]["n_samples"]
    assert report["data"]["n_documents"] == samples["doc_id"].nunique() < len(samples)
    parts = sorted((out / "tiny" / "activations").glob("part-*.parquet"))
    acts = pd.concat([pd.read_parquet(p) for p in parts])
    assert sorted(acts["snippet_id"]) == sorted(samples["snippet_id"])
    assert {"text.1", "text.2"} <= set(acts.columns)
    assert len(acts["text.1"].iloc[0]) == 64  # the test world tiny's hidden size
    assert acts["n_tokens"].max() <= 128


def test_the_attacks_take_the_targets_statistics_from_the_activation_pass(run, test_world):
    """One target pass per sample: the classic attacks' token statistics are in the activation
    parts, the reference model is the only other pass, and its LOSS AUCs are the target's."""
    from mia_ray.detectors.probes import grouped_holdout_splits
    from mia_ray.pipelines.lumia import fold_metrics

    out, report = run
    assert not (out / "tiny" / "rows" / "target").exists()
    assert sorted(p.name for p in (out / "tiny" / "rows").iterdir()) == ["reference"]
    parts = sorted((out / "tiny" / "activations").glob("part-*.parquet"))
    acts = pd.concat([pd.read_parquet(p) for p in parts])
    assert (acts["token_logprobs"].map(len) == acts["n_tokens"] - 1).all()
    samples = pd.read_parquet(out / "tiny" / "samples.parquet")
    acts = acts.set_index("snippet_id").loc[samples["snippet_id"]]
    y = samples["label"].to_numpy()
    # The job's probe settings: 3 repeats of a 20 % test part, seed 0.
    splits = grouped_holdout_splits(
        y, samples["doc_id"].to_numpy(), n_repeats=3, test_size=0.2, seed=0
    )
    mean_logprob = acts["token_logprobs"].map(lambda v: np.asarray(v, np.float64).mean())
    assert report["baselines"]["loss"] == fold_metrics(mean_logprob.to_numpy(), y, splits)


def test_rerun_recomputes_nothing_and_gives_identical_numbers(run, test_world, capfd):
    out, report = run
    stamps = {p: p.stat().st_mtime_ns for p in (out / "tiny").rglob("*.parquet")}
    stamps.update({p: p.stat().st_mtime_ns for p in (out / "tiny" / "probes").rglob("*.json")})
    assert len(stamps) > 4  # the activation parts and every layer's probes
    capfd.readouterr()
    assert main(_args(test_world, out)) == 0
    err = capfd.readouterr().err
    assert "activations: reusing" in err
    summaries = ("layers.parquet", "samples.parquet", "probe_scores.parquet")
    for p, t in stamps.items():
        if p.name not in summaries:  # those are rewritten from the reused rows
            assert p.stat().st_mtime_ns == t, p
    again = json.loads((out / "report.json").read_text())
    for key in ("layers", "best_layer", "baselines", "blind_baseline", "ngram_overlap"):
        assert again[key] == report[key], key


def test_another_dtype_extracts_and_probes_afresh(run, test_world, tmp_path, capfd):
    """Activations are keyed on how the model ran (dtype), not only on its name."""
    import shutil

    out, _ = run
    again = tmp_path / "bf16"
    shutil.copytree(out, again)
    capfd.readouterr()
    args = _args(
        test_world, again, "--set", "model.dtype=bfloat16", "--set", "probe.kinds=[logreg]"
    )
    assert main(args) == 0
    err = capfd.readouterr().err
    assert "activations: inputs changed since the last run; computing afresh" in err
    assert "activations: reusing" not in err


def test_serial_probes_give_the_same_numbers_as_parallel(run, test_world, tmp_path):
    out, report = run
    import shutil

    serial = tmp_path / "serial"
    shutil.copytree(out, serial)
    shutil.rmtree(serial / "tiny" / "probes")
    assert main(_args(test_world, serial, "--set", "probe.parallel=false")) == 0
    again = json.loads((serial / "report.json").read_text())
    assert again["layers"] == report["layers"]


def test_notebook_redraws_the_layer_plot_from_the_run(run, run_notebook):
    out, report = run
    nb, text = run_notebook("lumia.ipynb", out)
    best = report["best_layer"]
    assert f"{best['auc_mean']:.3f}" in text
    png = out / "lumia_layers.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000


def test_vision_language_model_is_probed_on_both_encoders(tmp_path, ray_local, test_world):
    from mia_ray.demo.llava import build_tiny_llava, make_image_text_samples

    model = build_tiny_llava(tmp_path / "llava", test_world["targets"]["tiny"]["model"])
    docs = [json.loads(x) for x in Path(test_world["documents"]).read_text().splitlines()]
    manifest = json.loads(Path(test_world["targets"]["tiny"]["manifest"]).read_text())
    docs = [d for d in docs if d["id"] in manifest][:40]
    data = make_image_text_samples(
        tmp_path / "data",
        [" ".join(d["text"].split()[:30]) for d in docs],
        [manifest[d["id"]] for d in docs],
    )
    out = tmp_path / "run"
    code = main(
        [
            "lumia", "--config", "jobs/lumia_demo.yaml", "--set", "targets=[]",
            "--set", f"model.name_or_path={model}", "--set", f"data.path={data}",
            "--set", "model.max_length=64", "--set", "probe.max_epochs=20",
            "--set", "data.min_docs_per_class=5", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["multimodal"] is True
    parts = {(r["part"], r["layer"]) for r in report["layers"]}
    assert parts == {("vision", 1), ("vision", 2), ("language", 1), ("language", 2)}
    assert report["baselines"] == {} and report["blind_baseline"] is not None
    acts = pd.concat(
        pd.read_parquet(p) for p in (out / "llava" / "activations").glob("part-*.parquet")
    )
    assert len(acts) == 40 and len(acts["vision.1"].iloc[0]) == 32
    # 16 image patches + the text: every sample has more tokens than its image alone.
    assert acts["n_tokens"].min() > 16
    assert "data:image/png" in (out / "report.html").read_text()


def test_missing_image_is_a_clear_error(tmp_path, ray_local, test_world, capsys):
    from mia_ray.demo.llava import build_tiny_llava, make_image_text_samples

    model = build_tiny_llava(tmp_path / "llava", test_world["targets"]["tiny"]["model"])
    data = make_image_text_samples(
        tmp_path / "data", [f"text number {i} here" for i in range(12)], [i % 2 for i in range(12)]
    )
    (tmp_path / "data" / "images" / "00003.png").unlink()
    code = main(
        [
            "lumia", "--config", "jobs/lumia_demo.yaml", "--set", "targets=[]",
            "--set", f"model.name_or_path={model}", "--set", f"data.path={data}",
            "--out", str(tmp_path / "run"),
        ]
    )  # fmt: skip
    assert code != 0
    err = capsys.readouterr().err
    assert "image not found:" in err and "00003.png" in err and "Traceback" not in err


def test_report_numbers_match_the_snapshot(run, report_snapshot):
    report_snapshot(run[1], "lumia")
