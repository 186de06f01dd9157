"""The audit's verdict sentence: what each check's outcome lets the report say."""

from mia_ray.pipelines.audit import verdict


def _report(p=1e-4, null_p=0.5, blind_p=1.0):
    def check(q):
        return {"p_value": q, "reject": q <= 0.05, "alpha": 0.05}

    return {
        "model": {"name_or_path": "m"},
        "data": {"n_suspected": 66},
        "dataset_test": {"p_value": p, "statistic": 0.93, "reject": p <= 0.05, "alpha": 0.05},
        "per_file": {"n_flagged": 50, "fdr": 0.05},
        "null_check": check(null_p),
        "blind_check": check(blind_p),
    }


def test_passing_checks_are_named_after_the_evidence():
    v = verdict(_report())
    assert v == {
        "text": "Evidence that m trained on these files: p = 0.0001, held-out AUC 0.93; 50 of 66 "
        "files flagged at 5% FDR; the blind check does not reject (p = 1); the null check on "
        "unseen vs unseen does not reject (p = 0.5).",
        "trained": True,
    }


def test_a_rejecting_null_check_is_read_as_its_chance_of_a_false_alarm():
    # Its sides are a random split of the unseen sources and its test is exact: a rejection
    # is its alpha chance, and says nothing about the suspected files (nor detects dependence).
    v = verdict(_report(null_p=0.047))
    assert v["trained"] is True
    assert v["text"].endswith(
        "; the blind check does not reject (p = 1). The null check rejects on two random halves "
        "of the unseen sources (p = 0.047): its permutation test is exact, so this is its 5% "
        "chance of a false alarm; it says nothing of the suspected files."
    )


def test_a_rejecting_blind_check_withholds_the_verdict_either_way():
    v = verdict(_report(blind_p=0.001))
    assert v["trained"] is False
    assert v["text"].startswith(
        "Not evidence of training: the model scores suspected files above unseen ones (p = "
        "0.0001, held-out AUC 0.93), but their words alone tell the two sets apart too"
    )
    assert "No file is called trained" in v["text"]
    # The dataset test does not reject: no claim that the model tells the sets apart.
    v = verdict(_report(p=0.4, blind_p=0.001))
    assert v["trained"] is False
    assert v["text"].startswith(
        "No evidence that m trained on these files (p = 0.4, held-out AUC 0.93, not below "
        "0.05), and this audit could not be trusted to find it: the files' words alone tell "
        "suspected from unseen files (blind check p = 0.001)"
    )
    assert "the model tells" not in v["text"] and "model scores suspected" not in v["text"]
