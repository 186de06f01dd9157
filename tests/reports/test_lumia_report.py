import base64
import copy
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from mia_ray.reports.io import write_json
from mia_ray.reports.lumia import layer_figure, render_lumia_report

PNG_MAGIC = b"\x89PNG"
REPO = Path(__file__).resolve().parents[2]


def _layers(part, aucs, std=0.012):
    """One row per (probe, layer) from ``{probe: [auc at layer 1, 2, ...]}``."""
    rows = []
    for probe, values in aucs.items():
        for layer, auc in enumerate(values, start=1):
            rows.append(
                {
                    "part": part,
                    "probe": probe,
                    "layer": layer,
                    "auc_mean": auc,
                    "auc_std": std,
                    "auc_repeats": [auc - std, auc, auc + std],
                    "tpr_at_1pct_fpr": 0.25 if probe == "mlp" else 0.1,
                    "tpr_std": 0.05,
                    "epochs_mean": 23.3 if probe == "mlp" else None,
                    "n_repeats": 3,
                }
            )
    return rows


def _best(rows):
    keys = ("part", "probe", "layer", "auc_mean", "auc_std", "tpr_at_1pct_fpr")
    scored = [r for r in rows if not math.isnan(r["auc_mean"])]
    return {k: max(scored, key=lambda r: r["auc_mean"])[k] for k in keys}


def _best_per_part_probe(rows):
    groups = {}
    for r in rows:
        groups.setdefault((r["part"], r["probe"]), []).append(r)
    return [_best(g) for g in groups.values()]


def _text_run():
    layers = _layers("text", {"mlp": [0.71, 0.88, 0.9512, 0.93], "logreg": [0.66, 0.8, 0.85, 0.9]})
    layers[5]["auc_std"] = math.nan  # logreg layer 2: a missing std
    layers[5]["tpr_at_1pct_fpr"] = math.nan
    best = _best(layers)
    lumia = best["auc_mean"]
    baselines = {
        "loss": {"auc": 0.8, "auc_std": 0.02, "tpr_at_1pct_fpr": 0.1},
        "ref": {"auc": 0.87, "auc_std": 0.03, "tpr_at_1pct_fpr": 0.15},
        "zlib": {"auc": 0.79, "auc_std": 0.02, "tpr_at_1pct_fpr": 0.08},
        "min_k": {"auc": 0.81, "auc_std": 0.02, "tpr_at_1pct_fpr": 0.09},
    }
    return {
        "target": "tiny",
        "model": {"name_or_path": "demo/tiny", "reference": "demo/tiny-ref", "multimodal": False},
        "data": {
            "n_samples": 812,
            "n_members": 300,
            "n_nonmembers": 512,
            "n_documents": 640,
            "sample": "128 words",
            "max_length": 256,
        },
        "probe": {"kinds": ["mlp", "logreg"], "repeats": 3, "test_size": 0.2, "seed": 0},
        "layers": layers,
        "best_layer": best,
        "best_layers": _best_per_part_probe(layers),
        "baselines": baselines,
        "blind_baseline": {
            "auc": 0.55,
            "auc_std": 0.03,
            "tpr_at_1pct_fpr": 0.01,
            "method": "tfidf+logreg on the same splits",
        },
        "comparison": [
            {
                "method": k,
                "method_auc": v["auc"],
                "lumia_auc": lumia,
                "improvement_pct": (lumia - v["auc"]) / v["auc"] * 100,
            }
            for k, v in baselines.items()
        ],
        "ngram_overlap": [
            {
                "n": 7,
                "p": 0.8,
                "mean": 0.1234,
                "median": 0.05,
                "share_at_least_p": 0.0,
                "n_texts": 400,
                "n_too_short": 3,
            },
            {
                "n": 13,
                "p": 0.2,
                "mean": 0.0456,
                "median": 0.01,
                "share_at_least_p": 0.125,
                "n_texts": 397,
                "n_too_short": 6,
            },
        ],  # fmt: skip
        "notes": ["the tiny model memorised its members <on purpose>"],
        "timings": {"extract_s": 12.3, "probe_s": 40.1, "baseline_s": 10.0, "samples_per_s": 50.0},
    }


def _vl_run():
    layers = _layers("vision", {"mlp": [0.61, 0.7321, 0.7]}, std=0.02) + _layers(
        "language", {"mlp": [0.58, 0.64, 0.69], "logreg": [0.55, 0.6, 0.62]}, std=0.03
    )
    layers[-1]["auc_mean"] = math.nan  # a probe that produced no AUC
    return {
        "target": "llava-tiny",
        "model": {"name_or_path": "demo/llava-tiny", "reference": None, "multimodal": True},
        "data": {"n_samples": 200, "n_members": 100, "n_nonmembers": 100},
        "probe": {"kinds": ["mlp", "logreg"], "repeats": 3},
        "layers": layers,
        "best_layer": _best(layers),
        "best_layers": _best_per_part_probe(layers),
        "baselines": {},
        "blind_baseline": None,
        "comparison": [],
        "ngram_overlap": [],
        "notes": [],
        "timings": {},
    }


@pytest.fixture
def report():
    runs = [_text_run(), _vl_run()]
    return {
        "pipeline": "lumia",
        "created": "2025-01-01T00:00:00+00:00",
        "targets": [r["target"] for r in runs],
        **copy.deepcopy(runs[0]),
        "runs": runs,
        "runtime": {"ray": "2.x", "device": "cpu"},
    }


def _section(html, target):
    """The HTML of one target's section."""
    start = html.index(f"<h2>Target {target}")
    end = html.find("<h2>", start + 4)
    return html[start : end if end > 0 else len(html)]


def test_report_shows_plots_best_layers_comparison_and_ngrams(report, tmp_path):
    path = render_lumia_report(report, tmp_path / "report.html")
    assert path == tmp_path / "report.html"
    html = path.read_text()
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically

    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(pngs) == 2  # one layer plot per target
    assert all(base64.b64decode(p).startswith(PNG_MAGIC) for p in pngs)
    assert '<div class="howto">' in html and "AUC 0.5 is chance" in html
    assert "validation fold carved from the training part, never the test part" in html

    text = _section(html, "tiny")
    # the best layer (text / mlp / layer 3), highlighted, formatted as mean ± std
    assert (
        '<tr class="highlight"><td>text</td><td>mlp</td><td>3</td><td>0.951 ± 0.012</td>'
        "<td>25.0%</td></tr>" in text
    )
    assert "Best layer: text / mlp / layer 3, AUC 0.951 ± 0.012" in text
    assert "above the paper&#x27;s 0.6 success threshold" in text
    # the comparison: every attack and the blind baseline, with the Table 1 improvement
    lumia = 0.9512
    for method, auc in (("loss", 0.8), ("ref", 0.87), ("zlib", 0.79), ("min_k", 0.81)):
        pct = f"{(lumia - auc) / auc * 100:.2f}%"
        assert f"<td>{method}</td><td>{auc:.3f} ± " in text
        assert f"<td>0.951</td><td>{lumia - auc:+.3f}</td><td>{pct}</td>" in text
    blind_pct = f"{(lumia - 0.55) / 0.55 * 100:.2f}%"
    assert blind_pct == "72.95%"
    assert (
        '<tr class="highlight"><td>blind baseline (tfidf+logreg on the same splits)</td>'
        f"<td>0.550 ± 0.030</td><td>1.0%</td><td>0.951</td><td>+0.401</td><td>{blind_pct}</td>"
        in text
    )
    # the n-gram rows and the sentence that explains them
    assert "<td>7</td><td>0.80</td><td>0.123</td><td>0.050</td><td>0.0%</td><td>400</td>" in text
    assert "<td>13</td><td>0.20</td><td>0.046</td><td>0.010</td><td>12.5%</td><td>397</td>" in text
    assert "The reference set is the members given to this run" in text
    # the per-layer table, NaN shown as a dash; notes escaped
    assert "<td>text</td><td>logreg</td><td>2</td><td>0.800</td><td>—</td><td>—</td>" in text
    assert "<td>text</td><td>mlp</td><td>1</td><td>0.710 ± 0.012</td><td>25.0% ± 5.0</td>" in text
    assert "&lt;on purpose&gt;" in text and "<on purpose>" not in html
    assert "<dt>members / non-members</dt><dd>300 / 512</dd>" in text

    vl = _section(html, "llava-tiny")
    assert "Best layer: vision / mlp / layer 2, AUC 0.732 ± 0.020" in vl
    assert "No blind baseline was computed" in vl
    assert "blind baseline (" not in vl and "Comparison with the attacks" not in vl
    assert "n-gram overlap" not in vl
    assert "<td>language</td><td>logreg</td><td>3</td><td>—</td>" in vl
    for part, probe, layer in (("vision", "mlp", 2), ("language", "mlp", 3)):
        assert f"<td>{part}</td><td>{probe}</td><td>{layer}</td>" in vl  # best per part/probe

    summary = html[html.index("<h2>Summary") : html.index("<h2>Target tiny")]
    assert "<td>tiny</td><td>demo/tiny</td><td>text / mlp / 3</td>" in summary
    assert "<td>llava-tiny</td><td>demo/llava-tiny</td><td>vision / mlp / 2</td>" in summary


def test_single_run_without_runs_key_or_blind_baseline(report, tmp_path):
    single = {k: v for k, v in report.items() if k not in ("runs", "targets")}
    single["blind_baseline"] = None
    single["baselines"] = {}
    single["comparison"] = []
    html = render_lumia_report(single, tmp_path / "r.html").read_text()
    assert "<h2>Summary" not in html and html.count("<h2>Target ") == 1
    assert html.count("data:image/png;base64,") == 1
    assert "Best layer: text / mlp / layer 3" in html
    assert "No blind baseline was computed" in html


def test_layer_figure_png_from_rows_or_dataframe_and_none_when_empty(report):
    rows = report["runs"][1]["layers"]
    assert layer_figure(rows, "AUC by layer").startswith(PNG_MAGIC)
    assert layer_figure(pd.DataFrame(report["layers"]), "tiny").startswith(PNG_MAGIC)
    assert layer_figure([], "x") is None
    assert layer_figure(pd.DataFrame(), "x") is None
    assert layer_figure([{"part": "text", "probe": "mlp", "layer": 1, "auc_mean": None}]) is None


def test_notebook_redraws_layers_best_layer_and_comparison(report, tmp_path, run_notebook):
    import nbformat

    run = tmp_path / "run"
    write_json(run / "report.json", report)  # NaN -> null, as the pipeline writes it
    shipped = nbformat.read(REPO / "notebooks" / "lumia.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in shipped.cells if c.cell_type == "code")
    nb, _ = run_notebook("lumia.ipynb", run, timeout=120, cwd=str(tmp_path))

    def out(i):
        return "".join(o.get("text", "") for o in nb.cells[i].outputs)

    assert (run / "lumia_layers.png").read_bytes().startswith(PNG_MAGIC)
    n_rows = sum(len(r["layers"]) for r in report["runs"])
    assert f"['tiny', 'llava-tiny'] | {n_rows} layer rows" in out(1)
    best = out(3)
    assert "tiny: best layer 3 (text, mlp), AUC 0.951 ± 0.012" in best
    assert "highest AUC in the layer table: 0.951" in best
    assert "llava-tiny: best layer 2 (vision, mlp), AUC 0.732 ± 0.020" in best
    comparison = out(4)
    for method in ("loss", "ref", "zlib", "min_k", "blind baseline"):
        assert method in comparison
    assert f"{(0.9512 - 0.55) / 0.55 * 100:.3f}" in comparison  # 72.945
    assert "llava-tiny" not in comparison  # no attacks, no blind baseline
