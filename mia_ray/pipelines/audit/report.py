"""What the audit says: the verdict, the notes, the guarantees it states, and its output files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mia_ray.pipelines.audit.config import AuditJobConfig

SCHEME = (
    "conformal against every unseen file: each source gets one score fixed without knowing "
    "which side it is on (the mean of its features, each standardized over every source of "
    "both sides; with a reference, the target's features and each one minus the "
    "reference's), and a suspected source of n files is ranked against all unseen sources, "
    "each counting its files: p = (n + files of unseen sources scoring at least as high) / "
    "(n + unseen files); for a single file, (1 + #{unseen scores >= its}) / (unseen files + "
    "1). A file takes its source's p-value (a file alone is its own source); "
    "Benjamini-Hochberg runs over the suspected files."
)


GUARANTEE = {
    "bh": "Each p-value is valid: P(p <= t) <= t for a file of a source the model did not "
    "train on, when that source is exchangeable with the unseen ones (proven: the score "
    "ignores the sides, and weighing each source by its files makes it exact for a file "
    "drawn at random, even when a source's size is tied to its score: weighted "
    "exchangeability, Tibshirani et al. 2019). Benjamini-Hochberg controls the FDR over files "
    "at the stated level when every source is one file (proven for conformal p-values whose "
    "score is symmetric in calibration and test units: Marandon et al. 2024, after Bates et "
    "al. 2023); with sources of several files it is measured (VALIDITY.md); "
    "audit.fdr_method=by controls it under any dependence.",
    "by": "Each p-value is valid: P(p <= t) <= t for a file of a source the model did not "
    "train on, when that source is exchangeable with the unseen ones (proven: the score "
    "ignores the sides; each source weighs its files); Benjamini-Yekutieli controls the FDR "
    "over files at the stated level under any dependence among them.",
}


PREMISE = (
    "suspected and unseen files differ only by training: had the model trained on neither, "
    "it would score them alike (their sources' sides are exchangeable)"
)
PREMISE_KIND = (
    "exact if the premise holds: the dataset test's p-value and the per-file p-values are "
    "exact when suspected and unseen sources are exchangeable, and the checks below can "
    "falsify that premise, never prove it (a randomized design, where the owner chose at "
    "random which files to expose, would make it true by construction)"
)


RANDOMIZED = (
    "the files were split at random into suspected and unseen before the model could have "
    "trained on them (declared by the user: audit.design randomized)"
)
RANDOMIZED_KIND = (
    "exact by the owner's randomization: a random split makes the two sets exchangeable "
    "whatever their texts, so the dataset test and the per-file p-values are exact if the "
    "declaration is true; the checks below cannot falsify a premise true by construction "
    "(each rejects 5 % of random splits by chance) and are reported, not acted on"
)


def premise(r: dict) -> dict:
    """What the verdict rests on: the premise, each check of it (ran or not, what it sees, its
    p-value) and what no check that ran could see. The null check is not among them: its
    sides are a random split, so it tests the machinery, never the premise."""
    from mia_ray.detectors.premise import BLIND_PARTS, REFERENCE_SEES, UNSEEN_WITHOUT_REFERENCE

    blind, ref = r.get("blind_check"), r.get("reference_check")
    checks = [
        {
            "name": "blind check",
            "ran": blind is not None,
            "sees": "; ".join(f"{k}: {v}" for k, v in BLIND_PARTS.items()),
            **({"p_value": blind["p_value"], "reject": blind["reject"]} if blind else
               {"why_not": "audit.blind_check is false"}),
        },
        {
            "name": "reference check",
            "ran": ref is not None,
            "sees": REFERENCE_SEES,
            **({"model": ref["model"], "p_value": ref["p_value"], "reject": ref["reject"]}
               if ref else {"why_not": "no model.reference (--reference)"
                            if not r["model"].get("reference") else
                            "audit.reference_check is false"}),
        },
    ]  # fmt: skip
    unseen = []
    if blind is None:
        unseen.append("any difference of the texts: no check of the premise ran without a "
                      "model (audit.blind_check: false)")  # fmt: skip
    if ref is None:
        unseen.append(UNSEEN_WITHOUT_REFERENCE if blind else
                      "differences a model sees (no --reference either)")  # fmt: skip
    else:
        unseen.append("differences a model sees that the reference model reads more weakly than "
                      "the target or not at all (the calibrated test cancels what the reference "
                      "reads as strongly; the reference check sees what it reads; a reference of "
                      "another make, or one trained on other text, may read less)")  # fmt: skip
    if r.get("design") == "randomized":
        return {
            "statement": RANDOMIZED,
            "kind": RANDOMIZED_KIND,
            "checks": checks,
            "falsified_by": [],
            "all_checks_ran": all(c["ran"] for c in checks),
            "not_ruled_out": [
                "a declaration that is not true: the audit cannot see how the files were split"
            ],  # fmt: skip
        }
    return {
        "statement": PREMISE,
        "kind": PREMISE_KIND,
        "checks": checks,
        "falsified_by": [c["name"] for c in checks if c.get("reject")],
        "all_checks_ran": all(c["ran"] for c in checks),
        "not_ruled_out": unseen,
    }


def verdict(r: dict) -> dict:
    """The headline and its ``claim``: ``evidence of training`` (the test rejects and every
    check of the premise ran and passed: ``trained`` is true only then), ``training signal,
    premise partly untested`` (the test rejects; a check could not run), ``not evidence of
    training`` (a check rejects), :data:`SOME_FILES` (the test does not reject, but files are
    flagged) or ``no evidence of training``."""
    t, m = r["dataset_test"], r["model"]["name_or_path"]
    null = r.get("null_check")
    prem = r.get("premise") or premise(r)
    pf = r["per_file"]
    files = f"{pf['n_flagged']} of {r['data']['n_suspected']} files flagged at {pf['fdr']:.0%} FDR"
    p = f"p = {_p(t['p_value'])}, held-out AUC {t['statistic']:.2f}"
    failed, cal = _failed_checks(r), r.get("calibrated_test")
    if r.get("design") == "randomized":
        return _randomized_verdict(r, m, p, files, null)
    if failed:
        if t["reject"]:
            text = (
                f"Not evidence of training: the model scores suspected files above unseen ones "
                f"({p}), but {failed} tells the two sets apart too: the sets differ in kind, "
                "and that difference could be what the model sees (Das et al. 2024). No file "
                "is called trained. Give unseen files of the same kind as the suspected ones"
            )
        else:
            text = (
                f"No evidence that {m} trained on these files ({p}, not below "
                f"{t['alpha']:g}), and this audit could not be trusted to find it: {failed} "
                "tells suspected from unseen files, so the two sets differ in kind. No file is "
                "called trained. Give unseen files of the same kind as the suspected ones"
            )
        claim = "not evidence of training"
    elif t["reject"] and cal and not cal["reject"]:
        text = (
            f"Not evidence of training: {m} scores the suspected files above unseen ones ({p}), "
            f"but not beyond what {cal['model']}, which never saw the files, scores them (the "
            f"calibrated test on {m}'s scores minus its own: p = {_p(cal['p_value'])}, not below "
            f"{cal['alpha']:g}): the difference may be in the texts. No file is called trained"
        )
        claim = "not evidence of training"
    elif t["reject"] and prem["all_checks_ran"]:
        text = (
            f"Evidence that {m} trained on these files: {p}; {files}. "
            + (f"{m}'s scores beyond {cal['model']}'s separate the sets too (calibrated test "
               f"p = {_p(cal['p_value'])}). " if cal else "")
            + "It rests on the premise that suspected and unseen files differ only by training, "
            f"which {_passed(r)} did not falsify"
        )  # fmt: skip
        claim = "evidence of training"
    elif t["reject"]:
        text = (
            f"{m} scores the suspected files as more trained-on than the unseen ones ({p}; "
            f"{files}). That is evidence of training only if the two sets differ by training "
            "alone, and not all of that was tested: " + "; ".join(_untested(r))
        )
        claim = "training signal, premise partly untested"
    elif pf["n_flagged"]:
        text = _some_files(r, m, p, files)
        if prem["all_checks_ran"]:
            text += f"; the premise rests on {_passed(r)}, which did not falsify it"
        else:
            text += "; not every check of the premise ran: " + "; ".join(_untested(r))
        claim = SOME_FILES
    else:
        text = (
            f"No evidence that {m} trained on these files: {p} (not below {t['alpha']:g}); {files}"
        )
        passed = _passed(r)
        if passed:
            text += f"; {passed} did not reject"
        claim = "no evidence of training"
    return _with_null(text, claim, null)


SOME_FILES = "evidence for some files"


def _some_files(r: dict, m: str, p: str, files: str) -> str:
    """The headline when files are flagged but the set as a whole does not separate: the
    held-out AUC averages over every suspected file, so a few trained ones barely move it,
    while each flagged file outscores nearly every unseen one. Benjamini-Hochberg flags any
    file only if Simes' test of "M trained on none of them" rejects at the FDR level."""
    pf = r["per_file"]
    return (
        f"Evidence that {m} trained on some of these files: {files} (by Simes' test on the "
        f"same p-values, a flag when {m} trained on none of them has a chance of at most "
        f"{pf['fdr']:.0%}), though the set as a whole does not separate ({p}, not below "
        f"{r['dataset_test']['alpha']:g}): a few trained files barely move an average over all"
    )


def _with_null(text: str, claim: str, null) -> dict:
    """The verdict dict; a rejecting null check is read as its chance of a false alarm."""
    if null and null["reject"]:
        text += (
            f". The null check rejects on two random halves of the unseen sources (p = "
            f"{_p(null['p_value'])}): its permutation test is exact, so this is its "
            f"{null['alpha']:.0%} chance of a false alarm; it says nothing of the suspected files"
        )
    return {"text": text + ".", "trained": claim == "evidence of training", "claim": claim}


def _randomized_verdict(r: dict, m: str, p: str, files: str, null) -> dict:
    t = r["dataset_test"]
    if t["reject"]:
        text = f"Evidence that {m} trained on these files: {p}; {files}"
        claim = "evidence of training"
    elif r["per_file"]["n_flagged"]:
        text, claim = _some_files(r, m, p, files), SOME_FILES
    else:
        text = (
            f"No evidence that {m} trained on these files: {p} (not below {t['alpha']:g}); {files}"
        )
        claim = "no evidence of training"
    text += (
        ". Exact by the randomization you declared (audit.design: randomized: the files were "
        "split at random into suspected and unseen before the model could train on them)"
    )
    said = []
    for key, name in (("blind_check", "blind check"), ("reference_check", "reference check")):
        c = r.get(key)
        if c:
            said.append(f"the {name} {'rejects' if c['reject'] else 'does not reject'} "
                        f"(p = {_p(c['p_value'])})")  # fmt: skip
    if said:
        text += ("; " + " and ".join(said) + ", reported only: a random split differs in "
                 f"kind by chance, and each check rejects {t['alpha']:.0%} of random splits")  # fmt: skip
    cal = r.get("calibrated_test")
    if cal:
        text += (f". {m}'s scores minus {cal['model']}'s "
                 f"{'separate' if cal['reject'] else 'do not separate'} the sets (calibrated "
                 f"test p = {_p(cal['p_value'])})")  # fmt: skip
    return _with_null(text, claim, null)


def _blind_views(blind: dict) -> str:
    names = list(blind.get("parts") or {})
    if len(names) < 2:
        return "".join(names)
    return f"{', '.join(names[:-1])} and {names[-1]}"


def _failed_checks(r: dict) -> str:
    """'the blind check (surface, p = ...)' and / or the reference check, those that reject."""
    out = []
    blind, ref = r.get("blind_check"), r.get("reference_check")
    if blind and blind["reject"]:
        views = [n for n, v in (blind.get("parts") or {}).items() if v["reject"]]
        inner = ", ".join([*views, f"blind check p = {_p(blind['p_value'])}"])
        out.append(f"the files' text alone, without a model ({inner})")
    if ref and ref["reject"]:
        out.append(
            f"the reference model {ref['model']}, which never saw the files (reference check "
            f"p = {_p(ref['p_value'])})"
        )
    return " and ".join(out)


def _passed(r: dict) -> str:
    out = []
    blind, ref = r.get("blind_check"), r.get("reference_check")
    if blind and not blind["reject"]:
        views = _blind_views(blind)
        out.append(f"the blind check{' on ' + views if views else ''} (p = {_p(blind['p_value'])})")
    if ref and not ref["reject"]:
        out.append(f"the reference check on {ref['model']} (p = {_p(ref['p_value'])})")
    return " and ".join(out)


def _untested(r: dict) -> list[str]:
    out = []
    passed = _passed(r)
    if passed:
        out.append(f"{passed} did not reject")
    if not r.get("blind_check"):
        out.append("the blind check did not run (audit.blind_check: false), so the premise "
                   "went unchecked without a model")  # fmt: skip
    if not r.get("reference_check"):
        out.append("differences a model sees but the text checks do not are not ruled out: "
                   "give --reference, a model that never saw the files, to test them")  # fmt: skip
    return out


def _premise_note(r: dict) -> str:
    prem = r.get("premise") or premise(r)
    ran = [c for c in prem["checks"] if c["ran"]]
    said = "; ".join(
        f"the {c['name']} ({c['sees']}) {'rejects' if c['reject'] else 'does not reject'}, "
        f"p = {_p(c['p_value'])}"
        for c in ran
    )
    gone = "; ".join(f"the {c['name']} did not run ({c['why_not']})" for c in prem["checks"]
                     if not c["ran"])  # fmt: skip
    out = f"{said}." if said else ""
    if gone:
        out += f" {gone[0].upper()}{gone[1:]}."
    out += " Not ruled out: " + "; ".join(prem["not_ruled_out"]) + "."
    out += (" The null check (two random halves of the unseen files) is exact by construction "
            "and tests the machinery only, never the premise.")  # fmt: skip
    return out.strip()


def calibration_note(pf: dict) -> str:
    """The calibration size and the smallest p-value it allows."""
    return (f"A suspected file is ranked against the {pf['n_calibration']} unseen files, so no "
            f"p-value is below {pf['min_p_value']:.4f}")  # fmt: skip


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def notes(cfg: AuditJobConfig, r: dict) -> list[str]:
    pf, t, d = r["per_file"], r["dataset_test"], r["data"]
    lines = [
        "The dataset test is LLM Dataset Inference (Maini et al. 2024) on files, with an exact "
        "test: the sources are split in halves (stratified, seeded); a linear discriminant whose "
        "weights are constrained to be >= 0 (every feature is oriented 'higher = member', so "
        "only files that look more trained-on can count) is fitted on one half's files and "
        "scores the other half's; the held-out AUC measures the separation; halves swap and "
        f"the whole repeats over {cfg.audit.rounds} seed(s). The mean AUC is compared with the "
        f"same statistic for {t['permutations']} random permutations of the sources' sides "
        f"(the whole cross-fit redone each time): p = (1 + #{{at least as high}}) / "
        f"({t['permutations']} + 1), exact under H0; Monte Carlo error ±{t['mc_error']:.2g}.",
        "H0: the model scores the suspected sources like unseen ones. A rejection reads as "
        "training on a premise: "
        + (r.get("premise") or premise(r))["statement"]
        + ". "
        + _premise_note(r)
        + " The test cannot tell which files were trained on, only that "
        "some were.",
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
        f"Per-file p-values: {pf['scheme']} {pf['guarantee']} {calibration_note(pf)}; at "
        f"{pf['fdr']:.0%} FDR files can be flagged only when at least "
        f"{pf['min_flagged_together']} of the {d['n_suspected']} are flagged together.",
        "A file that is not flagged is not shown unseen: short files, or files the model saw "
        "once, leave little signal.",
    ]
    if r["features"]["no_evidence"]:
        lines.append(
            "Features with weight 0 in every fit carry no evidence here: "
            + ", ".join(r["features"]["no_evidence"])
            + "."
        )
    lengths = r.get("lengths") or {}
    if lengths.get("warning"):
        lines.append(f"Lengths: {lengths['warning']}.")
    if d.get("left_out"):
        lines.append(f"{len(d['left_out'])} file(s) left out (listed under data.left_out).")
    held = d.get("held_out") or {}
    if held:
        lines.append(
            f"ReCaLL's prefix is the first snippet of {len(held['prefix_files'])} unseen files; "
            f"their {len(held['sources'])} source(s), {len(held['files_left_out'])} file(s) in "
            "all, are held out of the audit (neither scored nor calibrated on), so the prefix "
            "is part of the score for every file that remains and the p-values stay valid "
            "(data.held_out)."
        )
    if r.get("truth"):
        tr = r["truth"]
        lines.append(
            f"Scored against data.labels: {tr['members_flagged']} of {tr['n_members']} member "
            f"files flagged, {tr['nonmembers_flagged']} non-member files flagged "
            f"(false-discovery proportion {tr['fdp']:.0%})."
        )
    return lines


def merge_copycheck(report: dict) -> None:
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


def write_outputs(out: Path, snip: pd.DataFrame, features: list[str], report: dict) -> None:
    from mia_ray.reports.io import write_parquet

    write_parquet(out / "files.parquet", pd.DataFrame(report["files"]))
    cols = ["snippet_id", "doc_id", "n_tokens", *features, "text"]  # the text scored
    write_parquet(out / "snippet_scores.parquet", snip[cols])
