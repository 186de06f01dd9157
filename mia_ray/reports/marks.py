"""report.html of `mia-ray verify` (the verdict, its premise, the combined test, a table of
marks and their p-values against the uniform they follow under H0) and of `mia-ray
contamination` (the order test per shard)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mia_ray.reports.html import (
    definition_list,
    img_html,
    new_figure,
    page,
    paragraph,
    png,
    table_html,
)
from mia_ray.reports.io import write_text


def _verdict_and_premise(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The first two sections of both reports: the verdict, and the premise it rests on."""
    pr = report["premise"]
    premise = {"H0": pr["statement"], "why it is exact": pr["proof"]}
    if "checked_by" in pr:
        premise["checked by"] = (
            f"{pr['checked_by']}: p = {pr['reference_p_value']:.2g} "
            f"({'holds' if pr['holds'] else 'fails: no verdict'})"
            if pr["checked_by"] else "not checked (no reference model given)"
        )  # fmt: skip
    return [("Verdict", paragraph(report["verdict"]["text"])),
            ("Premise", definition_list(premise))]  # fmt: skip


def _rank_figure(report: Mapping[str, Any]) -> bytes:
    """The marks' p-values, sorted, against the uniform quantiles they follow under H0."""
    import numpy as np

    p = np.sort([m["p_value"] for m in report["marks"]])
    fig, (ax,) = new_figure(5.0, 3.6)
    q = (np.arange(1, p.size + 1)) / p.size
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, label="H0: uniform")
    ax.step(q, p, where="post", label="marks")
    ax.set_xlabel("uniform quantile")
    ax.set_ylabel("mark p-value (sorted)")
    ax.legend(loc="upper left")
    return png(fig)


def render_verify_report(report: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    c, s = report["combined_test"], report["settings"]
    cols = ["mark_id", "files", "rank", "p_value", "q_value", "verdict"]
    if report["marks"] and "carrying" in report["marks"][0]:
        cols.insert(2, "carrying")
    rows = [{**m, "files": ", ".join(m["files"][:3]) + (" …" if len(m["files"]) > 3 else "")}
            for m in report["marks"]]  # fmt: skip
    sections = [
        *_verdict_and_premise(report),
        (
            "Combined test",
            definition_list(
                {
                    "statistic": c["statistic"],
                    "value": c["value"],
                    "p-value": c["p_value"],
                    "marks tested": c["n_marks"],
                    "Monte Carlo draws": c["draws"],
                    "smallest possible p": c["smallest_p_value"],
                    "marks that must rank first together to flag one file": report["per_mark"][
                        "marks_needed_at_floor"
                    ],
                    "each mark": f"{s['candidates']} candidates each, {s['length']} {s['kind']}, "
                    f"{s['copies']} cop{'y' if s['copies'] == 1 else 'ies'} per file, one per {s['per']}",
                }
            ),
        ),  # fmt: skip
        ("Ranks", img_html(_rank_figure(report), "sorted p-values against uniform quantiles")),
        (
            "Marks",
            table_html(
                rows,
                cols,
                caption="rank 1 = the published candidate scored highest of all K; p = rank / K",
            ),
        ),  # fmt: skip
    ]
    html = page(
        f"mia-ray verify: {report['model']}", sections, subtitle=f"key run {report['run_id']}"
    )
    return write_text(out_path, html)


def _order_figure(report: Mapping[str, Any]) -> bytes:
    """Per shard: the published order's log-likelihood minus its shuffles' mean."""
    import numpy as np

    gap = np.array([s["published_ll"] - s["shuffled_ll_mean"] for s in report["shards"]])
    fig, (ax,) = new_figure(5.5, 3.2)
    ax.bar(range(gap.size), gap, color=["C3" if g > 0 else "C0" for g in gap])
    ax.axhline(0, color="0.4", lw=1)
    ax.set_xlabel("shard")
    ax.set_ylabel("published - shuffled log-lik.")
    return png(fig)


def render_contamination_report(report: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    t = report["test"]
    sections = [
        *_verdict_and_premise(report),
        (
            "Test",
            definition_list(
                {
                    "statistic": t["statistic"],
                    "value": t["value"],
                    "p-value": t["p_value"],
                    "shards": t["shards"],
                    "shuffles per shard": t["permutations"],
                    "shards preferring the published order": t["published_preferred"],
                    "smallest possible p": t["smallest_p_value"],
                }
            ),
        ),  # fmt: skip
        (
            "Shards",
            img_html(_order_figure(report), "published minus shuffled log-likelihood")
            + table_html(
                report["shards"],
                ["shard", "examples", "published_ll", "shuffled_ll_mean", "p_value"]
                + (["reference_p_value"] if report["premise"].get("checked_by") else []),
            ),
        ),  # fmt: skip
    ]
    title = f"mia-ray contamination: {report['model']}"
    return write_text(out_path, page(title, sections, subtitle=report["benchmark"]))
