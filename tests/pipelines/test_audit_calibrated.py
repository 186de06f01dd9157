"""The calibrated test: the dataset test on the target's scores minus the reference's. What
both models read alike in the texts cancels; what only the target learned stays. Exercised
through the audit's own analysis on snippet rows built here (no model is run: the scores are
the input)."""

import numpy as np
import pandas as pd

from mia_ray.pipelines.audit.analysis import analyse
from mia_ray.pipelines.audit.config import AuditJobConfig

WORDS = [f"w{i}" for i in range(400)]
N_SUS, N_UNS, PER_FILE = 20, 40, 4


def _rows(seed: int):
    """Snippet rows of 20 suspected and 40 unseen files, texts of one vocabulary, and a
    reference's scores (file effect + noise, independent of the sides)."""
    rng = np.random.default_rng(seed)
    ids = [f"suspected/s{i:02d}" for i in range(N_SUS)] + [f"unseen/u{i:02d}" for i in range(N_UNS)]
    doc = np.repeat(ids, PER_FILE)
    base = np.repeat(rng.normal(size=(len(ids), 2)), PER_FILE, axis=0)
    ref = np.round(8 * (base + rng.normal(size=(len(doc), 2)))) / 8  # exact sums below
    snip = pd.DataFrame({
        "doc_id": doc,
        "snippet_id": [f"{d}#{k % PER_FILE}" for k, d in enumerate(doc)],
        "text": [" ".join(rng.choice(WORDS, 60)) for _ in doc],
    })  # fmt: skip
    files = pd.DataFrame({"doc_id": ids, "side": [int(i.startswith("suspected/")) for i in ids],
                          "source": ids})  # fmt: skip
    return snip, files, ref, np.char.startswith(doc.astype(str), "suspected/")


def _analyse(snip, files, target, ref):
    cfg = AuditJobConfig()
    cfg.model.name_or_path, cfg.model.reference = "m", "r"
    cfg.audit.permutations, cfg.audit.rounds = 199, 2
    snip = snip.assign(loss=target[:, 0], zlib=target[:, 1])
    reference = snip[["snippet_id"]].assign(loss=ref[:, 0], zlib=ref[:, 1])
    calib = {"n_calibration": N_UNS, "min_p_value": 1 / (N_UNS + 1),
             "min_flagged_together": 1}  # fmt: skip
    return analyse(cfg, snip, ["loss", "zlib"], files, {}, calib, reference=reference)


def test_a_shift_both_models_read_alike_cancels_exactly():
    snip, files, ref, sus = _rows(0)
    shifted = ref + 1.5 * sus[:, None]  # texts easier for any model: both read it
    r = _analyse(snip, files, shifted + 0.25, shifted)
    assert r["dataset_test"]["reject"]
    cal = r["calibrated_test"]
    # target - reference is 0.25 on every snippet: no file differs, the held-out AUC is 1/2
    # in every permutation, so every permutation ties the observed one.
    assert cal["features"] == ["loss", "zlib"] and cal["statistic"] == 0.5
    assert cal["p_value"] == 1.0 and not cal["reject"]
    assert r["reference_check"]["reject"]
    assert r["verdict"]["claim"] == "not evidence of training"
    assert r["per_file"]["n_flagged"] == 0
    assert r["per_file"]["withheld"] == (
        "the reference check rejects (suspected and unseen files differ in kind) and the "
        "calibrated test does not reject (the target sees no more than the reference model, "
        "which never saw the files): no file's p-value can be read as evidence of training"
    )


def test_what_only_the_target_learned_stays():
    snip, files, ref, sus = _rows(1)
    trained = np.isin(snip["doc_id"], files["doc_id"][:10])  # 10 of the 20 suspected files
    target = ref + 0.5 * np.random.default_rng(2).normal(size=ref.shape) + 2.0 * trained[:, None]
    r = _analyse(snip, files, target, ref)
    cal, t = r["calibrated_test"], r["dataset_test"]
    assert t["reject"] and cal["reject"] and cal["p_value"] == 1 / 200
    # The reference's noise cancels too: the calibrated test separates the sets further.
    assert cal["statistic"] > t["statistic"]
    assert not r["reference_check"]["reject"] and not r["blind_check"]["reject"]
    assert r["verdict"]["claim"] == "evidence of training"
    assert "calibrated test p = 0.005" in r["verdict"]["text"]
    assert r["per_file"]["withheld"] is None
    # Each file is ranked against all 40 unseen files on its target scores and its target
    # minus reference scores: the 10 trained files lead (2 sd on the differences, where the
    # files' own effect has cancelled), and Benjamini-Hochberg flags them and nothing else.
    pf = r["per_file"]
    assert pf["n_calibration"] == 40 and "minus the reference's" in pf["score"]
    flagged = {f["file_id"] for f in r["files"] if f["flagged"]}
    assert flagged == {f"s{i:02d}" for i in range(10)}
    assert all(f["p_value"] == 1 / 41 for f in r["files"] if f["flagged"])
