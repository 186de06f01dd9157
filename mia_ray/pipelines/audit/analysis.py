"""The audit's statistics from its snippet rows: the dataset test, the null and blind checks, per-file p-values under false-discovery control (``detectors.dataset_inference``)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from mia_ray.pipelines.audit.config import AuditJobConfig
from mia_ray.pipelines.audit.report import GUARANTEE, SCHEME, notes, premise, verdict
from mia_ray.pipelines.common import log


def feature_columns(snip: pd.DataFrame, names: list[str]) -> list[str]:
    cols = []
    for name in names:
        variants = [c for c in snip.columns if c.startswith(f"{name}@")]
        cols.extend(variants or [name])
    return cols


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
    reference: pd.DataFrame | None = None,
) -> dict:
    """The statistics of an audit from its snippet rows (doc_id, text, feature columns) and its
    files (doc_id, side, source); ``reference``: the reference model's scores of the same
    snippets (snippet_id and the feature columns but ``ref``), for the reference check."""
    from mia_ray.detectors.dataset_inference import audit, effect_size, file_matrix

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
    ref_rows = _reference_rows(snip, reference)
    D = _diff_matrix(snip, features, ids, ref_rows)
    # The per-file score: with a reference, the target's features and the differences side
    # by side (on the demo: 50 of 50 members flagged, against 48 and 44 for either alone).
    score_F = F if D is None else np.hstack([F, D])
    got = audit(design, a.permutations, a.seed, a.alpha, a.fdr, a.fdr_method, score_F)

    test, rounds = got["test"], got["rounds"]
    is_sus = files["side"].to_numpy() == 1
    coefs = np.array([c for r in rounds for c in r.coefs])
    score = got["scores"]
    report: dict = {
        "pipeline": "audit",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"name_or_path": cfg.model.name_or_path, "reference": cfg.model.reference or None},
        "design": a.design,
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
    report.update(_checks(cfg, design, snip, ids, features, ref_rows, D))
    # A randomized split makes the premise true by construction: the checks are reported only.
    randomized = a.design == "randomized"
    withheld = [] if randomized else _withheld(report)
    tested = randomized or (a.blind_check and "reference_check" in report)
    rows = _file_rows(files, got, score, snip.groupby("doc_id").size(), truth, withheld, tested)
    report["per_file"] = {
        "fdr": a.fdr,
        "method": a.fdr_method,
        "scheme": SCHEME,
        "score": "the attacks' scores"
        + (" and each one's target score minus the reference's" if D is not None else ""),
        "guarantee": GUARANTEE[a.fdr_method],
        **calib,
        **_floor(design, a.fdr),
        "n_flagged": sum(1 for r in rows if r["flagged"]),
        "withheld": (
            " and ".join(withheld) + ": no file's p-value can be read as evidence of training"
            if withheld
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
    report["premise"] = premise(report)
    report["verdict"] = verdict(report)
    report["notes"] = notes(cfg, report)
    return report


def _reference_rows(snip: pd.DataFrame, reference: pd.DataFrame | None) -> pd.DataFrame | None:
    """The reference model's scores in the snippets' order (doc_id and its feature columns)."""
    if reference is None:
        return None
    return snip[["snippet_id", "doc_id"]].merge(reference, on="snippet_id", how="left",
                                                validate="one_to_one")  # fmt: skip


def _diff_matrix(snip, features, ids, ref_rows) -> np.ndarray | None:
    """With a reference, each file's row of each attack's target score minus the
    reference's (what the target sees beyond a model that never saw the files, so much of a
    file's own difficulty cancels); None without one."""
    from mia_ray.detectors.dataset_inference import file_matrix

    if ref_rows is None:
        return None
    cols = [c for c in features if c in ref_rows.columns]
    diff = snip[cols].to_numpy(dtype=np.float64) - ref_rows[cols].to_numpy(dtype=np.float64)
    return file_matrix(snip["doc_id"].to_numpy(), diff, ids)


def _checks(cfg, design, snip: pd.DataFrame, ids, features, rows, diff_F) -> dict:
    """The null check (the machinery) and the premise's checks: blind, and reference when
    ``rows`` holds the reference model's scores (:func:`_reference_rows`)."""
    from mia_ray.detectors.dataset_inference import null_check
    from mia_ray.detectors.premise import blind_check

    a, out = cfg.audit, {}
    if a.null_check:
        log("null check: the same test on two random halves of the unseen sources")
        out["null_check"] = _check_summary(null_check(design, a.permutations, a.seed, a.alpha))
    if a.blind_check:
        log("blind check: the same test on the snippets' words, characters and surface "
            "statistics (no model), weights free")  # fmt: skip
        blind = blind_check(design, snip["doc_id"].to_numpy(), snip["text"].tolist(), ids,
                            a.permutations, a.seed, a.alpha)  # fmt: skip
        out["blind_check"] = {
            "method": "three views of the snippets' text per file (word 1-2 grams lowercased, "
            "character 1-4 grams case kept, 13 surface statistics), each through the same "
            "cross-fit with free weights (two-sided in effect); one min-p permutation test "
            "over the three, on the same permutations, so the check's level is alpha",
            **_check_summary(blind),
            "parts": blind["parts"],
            "contrasts": blind["contrasts"],
        }
    if rows is not None:
        cols = [c for c in features if c in rows.columns]
        out["reference_check"] = _reference_check(cfg, rows, cols, ids, design)
        out["calibrated_test"] = _calibrated_test(cfg, diff_F, cols, design)
    return out


def _reference_check(cfg, rows: pd.DataFrame, cols: list[str], ids, design) -> dict:
    """The dataset test's cross-fit on the reference model's own scores of the snippets
    (``rows``: doc_id and the reference's feature columns, in the snippets' order), twice on
    the same permutations and joined by min-p: weights >= 0 (a shift that makes the suspected
    files look more trained-on, the dataset test's own direction) and free weights (any
    difference, e.g. text harder on most features and easier on one). Any difference a model
    that never saw the files sees between the sets is in the texts; each version alone missed
    shifts the other caught (VALIDITY.md, token level)."""
    from mia_ray.detectors.dataset_inference import file_matrix
    from mia_ray.detectors.premise import REFERENCE_SEES, reference_check

    a = cfg.audit
    log(f"reference check: the dataset test on {cfg.model.reference}'s own scores "
        f"({len(cols)} features), a model that never saw the files")  # fmt: skip
    F = file_matrix(rows["doc_id"].to_numpy(), rows[cols].to_numpy(dtype=np.float64), ids)
    got = reference_check(design.with_features(F, nonneg=True), a.permutations, a.seed, a.alpha)
    return {
        "model": cfg.model.reference,
        "features": cols,
        "sees": REFERENCE_SEES,
        "method": "the dataset test's cross-fit on the reference's scores of the same snippets "
        "with the same attacks, weights >= 0 and free weights, one min-p permutation test over "
        "the two on the same permutations",
        **_check_summary(got),
        "parts": got["parts"],
    }


def _calibrated_test(cfg, diff_F: np.ndarray, cols: list[str], design) -> dict:
    """The dataset test on the target's scores minus the reference's, attack by attack and
    snippet by snippet (the ``ref`` attack's calibration, for every feature): what the target
    sees beyond a model that never saw the files. A text shift the reference reads as strongly
    as the target cancels here; one it reads more weakly leaves a residue, which the reference
    check is there to see. The claim of training needs this test to reject as well as the
    dataset test (an intersection-union test: no level is spent)."""
    from mia_ray.detectors.dataset_inference import permutation_test

    a = cfg.audit
    log(f"calibrated test: the dataset test on the target's scores minus "
        f"{cfg.model.reference}'s ({len(cols)} features)")  # fmt: skip
    got = permutation_test(design.with_features(diff_F, nonneg=True), a.permutations, a.seed,
                           a.alpha)  # fmt: skip
    return {
        "model": cfg.model.reference,
        "features": cols,
        "method": "the dataset test's cross-fit (weights >= 0) on each snippet's target score "
        "minus the reference's score of the same attack",
        **_check_summary(got),
    }


FLAGGED_UNTESTED = "flagged, premise partly untested"


def _withheld(report: dict) -> list[str]:
    """Why no file may be flagged: a check of the premise rejects (the sets differ in kind),
    or the dataset test rejects and the target's scores beyond the reference's do not
    separate the sets."""
    out = [f"the {k.replace('_', ' ')} rejects (suspected and unseen files differ in kind)"
           for k in ("blind_check", "reference_check") if report.get(k, {}).get("reject")]  # fmt: skip
    cal = report.get("calibrated_test")
    # Where the dataset test rejects, the calibrated test must too (else the signal may be
    # the texts'); where neither rejects, flags stand on their own p-values (a few trained
    # files move neither set-level AUC).
    if cal and not cal["reject"] and report["dataset_test"]["reject"]:
        out.append("the calibrated test does not reject (the target sees no more than the "
                   "reference model, which never saw the files)")  # fmt: skip
    return out


def _file_rows(files, got: dict, score, n_snip, truth: dict, withheld: list[str],
               tested: bool) -> list[dict]:  # fmt: skip
    """One row per suspected file, sorted by p-value. No file is flagged when a check of the
    premise rejects (its p-value is then no more valid than the dataset test); a flagged file
    is "trained" when every check ran (blind and reference), else :data:`FLAGGED_UNTESTED`."""
    rows = []
    for j, i in enumerate(got["suspected"]):
        doc = files["doc_id"][i]
        flagged = bool(got["flagged"][j]) and not withheld
        verdict = ("trained" if tested else FLAGGED_UNTESTED) if flagged else "not flagged"
        rows.append(
            {
                "file_id": doc.split("/", 1)[1],
                "source": str(files["source"][i]).split("/", 1)[1],
                "score": float(score[i]),
                "p_value": float(got["pvalues"][i][0]),
                "q_value": float(got["adjusted"][j]),
                "flagged": flagged,
                "verdict": f"no verdict: {withheld[0].split(' (')[0]}" if withheld else verdict,
                "n_calibration": got["pvalues"][i][1],
                "n_snippets": int(n_snip[doc]),
                **({"truth": truth[doc]} if doc in truth else {}),
            }
        )
    return sorted(rows, key=lambda r: (r["p_value"], -r["score"], r["file_id"]))


def _floor(design, fdr: float) -> dict:
    """What the calibration allows, from the sources as scored: a suspected source of n files
    can reach no p-value below n / (n + the unseen files), and the step-up rule flags k of
    the m suspected files only if the k-th smallest p-value is <= fdr k / m."""
    n = np.bincount(design.group, minlength=design.side.size)
    sus = design.side == 1
    n0 = int(n[~sus].sum())
    min_p = float(min(n[sus] / (n[sus] + n0)))
    m = int(n[sus].sum())
    return {
        "n_calibration": n0,
        "min_p_value": min_p,
        "min_flagged_together": int(np.ceil(m * min_p / fdr - 1e-12)),
    }


def _truth_summary(rows: list[dict]) -> dict:
    mem = [r for r in rows if r.get("truth") == 1]
    hit = [r for r in rows if r["flagged"]]
    return {
        "n_members": len(mem),
        "n_nonmembers": sum(1 for r in rows if r.get("truth") == 0),
        "members_flagged": sum(1 for r in mem if r["flagged"]),
        "nonmembers_flagged": sum(1 for r in hit if r.get("truth") == 0),
        "tpr": (sum(1 for r in mem if r["flagged"]) / len(mem)) if mem else None,
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
