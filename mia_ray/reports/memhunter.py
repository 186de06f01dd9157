"""MemHunter's report.html: extraction against the time budget (the paper's Tables 1-3), the
plug-in (Figure 4), the dataset-level tests (Tables 4-6) with their null hypotheses, an LCSS
histogram per method, and example prompts and outputs (Table 7)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mia_ray.reports.html import (
    fmt_num,
    fmt_pct,
    img_html,
    list_html,
    new_figure,
    page,
    palette,
    paragraph,
    png,
    table_html,
)
from mia_ray.reports.io import write_text

HOW_TO_READ = (
    "MemHunter asks how much of a dataset the model reproduces word for word. Each sample is "
    "cut into a prefix x and its continuation y; the model continues x (after a prompt) and mu "
    "is the longest common substring of its output and y, as a share of y. A small 'hunter' "
    "model is trained to write prompts that make the target reproduce y; at use it only "
    "samples prompts, k per sample, and the best is kept. Avg LCSS is the mean best mu, Hit "
    "Rate the share of samples reproduced in full. Manual is the prefix alone; MiniPrompt "
    "optimises a prompt per sample by GCG in the same wall-clock time. The 'nonmember' split "
    "holds text the target never trained on: whatever is 'recovered' there is what any "
    "fluent model would write."
)


def lcss_histogram(values: Mapping[str, Sequence[float]]) -> bytes | None:
    """One histogram of per-sample mu per method, on shared bins over [0, 1]."""
    items = [(k, [float(v) for v in vs]) for k, vs in values.items() if len(vs)]
    if not items:
        return None
    fig, axes = new_figure(6.4, 3.4)
    ax = axes[0]
    bins = [i / 20 for i in range(21)]
    for (name, vs), color in zip(items, palette(len(items)), strict=True):
        ax.hist(vs, bins=bins, histtype="step", linewidth=1.6, color=color, label=name)
    ax.set_xlabel("mu = LCSS / |y| (best over the method's trials)")
    ax.set_ylabel("samples")
    ax.set_xlim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("Held-out member samples (test split)")
    return png(fig)


def _extraction_table(rows: Sequence[Mapping[str, Any]], split: str) -> str:
    mine = [r for r in rows if r.get("split") == split]
    body = [
        [
            r["method"],
            "—" if r.get("trials") is None else str(int(r["trials"])),
            fmt_num(r["seconds"], 1),
            fmt_pct(r["avg_lcss"]),
            fmt_pct(r["hit_rate"]),
            str(int(r["pairs"])),
        ]
        for r in mine
    ]
    return table_html(
        body,
        ["method", "k (budget)", "seconds", "Avg LCSS", "Hit Rate", "samples"],
        caption=f"split: {split}",
    )


def _sweep_tables(report: Mapping[str, Any]) -> str:
    """One row per cell: MemHunter at its largest k and Manual on the test split, the paired
    test against the reference and the verdict (the gap test); then every row of every cell."""
    rows = report.get("extraction", [])

    def by_kind(kind):
        return {
            (h["dataset"], h["model"]): h
            for h in report.get("hypothesis", [])
            if h.get("kind") == kind
        }

    paired, gap = by_kind("paired_greater"), by_kind("gap_vs_nonmember")
    power = {(p["dataset"], p["model"]): p for p in report.get("power_check", [])}
    cells = list(dict.fromkeys((r["dataset"], r["model"]) for r in rows))
    body = []
    for ds, m in cells:
        mine = [r for r in rows if (r["dataset"], r["model"]) == (ds, m) and r["split"] == "test"]
        mem = [r for r in mine if r["method"] == "memhunter"]
        best = max(mem, key=lambda r: r["trials"]) if mem else {}
        man = next((r for r in mine if r["method"] == "manual"), {})
        w, g = paired.get((ds, m), {}), gap.get((ds, m), {})
        pc = power.get((ds, m))
        check = "—"
        if pc is not None:
            check = f"{'passed' if pc['passed'] else 'failed'} (p = {fmt_num(pc['p_value'], 4)})"
        body.append(
            [ds, m, fmt_pct(best.get("avg_lcss")), fmt_pct(best.get("hit_rate")),
             fmt_pct(man.get("avg_lcss")), fmt_num(w.get("p_value"), 4),
             fmt_num(g.get("p_value"), 4), g.get("verdict", "—"), check]
        )  # fmt: skip
    summary = table_html(
        body,
        ["dataset", "model", "MemHunter Avg LCSS", "Hit Rate", "Manual Avg LCSS",
         "paired p vs reference", "gap p (members vs nonmembers)", "verdict",
         "power check (proxy vs reference)"],
        caption="test split; MemHunter at its largest k. The verdict is the gap test's. A "
        "failed power check means the cell's test could not have flagged training.",
    )  # fmt: skip
    detail = table_html(
        [
            [
                r["dataset"],
                r["model"],
                r["method"],
                r["split"],
                "—" if r.get("trials") is None else str(int(r["trials"])),
                fmt_num(r["seconds"], 1),
                fmt_pct(r["avg_lcss"]),
                fmt_pct(r["hit_rate"]),
            ]
            for r in rows
        ],  # fmt: skip
        ["dataset", "model", "method", "split", "k", "seconds", "Avg LCSS", "Hit Rate"],
    )
    tests = table_html(
        [
            [h["dataset"], h["model"], h["test"], h["against"], h.get("h0") or "—",
             fmt_num(h.get("statistic")), fmt_num(h.get("p_value"), 4), h["verdict"]]
            for h in report.get("hypothesis", [])
        ],
        ["dataset", "model", "test", "against", "H0", "t", "p-value", "verdict"],
        caption="every cell's dataset-level tests (suspect: the cell's model)",
    )  # fmt: skip
    return summary + paragraph(DATASET_TEST) + tests + detail


DATASET_TEST = (
    "Every model reads the same hunter prompts on the same pairs, so the tests compare them "
    "pair by pair (paired t-tests on the per-pair differences). The verdict is the gap test: "
    "H0 says the suspect's gain over a reference model that never saw the data is no larger "
    "on the dataset's pairs than on pairs of text outside it (the nonmember split); rejecting "
    "it flags memorization of this dataset, while a model that merely follows the hunter's "
    "prompts better than the reference gains everywhere and is not flagged. The paired test "
    "against the reference (H0: the suspect recovers no more than the reference on the same "
    "pairs) and the paired TOST against the proxy (H0: they differ by at least the margin) "
    "are shown beside it; the paper's unpaired Welch t-test and its rule (p > alpha read as "
    "memorized) only for comparison."
)


def _dataset_test_html(report: Mapping[str, Any]) -> str:
    dt = report.get("dataset_test", {})
    body = [
        [
            r["suspect"],
            r["test"],
            r["against"],
            r.get("h0") or "—",
            fmt_num(r.get("statistic")),
            fmt_num(r.get("df"), 1),
            fmt_num(r.get("p_value"), 4),
            fmt_pct(r.get("mean_diff", r.get("mean_gap_member"))),
            fmt_pct(r.get("mean_gap_nonmember")),
            r["verdict"],
        ]
        for r in report.get("hypothesis", [])
    ]
    non = dt.get("mean_lcss_nonmember", {})
    means = [[k, fmt_pct(v), fmt_pct(non.get(k))] for k, v in dt.get("mean_lcss", {}).items()]
    split = dt.get("split", "test")
    power, gap = dt.get("power_check") or {}, dt.get("power_check_gap") or {}
    return (
        paragraph(DATASET_TEST)
        + table_html(
            body,
            [
                "suspect",
                "test",
                "against",
                "H0",
                "t",
                "df",
                "p-value",
                "mean difference (members)",
                "mean difference (nonmembers)",
                "verdict",
            ],
            caption="mean difference: suspect minus the model it is tested against, per pair",
        )  # fmt: skip
        + table_html(
            means,
            ["model", f"mean LCSS ({split} pairs)", "mean LCSS (nonmember pairs)"],
            caption="each model's best mu over the same hunter prompts",
        )
        + paragraph(
            "Power check (the proxy, which trained on the data, against the reference; H0: it "
            f"recovers no more than the reference): paired t-test p = "
            f"{fmt_num(power.get('p_value'), 4)}, {power.get('verdict', '—')}; its gap over "
            f"the reference, members vs nonmembers: p = {fmt_num(gap.get('p_value'), 4)}, "
            f"{gap.get('verdict', '—')}."
        )
    )


def render_memhunter_report(report: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    rows = report.get("extraction", [])
    splits = list(dict.fromkeys(r["split"] for r in rows))
    sections: list[tuple[str, str]] = [("How to read this", paragraph(HOW_TO_READ))]
    if "sweep" in report:
        sections.append(("Sweep: datasets x models", _sweep_tables(report)))
    else:
        sections.append(
            (
                "Extraction against the time budget",
                "".join(_extraction_table(rows, s) for s in splits),
            )
        )
    png = lcss_histogram(report.get("lcss_by_method", {}))
    if png:
        sections.append(("LCSS per method", img_html(png, "histogram of mu per method")))
    if report.get("plugin"):
        sections.append(
            (
                "Plug-in: GCG to full recovery (Figure 4)",
                table_html(
                    report["plugin"],
                    [
                        "method",
                        "pair_id",
                        "presearch_s",
                        "seconds_to_full",
                        "gcg_steps",
                        "final_mu",
                    ],
                    caption="seconds_to_full: — when GCG did not recover y within the limit",
                ),
            )
        )
    hyp = report.get("hypothesis", [])
    if hyp and "sweep" not in report:
        sections.append(("Did the suspect train on the dataset?", _dataset_test_html(report)))
    ex = report.get("examples", [])
    if ex:
        body = [
            [
                e["x"],
                e["prompt"],
                e.get("output", ""),
                e.get("manual_output", ""),
                e["y"],
                fmt_pct(e["mu"]),
            ]
            for e in ex
        ]
        sections.append(
            (
                "Examples (Table 7)",
                table_html(
                    body,
                    ["x", "hunter prompt", "output with it", "output without", "y", "mu"],
                ),
            )
        )
    training = report.get("training", {}).get("iterations", [])
    if training:
        sections.append(
            (
                "Hunter training",
                table_html(
                    training,
                    [
                        "iteration",
                        "search_mu_mean",
                        "pool",
                        "pool_mu_mean",
                        "candidates",
                        "search_s",
                        "finetune_s",
                    ],
                ),  # fmt: skip
            )
        )
    sections.append(("Notes", list_html(report.get("notes", []))))
    html = page(
        "MemHunter: memorization extraction",
        sections,
        subtitle=f"target {report['model']['target']}, hunter {report['model']['hunter']}",
    )
    return write_text(out_path, html)
