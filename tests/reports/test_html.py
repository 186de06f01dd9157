import base64
import re

import numpy as np
import pytest

from mia_ray.reports.html import (
    fmt_ci,
    fmt_num,
    fmt_pct,
    page,
    render_attack_report,
    roc_figure,
    table_html,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _metrics(auc, lo, hi):
    fpr = [0.0, 0.001, 0.01, 0.05, 0.2, 1.0]
    return {
        "auc": auc,
        "auc_ci": [lo, hi],
        "tpr_at_fpr": {"0.001": 0.012, "0.01": 0.048, "0.05": 0.096},
        "tpr_at_fpr_ci": {"0.001": [0.0, 0.024], "0.01": [0.024, 0.096], "0.05": [0.048, 0.3]},
        "balanced_accuracy": 0.7,
        "accuracy": 0.71,
        "n_members": 100,
        "n_nonmembers": 100,
        "roc": {"fpr": fpr, "tpr": [0.0, 0.012, 0.048, 0.096, 0.6, 1.0]},
    }


@pytest.fixture
def report():
    return {
        "pipeline": "attack",
        "created": "2025-01-01T00:00:00+00:00",
        "model": {"name": "EleutherAI/pythia-1.4b", "reference": "EleutherAI/pythia-160m"},
        "data": {
            "path": "/data/docs.jsonl",
            "n_documents": 200,
            "n_members": 100,
            "n_nonmembers": 100,
            "n_snippets": 1600,
            "level": "document",
        },
        "metrics": {
            "loss": _metrics(0.81234, 0.7712, 0.8499),
            "zlib": _metrics(0.7, 0.65, 0.75),
            "min_k@0.1": _metrics(0.6, 0.55, 0.65),
            "ref": {**_metrics(0.9, 0.87, 0.93), "auc_ci": [float("nan"), float("nan")]},
        },
        "blind_baseline": {
            **_metrics(0.52, 0.45, 0.59),
            "method": "bag-of-words logistic regression",
        },
        "ngram_overlap": [
            {
                "n": 7,
                "p": 0.8,
                "mean": 0.123,
                "median": 0.1,
                "share_at_least_p": 0.02,
                "n_texts": 100,
            },
            {
                "n": 13,
                "p": 0.8,
                "mean": 0.05,
                "median": 0.0,
                "share_at_least_p": 0.0,
                "n_texts": 100,
            },
        ],
        "notes": ["<script>alert('x')</script> & friends"],
        "timings": {"score_s": 12.345, "eval_s": 1.0},
        "runtime": {"mode": "cluster", "address": "ray://head:10001"},
    }


def _rows(html):
    return re.findall(r"<tr(?: class=\"highlight\")?>(.*?)</tr>", html, flags=re.S)


def _cells(row_html):
    return re.findall(r"<td>(.*?)</td>", row_html, flags=re.S)


def test_attack_report_table_rows_hold_formatted_auc_and_ci(report, tmp_path):
    out = render_attack_report(report, tmp_path / "report.html")
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    rows = {_cells(r)[0]: _cells(r) for r in _rows(html) if _cells(r)}
    loss = rows["loss"]
    assert loss[1] == "0.812 [0.771, 0.850]"
    assert loss[2] == "+0.292"  # AUC minus the blind baseline's
    assert loss[3:6] == ["1.2% [0.0, 2.4]", "4.8% [2.4, 9.6]", "9.6% [4.8, 30.0]"]
    assert loss[6:] == ["0.700", "0.710"]
    assert rows["ref"][1] == "0.900"  # a NaN interval is left out, not printed as nan
    assert "min_k@0.1" in rows  # parameter variants stay in the table
    assert "TPR @ 0.1% FPR" in html and "AUC [95% CI]" in html


def test_blind_baseline_is_a_highlighted_row(report, tmp_path):
    html = render_attack_report(report, tmp_path / "r.html").read_text()
    highlighted = re.findall(r'<tr class="highlight">(.*?)</tr>', html, flags=re.S)
    assert len(highlighted) == 1
    cells = _cells(highlighted[0])
    assert cells[0] == "blind baseline (bag-of-words logistic regression)"
    assert cells[1] == "0.520 [0.450, 0.590]"
    assert cells[2] == "—"


def test_page_embeds_a_png_and_no_external_assets(report, tmp_path):
    html = render_attack_report(report, tmp_path / "r.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert images
    assert base64.b64decode(images[0]).startswith(PNG_MAGIC)
    assert 'src="http' not in html and 'href="http' not in html
    assert "<link" not in html and "<script" not in html


def test_text_is_escaped(report, tmp_path):
    html = render_attack_report(report, tmp_path / "r.html").read_text()
    assert "<script>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; friends" in html


def test_ngram_notes_timings_and_verdict_are_shown(report, tmp_path):
    html = render_attack_report(report, tmp_path / "r.html").read_text()
    assert "<td>7</td><td>0.80</td><td>0.123</td><td>0.100</td><td>2.0%</td><td>100</td>" in html
    assert "<td>score_s</td><td>12.3</td>" in html
    assert "Best attack by AUC: ref" in html
    assert (
        "The reference set is the members given to this run, not the model&#x27;s pretraining"
        in html
    )


def test_verdict_says_when_nothing_beats_the_blind_baseline(report, tmp_path):
    report["blind_baseline"]["auc"] = 0.95
    report["metrics"]["ref"]["auc"] = 0.9
    html = render_attack_report(report, tmp_path / "r.html").read_text()
    assert "No attack beats the blind baseline" in html


def test_report_without_optional_parts_still_renders(tmp_path):
    minimal = {"metrics": {"loss": {"auc": 0.5}}}
    html = render_attack_report(minimal, tmp_path / "r.html").read_text()
    assert "<td>loss</td><td>0.500</td>" in html
    assert "No blind baseline was computed" in html


def test_building_blocks():
    assert fmt_num(0.81234) == "0.812" and fmt_num(None) == "—" and fmt_num(np.nan) == "—"
    assert fmt_num(np.int64(5)) == "5" and fmt_num(np.float32(0.5), 2) == "0.50"
    assert (
        fmt_ci([0.1, 0.25]) == "[0.100, 0.250]" and fmt_ci(None) == "" and fmt_ci([None, 1]) == ""
    )
    assert fmt_pct(0.0512) == "5.1%" and fmt_pct(None) == "—"
    table = table_html(
        [["a<b", 0.5], {"x": "c", "y": None}], ["x", "y"], highlight=[1], caption="t&"
    )
    assert "<td>a&lt;b</td><td>0.500</td>" in table
    assert '<tr class="highlight"><td>c</td><td>—</td></tr>' in table
    assert "<caption>t&amp;</caption>" in table
    with pytest.raises(ValueError, match="2 columns"):
        table_html([[1]], ["x", "y"])
    doc = page("A <title>", [("Sec & 1", "<p>body</p>"), ("", "<p>bare</p>")], subtitle="s")
    assert "<h1>A &lt;title&gt;</h1>" in doc and "<h2>Sec &amp; 1</h2>" in doc
    assert "<p>body</p>" in doc and "<p>bare</p>" in doc


def test_roc_figure_returns_png_bytes():
    png = roc_figure(
        {"a": {"fpr": [0, 0.5, 1], "tpr": [0, 0.8, 1]}, "blind": ([0, 1], [0, 1])},
        highlight=["blind"],
    )
    assert png.startswith(PNG_MAGIC) and len(png) > 1000
