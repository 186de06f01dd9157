"""`mia-ray audit`: did model M train on these files?

suspected + unseen files → snippets → one Scorer pass per model (target, reference) →
attack features per snippet → cross-fitted linear model (``detectors.dataset_inference``) →
a dataset-level test (Maini et al. 2024) with a null check (unseen vs unseen) and a blind
check (text only, Das et al. 2024) → per-file conformal p-values → Benjamini-Hochberg →
report.
"""

from __future__ import annotations

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
    ("reference", "model.reference", "a reference model (adds the reference score)"),
)
SIDES = ("suspected", "unseen")
NULL_CHECK_MIN_UNSEEN = 8  # two halves of 4: each still needs 2 files per cross-fitting half


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
        )
    except MiaError as e:
        raise MiaError(f"--{side} ({path}): {e}") from None
    df = ds.select_columns(["doc_id", "text"]).to_pandas()
    if df.empty:
        raise MiaError(f"--{side} ({path}) holds no documents")
    df["file_id"] = df["doc_id"].astype(str)
    df["doc_id"] = f"{side}/" + df["file_id"]
    df["group"] = int(side == "suspected")
    return df


def read_inputs(cfg: AuditJobConfig) -> pd.DataFrame:
    """Both sides as one frame: doc_id (``suspected/<id>``, ``unseen/<id>``), file_id, text,
    group (1 suspected, 0 unseen). A text on both sides is an error."""
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
    return pd.concat([sus, uns], ignore_index=True)


def check_counts(cfg: AuditJobConfig, n_suspected: int, n_unseen: int) -> dict:
    """Fail before any scoring when there are too few files for the test or for any per-file
    verdict at ``audit.fdr``; return what the calibration allows."""
    from mia_ray.detectors.dataset_inference import MIN_FILES_PER_GROUP
    from mia_ray.stats.audit import min_calibration_files

    a = cfg.audit
    for n, side in ((n_suspected, "suspected"), (n_unseen, "unseen")):
        if n < MIN_FILES_PER_GROUP:
            raise MiaError(
                f"--{side} has {n} file(s): the audit needs at least {MIN_FILES_PER_GROUP} "
                f"suspected and {max(MIN_FILES_PER_GROUP, min_calibration_files(a.fdr))} "
                "unseen files (2 of each in each cross-fitting half)"
            )
    # Split calibration uses the unseen files of one half only.
    n_cal = n_unseen if a.calibration == "cross" else n_unseen // 2
    need = min_calibration_files(a.fdr)
    if n_cal < need:
        total = need if a.calibration == "cross" else 2 * need
        raise MiaError(
            f"--unseen has {n_unseen} file(s): with audit.calibration={a.calibration} a file is "
            f"calibrated against {n_cal} of them, so its p-value is at least 1/{n_cal + 1} = "
            f"{1 / (n_cal + 1):.3f} > audit.fdr = {a.fdr:g} and no file could ever be flagged; "
            f"give at least {total} unseen files (or raise audit.fdr)"
        )
    if a.null_check and n_unseen < NULL_CHECK_MIN_UNSEEN:
        raise MiaError(
            f"--unseen has {n_unseen} file(s): the null check (unseen vs unseen) needs at least "
            f"{NULL_CHECK_MIN_UNSEEN}; add files or set audit.null_check=false"
        )
    min_p = 1 / (n_cal + 1)
    return {
        "n_calibration": n_cal,
        "min_p_value": min_p,
        # BH flags k of m files only if the k-th smallest p-value is <= fdr * k / m.
        "min_flagged_together": int(np.ceil(n_suspected * min_p / a.fdr - 1e-12)),
    }


def _truth(cfg: AuditJobConfig, files: pd.DataFrame) -> dict[str, int]:
    """data.labels (file id -> 0/1 over the suspected files), for scoring the verdicts."""
    if not cfg.data.labels:
        return {}
    from mia_ray.data.readers import load_manifest

    known = load_manifest(cfg.data.labels)
    sus = files[files["group"] == 1]
    return {
        d: int(known[f]) for d, f in zip(sus["doc_id"], sus["file_id"], strict=True) if f in known
    }


def _feature_columns(snip: pd.DataFrame, names: list[str]) -> list[str]:
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
    files = read_inputs(cfg)
    group = dict(zip(files["doc_id"], files["group"], strict=True))
    n_sus = int(files["group"].sum())
    n_uns = len(files) - n_sus
    calib = check_counts(cfg, n_sus, n_uns)
    truth = _truth(cfg, files)
    log(f"{n_sus} suspected and {n_uns} unseen files")

    import ray

    attacks = [*a.attacks, *(["ref"] if cfg.model.reference else [])]
    acfg = AttackJobConfig(
        data=cfg.data,
        model=cfg.model,
        resources=cfg.resources,
        attack=AttackConfig(
            attacks=attacks, min_k_ratios=list(a.min_k_ratios), min_k_ratio=a.min_k_ratios[0]
        ),
    )
    docs = ray.data.from_pandas(files[["doc_id", "text"]])
    snip, _, ctx = score_attacks(acfg, out, docs=docs, labels=group)
    t_score = time.time() - t0
    features = _feature_columns(snip, attacks)
    texts = ctx["snippets"].set_index("snippet_id")["text"]
    snip["text"] = snip["snippet_id"].map(texts)
    report = analyse(cfg, snip, features, group, truth, calib)
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


def analyse(
    cfg: AuditJobConfig,
    snip: pd.DataFrame,
    features: list[str],
    group: dict[str, int],
    truth: dict[str, int],
    calib: dict,
) -> dict:
    """The statistics of an audit from its snippet rows (doc_id, text, feature columns)."""
    from mia_ray.detectors.dataset_inference import (
        LinearFeatureScorer,
        TextScorer,
        cross_fit,
        dataset_test,
        file_pvalues,
        file_scores,
        null_check,
    )
    from mia_ray.stats.audit import benjamini_hochberg

    a = cfg.audit
    seeds = list(range(a.seed, a.seed + a.rounds))
    units = snip["doc_id"].to_numpy()
    X = snip[features].to_numpy(dtype=np.float64)

    def linear():
        return LinearFeatureScorer(C=a.C)

    log(f"dataset test: {len(features)} features, {a.rounds} cross-fitting round(s)")
    rounds = cross_fit(units, X, group, linear, seeds)
    test = dataset_test(rounds, group, a.alpha)
    pv = file_pvalues(rounds, group, a.calibration)
    sus = sorted(pv)
    flagged, adjusted = benjamini_hochberg([pv[f][1] for f in sus], a.fdr)
    n_snip = snip.groupby("doc_id").size()
    rows = [
        {
            "file_id": f.split("/", 1)[1],
            "score": pv[f][0],
            "p_value": pv[f][1],
            "q_value": float(q),
            "verdict": "trained" if r else "not flagged",
            "n_snippets": int(n_snip[f]),
            **({"truth": truth[f]} if f in truth else {}),
        }
        for f, r, q in zip(sus, flagged, adjusted, strict=True)
    ]
    rows.sort(key=lambda r: (r["p_value"], -r["score"], r["file_id"]))
    coefs = np.array([c for r in rounds for c in r.coefs])
    report: dict = {
        "pipeline": "audit",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"name_or_path": cfg.model.name_or_path, "reference": cfg.model.reference or None},
        "data": {
            "suspected": a.suspected,
            "unseen": a.unseen,
            "n_suspected": sum(1 for v in group.values() if v == 1),
            "n_unseen": sum(1 for v in group.values() if v == 0),
            "n_snippets": int(len(snip)),
            "snippet": f"{cfg.data.snippet_size} {cfg.data.snippet_unit}",
        },
        "dataset_test": {
            "test": "one-sided Welch t-test (suspected > unseen) on held-out file scores",
            "h0": "the model scores suspected files no higher than unseen files",
            "combine": "2 x median of the per-half p-values (valid under any dependence)",
            "rounds": a.rounds,
            **test,
        },
        "features": {
            "names": features,
            "weights_mean": coefs.mean(axis=0).round(4).tolist(),
            "weights_sd": coefs.std(axis=0).round(4).tolist(),
        },
    }
    if a.null_check:
        uns = sorted(f for f, v in group.items() if v == 0)
        log("null check: the same test on two random halves of the unseen files")
        null = null_check(units, X, uns, linear, seeds, a.seed, a.alpha)
        report["null_check"] = {k: null[k] for k in ("p_value", "effect_size", "reject", "alpha")}
    if a.blind_check:
        log("blind check: the same test on the snippets' words alone (no model)")
        texts = snip["text"].tolist()
        blind = dataset_test(
            cross_fit(units, texts, group, lambda: TextScorer(seed=a.seed), seeds), group, a.alpha
        )
        report["blind_check"] = {
            "method": "tf-idf word 1-2 grams + logistic regression, same cross-fitting and test",
            **{k: blind[k] for k in ("p_value", "effect_size", "reject", "alpha")},
        }
    n_flag = int(flagged.sum())
    report["per_file"] = {
        "fdr": a.fdr,
        "calibration": a.calibration,
        "scheme": _SCHEMES[a.calibration],
        **calib,
        "n_flagged": n_flag,
    }
    report["files"] = rows
    avg = file_scores(rounds)
    report["unseen_files"] = [
        {"file_id": f.split("/", 1)[1], "score": avg[f]}
        for f in sorted(f for f, v in group.items() if v == 0)
    ]
    if truth:
        mem = [r for r in rows if r.get("truth") == 1]
        hit = [r for r in rows if r["verdict"] == "trained"]
        report["truth"] = {
            "n_members": len(mem),
            "n_nonmembers": sum(1 for r in rows if r.get("truth") == 0),
            "members_flagged": sum(1 for r in mem if r["verdict"] == "trained"),
            "nonmembers_flagged": sum(1 for r in hit if r.get("truth") == 0),
            "tpr": (sum(1 for r in mem if r["verdict"] == "trained") / len(mem)) if mem else None,
            "fdp": (sum(1 for r in hit if r.get("truth") == 0) / len(hit)) if hit else 0.0,
        }
    report["verdict"] = _verdict(report)
    report["notes"] = _notes(cfg, report)
    return report


_SCHEMES = {
    "cross": (
        "cross-conformal: each suspected file's out-of-fold score (averaged over the rounds) is "
        "ranked against every unseen file's out-of-fold score; each score comes from a model "
        "that never trained on that file. Uses every unseen file; valid up to a factor of 2 in "
        "the worst case (P(p <= t) <= 2t, Barber et al. 2021), close to exact in our null "
        "simulations."
    ),
    "split": (
        "split-conformal: in the first round, each suspected file is ranked against the unseen "
        "files of its own half, scored by the same model, which trained on none of them. "
        "Exactly valid (P(p <= t) <= t) with half of the unseen files."
    ),
}


def _verdict(r: dict) -> dict:
    t, m = r["dataset_test"], r["model"]["name_or_path"]
    blind, null = r.get("blind_check"), r.get("null_check")
    pf = r["per_file"]
    files = f"{pf['n_flagged']} of {r['data']['n_suspected']} files flagged at {pf['fdr']:.0%} FDR"
    p = f"p = {_p(t['p_value'])}, effect size d = {t['effect_size']:.2f}"
    if blind and blind["reject"]:
        text = (
            f"Not evidence of training: the model tells suspected from unseen files ({p}), but "
            f"so do their words alone (blind check p = {_p(blind['p_value'])}): the two sets "
            "differ in kind, and any model would separate them (Das et al. 2024). Give unseen "
            "files of the same kind as the suspected ones"
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
        if blind and not blind["reject"]:
            text += f", nor does the null check on unseen vs unseen (p = {_p(null['p_value'])})"
        else:
            text += (
                f"; the null check on unseen vs unseen does not reject (p = {_p(null['p_value'])})"
            )
    if null and null["reject"]:
        text += (
            f". Caution: the null check rejects on two random halves of the unseen files (p = "
            f"{_p(null['p_value'])}), where no difference can be: a 1-in-"
            f"{round(1 / null['alpha'])} chance at its {null['alpha']:.0%} level, or files that "
            "are not independent (near-duplicates, one source split into many files), which "
            "would make this run's p-values too small"
        )
    return {"text": text + ".", "trained": trained}


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def _notes(cfg: AuditJobConfig, r: dict) -> list[str]:
    pf = r["per_file"]
    notes = [
        "The dataset test is LLM Dataset Inference (Maini et al. 2024) on files: the files are "
        f"split in halves by file (stratified, seeded); a linear model fitted on one half's "
        f"snippets scores the other half's, a file's score is the mean over its snippets, and a "
        f"one-sided Welch t-test compares suspected with unseen files; halves swap and repeat "
        f"over {cfg.audit.rounds} seed(s), and the p-values merge by twice their median.",
        "H0: the model scores the suspected files no higher than files it never saw. The test "
        "assumes suspected and unseen files are alike apart from training (the blind check "
        "tests that on the words alone); it cannot tell which files were trained on, only that "
        "some were.",
        f"Per-file p-values: {pf['scheme']} With {pf['n_calibration']} calibration files the "
        f"smallest p-value is 1/{pf['n_calibration'] + 1} = {pf['min_p_value']:.4f}; "
        f"Benjamini-Hochberg at {pf['fdr']:.0%} can flag files only when at least "
        f"{pf['min_flagged_together']} of the {r['data']['n_suspected']} are flagged together.",
        "A file that is not flagged is not shown unseen: short files, or files the model saw "
        "once, leave little signal.",
    ]
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
