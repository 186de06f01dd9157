"""`mia-ray audit`: did model M train on these files?

suspected + unseen files → sources (a group field, near-duplicates) → the same number of
full-size snippets per file → one Scorer pass per model (target, reference) → attack features
per snippet → file rows → a cross-fitted monotone discriminant with a permutation test of
the whole procedure (``detectors.dataset_inference``, after Maini et al. 2024), a null check
(unseen vs unseen) and a blind check (text only, Das et al. 2024) → per-file split-conformal
p-values → Benjamini-Hochberg in exact arithmetic → report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path

import numpy as np
import pandas as pd

from mia_ray.config import AttackConfig, AttackJobConfig, AuditJobConfig
from mia_ray.errors import MiaError
from mia_ray.pipelines.common import check_model_early, check_target_early, log
from mia_ray.registry import pipeline
from mia_ray.runtime import describe

FLAGS = (
    ("model", "model.name_or_path", "the model to audit: a hub name or a local folder"),
    ("suspected", "audit.suspected", "the files you think it trained on"),
    ("unseen", "audit.unseen", "files of the same kind it surely never saw"),
    ("reference", "model.reference", "a reference model that did not train on the files"),
    ("group-by", "data.group_field", "the field naming each file's source (folder: its folder)"),
)
SIDES = ("suspected", "unseen")
NULL_CHECK_MIN_UNSEEN = 8  # two pseudo-sides of 4 groups: each still needs 2 per half
LENGTH_RATIO_WARNING = 2.0  # median words per file of one side over the other's


def _resolve_world(cfg: AuditJobConfig) -> None:
    """With ``world.target``: the demo world's books, split for the audit, and its models."""
    if not cfg.world.target:
        return
    from mia_ray.demo.world import ensure_audit_books, ensure_world

    log(f"demo world at {cfg.world.resolved_root()} (target {cfg.world.target})")
    info = ensure_world(cfg.world, [cfg.world.target])
    split = ensure_audit_books(info["root"], cfg.world.target)
    cfg.audit.suspected = cfg.audit.suspected or split["suspected"]
    cfg.audit.unseen = cfg.audit.unseen or split["unseen"]
    cfg.data.labels = cfg.data.labels or split["labels"]
    cfg.model.name_or_path = cfg.model.name_or_path or info["model"]
    cfg.model.reference = cfg.model.reference or info["reference"]


def _read_side(cfg: AuditJobConfig, side: str) -> pd.DataFrame:
    from mia_ray.data.readers import read_documents

    path = getattr(cfg.audit, side)
    try:
        ds = read_documents(
            path,
            format=cfg.data.format,
            text_field=cfg.data.text_field,
            id_field=cfg.data.id_field,
            label_field=cfg.data.label_field,
            date_field=cfg.data.date_field,
            group_field=cfg.data.group_field,
        )
    except MiaError as e:
        raise MiaError(f"--{side} ({path}): {e}") from None
    cols = ["doc_id", "text", *(["group"] if cfg.data.group_field else [])]
    df = ds.select_columns(cols).to_pandas()
    if df.empty:
        raise MiaError(f"--{side} ({path}) holds no documents")
    df["file_id"] = df["doc_id"].astype(str)
    df["doc_id"] = f"{side}/" + df["file_id"]
    df["side"] = int(side == "suspected")
    if "group" not in df:
        df["group"] = df["file_id"]
    return df


def read_inputs(cfg: AuditJobConfig) -> pd.DataFrame:
    """Both sides as one frame: doc_id (``suspected/<id>``, ``unseen/<id>``), file_id, text,
    side (1 suspected, 0 unseen), group (``data.group_field``'s value, else the file id). A
    text on both sides, or a group on both sides, is an error."""
    sus, uns = (_read_side(cfg, side) for side in SIDES)
    digest = {
        side: df["text"].map(lambda t: hashlib.sha256(t.encode()).hexdigest())
        for side, df in (("suspected", sus), ("unseen", uns))
    }
    shared = sorted(set(digest["suspected"]) & set(digest["unseen"]))
    if shared:
        a = sus["file_id"][digest["suspected"] == shared[0]].iloc[0]
        b = uns["file_id"][digest["unseen"] == shared[0]].iloc[0]
        raise MiaError(
            f"--suspected and --unseen share {len(shared)} file(s) with the same text, e.g. "
            f"{a!r} and {b!r}: a file cannot be both suspected and surely unseen"
        )
    if cfg.data.group_field:
        both = sorted(set(sus["group"]) & set(uns["group"]))
        if both:
            raise MiaError(
                f"group {both[0]!r} (data.group_field {cfg.data.group_field!r}) has files in "
                f"both --suspected and --unseen ({len(both)} such group(s)): a source cannot be "
                "both suspected and surely unseen"
            )
    return pd.concat([sus, uns], ignore_index=True)


def assign_sources(files: pd.DataFrame, near_duplicates: bool) -> tuple[pd.DataFrame, dict]:
    """Each file's ``source``: its group, joined with every file it shares long spans with
    (``data.neardup``, within a side). A suspected file that shares long spans with an unseen
    file is left out (it cannot be both). Returns the kept files with ``source`` and a summary
    (pairs found, files left out with the reason)."""
    from mia_ray.data.neardup import connected_groups, near_duplicate_pairs

    ids = files["doc_id"].tolist()
    side = dict(zip(ids, files["side"], strict=True))
    pairs = near_duplicate_pairs(ids, files["text"].tolist()) if near_duplicates else []
    cross = [(a, b, s) for a, b, s in pairs if side[a] != side[b]]
    left_out: dict[str, dict] = {}
    for a, b, share in cross:
        sus, uns = (a, b) if side[a] == 1 else (b, a)
        left_out.setdefault(
            sus,
            {
                "file_id": sus.split("/", 1)[1],
                "side": "suspected",
                "reason": f"shares {share:.0%} of its 8-word spans with unseen file "
                f"{uns.split('/', 1)[1]!r}: it cannot be both suspected and surely unseen",
            },
        )
    kept = files[~files["doc_id"].isin(left_out)].copy()
    links = [
        (a, b)
        for a, b, _ in pairs
        if side[a] == side[b] and a not in left_out and b not in left_out
    ]
    # The files of one given group, chained, join the same component.
    for _, members in kept.groupby(["side", "group"])["doc_id"]:
        m = sorted(members)
        links.extend(zip(m, m[1:], strict=False))
    comp = connected_groups(kept["doc_id"].tolist(), links)
    kept["source"] = kept["doc_id"].map(comp)
    summary = {
        "near_duplicates": bool(near_duplicates),
        "near_duplicate_pairs": [
            {"a": a, "b": b, "share": round(float(s), 4)} for a, b, s in pairs[:50]
        ],
        "n_near_duplicate_pairs": len(pairs),
        "left_out": list(left_out.values()),
    }
    return kept, summary


def select_snippets(
    cfg: AuditJobConfig, files: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The same number of full-size snippets for every file (``audit.snippets_per_file``, or the
    fewest any file has): files shorter than one snippet, or than the number asked for, are
    left out. Returns (kept files, snippets (snippet_id, doc_id, text), length summary)."""
    import ray

    from mia_ray.data.snippets import take_per_file
    from mia_ray.pipelines.common import snippets_of

    d = cfg.data
    full = dataclasses.replace(d, min_snippet_size=d.snippet_size + 1, max_snippets_per_doc=0)
    cut = snippets_of(ray.data.from_pandas(files[["doc_id", "text"]]), full, cfg.model.name_or_path)
    snip = cut.select_columns(["snippet_id", "doc_id", "text"]).to_pandas()
    if snip.empty:  # no block had a row: Ray gives no columns either
        snip = pd.DataFrame({"snippet_id": [], "doc_id": [], "text": []}, dtype=object)
    counts = snip.groupby("doc_id").size().reindex(files["doc_id"], fill_value=0)
    k = cfg.audit.snippets_per_file
    if not k:
        have = counts[counts > 0]
        k = int(have.min()) if len(have) else 1
        if d.max_snippets_per_doc > 0:
            k = min(k, d.max_snippets_per_doc)
    short = counts[counts < k]
    left_out = [
        {
            "file_id": doc.split("/", 1)[1],
            "side": doc.split("/", 1)[0],
            "reason": (
                f"shorter than one full snippet ({d.snippet_size} {d.snippet_unit})"
                if n == 0
                else f"{n} full snippet(s), fewer than audit.snippets_per_file = {k}"
            ),
        }
        for doc, n in short.items()
    ]
    kept = files[~files["doc_id"].isin(short.index)]
    chosen = take_per_file(snip[snip["doc_id"].isin(kept["doc_id"])], k, cfg.audit.seed)
    words = pd.Series([len(str(t).split()) for t in files["text"]], index=files["doc_id"])
    lengths = {"snippets_per_file": k}
    for side, name in ((1, "suspected"), (0, "unseen")):
        ids = files["doc_id"][files["side"] == side]
        w, c = words[ids], counts[ids]
        lengths[name] = {
            "files": int(len(ids)),
            "words_median": float(w.median()),
            "words_min": int(w.min()),
            "words_max": int(w.max()),
            "full_snippets_median": float(c.median()),
            "full_snippets_min": int(c.min()),
            "full_snippets_max": int(c.max()),
        }
    ws, wu = lengths["suspected"]["words_median"], lengths["unseen"]["words_median"]
    ratio = max(ws, wu) / max(1.0, min(ws, wu))
    lengths["warning"] = (
        f"the sides' lengths differ: a suspected file has {ws:g} words at the median, an unseen "
        f"one {wu:g}. Every file is scored on {k} snippet(s) of the same size, so their scores "
        "are comparable, but files of very different lengths may differ in kind too (the "
        "blind check tests that)"
        if ratio >= LENGTH_RATIO_WARNING
        else None
    )
    return kept, chosen, {"lengths": lengths, "left_out": left_out}


def check_counts(cfg: AuditJobConfig, n_suspected: int, n_unseen: int, unit: str = "file") -> dict:
    """Fail before any scoring when there are too few independent sources (``unit``: file or
    source) for the test or for any per-file verdict at ``audit.fdr``; return what the
    calibration allows."""
    from mia_ray.detectors.dataset_inference import MIN_GROUPS_PER_SIDE
    from mia_ray.stats.audit import min_calibration_files

    a = cfg.audit
    need = min_calibration_files(a.fdr)
    for n, side in ((n_suspected, "suspected"), (n_unseen, "unseen")):
        if n < MIN_GROUPS_PER_SIDE:
            raise MiaError(
                f"--{side} has {n} {unit}(s): the audit needs at least {MIN_GROUPS_PER_SIDE} "
                f"suspected and {max(MIN_GROUPS_PER_SIDE, 2 * need - 1)} unseen {unit}s (2 of each "
                "in each cross-fitting half)"
            )
    # A file is calibrated against the unseen sources of its own half: n // 2 or n - n // 2.
    n_cal, n_max = n_unseen // 2, n_unseen - n_unseen // 2
    if n_max < need:
        raise MiaError(
            f"--unseen has {n_unseen} {unit}(s): a suspected file is ranked against at most "
            f"{n_max} of them (those in its cross-fitting half), so its p-value is at least "
            f"1/{n_max + 1} = {1 / (n_max + 1):.3f} > audit.fdr = {a.fdr:g} and no file could "
            f"ever be flagged; give at least {2 * need - 1} unseen {unit}s (or raise audit.fdr)"
        )
    if a.null_check and n_unseen < NULL_CHECK_MIN_UNSEEN:
        raise MiaError(
            f"--unseen has {n_unseen} {unit}(s): the null check (unseen vs unseen) needs at "
            f"least {NULL_CHECK_MIN_UNSEEN}; add files or set audit.null_check=false"
        )
    min_p = 1 / (n_max + 1)
    return {
        "n_calibration": n_cal,
        "min_p_value": min_p,
        # BH flags k of m files only if the k-th smallest p-value is <= fdr * k / m.
        "min_flagged_together": int(np.ceil(n_suspected * min_p / a.fdr - 1e-12)),
    }


def _check_sources(cfg: AuditJobConfig, files: pd.DataFrame) -> tuple[dict, pd.Series]:
    """:func:`check_counts` on the independent sources of each side (files when none is
    grouped); returns its result and the sources per side (index 0 unseen, 1 suspected)."""
    n_src = files.groupby("side")["source"].nunique().reindex([0, 1], fill_value=0)
    unit = "source" if n_src.sum() < len(files) else "file"
    return check_counts(cfg, int(n_src[1]), int(n_src[0]), unit), n_src


def _truth(cfg: AuditJobConfig, files: pd.DataFrame) -> dict[str, int]:
    """data.labels (file id -> 0/1 over the suspected files), for scoring the verdicts."""
    if not cfg.data.labels:
        return {}
    from mia_ray.data.readers import load_manifest

    known = load_manifest(cfg.data.labels)
    sus = files[files["side"] == 1]
    return {
        d: int(known[f]) for d, f in zip(sus["doc_id"], sus["file_id"], strict=True) if f in known
    }


def feature_columns(snip: pd.DataFrame, names: list[str]) -> list[str]:
    cols = []
    for name in names:
        variants = [c for c in snip.columns if c.startswith(f"{name}@")]
        cols.extend(variants or [name])
    return cols


@pipeline(
    "audit",
    AuditJobConfig,
    help="did this model train on these files? a dataset-level p-value and per-file verdicts "
    "under false-discovery control",
    flags=FLAGS,
)
def run(cfg: AuditJobConfig, out: Path) -> dict:
    from mia_ray.pipelines.attack import score_attacks
    from mia_ray.pipelines.audit_methods import method_configs, run_methods

    t0 = time.time()
    _resolve_world(cfg)
    a = cfg.audit
    methods = method_configs(cfg)  # every requested method's config checks out before any work
    check_target_early(cfg.model)
    if cfg.model.reference:
        check_model_early(cfg.model.reference, "model.reference")
    files, sources = assign_sources(read_inputs(cfg), a.near_duplicates)
    _check_sources(cfg, files)
    files, snippets, lengths = select_snippets(cfg, files)
    left_out = sources.pop("left_out") + lengths.pop("left_out")
    for f in left_out:
        log(f"left out: {f['side']} file {f['file_id']}: {f['reason']}")
    try:
        calib, n_src = _check_sources(cfg, files)
    except MiaError as e:
        raise MiaError(
            f"{e}; that is after leaving out {len(left_out)} file(s) (the log lists them): "
            "shorter than audit.snippets_per_file full snippets, or near-duplicates of an "
            "unseen file. A smaller data.snippet_size or audit.snippets_per_file keeps more"
        ) from None
    truth = _truth(cfg, files)
    log(
        f"{int(files['side'].sum())} suspected and {int((files['side'] == 0).sum())} unseen "
        f"files ({int(n_src[1])} and {int(n_src[0])} independent sources), "
        f"{lengths['lengths']['snippets_per_file']} snippet(s) of each"
    )
    side = dict(zip(files["doc_id"], files["side"], strict=True))
    attacks = [*a.attacks, *(["ref"] if cfg.model.reference else [])]
    acfg = AttackJobConfig(
        data=cfg.data,
        model=cfg.model,
        resources=cfg.resources,
        attack=AttackConfig(
            attacks=attacks, min_k_ratios=list(a.min_k_ratios), min_k_ratio=a.min_k_ratios[0]
        ),
    )
    snip, _, ctx = score_attacks(acfg, out, labels=side, snippets=snippets)
    t_score = time.time() - t0
    features = feature_columns(snip, attacks)
    texts = ctx["snippets"].set_index("snippet_id")["text"]
    snip["text"] = snip["snippet_id"].map(texts)
    inputs = {**sources, **lengths, "left_out": left_out}
    report = analyse(cfg, snip, features, files, truth, calib, inputs)
    if methods:
        report["methods"] = run_methods(cfg, out, methods, ctx["target_rows"])
        _merge_copycheck(report)
    _write_outputs(out, snip, features, report)
    report["runtime"] = describe()
    report["timings"] = {
        "score_s": round(t_score, 2),
        "analysis_s": round(time.time() - t0 - t_score, 2),
        "n_snippets": int(len(snip)),
    }
    from mia_ray.reports.audit import render_audit_report
    from mia_ray.reports.io import write_json

    write_json(out / "report.json", report)
    render_audit_report(report, out / "report.html")
    log(report["verdict"]["text"])
    return report


def design_of(files: pd.DataFrame, F: np.ndarray, cfg: AuditJobConfig, nonneg: bool):
    """The test's :class:`Design` for ``files`` (doc_id, side, source; rows of ``F`` in order)."""
    from mia_ray.detectors.dataset_inference import Design

    codes, uniq = pd.factorize(files["source"], sort=True)
    side = files.groupby("source")["side"].first().reindex(uniq).to_numpy()
    seeds = list(range(cfg.audit.seed, cfg.audit.seed + cfg.audit.rounds))
    return Design(F, codes, side, seeds, C=cfg.audit.C, nonneg=nonneg)


def analyse(
    cfg: AuditJobConfig,
    snip: pd.DataFrame,
    features: list[str],
    files: pd.DataFrame,
    truth: dict[str, int],
    calib: dict,
    inputs: dict | None = None,
) -> dict:
    """The statistics of an audit from its snippet rows (doc_id, text, feature columns) and its
    files (doc_id, side, source)."""
    from mia_ray.detectors.dataset_inference import (
        audit,
        effect_size,
        file_matrix,
        null_check,
        permutation_test,
        text_matrix,
    )

    a = cfg.audit
    files = files.sort_values("doc_id").reset_index(drop=True)
    ids = files["doc_id"].tolist()
    units = snip["doc_id"].to_numpy()
    F = file_matrix(units, snip[features].to_numpy(dtype=np.float64), ids)
    design = design_of(files, F, cfg, nonneg=True)
    log(
        f"dataset test: {len(features)} features, {a.rounds} cross-fitting round(s), "
        f"{a.permutations} permutations"
    )
    got = audit(design, a.permutations, a.seed, a.alpha, a.fdr, a.fdr_method, a.file_rounds)
    test, rounds = got["test"], got["rounds"]
    is_sus = files["side"].to_numpy() == 1
    coefs = np.array([c for r in rounds for c in r.coefs])
    score = np.mean([r.score for r in rounds], axis=0)
    report: dict = {
        "pipeline": "audit",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"name_or_path": cfg.model.name_or_path, "reference": cfg.model.reference or None},
        "data": {
            "suspected": a.suspected,
            "unseen": a.unseen,
            "n_suspected": int(is_sus.sum()),
            "n_unseen": int((~is_sus).sum()),
            "n_sources_suspected": int(design.side.sum()),
            "n_sources_unseen": int((design.side == 0).sum()),
            "group_field": cfg.data.group_field or None,
            "n_snippets": int(len(snip)),
            "snippet": f"{cfg.data.snippet_size} {cfg.data.snippet_unit}",
            **{k: v for k, v in (inputs or {}).items() if k != "lengths"},
        },
        "lengths": (inputs or {}).get("lengths"),
        "dataset_test": {
            "test": "permutation test of the cross-fit: the mean held-out AUC (suspected vs "
            "unseen files, ties 1/2) of a monotone linear discriminant, against the same "
            "statistic with the sources' sides permuted",
            "h0": "the model scores suspected sources like unseen ones (their sides are "
            "exchangeable)",
            "rounds": a.rounds,
            **test,
            "effect_size": effect_size(design, rounds),
            "n_suspected": int(design.side.sum()),
            "n_unseen": int((design.side == 0).sum()),
            "halves": [
                {"seed": r.seed, "half": h, "auc": r.auc[h]} for r in rounds for h in (0, 1)
            ],
        },
        "features": _weights(features, coefs),
    }
    if a.null_check:
        log("null check: the same test on two random halves of the unseen sources")
        null = null_check(design, a.permutations, a.seed, a.alpha)
        report["null_check"] = _check_summary(null)
    if a.blind_check:
        log("blind check: the same test on the snippets' words alone (no model), weights free")
        T = text_matrix(units, snip["text"].tolist(), ids)
        blind = permutation_test(design_of(files, T, cfg, False), a.permutations, a.seed, a.alpha)
        report["blind_check"] = {
            "method": "tf-idf word 1-2 grams per file, truncated SVD, ridge discriminant with "
            "free weights (two-sided in effect), same cross-fitting and permutation test",
            **_check_summary(blind),
        }
    blind_rejects = bool(report.get("blind_check", {}).get("reject"))
    rows = _file_rows(files, got, score, snip.groupby("doc_id").size(), truth, blind_rejects)
    report["per_file"] = {
        "fdr": a.fdr,
        "method": a.fdr_method,
        "scheme": SCHEME,
        "guarantee": GUARANTEE[a.fdr_method],
        **calib,
        "n_flagged": sum(1 for r in rows if r["verdict"] == "trained"),
        "withheld": (
            "the blind check rejects: suspected and unseen files differ in kind, so no "
            "file's p-value can be read as evidence of training"
            if blind_rejects
            else None
        ),
    }
    report["files"] = rows
    report["unseen_files"] = [
        {
            "file_id": ids[i].split("/", 1)[1],
            "source": str(files["source"][i]).split("/", 1)[1],
            "score": float(score[i]),
        }
        for i in range(len(ids))
        if not is_sus[i]
    ]
    if truth:
        report["truth"] = _truth_summary(rows)
    report["verdict"] = _verdict(report)
    report["notes"] = _notes(cfg, report)
    return report


def _file_rows(files, got: dict, score, n_snip, truth: dict, blind_rejects: bool) -> list[dict]:
    """One row per suspected file, sorted by p-value; no file is "trained" when the blind
    check rejects (its p-value is then no more valid than the dataset test)."""
    rows = []
    for j, i in enumerate(got["suspected"]):
        doc = files["doc_id"][i]
        verdict = "trained" if got["flagged"][j] else "not flagged"
        rows.append(
            {
                "file_id": doc.split("/", 1)[1],
                "source": str(files["source"][i]).split("/", 1)[1],
                "score": float(score[i]),
                "p_value": float(got["pvalues"][i][0]),
                "q_value": float(got["adjusted"][j]),
                "verdict": "no verdict: blind check rejects" if blind_rejects else verdict,
                "n_calibration": got["pvalues"][i][1],
                "n_snippets": int(n_snip[doc]),
                **({"truth": truth[doc]} if doc in truth else {}),
            }
        )
    return sorted(rows, key=lambda r: (r["p_value"], -r["score"], r["file_id"]))


def _truth_summary(rows: list[dict]) -> dict:
    mem = [r for r in rows if r.get("truth") == 1]
    hit = [r for r in rows if r["verdict"] == "trained"]
    return {
        "n_members": len(mem),
        "n_nonmembers": sum(1 for r in rows if r.get("truth") == 0),
        "members_flagged": sum(1 for r in mem if r["verdict"] == "trained"),
        "nonmembers_flagged": sum(1 for r in hit if r.get("truth") == 0),
        "tpr": (sum(1 for r in mem if r["verdict"] == "trained") / len(mem)) if mem else None,
        "fdp": (sum(1 for r in hit if r.get("truth") == 0) / len(hit)) if hit else 0.0,
    }


def _check_summary(t: dict) -> dict:
    keys = ("statistic", "p_value", "mc_error", "permutations", "reject", "alpha")
    return {k: t[k] for k in keys}


def _weights(names: list[str], coefs: np.ndarray) -> dict:
    """The fits' weights on the standardized features; a feature whose weight is 0 in every
    fit carries no evidence that suspected files look more trained-on."""
    positive = (coefs > 0).mean(axis=0)
    return {
        "names": names,
        "weights_mean": coefs.mean(axis=0).round(4).tolist(),
        "weights_sd": coefs.std(axis=0).round(4).tolist(),
        "share_positive": positive.round(3).tolist(),
        "no_evidence": [n for n, s in zip(names, positive, strict=True) if s == 0],
    }


SCHEME = (
    "split-conformal: in a cross-fitting round, a suspected file is ranked against one file "
    "of each unseen source in its own held-out half, all scored by the model fitted on the "
    "other half, which trained on none of them: p = (1 + #{calibration scores >= the file's}) "
    "/ (n + 1). The file's p-value is the largest over the first audit.file_rounds rounds."
)
GUARANTEE = {
    "bh": "Each p-value is valid: P(p <= t) <= t for a file the model did not train on, "
    "when its source is exchangeable with the unseen ones (proven: split-conformal, and the "
    "largest of valid p-values is valid). The p-values of one round and one half share one "
    "calibration set and one model, so they are PRDS and Benjamini-Hochberg controls the FDR "
    "at the stated level among them (Bates et al. 2023); for the reported p-values (pooled "
    "over both halves, and the largest over rounds when audit.file_rounds > 1) PRDS is not "
    "proven, and the FDR is measured by simulation (VALIDITY.md); audit.fdr_method=by "
    "controls it under any dependence.",
    "by": "Each p-value is valid: P(p <= t) <= t for a file the model did not train on (proven: "
    "split-conformal, and the largest of valid p-values is valid); Benjamini-Yekutieli "
    "controls the FDR at the stated level under any dependence among them.",
}


def _verdict(r: dict) -> dict:
    t, m = r["dataset_test"], r["model"]["name_or_path"]
    blind, null = r.get("blind_check"), r.get("null_check")
    pf = r["per_file"]
    files = f"{pf['n_flagged']} of {r['data']['n_suspected']} files flagged at {pf['fdr']:.0%} FDR"
    p = f"p = {_p(t['p_value'])}, held-out AUC {t['statistic']:.2f}"
    if blind and blind["reject"]:
        if t["reject"]:
            text = (
                f"Not evidence of training: the model scores suspected files above unseen ones "
                f"({p}), but their words alone tell the two sets apart too (blind check p = "
                f"{_p(blind['p_value'])}): the sets differ in kind, and that difference could "
                "be what the model sees (Das et al. 2024). No file is called trained. Give "
                "unseen files of the same kind as the suspected ones"
            )
        else:
            text = (
                f"No evidence that {m} trained on these files ({p}, not below "
                f"{t['alpha']:g}), and this audit could not be trusted to find it: the files' "
                f"words alone tell suspected from unseen files (blind check p = "
                f"{_p(blind['p_value'])}), so the two sets differ in kind. No file is called "
                "trained. Give unseen files of the same kind as the suspected ones"
            )
        trained = False
    elif t["reject"]:
        text = f"Evidence that {m} trained on these files: {p}; {files}"
        trained = True
    else:
        text = (
            f"No evidence that {m} trained on these files: {p} (not below {t['alpha']:g}); {files}"
        )
        trained = False
    if blind and not blind["reject"]:
        text += f"; the blind check does not reject (p = {_p(blind['p_value'])})"
    if null and not null["reject"]:
        text += f"; the null check on unseen vs unseen does not reject (p = {_p(null['p_value'])})"
    if null and null["reject"]:
        text += (
            f". The null check rejects on two random halves of the unseen sources (p = "
            f"{_p(null['p_value'])}): its permutation test is exact, so this is its "
            f"{null['alpha']:.0%} chance of a false alarm; it says nothing of the suspected files"
        )
    return {"text": text + ".", "trained": trained}


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def _notes(cfg: AuditJobConfig, r: dict) -> list[str]:
    pf, t, d = r["per_file"], r["dataset_test"], r["data"]
    notes = [
        "The dataset test is LLM Dataset Inference (Maini et al. 2024) on files, with an exact "
        "test: the sources are split in halves (stratified, seeded); a linear discriminant whose "
        "weights are constrained to be >= 0 (every feature is oriented 'higher = member', so "
        "only files that look more trained-on can count) is fitted on one half's files and "
        "scores the other half's; the held-out AUC measures the separation; halves swap and "
        f"the whole repeats over {cfg.audit.rounds} seed(s). The mean AUC is compared with the "
        f"same statistic for {t['permutations']} random permutations of the sources' sides "
        f"(the whole cross-fit redone each time): p = (1 + #{{at least as high}}) / "
        f"({t['permutations']} + 1), exact under H0; Monte Carlo error ±{t['mc_error']:.2g}.",
        "H0: the model scores the suspected sources like unseen ones. The test assumes the two "
        "sets are alike apart from training (the blind check tests that on the words alone); "
        "it cannot tell which files were trained on, only that some were.",
        f"The verdict rests on {d['n_sources_suspected']} suspected and "
        f"{d['n_sources_unseen']} unseen independent sources"
        + (
            f" ({d['n_suspected']} and {d['n_unseen']} files; files of one source, by "
            + (f"data.group_field {d['group_field']!r}" if d.get("group_field") else "")
            + (" and " if d.get("group_field") and d.get("n_near_duplicate_pairs") else "")
            + (
                f"{d['n_near_duplicate_pairs']} near-duplicate pair(s)"
                if d.get("n_near_duplicate_pairs")
                else ""
            )
            + ", are split, permuted and calibrated together)"
            if d["n_sources_suspected"] + d["n_sources_unseen"] < d["n_suspected"] + d["n_unseen"]
            else ""
        )
        + ". Files that are not independent but not found so (chapters of one book with no "
        "shared text) must be named by data.group_field (--group-by): no check can see them.",
        f"Per-file p-values: {pf['scheme']} {pf['guarantee']} With at least "
        f"{pf['n_calibration']} calibration files in a half the smallest p-value is "
        f"{pf['min_p_value']:.4f}; at {pf['fdr']:.0%} FDR files can be flagged only when at "
        f"least {pf['min_flagged_together']} of the {d['n_suspected']} are flagged together.",
        "A file that is not flagged is not shown unseen: short files, or files the model saw "
        "once, leave little signal.",
    ]
    if r["features"]["no_evidence"]:
        notes.append(
            "Features with weight 0 in every fit carry no evidence here: "
            + ", ".join(r["features"]["no_evidence"])
            + "."
        )
    lengths = r.get("lengths") or {}
    if lengths.get("warning"):
        notes.append(f"Lengths: {lengths['warning']}.")
    if d.get("left_out"):
        notes.append(f"{len(d['left_out'])} file(s) left out (listed under data.left_out).")
    if r.get("truth"):
        tr = r["truth"]
        notes.append(
            f"Scored against data.labels: {tr['members_flagged']} of {tr['n_members']} member "
            f"files flagged, {tr['nonmembers_flagged']} non-member files flagged "
            f"(false-discovery proportion {tr['fdp']:.0%})."
        )
    return notes


def _merge_copycheck(report: dict) -> None:
    """CopyCheck's verdict and confidence beside the audit's own, per file; each method's
    summary keeps its numbers, not the per-file dict the table now shows."""
    cc = report["methods"].get("copycheck")
    if not cc:
        return
    files = cc.pop("files")
    for row in report["files"]:
        got = files.get(row["file_id"], {})
        row["copycheck_verdict"] = got.get("verdict")
        row["copycheck_confidence"] = got.get("confidence")


def _write_outputs(out: Path, snip: pd.DataFrame, features: list[str], report: dict) -> None:
    from mia_ray.reports.io import write_parquet

    write_parquet(out / "files.parquet", pd.DataFrame(report["files"]))
    cols = ["snippet_id", "doc_id", "n_tokens", *features, "text"]  # the text scored
    write_parquet(out / "snippet_scores.parquet", snip[cols])
