"""LUMIA's report.html: AUC by layer (the paper's Figures 2-3), the best layers, and the
comparison with the classic attacks and the blind baseline (the paper's Tables 1-2 layout).

One section per target in ``report["runs"]`` (the primary target's results also sit at the
top level of report.json; a report without ``runs`` is read as a single run).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from mia_ray.reports.html import (
    MISSING,
    NGRAM_EXPLAINED,
    definition_list,
    fmt_num,
    fmt_pct,
    img_html,
    is_missing,
    list_html,
    new_figure,
    page,
    palette,
    paragraph,
    png,
    table_html,
)
from mia_ray.reports.io import write_text

__all__ = ["fmt_improvement", "layer_figure", "render_lumia_report"]

CHANCE_AUC = 0.5
SUCCESS_AUC = 0.6  # the paper's threshold for a successful MIA (§4.2, after Duan et al.)
PART_ORDER = ("text", "vision", "language")

HOW_TO_READ = (
    "LUMIA asks, layer by layer, whether the model's internal state gives away which documents "
    "it was trained on. For every layer, a small probe (an MLP, and a logistic regression) "
    "learns to predict member or non-member from the layer's hidden state averaged over the "
    "document's tokens. Each probe is scored by its AUC on held-out documents it never saw in "
    "training: the documents are split 80/20 into training and test parts (grouped, so that "
    "pieces of one document never sit on both sides), and the split is repeated; the numbers "
    "are the mean ± standard deviation over the repeats. Early stopping uses a validation fold "
    "carved from the training part, never the test part. AUC 0.5 is chance (dashed line); the "
    "paper counts an attack as successful above 0.6 (dotted line). The best layer is the one "
    "with the highest mean validation AUC, so choosing it never looks at the test part; its "
    "test AUC is what the tables report. "
    "The comparison table sets it against the classic attacks (loss, reference model, zlib, "
    "min-k%) on the same test folds, and against the blind baseline: a bag-of-words classifier "
    "that never sees the model. A probe only shows training signal where it beats the blind "
    "baseline."
)


LAYER_COLUMNS = ["part", "probe", "layer", "AUC (mean ± std)", "TPR @ 1% FPR", "epochs", "repeats"]
BEST_COLUMNS = ["part", "probe", "layer", "AUC (mean ± std)", "TPR @ 1% FPR"]
COMPARISON_COLUMNS = [
    "method",
    "method AUC",
    "method TPR @ 1% FPR",
    "LUMIA AUC (best layer)",
    "AUC difference",
    "improvement",
]


# ------------------------------------------------------------------------------ helpers


def _float(x: Any) -> float:
    """A number as float; None, NaN, strings and the like as NaN."""
    if is_missing(x):
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _records(rows: Any) -> list[Mapping[str, Any]]:
    """Rows as a list of mappings: accepts a pandas DataFrame or an iterable of mappings."""
    if rows is None:
        return []
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):  # a DataFrame, without pandas
        return list(rows.to_dict("records"))
    return [r for r in rows if isinstance(r, Mapping)]


def _parts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen = list(dict.fromkeys(str(r.get("part", "text")) for r in rows))
    known = [p for p in PART_ORDER if p in seen]
    return known + [p for p in seen if p not in known]


def _fmt_auc(mean: Any, std: Any) -> str:
    if is_missing(mean):
        return MISSING
    return fmt_num(mean) if is_missing(std) else f"{fmt_num(mean)} ± {fmt_num(std)}"


def _fmt_tpr(tpr: Any, std: Any = None) -> str:
    if is_missing(tpr):
        return MISSING
    return fmt_pct(tpr) if is_missing(std) else f"{fmt_pct(tpr)} ± {100 * float(std):.1f}"


def fmt_improvement(pct: Any) -> str:
    """``5.5555`` → ``"5.56%"`` (the paper's Table 1 style); missing → ``"—"``."""
    return MISSING if is_missing(pct) else f"{float(pct):.2f}%"


def _best_of(rows: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The row with the highest validation AUC (as the pipeline picks l*), else test AUC."""
    scored = [r for r in rows if math.isfinite(_float(r.get("auc_mean")))]
    if not scored:
        return None
    key = (
        "val_auc_mean"
        if all(math.isfinite(_float(r.get("val_auc_mean"))) for r in scored)
        else "auc_mean"
    )
    return max(scored, key=lambda r: _float(r[key]))


def _key(row: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(row.get("part", "text")), str(row.get("probe", "")), str(row.get("layer", "")))


# ------------------------------------------------------------------------------------ plot


def layer_figure(layers_rows: Any, title: str = "AUC by layer") -> bytes | None:
    """AUC by layer, one line per probe kind with a ±std band, one panel per part (text; or
    vision and language side by side), chance (0.5, dashed) and the paper's success threshold
    (0.6, dotted), each panel's best layer starred. PNG bytes; None when no row has an AUC.

    ``layers_rows``: report.json's ``layers`` rows, or a DataFrame of them.
    """
    rows = [r for r in _records(layers_rows) if math.isfinite(_float(r.get("auc_mean")))]
    if not rows:
        return None
    from matplotlib.ticker import MaxNLocator

    parts = _parts(rows)
    probes = list(dict.fromkeys(str(r.get("probe", "probe")) for r in rows))
    colors = dict(zip(probes, palette(len(probes)), strict=False))
    fig, axes = new_figure(max(5.5, 5.2 * len(parts)), 3.8, ncols=len(parts))
    lo, hi = CHANCE_AUC, SUCCESS_AUC
    for ax, part in zip(axes, parts, strict=True):
        in_part = [r for r in rows if str(r.get("part", "text")) == part]
        for probe in probes:
            pr = sorted(
                (r for r in in_part if str(r.get("probe", "probe")) == probe),
                key=lambda r: _float(r.get("layer")),
            )
            if not pr:
                continue
            x = [_float(r.get("layer")) for r in pr]
            y = [_float(r["auc_mean"]) for r in pr]
            s = [_float(r.get("auc_std")) for r in pr]
            s = [0.0 if not math.isfinite(v) else v for v in s]
            down = [m - d for m, d in zip(y, s, strict=True)]
            up = [m + d for m, d in zip(y, s, strict=True)]
            color = colors[probe]
            ax.plot(x, y, color=color, marker="o", markersize=3, linewidth=1.6, label=probe)
            ax.fill_between(x, down, up, color=color, alpha=0.2, linewidth=0)
            lo, hi = min(lo, *down), max(hi, *up)
        best = _best_of(in_part)
        if best is not None:
            bx, by = _float(best.get("layer")), _float(best["auc_mean"])
            ax.scatter(
                [bx],
                [by],
                marker="*",
                s=180,
                color="black",
                zorder=5,
                label=f"best: layer {best.get('layer')} ({best.get('probe')}), {by:.3f}",
            )
        ax.axhline(CHANCE_AUC, color="#57606a", linestyle="--", linewidth=1, label="chance (0.5)")
        ax.axhline(
            SUCCESS_AUC, color="#cf222e", linestyle=":", linewidth=1.3, label="success (0.6)"
        )
        ax.set_title(f"{title}: {part}" if len(parts) > 1 or part != "text" else title)
        ax.set_xlabel("layer (output of block l)")
        ax.set_ylabel("test AUC (mean ± std)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small", framealpha=0.9)
    for ax in axes:
        ax.set_ylim(max(0.0, lo - 0.03), min(1.02, hi + 0.03))
    return png(fig)


# ------------------------------------------------------------------------------------ page


def _run_results(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    runs = [r for r in report.get("runs") or [] if isinstance(r, Mapping)]
    return runs or [report]


def _lumia_auc(run: Mapping[str, Any], best: Mapping[str, Any] | None) -> float:
    if best is not None and math.isfinite(_float(best.get("auc_mean"))):
        return _float(best["auc_mean"])
    for c in run.get("comparison") or []:
        if math.isfinite(_float(c.get("lumia_auc"))):
            return _float(c["lumia_auc"])
    return math.nan


def _comparison_rows(
    run: Mapping[str, Any], best: Mapping[str, Any] | None
) -> tuple[list[list[str]], list[int]]:
    """Rows of the comparison table and the index of the blind baseline's row (if any)."""
    baselines: Mapping[str, Mapping[str, Any]] = run.get("baselines") or {}
    lumia = _lumia_auc(run, best)
    entries = [c for c in run.get("comparison") or [] if isinstance(c, Mapping)]
    if not entries:  # derive from the baselines when the pipeline left no comparison
        entries = [{"method": k, "method_auc": v.get("auc")} for k, v in baselines.items()]

    def row(name: str, method_auc: Any, std: Any, tpr: Any, lumia_auc: Any, pct: Any) -> list:
        m, lu = _float(method_auc), _float(lumia_auc)
        if is_missing(pct) and math.isfinite(m) and math.isfinite(lu) and m > 0:
            pct = (lu - m) / m * 100
        diff = f"{lu - m:+.3f}" if math.isfinite(m) and math.isfinite(lu) else MISSING
        return [
            name,
            _fmt_auc(method_auc, std),
            _fmt_tpr(tpr),
            fmt_num(lumia_auc),
            diff,
            fmt_improvement(pct),
        ]

    rows, highlight = [], []
    for c in entries:
        name = str(c.get("method", MISSING))
        base = baselines.get(name) or {}
        lumia_auc = c.get("lumia_auc", lumia)
        rows.append(
            row(
                name,
                c.get("method_auc", base.get("auc")),
                base.get("auc_std"),
                base.get("tpr_at_1pct_fpr"),
                lumia_auc,
                c.get("improvement_pct"),
            )
        )
        if name.startswith("blind"):
            highlight.append(len(rows) - 1)
    blind = run.get("blind_baseline")
    if isinstance(blind, Mapping) and not highlight:
        method = blind.get("method")
        label = f"blind baseline ({method})" if method else "blind baseline"
        highlight.append(len(rows))
        rows.append(
            row(
                label,
                blind.get("auc"),
                blind.get("auc_std"),
                blind.get("tpr_at_1pct_fpr"),
                lumia,
                None,
            )
        )
    return rows, highlight


def _verdict(run: Mapping[str, Any], best: Mapping[str, Any] | None) -> str:
    if best is None or not math.isfinite(_float(best.get("auc_mean"))):
        return "No probe produced an AUC."
    auc = _float(best["auc_mean"])
    where = f"{best.get('part', 'text')} / {best.get('probe')} / layer {best.get('layer')}"
    text = f"Best layer: {where}, AUC {_fmt_auc(best.get('auc_mean'), best.get('auc_std'))}"
    if auc > SUCCESS_AUC:
        text += ", above the paper's 0.6 success threshold"
    elif auc > CHANCE_AUC:
        text += ", above chance but below the paper's 0.6 success threshold"
    else:
        text += ", no better than chance"
    blind = run.get("blind_baseline")
    b_auc = _float(blind.get("auc")) if isinstance(blind, Mapping) else math.nan
    if not math.isfinite(b_auc):
        return text + ". No blind baseline was computed, so this number cannot be judged alone."
    text += f"; blind baseline {_fmt_auc(blind.get('auc'), blind.get('auc_std'))}"
    if auc > b_auc:
        return text + ". The probe is ahead of the blind baseline."
    return (
        text + ". The probe does not beat the blind baseline: no membership signal beyond how "
        "the two sets differ as texts."
    )


def _h3(text: str) -> str:
    return f"<h3>{escape(text)}</h3>"


def _run_body(run: Mapping[str, Any]) -> str:
    model = run.get("model") or {}
    data = run.get("data") or {}
    layers = _records(run.get("layers"))
    best = run.get("best_layer") if isinstance(run.get("best_layer"), Mapping) else None
    best = best or _best_of(layers)
    best_rows = [r for r in run.get("best_layers") or [] if isinstance(r, Mapping)]
    if not best_rows and best is not None:
        best_rows = [best]

    facts: dict[str, Any] = {"model": model.get("name_or_path") or model.get("name") or MISSING}
    if model.get("reference"):
        facts["reference model"] = model["reference"]
    if "multimodal" in model:
        facts["multimodal"] = "yes" if model["multimodal"] else "no"
    facts["samples"] = data.get("n_samples", MISSING)
    facts["members / non-members"] = (
        f"{data.get('n_members', MISSING)} / {data.get('n_nonmembers', MISSING)}"
    )
    for key, label in (
        ("n_documents", "documents"),
        ("sample", "sample"),
        ("max_length", "max tokens"),
    ):
        if key in data:
            facts[label] = data[key]
    probe = run.get("probe") or {}
    if probe:
        facts["probes"] = ", ".join(map(str, probe.get("kinds") or [])) or MISSING
        facts["repeats"] = probe.get("repeats", MISSING)
    parts = [paragraph(_verdict(run, best), cls="verdict"), definition_list(facts)]

    png = layer_figure(layers, title=f"AUC by layer, {run.get('target') or 'target'}")
    if png:
        parts.append(img_html(png, "test AUC by layer for every probe kind"))

    best_key = _key(best) if best is not None else None
    if best_rows:
        rows = [
            [
                str(r.get("part", "text")),
                str(r.get("probe", MISSING)),
                str(r.get("layer", MISSING)),
                _fmt_auc(r.get("auc_mean"), r.get("auc_std")),
                _fmt_tpr(r.get("tpr_at_1pct_fpr")),
            ]
            for r in best_rows
        ]
        marked = [i for i, r in enumerate(best_rows) if _key(r) == best_key]
        parts.append(_h3("Best layers"))
        parts.append(
            table_html(
                rows,
                BEST_COLUMNS,
                highlight=marked,
                caption="The best layer per part and probe kind; the highlighted row is "
                "the best overall.",
            )
        )

    comp_rows, comp_marked = _comparison_rows(run, best)
    if comp_rows:
        parts.append(_h3("Comparison with the attacks (Table 1 layout)"))
        parts.append(
            table_html(
                comp_rows,
                COMPARISON_COLUMNS,
                highlight=comp_marked,
                caption="Improvement = (LUMIA AUC − method AUC) / method AUC, in percent, as in "
                "the paper; the AUC difference says the same without inflating gains over "
                "methods near or below chance. Same test folds, mean over the repeats.",
            )
        )

    if layers:
        per_best = {_key(r) for r in best_rows}
        rows = [
            [
                str(r.get("part", "text")),
                str(r.get("probe", MISSING)),
                str(r.get("layer", MISSING)),
                _fmt_auc(r.get("auc_mean"), r.get("auc_std")),
                _fmt_tpr(r.get("tpr_at_1pct_fpr"), r.get("tpr_std")),
                fmt_num(r.get("epochs_mean"), 1),
                str(r.get("n_repeats", MISSING)),
            ]
            for r in layers
        ]
        marked = [i for i, r in enumerate(layers) if _key(r) in per_best]
        table = table_html(
            rows,
            LAYER_COLUMNS,
            highlight=marked,
            caption="Every probe at every layer; highlighted: the best layer per part and probe. "
            "Epochs: mean training epochs before early stopping (MLP).",
        )
        opened = " open" if len(rows) <= 48 else ""
        parts.append(_h3("All layers"))
        parts.append(f"<details{opened}><summary>{len(rows)} rows</summary>{table}</details>")

    ngram = [r for r in run.get("ngram_overlap") or [] if isinstance(r, Mapping)]
    if ngram:
        rows = [
            [
                str(r.get("n", MISSING)),
                fmt_num(r.get("p"), 2),
                fmt_num(r.get("mean")),
                fmt_num(r.get("median")),
                fmt_pct(r.get("share_at_least_p")),
                str(r.get("n_texts", MISSING)),
                str(r.get("n_too_short", MISSING)),
            ]
            for r in ngram
        ]
        cols = ["N", "P", "mean overlap", "median overlap", "share ≥ P", "texts", "too short"]
        parts.append(_h3("Member / non-member n-gram overlap"))
        parts.append(paragraph(NGRAM_EXPLAINED) + table_html(rows, cols))

    notes = run.get("notes") or []
    if notes:
        parts.append(_h3("Notes"))
        parts.append(list_html(notes))
    timings = run.get("timings") or {}
    if timings:
        parts.append(_h3("Timings"))
        parts.append(
            table_html([[k, fmt_num(v, 1)] for k, v in timings.items()], ["stage", "value"])
        )
    return "".join(parts)


def _summary(runs: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for run in runs:
        best = run.get("best_layer") if isinstance(run.get("best_layer"), Mapping) else None
        best = best or _best_of(_records(run.get("layers")))
        blind = run.get("blind_baseline")
        where = (
            f"{best.get('part', 'text')} / {best.get('probe')} / {best.get('layer')}"
            if best
            else MISSING
        )
        rows.append(
            [
                str(run.get("target") or MISSING),
                str((run.get("model") or {}).get("name_or_path") or MISSING),
                where,
                _fmt_auc(best.get("auc_mean"), best.get("auc_std")) if best else MISSING,
                _fmt_tpr(best.get("tpr_at_1pct_fpr")) if best else MISSING,
                _fmt_auc(blind.get("auc"), blind.get("auc_std"))
                if isinstance(blind, Mapping)
                else MISSING,
            ]
        )
    cols = [
        "target",
        "model",
        "best part / probe / layer",
        "best AUC",
        "TPR @ 1% FPR",
        "blind baseline AUC",
    ]
    return table_html(rows, cols, highlight=[0], caption="The first target is the primary one.")


def render_lumia_report(report: Mapping[str, Any], out_path: str | os.PathLike) -> Path:
    """Write LUMIA's ``report.html`` from its report.json dict; return its path.

    One section per target (``report["runs"]``, or the top level as a single run): facts,
    the AUC-by-layer plot, best layers, the comparison with the attacks and the blind
    baseline, every layer's row, the n-gram overlap and notes. Missing pieces (no blind
    baseline, no attacks, NaN values) are left out or shown as "—".
    """
    runs = _run_results(report)
    primary = runs[0]
    model = (primary.get("model") or {}).get("name_or_path") or primary.get("target") or "model"
    title = f"LUMIA: membership signal by layer in {model}"
    targets = report.get("targets") or [r.get("target") for r in runs if r.get("target")]
    subtitle = " · ".join(
        s
        for s in (
            f"targets: {', '.join(map(str, targets))}" if targets else "",
            f"created {report['created']}" if report.get("created") else "",
        )
        if s
    )
    sections: list[tuple[str, str]] = [("", f'<div class="howto">{paragraph(HOW_TO_READ)}</div>')]
    if len(runs) > 1:
        sections.append(("Summary", _summary(runs)))
    for i, run in enumerate(runs):
        name = run.get("target") or f"run {i + 1}"
        m = (run.get("model") or {}).get("name_or_path")
        heading = f"Target {name}" + (f" ({m})" if m and m != name else "")
        sections.append((heading, _run_body(run)))
    runtime = report.get("runtime") or {}
    if runtime:
        sections.append(("Runtime", definition_list(runtime)))
    return write_text(out_path, page(title, sections, subtitle=subtitle))
