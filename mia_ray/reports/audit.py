"""The audit's ``report.html``: the verdict first, then the evidence behind it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
    "The question: did the model train on the suspected files? The dataset test asks whether "
    "the model scores the suspected files as more trained-on than files it surely never saw; "
    "a small p-value is evidence of training only on a premise: that the two sets differ by "
    "training alone. Checks of that premise stand beside it: the blind check reads the "
    "files' text with no model (their words, their characters with case kept, and surface "
    "statistics such as repetition, casing and layout), and with a reference model the "
    "reference check runs the dataset test on a model that never saw the files. If either "
    "rejects, the sets differ in kind and no file is called trained. With a reference, the "
    "calibrated test must reject as well: the target's scores minus the reference's, so that "
    "what both models read in the texts cancels. A check can falsify "
    "the premise, never prove it: the Premise section says what each one sees and what none "
    "could. The null check (two random halves of the unseen files) tests the machinery only. "
    "Each suspected file then gets a p-value, and the files flagged are chosen so that on "
    "average at most the stated share of them are false discoveries."
)


def _check_rows(r: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    blind = r.get("blind_check") or {}
    for key, label in (
        ("dataset_test", "dataset test: suspected vs unseen"),
        ("null_check", "null check: unseen vs unseen (rejects only by chance)"),
        ("blind_check", "blind check: the text alone, no model (must not reject)"),
        *[(f"blind:{n}", f"  · {n} (adjusted p)") for n in blind.get("parts", {})],
        ("reference_check", "reference check: a model that never saw the files (must not "
                            "reject)"),
        ("calibrated_test", "calibrated test: the target's scores minus the reference's "
                            "(must reject too)"),
    ):  # fmt: skip
        if key.startswith("blind:"):
            t = blind["parts"][key[6:]]
            rows.append([label, f"{t['adjusted_p_value']:.3g}", fmt_num(t["statistic"], 3),
                         "rejects" if t["reject"] else "does not reject"])  # fmt: skip
            continue
        t = r.get(key)
        if t:
            stat = "-" if key == "blind_check" else fmt_num(t.get("statistic"), 3)
            rows.append(
                [
                    label,
                    f"{t['p_value']:.3g} ± {t['mc_error']:.1g}",
                    stat,
                    "rejects" if t["reject"] else "does not reject",
                ]
            )
    return rows


def _premise_rows(prem: Mapping[str, Any]) -> list[list[str]]:
    return [
        [c["name"], c["sees"],
         fmt_num(c.get("p_value"), 3) if c["ran"] else f"did not run: {c['why_not']}",
         ("rejects" if c["reject"] else "does not reject") if c["ran"] else "-"]
        for c in prem["checks"]
    ]  # fmt: skip


def _score_figure(r: Mapping[str, Any]) -> bytes:
    import numpy as np

    sus = np.array([f["score"] for f in r["files"]])
    flagged = np.array([f["flagged"] for f in r["files"]], dtype=bool)
    uns = np.array([f["score"] for f in r.get("unseen_files", [])])
    pv = np.array([f["p_value"] for f in r["files"]])
    fig, (ax1, ax2) = new_figure(10, 3.6, ncols=2)
    bins = np.histogram_bin_edges(np.concatenate([sus, uns]) if uns.size else sus, bins=20)
    if uns.size:
        ax1.hist(uns, bins=bins, alpha=0.6, label=f"unseen ({uns.size})", color="#888888")
    ax1.hist(sus[~flagged], bins=bins, alpha=0.6, label="suspected, not flagged", color="#4c72b0")
    ax1.hist(sus[flagged], bins=bins, alpha=0.8, label="suspected, flagged", color="#c44e52")
    ax1.set_xlabel("file score (out-of-fold, higher = more like trained)")
    ax1.set_ylabel("files")
    ax1.set_title("Score distributions")
    ax1.legend(fontsize=8)
    ax2.hist(pv, bins=np.linspace(0, 1, 21), color="#4c72b0")
    ax2.set_xlabel("per-file p-value")
    ax2.set_ylabel("suspected files")
    ax2.set_title("p-values (uniform if none was trained on)")
    return png(fig)


def _weights_figure(feat: Mapping[str, Any]) -> bytes:
    names, mean, sd = feat["names"], feat["weights_mean"], feat["weights_sd"]
    fig, (ax,) = new_figure(7, 0.3 * len(names) + 1.2)
    ax.barh(range(len(names)), mean, xerr=sd, color="#4c72b0")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("weight (>= 0) on the standardized feature (mean ± sd over fits)")
    return png(fig)


def render_audit_report(report: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    r = report
    model = r.get("model") or {}
    title = f"Audit: did {model.get('name_or_path', 'the model')} train on these files?"
    subtitle = f"suspected: {r['data']['suspected']} · unseen: {r['data']['unseen']}"
    if r.get("created"):
        subtitle += f" · created {r['created']}"
    sections: list[tuple[str, str]] = [
        ("Verdict", paragraph(r["verdict"]["text"], cls="verdict")),
        ("", f'<div class="howto">{paragraph(HOW_TO_READ)}</div>'),
        (
            "Tests",
            table_html(
                _check_rows(r),
                ["test", "p-value ± Monte Carlo error", "mean held-out AUC", "at the level"],
                caption=f"Level {r['dataset_test']['alpha']:g}; each statistic is the mean AUC "
                f"of {2 * r['dataset_test']['rounds']} held-out halves, each p-value from "
                f"{r['dataset_test']['permutations']} permutations of the sources' sides; "
                f"effect size (Cohen's d of the held-out scores) "
                f"{fmt_num(r['dataset_test'].get('effect_size'), 2)}.",
            ),
        ),
    ]
    prem = r.get("premise")
    if prem:
        contrasts = (r.get("blind_check") or {}).get("contrasts") or []
        body = paragraph(f"Premise: {prem['statement']}. Kind of proof: {prem['kind']}.")
        body += table_html(_premise_rows(prem), ["check", "what it sees", "p-value", "outcome"])
        body += paragraph("Not ruled out: " + "; ".join(prem["not_ruled_out"]) + ".")
        if contrasts:
            body += table_html(
                [[c["feature"], c["cohens_d"], c["suspected_mean"], c["unseen_mean"]]
                 for c in contrasts],
                ["surface statistic", "Cohen's d (suspected - unseen)", "suspected mean",
                 "unseen mean"],
                caption="The surface statistics whose file means differ most between the sets.",
            )  # fmt: skip
        sections.append(("Premise", body))
    if r.get("truth"):
        sections.append(("Against known labels", definition_list(r["truth"])))
    sections.append(("Scores and p-values", img_html(_score_figure(r), "score distributions")))
    pf = r["per_file"]
    cols = ["file_id", "source", "score", "p_value", "q_value", "verdict", "n_calibration"]
    if any("truth" in f for f in r["files"]):
        cols.append("truth")
    if any("copycheck_verdict" in f for f in r["files"]):
        cols += ["copycheck_verdict", "copycheck_confidence"]
    sections.append(
        (
            f"Files ({pf['n_flagged']} of {len(r['files'])} flagged at {pf['fdr']:.0%} FDR)",
            table_html(
                [[f.get(c) for c in cols] for f in r["files"]],
                cols,
                highlight=[i for i, f in enumerate(r["files"]) if f["flagged"]],
                caption="q_value: the adjusted p-value of the step-up rule; a file is flagged "
                "when it is at most the FDR level"
                + (f". No verdicts: {pf['withheld']}." if pf.get("withheld") else "."),
                digits=4,
            ),
        )
    )
    sections.append(
        ("Feature weights", img_html(_weights_figure(r["features"]), "feature weights"))
    )
    for name, summary in (r.get("methods") or {}).items():
        body = definition_list({k: v for k, v in summary.items() if k != "out"})
        body += paragraph(f"Its own report: {summary.get('out', '')}/report.html")
        sections.append((f"More evidence: {name}", body))
    lengths = r.get("lengths")
    if lengths:
        rows = [
            [side]
            + [
                lengths[side][k]
                for k in ("files", "words_median", "words_min", "words_max", "full_snippets_median")
            ]
            for side in ("suspected", "unseen")
        ]
        sections.append(
            (
                "Lengths",
                table_html(
                    rows,
                    ["side", "files", "median words", "fewest", "most", "median full snippets"],
                    caption=f"Every file is scored on {lengths['snippets_per_file']} full-size "
                    "snippet(s), drawn from its own"
                    + (f" ({lengths['rule']})." if lengths.get("rule") else ".")
                    + (f" Warning: {lengths['warning']}." if lengths.get("warning") else ""),
                ),
            )
        )
    left = r["data"].get("left_out") or []
    if left:
        sections.append(
            (
                f"Left out ({len(left)})",
                table_html(
                    [[f["side"], f["file_id"], f["reason"]] for f in left],
                    ["side", "file_id", "why"],
                ),
            )
        )
    sections.append(("Caveats and method", list_html(r.get("notes") or [])))
    sections.append(("Data", definition_list(r["data"])))
    sections.append(("Model", definition_list(model)))
    for key, head in (("timings", "Timings"), ("runtime", "Runtime")):
        if r.get(key):
            sections.append((head, definition_list(r[key])))
    return write_text(out_path, page(title, sections, subtitle=subtitle))
