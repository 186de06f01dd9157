"""The leakage survey's report.json and report.html: leakage rates per category with their
intervals (the paper's Table 2), per PII type and per shard, precision and recall against the
planted truth, the matches themselves so a person can check them, and for audited models the
output rate (Table 3), detection rates per method (Table 4) and the few-shot curve (Figure 2)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mia_ray.reports.html import (
    fmt_pct,
    fmt_pct_ci,
    img_html,
    list_html,
    new_figure,
    page,
    paragraph,
    png,
    table_html,
)
from mia_ray.reports.io import write_json, write_text

HOW_TO_READ = (
    "The leakage rate of a category is the share of documents with at least one "
    "finding of it (Kaneko et al., §2), with a Wilson interval. Personal information: 20 "
    "regular-expression types, each with its own check (docs/pii.md), plus person names "
    "from the US Census 1990 name lists; a document counts if it holds any of them, as in "
    "the paper. Copyrighted text and benchmark data: a document counts if it contains a "
    "span of the stated number of consecutive words (after normalising case, punctuation and "
    "line breaks) of a reference text. Their rate divides by the eligible documents, those "
    "with at least that many words (a shorter text can never match; the paper leaves texts "
    "under 300 words out); the raw rate beside it divides by every scanned document. Where "
    "the corpus has planted records with known "
    "places, recall is the share of them found and precision the share of matches that are "
    "planted ones; real text also holds real personal data nobody planted, which lowers "
    "precision and is listed for checking."
)

RATE_COLUMNS = ["category", "rate", "CI", "documents", "eligible", "min. words", "raw rate",
                "raw CI", "planted", "found", "precision", "recall"]  # fmt: skip

LABELS = {"pii": "personal information", "copyright": "copyrighted text", "benchmark": "benchmark"}


def rates_figure(rates: Mapping[str, Mapping[str, Any]]) -> bytes:
    """Leakage rate per category with its interval."""
    fig, axes = new_figure(5.6, 3.0)
    ax = axes[0]
    names = list(rates)
    vals = [rates[n]["rate"] for n in names]
    # Clipped at 0: an interval computed elsewhere may miss the rate by a rounding error,
    # and matplotlib refuses a negative error bar.
    lo = [max(0.0, rates[n]["rate"] - rates[n]["ci"][0]) for n in names]
    hi = [max(0.0, rates[n]["ci"][1] - rates[n]["rate"]) for n in names]
    ax.bar(range(len(names)), vals, yerr=[lo, hi], capsize=4, color="#4c72b0")
    ax.set_xticks(range(len(names)), [LABELS.get(n, n) for n in names])
    ax.set_ylabel("share of documents")
    ax.set_ylim(0, 1)
    ax.set_title("Leakage rate")
    return png(fig)


METHOD_LABELS = {
    "self_detection": "self-detection", "loss": "LOSS", "zlib": "PPL/zlib", "min_k": "Min-K%",
    "majority_vote": "majority vote",
}  # fmt: skip


def few_shot_figure(models: Mapping[str, Mapping[str, Any]]) -> bytes:
    """Self-detection accuracy against the number of few-shot examples (the paper's Figure 2),
    one line per category and model."""
    fig, axes = new_figure(5.6, 3.2)
    ax = axes[0]
    for mi, (name, m) in enumerate(models.items()):
        for c in LABELS:
            rows = sorted(
                (r for r in m["few_shot_curve"] if r["category"] == c), key=lambda r: r["shots"]
            )
            if rows:
                ax.plot([r["shots"] for r in rows], [r["rate"] for r in rows], marker="o",
                        linestyle="-" if mi == 0 else "--", label=f"{LABELS[c]} · {name}")  # fmt: skip
    ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("few-shot examples (half leaked)")
    ax.set_ylabel("detection rate")
    ax.set_ylim(0, 1)
    ax.set_title("Self-detection and the number of examples")
    ax.legend(fontsize=6)
    return png(fig)


def _model_sections(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    ev = report.get("eval")
    if report.get("eval_skipped"):
        return [("The models", paragraph(f"The model side did not run: {report['eval_skipped']}."))]
    if not ev:
        return []
    models = ev["models"]
    out_rows, det_rows = [], []
    for name, m in models.items():
        for c, r in m["output_rate"].items():
            out_rows.append([name, LABELS[c], fmt_pct(r["rate"]), fmt_pct_ci(r["ci"]), r["n"]])
        for c, methods in m["detection_rate"].items():
            for meth, r in methods.items():
                det_rows.append([name, LABELS[c], METHOD_LABELS[meth], fmt_pct(r["rate"]),
                                 fmt_pct_ci(r["ci"]), r["n"], r.get("auc")])  # fmt: skip
    counts = ", ".join(f"{LABELS[c]} {n}" for c, n in ev["instances"].items())
    how = paragraph(
        f"Leaked instances per category (few-shot pool and evaluated): {counts}. {ev['method']}"
    )
    return [
        (
            "How the model side was measured",
            how + paragraph("Refusals:") + list_html(ev["refusals"]),
        ),
        (
            "Output rate (Table 3)",
            paragraph(
                "The share of leaked instances whose mean per-token log-probability after "
                "their eliciting prompt is higher than the mean of the 8 refusals' (each "
                "scored the same way, after the same prompt). What the prompt gives away (its "
                "quote of the instance's first words, the person it names) is read as "
                "context and not scored: repeating it from the prompt is copying, not leakage."
            )
            + table_html(out_rows, ["model", "category", "output rate", "CI", "instances"]),
        ),
        (
            "Detection rate (Table 4, Figure 1)",
            paragraph(
                "Accuracy on leaked instances and their non-leaked counterparts (half each). "
                "LOSS, PPL/zlib and Min-K% flag an instance when its score passes a threshold "
                "chosen on the few-shot pool; the majority vote takes the four, a tie going to "
                "self-detection. AUC is the score's ranking quality, threshold-free."
            )
            + table_html(det_rows, ["model", "category", "method", "rate", "CI", "n", "AUC"]),
        ),
        ("Few-shot curve (Figure 2)", img_html(few_shot_figure(models), "few-shot curve")),
    ]


def render_leakage_report(report: Mapping[str, Any], out_path: Path) -> Path:
    lr = report["leakage_rate"]
    sections = [("How to read this", paragraph(HOW_TO_READ))]
    crawl = report["crawl"]
    sections.append(
        (
            "Leakage rate (Table 2)",
            paragraph(
                f"{crawl['documents']} documents, {crawl['megabytes']:.2f} MB in "
                f"{len(crawl['shards'])} shards."
            )
            + table_html(
                [
                    [LABELS[c], r["why"], *[""] * (len(RATE_COLUMNS) - 2)]
                    if r.get("scanned") is False
                    else [
                        LABELS[c],
                        fmt_pct(r["rate"]),
                        fmt_pct_ci(r["ci"]),
                        r["documents"],
                        r["eligible"],
                        r["min_words"] or "any",
                        fmt_pct(r["raw_rate"]),
                        fmt_pct_ci(r["raw_ci"]),
                        r.get("planted"),
                        r.get("found"),
                        r.get("precision"),
                        r.get("recall"),
                    ]
                    for c, r in lr.items()
                ],  # fmt: skip
                RATE_COLUMNS,
            )
            + img_html(
                rates_figure({c: r for c, r in lr.items() if r.get("scanned") is not False}),
                "leakage rate per category",
            ),
        )
    )
    types = report.get("pii_types", {})
    sections.append(
        (
            "Personal information by type",
            table_html(
                [
                    [t, fmt_pct(r["rate"]), fmt_pct_ci(r["ci"]), r["documents"]]
                    for t, r in types.items()
                ]
                + [
                    [
                        "any of the 20 types (no names)",
                        fmt_pct(report["pii_without_names"]["rate"]),
                        fmt_pct_ci(report["pii_without_names"]["ci"]),
                        report["pii_without_names"]["documents"],
                    ]
                ],
                ["type", "rate", "CI", "documents"],
            ),  # fmt: skip
        )
    )
    truth = report.get("truth")
    if truth:
        names = truth["person_name"]
        body = paragraph(
            f"Person names: {names['found']} of {names['planted']} planted names found "
            f"({fmt_pct(names['recall'])}); {names['matches']} name matches in all."
        )
        if names["missed"]:
            body += paragraph("Planted names not found:") + list_html(
                sorted({m["value"] for m in names["missed"]})
            )
        wrong = truth["pii"]["unplanted_matches"][:20]
        if wrong:
            body += paragraph("Personal-information matches nobody planted (check them):")
            body += table_html(wrong, ["shard", "doc_id", "type", "value"])
        sections.append(("Against the planted truth", body))
    sections += _model_sections(report)
    shown = [c for c in LABELS if lr.get(c, {}).get("scanned") is not False]
    sections.append(
        (
            "Per shard",
            table_html(
                [
                    [s, r["documents"], r["bytes"], *(fmt_pct(r[c]["rate"]) for c in shown)]
                    for s, r in report.get("shards", {}).items()
                ],
                ["shard", "documents", "bytes", *(LABELS[c] for c in shown)],
            ),  # fmt: skip
        )
    )
    sections.append(
        (
            f"Matches (first {len(report['matches'])} of {report['matches_total']}; all in "
            f"{report['crawl'].get('findings', 'scan/<shard>/findings/')})",
            table_html(
                [{**m, "value": str(m["value"])[:120]} for m in report["matches"][:200]],
                ["shard", "doc_id", "category", "type", "start", "end", "value", "ref"],
            ),
        )
    )
    return write_text(out_path, page("Leakage survey", sections, subtitle="mia-ray leakage"))


def write_report(report: Mapping[str, Any], out: Path) -> None:
    write_json(out / "report.json", report)
    render_leakage_report(report, out / "report.html")
