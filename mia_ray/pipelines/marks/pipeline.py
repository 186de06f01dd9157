"""`mia-ray mark`: the owner's files with randomized marks, and the secret key; `mia-ray
verify`: each mark's published candidate ranked among its unpublished alternatives under a
model (the shared Scorer pool on Ray Data), an exact p-value per mark, a combined one, and
per-file verdicts under Benjamini-Hochberg."""

from __future__ import annotations

import time
from fractions import Fraction
from math import ceil
from pathlib import Path

import numpy as np
import pandas as pd

from mia_ray.data.marks import candidates_of, count_in, insert_mark, new_key, published, read_key
from mia_ray.errors import MiaError
from mia_ray.pipelines.common import check_target_early, log, world_copy
from mia_ray.pipelines.marks.config import MarkJobConfig, VerifyJobConfig
from mia_ray.registry import pipeline
from mia_ray.runtime import describe

PREMISE = (
    "exact by the owner's randomization: each mark's published candidate was drawn uniformly "
    "from its K candidates, so a model that never trained on text carrying it ranks it like "
    "any other, whatever the files' text and the model"
)


def _documents(path: str, cfg) -> pd.DataFrame:
    from mia_ray.data.readers import read_documents

    d = cfg.data
    docs = read_documents(path, format=d.format, text_field=d.text_field, id_field=d.id_field)
    return docs.select_columns(["doc_id", "text"]).to_pandas().sort_values("doc_id")


def _format_of(path: str, fmt: str) -> str:
    from mia_ray.data.sources import resolve_source

    return resolve_source(path, fmt).fmt if fmt == "auto" else fmt


def _write_marked(docs: pd.DataFrame, fmt: str, out: Path, cfg) -> Path:
    """The marked documents in the input's format: a text file per document under its id, or
    one jsonl / parquet of (id field, text field)."""
    from mia_ray.reports.io import write_parquet, write_text

    if fmt == "text":
        for doc_id, text in zip(docs["doc_id"], docs["text"], strict=True):
            write_text(out / doc_id, text)
        return out
    frame = pd.DataFrame({cfg.data.id_field: docs["doc_id"], cfg.data.text_field: docs["text"]})
    if fmt == "parquet":
        return write_parquet(out / "marked.parquet", frame)
    return write_text(out / "marked.jsonl", frame.to_json(orient="records", lines=True,
                                                          force_ascii=False))  # fmt: skip


@pipeline(
    "mark",
    MarkJobConfig,
    help="insert randomized marks into your files before publishing; writes a secret key",
    flags=(
        ("in", "mark.input", "the files to mark (any format the data layer reads)"),
        ("key", "mark.key", "where to write the secret key (never overwritten)"),
    ),
)
def run_mark(cfg: MarkJobConfig, out: Path) -> dict:
    from mia_ray.reports.io import write_json

    m = cfg.mark
    key_path = Path(m.key).expanduser()
    if key_path.exists():
        raise MiaError(
            f"key file exists: {key_path}; mark never overwrites a key (it is what proves the "
            "marks): choose another path"
        )
    docs = _documents(m.input, cfg)
    fmt = _format_of(m.input, cfg.data.format)
    key = new_key(list(docs["doc_id"]), m.kind, m.length, m.candidates, m.copies, m.per)
    pub = published(key)
    text = dict(zip(docs["doc_id"], docs["text"], strict=True))
    for mark in key["marks"]:
        for f in mark["files"]:
            text[f] = insert_mark(text[f], pub[mark["mark_id"]], m.copies, key, f)
    docs["text"] = docs["doc_id"].map(text)
    where = _write_marked(docs, fmt, out / "marked", cfg)
    # Read back as a user would: every file carries its mark whole, whitespace normalized.
    back = dict(zip(*_documents(str(where), cfg)[["doc_id", "text"]].to_numpy().T, strict=True))
    lost = [f for mk in key["marks"] for f in mk["files"]
            if count_in(back.get(f, ""), pub[mk["mark_id"]]) < m.copies]  # fmt: skip
    if lost:
        raise MiaError(f"{len(lost)} marked file(s) lost their mark on writing, e.g. {lost[0]}")
    write_json(key_path, key)
    log(f"{len(key['marks'])} mark(s) in {len(docs)} file(s) under {where}; key: {key_path}")
    report = {
        "pipeline": "mark",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_id": key["run_id"],
        "key": str(key_path),
        "marked": str(where),
        "format": fmt,
        "n_files": len(docs),
        "n_marks": len(key["marks"]),
        "settings": {k: getattr(m, k) for k in ("kind", "length", "candidates", "copies", "per")},
        "note": "Keep the key secret and safe, and publish the files under marked/ only: the "
        "key regenerates every candidate, and `mia-ray verify --key` tests a model with it.",
        "runtime": describe(),
    }
    write_json(out / "report.json", report)
    return report


def _found(key: dict, files: str, cfg) -> dict[str, dict]:
    """Per mark: in how many of its files the published copy still carries it."""
    docs = _documents(files, cfg)
    text = dict(zip(docs["doc_id"], docs["text"], strict=True))
    pub = published(key)
    out = {}
    for mark in key["marks"]:
        present = [f for f in mark["files"] if f in text]
        carrying = [f for f in present if count_in(text[f], pub[mark["mark_id"]]) > 0]
        out[mark["mark_id"]] = {"files": len(mark["files"]), "present": len(present),
                                "carrying": len(carrying)}  # fmt: skip
    if not any(v["carrying"] for v in out.values()):
        raise MiaError(
            f"none of the key's {len(key['marks'])} marks is in {files}: the key is of another "
            f"run (its run id is {key['run_id']}) or these files were not marked with it"
        )
    return out


def _scores(cfg: VerifyJobConfig, key: dict, out: Path) -> pd.DataFrame:
    """Every candidate of every mark scored under the model (mark_id, candidate, loss): the
    Scorer pool's plain pass, a resumable stage keyed by the key's candidates and the model."""
    from mia_ray.scoring.pools import score_pool

    rows = pd.DataFrame(
        [
            {"snippet_id": f"{mk['mark_id']}/{j:06d}", "text": c}
            for mk in key["marks"]
            for j, c in enumerate(candidates_of(key, mk["mark_id"]))
        ]
    )
    log(f"scoring {len(rows)} candidates ({len(key['marks'])} marks x {key['candidates']})")
    scored = score_pool(rows, cfg.model, cfg.resources, cfg.model.name_or_path, "", False, False,
                        out / "rows" / "candidates", what="candidates")  # fmt: skip
    df = scored[["snippet_id", "loss"]].copy()
    df[["mark_id", "candidate"]] = df["snippet_id"].str.split("/", expand=True)
    df["candidate"] = df["candidate"].astype(int)
    if not np.isfinite(df["loss"]).all():
        raise MiaError("the model gave a non-finite loss to a candidate: check its dtype")
    return df.sort_values(["mark_id", "candidate"]).reset_index(drop=True)


def mark_pvalues(key: dict, scores: pd.DataFrame) -> pd.DataFrame:
    """Per mark: the published candidate's score (-loss), its rank among the K and the exact
    p-value (1 + #{alternatives scoring at least as high}) / K, as a Fraction too."""
    # One pass over the rows: each mark's scores in candidate order (``scores`` is sorted).
    by_mark = {m: -g["loss"].to_numpy() for m, g in scores.groupby("mark_id", sort=False)}
    rows = []
    for mk in key["marks"]:
        s = by_mark.get(mk["mark_id"], np.empty(0))
        if s.size != key["candidates"]:
            raise MiaError(
                f"mark {mk['mark_id']}: {s.size} scores for {key['candidates']} candidates"
            )
        mine = s[mk["chosen"]]
        others = np.delete(s, mk["chosen"])
        at_least = int(np.count_nonzero(others >= mine))
        rows.append({"mark_id": mk["mark_id"], "files": mk["files"], "score": float(mine),
                     "alternatives_mean": float(others.mean()), "rank": 1 + at_least,
                     "p_exact": Fraction(1 + at_least, s.size)})  # fmt: skip
    df = pd.DataFrame(rows)
    df["p_value"] = df["p_exact"].astype(float)
    return df


def _decide(marks: pd.DataFrame, tested: pd.DataFrame, key: dict, v, with_files: bool):
    """The combined test over the ``tested`` marks, and Benjamini-Hochberg over their exact
    p-values; fills ``marks``' q_value, flagged and verdict. Returns (statistic, p)."""
    from mia_ray.stats.audit import benjamini_hochberg
    from mia_ray.stats.ranks import combined_pvalue

    stat, p = combined_pvalue(tested["p_value"].to_numpy(), key["candidates"], v.draws, v.seed)
    flagged, adjusted = benjamini_hochberg(list(tested["p_exact"]), v.fdr)
    marks["q_value"] = np.nan
    marks["flagged"] = False
    marks.loc[tested.index, "q_value"] = adjusted
    marks.loc[tested.index, "flagged"] = flagged
    marks["verdict"] = np.where(
        marks["flagged"], "trained on text carrying the mark", "no evidence at this FDR"
    )
    if with_files:
        lost = marks["carrying"] == 0
        marks.loc[lost, "verdict"] = "mark not found in the published copy: no verdict"
    return stat, p


def _verdict(name: str, p: float, n_tested: int, n_flagged: int, v) -> str:
    text = (
        f"{'Evidence' if p <= 0.05 else 'No evidence'} that {name} trained on text carrying "
        f"the marks: p = {p:.2g} over {n_tested} mark(s) (Fisher's combination of exact rank "
        f"p-values, {v.draws} Monte Carlo draws); {n_flagged} of {n_tested} mark(s) flagged "
        f"at {v.fdr:.0%} FDR. {PREMISE[0].upper() + PREMISE[1:]}."
    )
    if p > 0.05:
        text += (
            " No evidence is not proof of no training: a mark must be seen often enough and be "
            "long enough to be remembered (docs/marks.md: the limits measured)."
        )
    return text


def resolve_verify(cfg: VerifyJobConfig) -> VerifyJobConfig:
    """The demo world's model, its marks' key and its published (marked) documents filled in."""
    cfg, info = world_copy(cfg, "marks_key", "marks")
    if info:
        cfg.verify.key = cfg.verify.key or info["marks_key"]
        cfg.verify.files = cfg.verify.files or info["documents"]
        cfg.model.name_or_path = cfg.model.name_or_path or info["model"]
    return cfg


@pipeline(
    "verify",
    VerifyJobConfig,
    help="test a model with the key of `mia-ray mark`: an exact p-value per mark and in all",
    flags=(
        ("model", "model.name_or_path", "the model to test: a hub name or a local folder"),
        ("key", "verify.key", "the key file `mia-ray mark` wrote"),
        ("files", "verify.files", "a copy of the published files, to check the marks are there"),
    ),
    resolve=resolve_verify,
)
def run_verify(cfg: VerifyJobConfig, out: Path) -> dict:
    from mia_ray.reports.io import write_json, write_parquet
    from mia_ray.reports.marks import render_verify_report
    from mia_ray.stats.ranks import floor_marks

    t0 = time.time()
    v = cfg.verify
    key = read_key(v.key)
    check_target_early(cfg.model)
    found = _found(key, v.files, cfg) if v.files else None
    scores = _scores(cfg, key, out)
    marks = mark_pvalues(key, scores)
    if found is not None:
        marks["carrying"] = marks["mark_id"].map(lambda m: found[m]["carrying"])
        marks["present"] = marks["mark_id"].map(lambda m: found[m]["present"])
    tested = marks if found is None else marks[marks["carrying"] > 0]
    stat, p = _decide(marks, tested, key, v, found is not None)
    text = _verdict(cfg.model.name_or_path, p, len(tested), int(marks["flagged"].sum()), v)
    log(text)
    need = floor_marks(len(tested), key["candidates"], v.fdr)
    if need > 1:
        log(f"per-file verdicts: with K = {key['candidates']} and {len(tested)} marks, no mark is "
            f"flagged alone; at least {need} must rank first together (K >= "
            f"{ceil(len(tested) / v.fdr)} lets one mark be flagged alone)")  # fmt: skip
    write_parquet(out / "candidate_scores.parquet", scores)
    table = marks.drop(columns=["p_exact"])
    report = {
        "pipeline": "verify",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": cfg.model.name_or_path,
        "run_id": key["run_id"],
        "settings": {k: key[k] for k in ("kind", "length", "candidates", "copies", "per")},
        "premise": {
            "statement": "M never trained on text carrying the published marks (H0)",
            "kind": "randomized",
            "proof": PREMISE,
        },
        "combined_test": {
            "statistic": "Fisher: -2 sum log p",
            "value": stat,
            "p_value": p,
            "draws": v.draws,
            "n_marks": int(len(tested)),
            "reject": p <= 0.05,
            "smallest_p_value": 1 / (v.draws + 1),
        },
        "per_mark": {
            "fdr": v.fdr,
            "n_flagged": int(marks["flagged"].sum()),
            "smallest_p_value": 1 / key["candidates"],
            "marks_needed_at_floor": floor_marks(len(tested), key["candidates"], v.fdr),
        },
        "marks": table.to_dict(orient="records"),
        "verdict": {"text": text, "trained": p <= 0.05},
        "runtime": describe(),
        "timings": {"total_s": round(time.time() - t0, 2)},
    }
    write_json(out / "report.json", report)
    render_verify_report(report, out / "report.html")
    return report
