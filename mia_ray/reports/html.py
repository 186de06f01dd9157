"""Self-contained HTML reports: inline CSS, plots embedded as base64 PNG, no external assets.

The building blocks (:func:`fmt_num`, :func:`fmt_ci`, :func:`table_html`, :func:`roc_figure`,
:func:`img_html`, :func:`page`, ...) are shared by every pipeline's page;
:func:`render_attack_report` is the attack pipeline's page built from them.

Every piece of text that reaches the page goes through ``html.escape``; only the HTML
returned by the builders here is passed on unescaped (as section bodies).
"""

from __future__ import annotations

import base64
import io
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from mia_ray.reports.io import write_text

__all__ = [
    "definition_list",
    "fmt_ci",
    "fmt_num",
    "fmt_pct",
    "fmt_pct_ci",
    "img_html",
    "list_html",
    "page",
    "paragraph",
    "render_attack_report",
    "roc_figure",
    "table_html",
]

MISSING = "—"

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       margin: 0 auto; max-width: 1150px; padding: 1.5rem 2rem 4rem; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.2rem; margin-top: 2.2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .25rem; }
.subtitle { color: #57606a; margin-top: 0; }
.howto { background: #f6f8fa; border-left: 4px solid #0969da; padding: .6rem 1rem; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .92rem; }
caption { text-align: left; color: #57606a; padding-bottom: .3rem; }
th, td { padding: .3rem .7rem; border-bottom: 1px solid #d8dee4; vertical-align: top; }
th { background: #f6f8fa; text-align: left; }
td { font-variant-numeric: tabular-nums; }
td:not(:first-child), th:not(:first-child) { text-align: right; }
tr.highlight td { background: #fff4d6; font-weight: 600; }
dl { display: grid; grid-template-columns: max-content auto; gap: .2rem 1rem; }
dt { color: #57606a; }
dd { margin: 0; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .9rem; }
img { max-width: 100%; height: auto; }
.verdict { font-weight: 600; }
footer { color: #57606a; font-size: .85rem; margin-top: 3rem; }
"""


# ------------------------------------------------------------------------------ formatting


def is_missing(x: Any) -> bool:
    if x is None:
        return True
    return isinstance(x, numbers.Real) and not isinstance(x, numbers.Integral) and math.isnan(x)


def fmt_num(x: Any, digits: int = 3) -> str:
    """``0.81234`` → ``"0.812"``; None/NaN → ``"—"``; integers and other values as ``str``."""
    if is_missing(x):
        return MISSING
    if isinstance(x, (bool, numbers.Integral)) or not isinstance(x, numbers.Real):
        return str(x)
    return f"{float(x):.{digits}f}"


def fmt_ci(ci: Sequence[Any] | None, digits: int = 3) -> str:
    """``[0.78, 0.84]`` → ``"[0.780, 0.840]"``; missing or incomplete → ``""``."""
    if ci is None or len(ci) != 2 or any(is_missing(v) for v in ci):
        return ""
    return f"[{float(ci[0]):.{digits}f}, {float(ci[1]):.{digits}f}]"


def fmt_pct(x: Any, digits: int = 1) -> str:
    """A fraction as a percentage: ``0.0525`` → ``"5.2%"``."""
    return MISSING if is_missing(x) else f"{100 * float(x):.{digits}f}%"


def fmt_pct_ci(ci: Sequence[Any] | None, digits: int = 1) -> str:
    """A fraction interval in percent: ``[0.01, 0.09]`` → ``"[1.0, 9.0]"``."""
    if ci is None or len(ci) != 2 or any(is_missing(v) for v in ci):
        return ""
    return f"[{100 * float(ci[0]):.{digits}f}, {100 * float(ci[1]):.{digits}f}]"


def _with_ci(value: str, ci: str) -> str:
    return f"{value} {ci}" if ci and value != MISSING else value


def _fpr_label(key: str | float) -> str:
    """``"0.001"`` → ``"0.1%"``."""
    try:
        return f"{100 * float(key):g}%"
    except (TypeError, ValueError):
        return str(key)


# ------------------------------------------------------------------------------- building blocks


def paragraph(text: str, cls: str = "") -> str:
    attr = f' class="{escape(cls)}"' if cls else ""
    return f"<p{attr}>{escape(str(text))}</p>"


def list_html(items: Iterable[Any]) -> str:
    return "<ul>" + "".join(f"<li>{escape(str(i))}</li>" for i in items) + "</ul>"


def definition_list(pairs: Mapping[str, Any]) -> str:
    """Key/value pairs as a two-column list; nested values are shown as their ``str``."""
    body = "".join(
        f"<dt>{escape(str(k))}</dt><dd>{escape(MISSING if is_missing(v) else str(v))}</dd>"
        for k, v in pairs.items()
    )
    return f"<dl>{body}</dl>"


def table_html(
    rows: Iterable[Sequence[Any] | Mapping[str, Any]],
    columns: Sequence[str],
    *,
    highlight: Iterable[int] = (),
    caption: str = "",
    digits: int = 3,
) -> str:
    """An HTML table. A row is a sequence (one cell per column) or a mapping keyed by column.

    Cells: strings are shown as they are, numbers through :func:`fmt_num`, None/NaN as "—".
    Every cell is escaped. Rows whose index is in ``highlight`` get ``class="highlight"``.
    """
    marked = set(highlight)
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        cells = [row.get(c) for c in columns] if isinstance(row, Mapping) else list(row)
        if len(cells) != len(columns):
            raise ValueError(f"table row {i} has {len(cells)} cells for {len(columns)} columns")
        tds = "".join(
            f"<td>{escape(c if isinstance(c, str) else fmt_num(c, digits))}</td>" for c in cells
        )
        cls = ' class="highlight"' if i in marked else ""
        body.append(f"<tr{cls}>{tds}</tr>")
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def img_html(png: bytes, alt: str) -> str:
    """Embed PNG bytes as a data URI (the page stays one file)."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{escape(alt)}">'


def page(title: str, sections: Iterable[tuple[str, str]], subtitle: str = "") -> str:
    """A whole HTML document. ``sections`` are ``(heading, body_html)``; headings are escaped,
    bodies are HTML from the builders above. An empty heading adds the body without one."""
    parts = [f"<h1>{escape(title)}</h1>"]
    if subtitle:
        parts.append(f'<p class="subtitle">{escape(subtitle)}</p>')
    for heading, body in sections:
        parts.append(f"<section>{f'<h2>{escape(heading)}</h2>' if heading else ''}{body}</section>")
    parts.append("<footer>Generated by mia-ray.</footer>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


# ------------------------------------------------------------------------------------- plots


def new_figure(width: float, height: float, ncols: int = 1):
    # A bare Figure with an Agg canvas: no pyplot, so no global state and no GUI backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def png(fig, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _curve_xy(curve: Any) -> tuple[list[float], list[float]]:
    if isinstance(curve, Mapping):
        roc = curve.get("roc", curve)
        return list(roc["fpr"]), list(roc["tpr"])
    fpr, tpr = curve
    return list(fpr), list(tpr)


def roc_figure(
    curves: Mapping[str, Any],
    highlight: Iterable[str] = (),
    title: str = "ROC curves",
) -> bytes:
    """ROC curves side by side on linear and log-log axes, with the chance diagonal; PNG bytes.

    ``curves`` maps a label to ``{"fpr": [...], "tpr": [...]}`` (a metrics dict holding such a
    ``"roc"`` entry, or an ``(fpr, tpr)`` pair, also works). Labels in ``highlight`` are
    drawn black and dashed (the blind baseline). The log-log panel shows the low-FPR region
    where a membership claim about a few documents is decided.
    """
    marked = set(highlight)
    fig, (lin, log) = new_figure(11, 4.6, ncols=2)
    colors = palette(sum(1 for k in curves if k not in marked))
    smallest = 1.0
    ci = 0
    for label, curve in curves.items():
        fpr, tpr = _curve_xy(curve)
        if not fpr:
            continue
        if label in marked:
            style = {"color": "black", "linestyle": "--", "linewidth": 1.8}
        else:
            style = {"color": colors[ci], "linewidth": 1.4}
            ci += 1
        for ax in (lin, log):
            ax.plot(fpr, tpr, label=str(label), **style)
        positive = [x for x in fpr if x > 0]
        if positive:
            smallest = min(smallest, min(positive))
    lo = max(min(smallest, 1e-3), 1e-5)
    for ax in (lin, log):
        ax.plot([0, 1], [0, 1], color="#8c959f", linestyle=":", linewidth=1, label="chance")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.grid(True, which="major", alpha=0.3)
    lin.set_xlim(0, 1)
    lin.set_ylim(0, 1)
    lin.set_title(f"{title} (linear)")
    log.set_xscale("log")
    log.set_yscale("log")
    log.set_xlim(lo, 1)
    log.set_ylim(lo, 1)
    log.set_title(f"{title} (log-log)")
    log.legend(loc="lower right", fontsize="small", framealpha=0.9)
    return png(fig)


def palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(max(n, 1))]


# ------------------------------------------------------------------------------ attack report

HOW_TO_READ = (
    "Each attack gives every document a score (higher = more likely a member) and is judged "
    "on how well that score separates documents the model was trained on from documents it "
    "was not. AUC 0.5 is chance and 1.0 is perfect separation. An attack only shows "
    "something if it beats the blind baseline: a bag-of-words classifier that never sees the "
    "model and only learns how members and non-members differ as texts. If the blind baseline "
    "does well, the two sets differ by content or date, and no attack number can be read as "
    "evidence of training. The true positive rate at a low false positive rate (0.1%, 1%) "
    "matters most: it says how many members are caught when almost no non-member is accused. "
    "Brackets are bootstrap confidence intervals."
)

NGRAM_EXPLAINED = (
    "For each non-member text, the share of its n-grams that also appear in at least one "
    "member text (the n-gram bias measure of Duan et al., used by LUMIA). The reference set "
    "is the members given to this run, not the model's pretraining corpus: this says how alike "
    "the two sides are, not how much of the non-members the model could have seen elsewhere. "
    "High overlap means members and non-members are alike in content, so no attack can win on "
    "topic alone; low overlap lets a content-only classifier, such as the blind baseline, tell "
    "them apart. 'share ≥ p' is the fraction of non-member texts whose overlap reaches p."
)


def _fpr_keys(metric_dicts: Iterable[Mapping[str, Any]]) -> list[str]:
    keys: list[str] = []
    for m in metric_dicts:
        for k in m.get("tpr_at_fpr") or {}:
            if k not in keys:
                keys.append(k)
    return sorted(keys, key=lambda k: float(k))


def _metric_row(name: str, m: Mapping[str, Any], fprs: list[str], blind_auc: Any) -> list[str]:
    tprs = m.get("tpr_at_fpr") or {}
    tpr_cis = m.get("tpr_at_fpr_ci") or {}
    row = [name, _with_ci(fmt_num(m.get("auc")), fmt_ci(m.get("auc_ci")))]
    if blind_auc is not None:
        auc = m.get("auc")
        row.append(MISSING if is_missing(auc) else f"{float(auc) - float(blind_auc):+.3f}")
    row += [_with_ci(fmt_pct(tprs.get(k)), fmt_pct_ci(tpr_cis.get(k))) for k in fprs]
    row += [fmt_num(m.get("balanced_accuracy")), fmt_num(m.get("accuracy"))]
    return row


def _verdict(metrics: Mapping[str, Mapping[str, Any]], blind: Mapping[str, Any] | None) -> str:
    scored = {k: m for k, m in metrics.items() if not is_missing(m.get("auc"))}
    if not scored:
        return "No attack produced an AUC."
    best, m = max(scored.items(), key=lambda kv: float(kv[1]["auc"]))
    text = f"Best attack by AUC: {best}, {fmt_num(m['auc'])} {fmt_ci(m.get('auc_ci'))}".rstrip()
    if not blind or is_missing(blind.get("auc")):
        return text + ". No blind baseline was computed, so this number cannot be judged alone."
    b_auc = float(blind["auc"])
    text += f"; blind baseline {fmt_num(b_auc)} {fmt_ci(blind.get('auc_ci'))}".rstrip()
    ci = m.get("auc_ci")
    if ci and len(ci) == 2 and not is_missing(ci[0]) and float(ci[0]) > b_auc:
        return (
            text + ". Its confidence interval lies above the blind baseline's AUC: the model "
            "carries membership signal beyond how the two sets differ as texts."
        )
    if float(m["auc"]) > b_auc:
        return (
            text + ". It is ahead of the blind baseline, but its confidence interval reaches "
            "the baseline's AUC: the evidence is weak."
        )
    return (
        text + ". No attack beats the blind baseline: these scores show no membership signal "
        "beyond how the two sets differ as texts."
    )


def render_attack_report(report: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """Write the attack pipeline's ``report.html`` from its report dict; return its path.

    Optional parts (blind baseline, ROC curves, n-gram overlap, notes, timings, runtime) are
    left out when absent. The CI level in the header comes from ``report["ci_level"]``
    (default 0.95). Metric names with ``@`` (``min_k@0.1``) are tabulated but not plotted.
    """
    model = report.get("model") or {}
    data = report.get("data") or {}
    metrics: Mapping[str, Mapping[str, Any]] = report.get("metrics") or {}
    blind = report.get("blind_baseline") or None
    ci_level = report.get("ci_level", 0.95)

    model_name = model.get("name") or model.get("name_or_path") or "model"
    data_name = data.get("path") or "documents"
    title = f"Membership inference audit: {model_name}"
    subtitle = f"data: {data_name}"
    if report.get("created"):
        subtitle += f" · created {report['created']}"

    sections: list[tuple[str, str]] = [("", f'<div class="howto">{paragraph(HOW_TO_READ)}</div>')]

    fprs = _fpr_keys([*metrics.values(), *([blind] if blind else [])])
    blind_auc = None if not blind or is_missing(blind.get("auc")) else blind["auc"]
    columns = [
        "attack",
        f"AUC [{ci_level * 100:g}% CI]",
        *(["AUC − blind"] if blind_auc is not None else []),
        *(f"TPR @ {_fpr_label(k)} FPR" for k in fprs),
        "balanced accuracy",
        "accuracy",
    ]
    rows = [_metric_row(name, m, fprs, blind_auc) for name, m in metrics.items()]
    highlight = []
    if blind:
        method = blind.get("method")
        label = f"blind baseline ({method})" if method else "blind baseline"
        highlight.append(len(rows))
        rows.append(_metric_row(label, blind, fprs, blind_auc))
        if blind_auc is not None:
            rows[-1][2] = MISSING  # the baseline minus itself says nothing
    n_m = data.get("n_members", MISSING)
    n_n = data.get("n_nonmembers", MISSING)
    level = data.get("level", "document")
    results = paragraph(_verdict(metrics, blind), cls="verdict") + table_html(
        rows,
        columns,
        highlight=highlight,
        caption=f"Evaluated per {level}: {n_m} members, {n_n} non-members. TPR in percent.",
    )
    sections.append(("Results", results))

    curves = {name: m for name, m in metrics.items() if "@" not in name and m.get("roc")}
    if blind and blind.get("roc"):
        curves["blind baseline"] = blind
    if curves:
        png = roc_figure(curves, highlight=["blind baseline"])
        note = paragraph(
            "Variants with a parameter (such as min_k@0.1) are in the table only, to keep "
            "the plot readable. On the log-log panel the chance line is the diagonal too."
        )
        sections.append(("ROC curves", img_html(png, "ROC curves of every attack") + note))

    ngram = report.get("ngram_overlap") or []
    if ngram:
        ng_rows = [
            [
                str(r.get("n", MISSING)),
                fmt_num(r.get("p"), 2),
                fmt_num(r.get("mean")),
                fmt_num(r.get("median")),
                fmt_pct(r.get("share_at_least_p")),
                str(r.get("n_texts", MISSING)),
            ]
            for r in ngram
        ]
        ng_cols = ["n", "threshold p", "mean overlap", "median overlap", "share ≥ p", "texts"]
        sections.append(
            (
                "Member / non-member n-gram overlap",
                paragraph(NGRAM_EXPLAINED) + table_html(ng_rows, ng_cols),
            )
        )

    sections.append(("Data", definition_list(data)))
    sections.append(("Model", definition_list(model)))
    notes = report.get("notes") or []
    if notes:
        sections.append(("Notes", list_html(notes)))
    timings = report.get("timings") or {}
    if timings:
        t_rows = [[k, fmt_num(v, 1)] for k, v in timings.items()]
        sections.append(("Timings", table_html(t_rows, ["stage", "seconds"])))
    runtime = report.get("runtime") or {}
    if runtime:
        sections.append(("Runtime", definition_list(runtime)))

    return write_text(out_path, page(title, sections, subtitle=subtitle))
