"""The audit's verdict sentence: what each check's outcome lets the report say, and the
premise every verdict rests on."""

from mia_ray.pipelines.audit import verdict
from mia_ray.pipelines.audit.report import calibration_note, premise


def _report(p=1e-4, null_p=0.5, blind_p=1.0, ref_p=None, views_p=None, blind=True, cal_p=1e-3,
            flagged=50):  # fmt: skip
    def check(q):
        return {"p_value": q, "reject": q <= 0.05, "alpha": 0.05}

    r = {
        "model": {"name_or_path": "m", "reference": "r" if ref_p is not None else None},
        "data": {"n_suspected": 66},
        "dataset_test": {"p_value": p, "statistic": 0.93, "reject": p <= 0.05, "alpha": 0.05},
        "per_file": {"n_flagged": flagged, "fdr": 0.05},
        "null_check": check(null_p),
    }
    if blind:
        views = views_p or {"words": 1.0, "characters": 1.0, "surface": 1.0}
        r["blind_check"] = {
            **check(blind_p),
            "parts": {k: {"adjusted_p_value": v, "reject": v <= 0.05} for k, v in views.items()},
        }
    if ref_p is not None:
        r["reference_check"] = {**check(ref_p), "model": "r"}
        r["calibrated_test"] = {**check(cal_p), "model": "r"}
    return r


def test_evidence_only_when_every_check_of_the_premise_ran_and_passed():
    v = verdict(_report(ref_p=0.6))
    assert v == {
        "text": "Evidence that m trained on these files: p = 0.0001, held-out AUC 0.93; 50 of 66 "
        "files flagged at 5% FDR. m's scores beyond r's separate the sets too (calibrated test "
        "p = 0.001). It rests on the premise that suspected and unseen files "
        "differ only by training, which the blind check on words, characters and surface (p = 1) "
        "and the reference check on r (p = 0.6) did not falsify.",
        "trained": True,
        "claim": "evidence of training",
    }


def test_without_a_reference_the_headline_says_what_is_not_ruled_out():
    v = verdict(_report())
    assert v == {
        "text": "m scores the suspected files as more trained-on than the unseen ones (p = "
        "0.0001, held-out AUC 0.93; 50 of 66 files flagged at 5% FDR). That is evidence of "
        "training only if the two sets differ by training alone, and not all of that was "
        "tested: the blind check on words, characters and surface (p = 1) did not reject; "
        "differences a model sees but the text checks do not are not ruled out: give "
        "--reference, a model that never saw the files, to test them.",
        "trained": False,
        "claim": "training signal, premise partly untested",
    }
    assert "Evidence that" not in v["text"]


def test_with_the_blind_check_off_the_headline_says_the_premise_went_unchecked():
    v = verdict(_report(blind=False))
    assert v["claim"] == "training signal, premise partly untested" and not v["trained"]
    assert (
        "the blind check did not run (audit.blind_check: false), so the premise went "
        "unchecked without a model" in v["text"]
    )
    v = verdict(_report(blind=False, ref_p=0.5))
    assert v["claim"] == "training signal, premise partly untested"


def test_the_null_check_is_never_cited_for_the_premise():
    # Exact by construction on a random split of the unseen files: it tests the machinery.
    v = verdict(_report(ref_p=0.6))
    assert "null check" not in v["text"]
    prem = premise(_report(ref_p=0.6))
    assert [c["name"] for c in prem["checks"]] == ["blind check", "reference check"]


def test_a_rejecting_null_check_is_read_as_its_chance_of_a_false_alarm():
    v = verdict(_report(null_p=0.047, ref_p=0.6))
    assert v["trained"] is True
    assert v["text"].endswith(
        " did not falsify. The null check rejects on two random halves of the unseen sources "
        "(p = 0.047): its permutation test is exact, so this is its 5% chance of a false alarm; "
        "it says nothing of the suspected files."
    )


def test_a_rejecting_blind_check_withholds_the_verdict_either_way():
    v = verdict(_report(blind_p=0.001, views_p={"words": 0.4, "characters": 0.03,
                                                "surface": 0.001}))  # fmt: skip
    assert v["trained"] is False and v["claim"] == "not evidence of training"
    assert v["text"].startswith(
        "Not evidence of training: the model scores suspected files above unseen ones (p = "
        "0.0001, held-out AUC 0.93), but the files' text alone, without a model (characters, "
        "surface, blind check p = 0.001) tells the two sets apart too"
    )
    assert "No file is called trained" in v["text"]
    # The dataset test does not reject: no claim that the model tells the sets apart.
    v = verdict(_report(p=0.4, blind_p=0.001))
    assert v["trained"] is False
    assert v["text"].startswith(
        "No evidence that m trained on these files (p = 0.4, held-out AUC 0.93, not below "
        "0.05), and this audit could not be trusted to find it: the files' text alone, without "
        "a model (blind check p = 0.001) tells suspected from unseen files"
    )
    assert "the model tells" not in v["text"] and "model scores suspected" not in v["text"]


def test_a_rejecting_reference_check_means_the_texts_differ():
    v = verdict(_report(ref_p=0.002))
    assert v["claim"] == "not evidence of training" and not v["trained"]
    assert (
        "but the reference model r, which never saw the files (reference check p = "
        "0.002) tells the two sets apart too" in v["text"]
    )
    prem = premise(_report(ref_p=0.002))
    assert prem["falsified_by"] == ["reference check"] and prem["all_checks_ran"]


def test_what_the_reference_also_reads_is_not_evidence_of_training():
    # The target prefers the suspected files, the reference check does not reject, but the
    # target's scores minus the reference's do not separate the sets: what the target sees may
    # be what any model reads in the texts, more weakly in the reference (VALIDITY.md, easier).
    v = verdict(_report(ref_p=0.3, cal_p=0.2))
    assert v == {
        "text": "Not evidence of training: m scores the suspected files above unseen ones (p = "
        "0.0001, held-out AUC 0.93), but not beyond what r, which never saw the files, scores "
        "them (the calibrated test on m's scores minus its own: p = 0.2, not below 0.05): the "
        "difference may be in the texts. No file is called trained.",
        "trained": False,
        "claim": "not evidence of training",
    }
    # A check that rejects is the stronger reason, and is the one given.
    v = verdict(_report(ref_p=0.002, cal_p=0.2))
    assert "reference check p = 0.002" in v["text"] and "calibrated" not in v["text"]


def test_a_randomized_split_reports_the_calibrated_test_only():
    v = verdict({**_report(ref_p=0.5, cal_p=0.3), "design": "randomized"})
    assert v["claim"] == "evidence of training"
    assert v["text"].endswith(
        "the blind check does not reject (p = 1) and the reference check does not reject (p = "
        "0.5), reported only: a random split differs in kind by chance, and each check rejects "
        "5% of random splits. m's scores minus r's do not separate the sets (calibrated test p "
        "= 0.3)."
    )


def test_no_evidence_names_the_checks_that_passed():
    v = verdict(_report(p=0.3, ref_p=0.7, flagged=0))
    assert v == {
        "text": "No evidence that m trained on these files: p = 0.3, held-out AUC 0.93 (not below "
        "0.05); 0 of 66 files flagged at 5% FDR; the blind check on words, characters and "
        "surface (p = 1) and the reference check on r (p = 0.7) did not reject.",
        "trained": False,
        "claim": "no evidence of training",
    }


def test_flagged_files_under_a_set_that_does_not_separate_lead_the_headline():
    """Never "No evidence" above a table of flagged files: a few trained files move the
    held-out AUC little, and each flag is evidence on its own (Simes)."""
    v = verdict(_report(p=0.3, ref_p=0.7, flagged=7))
    assert v == {
        "text": "Evidence that m trained on some of these files: 7 of 66 files flagged at 5% FDR "
        "(by Simes' test on the same p-values, a flag when m trained on none of them has a "
        "chance of at most 5%), though the set as a whole does not separate (p = 0.3, held-out "
        "AUC 0.93, not below 0.05): a few trained files barely move an average over all; the "
        "premise rests on the blind check on words, characters and surface (p = 1) and the "
        "reference check on r (p = 0.7), which did not falsify it.",
        "trained": False,
        "claim": "evidence for some files",
    }
    untested = verdict(_report(p=0.3, flagged=7))
    assert untested["claim"] == "evidence for some files"
    assert "not every check of the premise ran: " in untested["text"]


def test_the_premise_lists_what_no_check_could_see():
    prem = premise(_report())
    assert prem["statement"].startswith("suspected and unseen files differ only by training")
    assert prem["kind"].startswith("exact if the premise holds")
    ref = prem["checks"][1]
    assert ref == {"name": "reference check", "ran": False, "sees": ref["sees"],
                   "why_not": "no model.reference (--reference)"}  # fmt: skip
    assert prem["not_ruled_out"][0].startswith("differences a model sees but the blind check")
    assert not prem["all_checks_ran"] and prem["falsified_by"] == []


def test_a_declared_randomized_split_is_exact_by_design_and_its_checks_are_reported_only():
    # A random split differs in kind by chance: a check that rejects (5 % of random splits)
    # cannot falsify a premise true by construction, so it withholds nothing.
    r = {**_report(blind_p=0.02, views_p={"words": 0.3, "characters": 0.02, "surface": 0.5}),
         "design": "randomized"}  # fmt: skip
    v = verdict(r)
    assert v["claim"] == "evidence of training" and v["trained"]
    assert v["text"] == (
        "Evidence that m trained on these files: p = 0.0001, held-out AUC 0.93; 50 of 66 files "
        "flagged at 5% FDR. Exact by the randomization you declared (audit.design: randomized: "
        "the files were split at random into suspected and unseen before the model could train "
        "on them); the blind check rejects (p = 0.02), reported only: a random split differs in "
        "kind by chance, and each check rejects 5% of random splits."
    )
    prem = premise(r)
    assert prem["kind"].startswith("exact by the owner's randomization")
    assert prem["falsified_by"] == [] and "declared by the user" in prem["statement"]
    v = verdict({**_report(p=0.4, flagged=0), "design": "randomized"})
    assert v["claim"] == "no evidence of training"
    v = verdict({**_report(p=0.4, flagged=3), "design": "randomized"})
    assert v["claim"] == "evidence for some files"
    assert v["text"].startswith("Evidence that m trained on some of these files: 3 of 66")


def test_the_calibration_note_says_the_floor():
    assert calibration_note({"n_calibration": 90, "min_p_value": 1 / 91}) == (
        "A suspected file is ranked against the 90 unseen files, so no p-value is below 0.0110"
    )
