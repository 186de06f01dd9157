"""CopyCheck's report.html: the Table-II-style results, Figure-1-style violins, per-file verdicts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.reports.html import (
    definition_list,
    fmt_num,
    img_html,
    list_html,
    new_figure,
    page,
    paragraph,
    png,
    table_html,
)
from mia_ray.reports.io import write_text

HOW_TO_READ = (
    "CopyCheck decides, for each suspected file, whether the model saw it in training. It "
    "fine-tunes the model to answer 1 for suspected and 0 for surely-unseen files and measures "
    "how uncertain the fine-tuned models are about each snippet: files the model already knew "
    "come out more certain. Files are clustered into two groups without any threshold; the more "
    "uncertain group is called unseen. Balanced accuracy is the mean of the rates of correctly "
    "called seen and unseen files: 0.5 is chance, whatever the mix."
)
RESULT_COLUMNS = ["method", "n_unseen", "acc", "bacc", "tp", "fp", "fn", "tn"]
FINETUNE_COLUMNS = ("member", "seed", "n_train", "steps", "first_loss", "final_loss", "elapsed_s")
SAMPLER_NAMES = {"mcd": "MC dropout", "blob": "BLoB", "ensemble": "Ensemble"}


def results_table(results: list[Mapping[str, Any]], order: list[str]) -> pd.DataFrame:
    """Table II layout: grouped by N_unseen, methods in ``order``."""
    df = pd.DataFrame(results, columns=RESULT_COLUMNS)
    if df.empty:
        return df
    rank = {m: i for i, m in enumerate(order)}
    df["_r"] = df["method"].map(lambda m: rank.get(m, len(rank)))
    return df.sort_values(["n_unseen", "_r"]).drop(columns="_r").reset_index(drop=True)


def violin_figure(snip: pd.DataFrame, samplers: list[str]) -> bytes | None:
    """Aleatoric uncertainty of seen vs unseen suspected snippets per sampler and N_unseen
    (the paper's Figure 1). Needs the ``truth`` column."""
    if snip.empty or snip["truth"].isna().all():
        return None
    exps = list(dict.fromkeys(snip["experiment"]))
    fig, axes = new_figure(3.2 * len(samplers), 2.6 + 0.0 * len(exps), ncols=len(samplers))
    for ax, s in zip(axes, samplers, strict=True):
        col = f"{s}.aleatoric"
        pos, data, colors = [], [], []
        for i, e in enumerate(exps):
            part = snip[snip["experiment"] == e]
            for j, (truth, color) in enumerate(((1, "#1f77b4"), (0, "#d62728"))):
                vals = part.loc[part["truth"] == truth, col].to_numpy(dtype=float)
                if vals.size >= 2 and np.ptp(vals) > 0:
                    data.append(vals)
                    pos.append(i * 3 + j)
                    colors.append(color)
                elif vals.size:
                    ax.scatter([i * 3 + j] * vals.size, vals, s=4, color=color)
        if data:
            parts = ax.violinplot(data, positions=pos, widths=0.9, showmedians=True)
            for body, color in zip(parts["bodies"], colors, strict=True):
                body.set_facecolor(color)
                body.set_alpha(0.6)
        ax.set_xticks([i * 3 + 0.5 for i in range(len(exps))])
        labels = [str(v) for v in snip.drop_duplicates("experiment")["n_unseen"]]
        ax.set_xticklabels(labels)
        ax.set_xlabel("N_unseen")
        ax.set_title(SAMPLER_NAMES.get(s, s))
        ax.set_ylabel("aleatoric uncertainty")
    axes[0].scatter([], [], color="#1f77b4", label="seen")
    axes[0].scatter([], [], color="#d62728", label="unseen")
    axes[0].legend(loc="upper left", fontsize=8)
    return png(fig)


def render_copycheck_report(
    report: Mapping[str, Any], snip: pd.DataFrame, out_path: str | os.PathLike
) -> Path:
    model = (report.get("model") or {}).get("name_or_path", "model")
    title = f"CopyCheck: which files has {model} seen?"
    sections: list[tuple[str, str]] = [("", f'<div class="howto">{paragraph(HOW_TO_READ)}</div>')]
    summary = report.get("summary") or {}
    if summary:
        rows = [
            [m, fmt_num(v["mean_acc"]), fmt_num(v["mean_bacc"]), str(v["n"])]
            for m, v in sorted(summary.items(), key=lambda kv: -kv[1]["mean_bacc"])
        ]
        sections.append(
            (
                "Summary",
                table_html(
                    rows,
                    ["method", "mean accuracy", "mean balanced accuracy", "experiments"],
                    highlight=[i for i, r in enumerate(rows) if r[0] == "gmm"],
                    caption="Averaged over the experiments (N_unseen values); gmm is CopyCheck's default.",
                ),
            )
        )
    order = [r["method"] for r in report.get("results") or []]
    table = results_table(report.get("results") or [], list(dict.fromkeys(order)))
    if not table.empty:
        sections.append(
            (
                "Results per N_unseen (Table II layout)",
                table_html(
                    table.to_dict("records"),
                    RESULT_COLUMNS,
                    highlight=[i for i, m in enumerate(table["method"]) if m == "gmm"],
                    caption="TP: seen files called seen; FP: unseen called seen; FN: seen called "
                    "unseen; TN: unseen called unseen.",
                ),
            )
        )
    blind = report.get("blind_baseline") or []
    if blind:
        sections.append(
            (
                "Blind baseline",
                paragraph(
                    "A bag-of-words classifier trained with the true labels (cross-validated) on the "
                    "suspected files' text alone, never the model: if it separates seen from unseen "
                    "files, the files differ in content and any method can look good."
                )
                + table_html(blind, ["n_unseen", "auc", "acc", "bacc"]),
            )
        )
    samplers = [s for s in SAMPLER_NAMES if f"{s}.aleatoric" in snip.columns]
    png = violin_figure(snip, samplers) if samplers else None
    if png:
        sections.append(
            (
                "Uncertainty of seen vs unseen snippets (Figure 1)",
                img_html(png, "violin plots of aleatoric uncertainty")
                + paragraph("Suspected snippets only, grouped by their file's true status."),
            )
        )
    files = report.get("files") or []
    if files:
        cols = ["n_unseen", "file_id", "verdict", "confidence", "label"]
        sections.append(
            (
                f"Per-file verdicts ({files[0].get('method', 'gmm')})",
                table_html(files, cols, caption="label: 1 seen, 0 unseen, when known."),
            )
        )
    notes = report.get("notes") or []
    if notes:
        sections.append(("Notes", list_html(notes)))
    ft = (report.get("finetune") or {}).get("records") or []
    if ft:
        sections.append(("Fine-tuning", table_html(ft, ["experiment", *FINETUNE_COLUMNS])))
    sections.append(
        (
            "Data",
            definition_list(
                {k: v for k, v in (report.get("data") or {}).items() if k != "experiments"}
            ),
        )
    )
    timings = report.get("timings") or {}
    if timings:
        sections.append(
            (
                "Timings",
                table_html([[k, fmt_num(v, 1)] for k, v in timings.items()], ["stage", "seconds"]),
            )
        )
    runtime = report.get("runtime") or {}
    if runtime:
        sections.append(("Runtime", definition_list(runtime)))
    return write_text(out_path, page(title, sections, subtitle=str(report.get("created", ""))))
