"""The audit's verdict sentence: what each check's outcome lets the report say."""

from mia_ray.pipelines.audit import _verdict


def _report(p=1e-9, null_p=0.5, blind_p=1.0):
    check = lambda q: {"p_value": q, "reject": q < 0.05, "alpha": 0.05}  # noqa: E731
    return {
        "model": {"name_or_path": "m"},
        "data": {"n_suspected": 66},
        "dataset_test": {"p_value": p, "effect_size": 2.0, "reject": p < 0.05, "alpha": 0.05},
        "per_file": {"n_flagged": 50, "fdr": 0.05},
        "null_check": check(null_p),
        "blind_check": check(blind_p),
    }


def test_passing_checks_are_named_after_the_evidence():
    v = _verdict(_report())
    assert v == {
        "text": "Evidence that m trained on these files: p = 1.0e-09, effect size d = 2.00; 50 of "
        "66 files flagged at 5% FDR; the blind check does not reject (p = 1), nor does the null "
        "check on unseen vs unseen (p = 0.5).",
        "trained": True,
    }


def test_a_rejecting_null_check_is_read_as_chance_or_dependent_files():
    # Its halves are a random split of the unseen files: they cannot differ, so a rejection
    # is the test's own 5% error or files that are not independent, never "unlike files".
    v = _verdict(_report(null_p=0.047))
    assert v["trained"] is True
    assert v["text"].endswith(
        "; the blind check does not reject (p = 1). Caution: the null check rejects on two "
        "random halves of the unseen files (p = 0.047), where no difference can be: a 1-in-20 "
        "chance at its 5% level, or files that are not independent (near-duplicates, one "
        "source split into many files), which would make this run's p-values too small."
    )


def test_the_chance_of_a_null_check_rejection_follows_its_level():
    r = _report(null_p=0.004)
    r["null_check"]["alpha"] = 0.01
    assert (
        "(p = 0.004), where no difference can be: a 1-in-100 chance at its 1% level"
        in (_verdict(r)["text"])
    )
