"""`mia-ray audit` end to end on the test world: a memorising target is caught with its member
files flagged under FDR control; a target that never trained is cleared; bad inputs stop
early with one clear line."""

import json
import random
import shutil
from pathlib import Path

import pandas as pd
import pytest

from mia_ray.cli import main
from mia_ray.errors import MiaError
from mia_ray.pipelines.audit import SIDES, check_counts
from mia_ray.pipelines.audit.config import AuditJobConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow]
SETTINGS = [
    "--set", "data.snippet_unit=words", "--set", "data.snippet_size=64",
    "--set", "model.max_length=128", "--set", "resources.scorer.torch_threads=1",
    "--set", "audit.fdr=0.1",
]  # fmt: skip  # the snapshot's 64-word snippets; the default (the window) below
# The audit's default: snippets of the models' window in tokens, less ReCaLL's room (the test
# world's tiny and tiny-ref read 128 tokens: 64).
WINDOW = ["--set", "data.snippet_unit=tokens", "--set", "data.snippet_size=0"]


def _write_jsonl(path, docs):
    path.write_text("".join(json.dumps({"id": d["id"], "text": d["text"]}) + "\n" for d in docs))
    return path


@pytest.fixture(scope="module")
def audit_inputs(tmp_path_factory, test_world):
    """suspected = every member of tiny + 8 non-members; unseen = the other non-members."""
    root = Path(test_world["root"])
    manifest = json.loads((root / "manifests" / "tiny.json").read_text())
    docs = [json.loads(x) for x in (root / "corpus" / "documents.jsonl").read_text().splitlines()]
    docs = [d for d in docs if d["id"] in manifest]
    members = [d for d in docs if manifest[d["id"]] == 1]
    others = [d for d in docs if manifest[d["id"]] == 0]
    random.Random(0).shuffle(others)
    d = tmp_path_factory.mktemp("audit-inputs")
    sus = members + others[:8]
    labels = d / "labels.json"
    labels.write_text(json.dumps({x["id"]: manifest[x["id"]] for x in sus}))
    return {
        "root": root,
        "suspected": _write_jsonl(d / "suspected.jsonl", sus),
        "unseen": _write_jsonl(d / "unseen.jsonl", others[8:]),
        "labels": labels,
        "n_members": len(members),
        "dir": d,
    }


def names_of(report):
    return report["features"]["names"]


def _audit(out, inputs, target, *extra, reference="tiny-ref"):
    models = inputs["root"] / "models"
    ref = ["--reference", str(models / reference)] if reference else []
    args = [
        "audit", "--model", str(models / target), *ref,
        "--suspected", str(inputs["suspected"]), "--unseen", str(inputs["unseen"]),
        "--set", f"data.labels={inputs['labels']}", *SETTINGS, *extra, "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def tiny_audit(tmp_path_factory, ray_local, audit_inputs):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    return out, _audit(out, audit_inputs, "tiny")


def test_memorising_target_is_caught_and_its_member_files_flagged(
    tiny_audit, audit_inputs, null_check_calibrated
):
    out, r = tiny_audit
    assert r["dataset_test"]["reject"] and r["dataset_test"]["p_value"] < 1e-3
    assert r["dataset_test"]["effect_size"] > 1.0
    assert not r["blind_check"]["reject"]
    assert set(r["blind_check"]["parts"]) == {"words", "characters", "surface"}
    # The reference check: the dataset test on tiny-ref's own scores, the same features but ref.
    ref = r["reference_check"]
    assert not ref["reject"] and ref["features"] == [c for c in names_of(r) if c != "ref"]
    assert (out / "reference" / "rows" / "reference").is_dir()
    # The calibrated test: tiny's scores minus tiny-ref's, feature by feature; tiny memorised
    # its members and tiny-ref did not, so it rejects as strongly as the dataset test.
    cal = r["calibrated_test"]
    assert cal["reject"] and cal["p_value"] == 1 / 2000 and cal["features"] == ref["features"]
    assert r["per_file"]["withheld"] is None
    null_check_calibrated(out, r)
    assert r["premise"]["all_checks_ran"] and r["premise"]["falsified_by"] == []
    assert r["verdict"]["claim"] == "evidence of training" and r["verdict"]["trained"]
    assert r["verdict"]["text"].startswith("Evidence that ")
    t = r["truth"]
    # Files shorter than one 64-word snippet are left out, and said so.
    left = r["data"]["left_out"]
    assert left and all(f["reason"] == "shorter than one full snippet (64 words)" for f in left)
    n_left = sum(f["side"] == "suspected" for f in left)
    labels = json.loads(audit_inputs["labels"].read_text())
    members_left = sum(labels[f["file_id"]] for f in left if f["side"] == "suspected")
    assert t["n_members"] == audit_inputs["n_members"] - members_left
    assert t["members_flagged"] >= 0.8 * t["n_members"]
    assert t["fdp"] <= 0.1
    # Every kept suspected file has a row; the flagged ones are exactly those with q <= fdr.
    assert len(r["files"]) == r["data"]["n_suspected"] == audit_inputs["n_members"] + 8 - n_left
    for f in r["files"]:
        assert (f["verdict"] == "trained") == (f["q_value"] <= 0.1)
        assert f["p_value"] >= r["per_file"]["min_p_value"] - 1e-12
    assert r["per_file"]["n_calibration"] == r["data"]["n_unseen"]
    assert r["data"]["n_unseen"] == len(r["unseen_files"]) == r["data"]["n_sources_unseen"]
    assert {f["n_calibration"] for f in r["files"]} == {r["data"]["n_unseen"]}
    # The same number of full-size snippets for every file.
    k = r["lengths"]["snippets_per_file"]
    assert k >= 1 and {f["n_snippets"] for f in r["files"]} == {k}
    assert r["data"]["n_snippets"] == k * (r["data"]["n_suspected"] + r["data"]["n_unseen"])
    assert r["dataset_test"]["permutations"] == 1999 and r["dataset_test"]["p_value"] == 1 / 2000
    names = r["features"]["names"]
    assert "ref" in names and "loss" in names and "min_k_plus_plus@0.2" in names
    assert len(r["features"]["weights_mean"]) == len(names)
    assert min(r["features"]["weights_mean"]) >= 0  # monotone: no feature counts against
    files = pd.read_parquet(out / "files.parquet")
    assert sorted(files["file_id"]) == sorted(f["file_id"] for f in r["files"])
    html = (out / "report.html").read_text()
    assert r["verdict"]["text"].split(":")[0] in html and html.count("<img") == 2
    assert "<h2>Premise</h2>" in html and "reference check" in html


def test_rerun_reuses_the_scored_rows_and_gives_the_same_numbers(tiny_audit, audit_inputs, capfd):
    out, r = tiny_audit
    capfd.readouterr()
    again = _audit(out, audit_inputs, "tiny")
    err = capfd.readouterr().err
    n = r["data"]["n_snippets"]
    assert f"target: reusing {n} of {n} rows" in err and f"reference: reusing {n} of {n}" in err
    assert again["dataset_test"]["p_value"] == r["dataset_test"]["p_value"]
    assert again["files"] == r["files"]


def test_a_target_that_never_trained_is_cleared(
    tmp_path, ray_local, audit_inputs, null_check_calibrated
):
    r = _audit(tmp_path / "random", audit_inputs, "tiny-random")
    assert not r["dataset_test"]["reject"] and r["dataset_test"]["p_value"] > 0.05
    assert not r["verdict"]["trained"] and r["verdict"]["text"].startswith("No evidence that ")
    # Nothing tiny-random sees beyond tiny-ref either, and no file is flagged on its own
    # p-value (nothing is withheld: the dataset test does not reject, so nothing is there
    # for the calibrated test to explain away).
    assert not r["calibrated_test"]["reject"] and r["per_file"]["n_flagged"] == 0
    assert r["per_file"]["withheld"] is None and r["verdict"]["claim"] == "no evidence of training"
    null_check_calibrated(tmp_path / "random", r)


def test_different_kinds_of_files_trip_the_blind_check(tmp_path, ray_local, audit_inputs):
    """Suspected = web leads, unseen = play scenes: any model separates them; the blind check
    sees it from the words and the verdict refuses to call it training."""
    root = audit_inputs["root"]
    docs = [json.loads(x) for x in (root / "corpus" / "documents.jsonl").read_text().splitlines()]
    web = [d for d in docs if d["id"].startswith("web/")]
    books = [d for d in docs if d["id"].startswith("books/")]
    inputs = dict(audit_inputs)
    inputs["suspected"] = _write_jsonl(tmp_path / "web.jsonl", web[:24])
    inputs["unseen"] = _write_jsonl(tmp_path / "books.jsonl", books[:24])
    inputs["labels"] = _write_jsonl(tmp_path / "none.jsonl", [])
    # The one-pass features (ReCaLL would hold 4 of the 24 books out for its prefix): this
    # tests the verdict when both the dataset test and the blind check reject.
    one_pass = "audit.attacks=[loss,zlib,min_k,min_k_plus_plus,lowercase]"
    r = _audit(
        tmp_path / "kinds", inputs, "tiny-random", "--set", "data.labels=", "--set", one_pass
    )
    assert r["blind_check"]["reject"] and r["blind_check"]["p_value"] < 0.01
    assert r["blind_check"]["parts"]["words"]["reject"]
    assert not r["verdict"]["trained"] and r["verdict"]["claim"] == "not evidence of training"
    assert "blind check" in r["premise"]["falsified_by"]
    assert r["verdict"]["text"].startswith("Not evidence of training")
    assert all(f["verdict"].startswith("no verdict: ") and not f["flagged"] for f in r["files"])


def test_without_a_reference_the_verdict_says_the_premise_is_partly_untested(
    tmp_path, ray_local, audit_inputs
):
    """tiny memorised its members, but with no reference no check can see a difference a model
    sees and the text checks do not: the headline says so and calls no file "trained"."""
    r = _audit(tmp_path / "noref", audit_inputs, "tiny", *WINDOW, reference="")
    # Without a reference the window is tiny's alone; its config records the size it ran with.
    assert r["data"]["snippet"] == "64 tokens"
    assert "snippet_size: 64\n" in (tmp_path / "noref" / "config.yaml").read_text()
    assert r["dataset_test"]["reject"] and "reference_check" not in r
    assert "ref" not in names_of(r)
    assert r["verdict"]["claim"] == "training signal, premise partly untested"
    assert not r["verdict"]["trained"] and "Evidence that" not in r["verdict"]["text"]
    assert "give --reference, a model that never saw the files" in r["verdict"]["text"]
    flagged = [f for f in r["files"] if f["flagged"]]
    assert flagged and {f["verdict"] for f in flagged} == {"flagged, premise partly untested"}
    check = r["premise"]["checks"][1]
    assert check["name"] == "reference check" and not check["ran"]
    assert check["why_not"] == "no model.reference (--reference)"


def test_sources_near_duplicates_and_short_files_as_users_bring_them(
    tmp_path, ray_local, audit_inputs
):
    """A suspected file that is an unseen file with 1 word in 20 changed, a 3-word file, and
    chapters of one book (--group-by): the first two are left out with their reason, the
    chapters are one source, and the report counts the sources the verdict rests on."""
    read = {s: [json.loads(x) for x in audit_inputs[s].read_text().splitlines()] for s in SIDES}
    sus, uns = read["suspected"], read["unseen"]
    words = uns[0]["text"].split()
    for i in random.Random(0).sample(range(len(words)), len(words) // 20):
        words[i] = "zzz"
    sus = [*sus, {"id": "copy-of-unseen", "text": " ".join(words)}]
    sus.append({"id": "three-words", "text": "three short words"})
    chapters = [d["id"] for d in sus if len(d["text"].split()) >= 128][:4]
    inputs = dict(audit_inputs)
    for side, docs in (("suspected", sus), ("unseen", uns)):
        for d in docs:
            d["book"] = "book-a" if d["id"] in chapters else d["id"]
        inputs[side] = tmp_path / f"{side}.jsonl"
        inputs[side].write_text("".join(json.dumps(d) + "\n" for d in docs))
    out = tmp_path / "users"
    r = _audit(out, inputs, "tiny", "--group-by", "book")
    left = {f["file_id"]: f["reason"] for f in r["data"]["left_out"]}
    assert left["copy-of-unseen"].startswith("shares ")
    assert left["copy-of-unseen"].endswith(
        f"of its 8-word spans with unseen file {uns[0]['id']!r}: it cannot be both suspected "
        "and surely unseen"
    )
    assert left["three-words"] == "shorter than one full snippet (64 words)"
    assert r["data"]["group_field"] == "book" and r["data"]["n_near_duplicate_pairs"] >= 1
    source = {f["file_id"]: f["source"] for f in r["files"]}
    assert {source[c] for c in chapters} == {min(chapters)}
    assert r["data"]["n_sources_suspected"] == r["data"]["n_suspected"] - 3
    assert "4 suspected and" not in r["verdict"]["text"]
    note = next(n for n in r["notes"] if n.startswith("The verdict rests on"))
    assert note.startswith(
        f"The verdict rests on {r['data']['n_sources_suspected']} suspected and "
        f"{r['data']['n_sources_unseen']} unseen independent sources ("
    )
    assert "Left out (" in (out / "report.html").read_text()


def _fails(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"mia-ray: error: {message}"


def _base(inputs, tmp_path):
    return [
        "audit", "--model", str(inputs["root"] / "models" / "tiny"),
        "--suspected", str(inputs["suspected"]), "--out", str(tmp_path / "out"),
    ]  # fmt: skip


def test_empty_unseen_folder_is_an_error(tmp_path, ray_local, audit_inputs, capsys):
    (tmp_path / "empty").mkdir()
    _fails(
        capsys,
        [*_base(audit_inputs, tmp_path), "--unseen", str(tmp_path / "empty")],
        f"--unseen ({tmp_path / 'empty'}): data directory {tmp_path / 'empty'} has no files "
        "(hidden files are skipped)",
    )


def test_a_file_on_both_sides_is_an_error(tmp_path, ray_local, audit_inputs, capsys):
    uns = tmp_path / "unseen.jsonl"
    shutil.copyfile(audit_inputs["unseen"], uns)
    first = json.loads(audit_inputs["suspected"].read_text().splitlines()[0])
    with open(uns, "a") as f:
        f.write(json.dumps({"id": "copy", "text": first["text"]}) + "\n")
    _fails(
        capsys,
        [*_base(audit_inputs, tmp_path), "--unseen", str(uns)],
        f"--suspected and --unseen share 1 file(s) with the same text, e.g. {first['id']!r} "
        "and 'copy': a file cannot be both suspected and surely unseen",
    )


def test_too_few_unseen_files_for_any_verdict_is_an_error(
    tmp_path, ray_local, audit_inputs, capsys
):
    lines = audit_inputs["unseen"].read_text().splitlines()[:10]
    uns = tmp_path / "few.jsonl"
    uns.write_text("\n".join(lines) + "\n")
    _fails(
        capsys,
        [*_base(audit_inputs, tmp_path), "--unseen", str(uns)],
        # The one minimum counts the 4 files ReCaLL's prefix holds out (default features).
        "--unseen has 10 file(s), 4 of them held out for ReCaLL's prefix: a suspected file is "
        "ranked against 6 of them, so its p-value is at least 1/7 = 0.143 > audit.fdr = 0.05 "
        "and no file could ever be flagged; give at least 23 unseen files (4 of them for "
        "ReCaLL's prefix, held out of the audit) (or raise audit.fdr)",
    )
    assert not (tmp_path / "out" / "rows").exists()  # stopped before any scoring


def test_check_counts_messages_and_what_the_calibration_allows():
    cfg = AuditJobConfig()
    with pytest.raises(MiaError, match=r"--suspected has 3 file\(s\): the audit needs at least 4 "):
        check_counts(cfg, 3, 40)
    with pytest.raises(MiaError, match=r"--unseen has 3 source\(s\): .* and 19 unseen sources"):
        check_counts(cfg, 10, 3, "source")
    with pytest.raises(MiaError, match="a suspected source is ranked against 15 of them.*give "
                       "at least 19 unseen sources"):  # fmt: skip
        check_counts(cfg, 10, 15, "source")
    got = check_counts(cfg, 66, 94)
    assert got == {"n_calibration": 94, "min_p_value": 1 / 95, "min_flagged_together": 14}
    # 19 unseen: every suspected file is ranked against all 19 and can reach 1/20 = 0.05
    assert check_counts(cfg, 10, 19)["min_p_value"] == 1 / 20
    with pytest.raises(MiaError, match="ranked against 18 of them"):
        check_counts(cfg, 10, 18)
    # ReCaLL's held-out files are part of the one minimum, in every message.
    with pytest.raises(
        MiaError,
        match=r"has 22 file\(s\), 4 of them held out .* ranked against 18 of "
        r"them.* give at least 23 unseen files \(4 of them for ReCaLL's prefix",
    ):
        check_counts(cfg, 10, 22, held=4)
    assert check_counts(cfg, 10, 23, held=4)["min_p_value"] == 1 / 20
    cfg.audit.fdr = 0.5
    with pytest.raises(MiaError, match="null check .* needs 8 of them; give at least 8 unseen"):
        check_counts(cfg, 10, 5)
    # fdr 0.3 needs 3 calibration files (5 unseen), the null check 8, ReCaLL 4 more: one
    # minimum, 12, whichever check fails first.
    cfg.audit.fdr = 0.3
    for n in (3, 5, 8):
        with pytest.raises(MiaError, match=r"at least (4 suspected and )?12 unseen files"):
            check_counts(cfg, 10, n, held=4)
    check_counts(cfg, 10, 12, held=4)


def test_snippets_per_file_reads_all_but_the_shortest_files_whatever_their_side():
    """k = the most full snippets that all files but the shortest 10 % have (both sides
    pooled, so a relabelling of the sides gives the same k), capped, at least 1; a number
    asked for wins."""
    from mia_ray.pipelines.audit.inputs import AUTO_MAX_SNIPPETS, snippets_per_file

    counts = [1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 30, 40, 50, 60, 70, 80, 90, 99, 99, 99]
    # 20 files: the 2 shortest (10 %) may be left out, so k is the third smallest count.
    assert snippets_per_file(counts, 0, 0, 0.1) == 3
    assert snippets_per_file(counts[::-1], 0, 0, 0.1) == 3  # order (and so side) blind
    assert snippets_per_file(counts, 0, 0, 0.0) == 1  # leave none out: the fewest
    assert snippets_per_file(counts, 0, 0, 0.45) == 9  # the 9 shortest may go
    assert snippets_per_file(counts, 0, 2, 0.45) == 2  # data.max_snippets_per_doc caps it
    assert snippets_per_file([99] * 10, 0, 0, 0.1) == AUTO_MAX_SNIPPETS == 16
    assert snippets_per_file([0, 0, 0, 5, 5], 0, 0, 0.1) == 1  # files without one: k >= 1
    assert snippets_per_file(counts, 7, 0, 0.1) == 7  # audit.snippets_per_file asked for


def test_flags_set_their_config_keys_and_missing_inputs_are_named(tmp_path, capsys):
    out = tmp_path / "o"
    args = ["audit", "--model", "org/m:v1 #x", "--suspected", "a", "--unseen", "b"]
    assert main([*args, "--reference", "r", "--out", str(out), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "name_or_path: 'org/m:v1 #x'" in printed and "reference: r" in printed
    assert "suspected: a" in printed and "unseen: b" in printed
    _fails(
        capsys,
        ["audit", "--model", "m", "--suspected", "a", "--out", str(out)],
        "audit needs --suspected (the files you think the model trained on) and --unseen "
        "(files of the same kind it surely never saw)",
    )
    _fails(
        capsys,
        [*args, "--set", "audit.design=random", "--out", str(out)],
        "audit.design must be one of observational, randomized, not 'random'",
    )


@pytest.mark.extra
def test_copycheck_on_request_joins_the_files_table(tmp_path, ray_local, audit_inputs, capsys):
    settings = (
        'audit.method_settings={copycheck: ["uncertainty.samplers=[mcd, ensemble]", '
        '"uncertainty.ensemble_size=2", "uncertainty.n_samples=4", "finetune.lr=0.001"]}'
    )
    # A small audit (6 suspected, 20 unseen files): CopyCheck fine-tunes on every snippet.
    small = dict(audit_inputs)
    for side, n in (("suspected", 6), ("unseen", 20)):
        lines = audit_inputs[side].read_text().splitlines()[:n]
        small[side] = tmp_path / f"{side}.jsonl"
        small[side].write_text("\n".join(lines) + "\n")
    # Storage a place of its own: every part the sub-run checkpoints under with-cc/copycheck
    # must reach it, and the members trained there come back into with-cc.
    store = tmp_path / "store"
    r = _audit(
        tmp_path / "with-cc", small, "tiny", "--set", "audit.methods=[copycheck]",
        "--set", settings, "--set", "audit.null_check=false", "--set", "audit.fdr=0.2",
        "--set", f"resources.storage={store}",
    )  # fmt: skip
    assert len(r["files"]) == 6
    cc = r["methods"]["copycheck"]
    assert cc["out"] == str(tmp_path / "with-cc" / "copycheck") and "files" not in cc
    assert cc["method"] == "gmm" and "loss_over_entropy" in cc["diagnostics"]
    # With labels, the verdicts are scored: one experiment per method.
    assert {"gmm", "prob_tool"} <= set(cc["summary"])
    assert all(v["n"] == 1 for v in cc["summary"].values())
    assert (store / "copycheck" / "samples" / "audit" / "mcd" / ".complete.json").is_file()
    assert list((store / "copycheck" / "samples" / "audit" / "ensemble").glob("part-*.parquet"))
    assert (store / "copycheck" / "train" / "audit" / "snippets.parquet").is_file()
    member = tmp_path / "with-cc" / "copycheck" / "train" / "audit" / "ens-1" / ".complete.json"
    assert member.is_file()
    assert {f["copycheck_verdict"] for f in r["files"]} <= {"seen", "unseen"}
    assert all(0 <= f["copycheck_confidence"] <= 1 for f in r["files"])
    sub = json.loads((tmp_path / "with-cc" / "copycheck" / "report.json").read_text())
    assert sub["data"]["mode"] == "audit"
    # One target pass: CopyCheck's Min-K% baseline (prob_tool, run since labels are given)
    # takes the audit's rows for the same snippet texts instead of scoring them again. Only
    # the snippets the audit cut to what both models score (15 of 65 here) are scored anew.
    assert {r["method"] for r in sub["results"]} >= {"prob_tool"}
    cc = pd.read_parquet(tmp_path / "with-cc" / "copycheck" / "snippets.parquet")
    cc = cc[cc["doc_id"].str.startswith("suspected/")]  # the side the baselines score
    audit_texts = set(pd.read_parquet(tmp_path / "with-cc" / "snippet_scores.parquet")["text"])
    same = int(cc["text"].isin(audit_texts).sum())
    assert 0 < same < len(cc)
    assert (
        f"] {same} snippets' target scores reused from the caller's pass" in capsys.readouterr().err
    )
    parts = (tmp_path / "with-cc" / "copycheck" / "rows" / "target").glob("part-*.parquet")
    assert sum(len(pd.read_parquet(p)) for p in parts) == len(cc) - same
    assert "copycheck_verdict" in (tmp_path / "with-cc" / "report.html").read_text()


def test_a_method_setting_with_a_typo_stops_before_any_work(tmp_path, audit_inputs, capsys):
    _fails(
        capsys,
        [
            *_base(audit_inputs, tmp_path),
            "--unseen",
            str(audit_inputs["unseen"]),
            "--set",
            "audit.methods=[copycheck]",
            "--set",
            'audit.method_settings={copycheck: ["uncertainty.n_samplez=4"]}',
        ],
        "audit.methods copycheck: unknown config key 'uncertainty.n_samplez'; did you mean "
        "'n_samples'?",
    )


def test_report_numbers_match_the_snapshot(tiny_audit, report_snapshot):
    report_snapshot(tiny_audit[1], "audit-tiny")


@pytest.mark.extra
def test_the_attack_zoo_serves_as_audit_features(tmp_path, ray_local, audit_inputs):
    """Any attack is a feature (audit.attacks); each extra pass runs on the audit's snippets.
    The reference check is off here (it would run every zoo pass on the reference as well):
    the reference still gives ``ref``, and the verdict says its check did not run."""
    pool = audit_inputs["root"] / "corpus" / "reference_pool.jsonl"
    zoo = "[loss,dc_pdd,pac,samia,neighbourhood,grad_norm]"
    r = _audit(tmp_path / "zoo", audit_inputs, "tiny", "--set", f"audit.attacks={zoo}",
               "--set", f"audit.dc_pdd.corpus={pool}", "--set", "audit.samia.samples=2",
               "--set", "audit.neighbourhood.n=3", "--set", "audit.pac.copies=2",
               "--set", "audit.reference_check=false")  # fmt: skip
    names = r["features"]["names"]
    for attack in ("dc_pdd", "pac", "samia", "neighbourhood", "grad_norm", "ref"):
        assert attack in names
    assert "held_out" not in r["data"] or not r["data"]["held_out"]  # no ReCaLL: none held out
    assert r["dataset_test"]["reject"] and "calibrated_test" not in r
    assert not (tmp_path / "zoo" / "reference" / "rows").exists()
    assert r["verdict"]["claim"] == "training signal, premise partly untested"
    check = r["premise"]["checks"][1]
    assert not check["ran"] and check["why_not"] == "audit.reference_check is false"


def test_con_recall_in_the_audit_needs_member_files():
    from mia_ray.config import load_config
    from mia_ray.errors import MiaError
    from mia_ray.pipelines.audit.config import AuditJobConfig

    with pytest.raises(MiaError, match="con_recall needs audit.recall.member_prefix"):
        load_config(AuditJobConfig, None, ["audit.suspected=a", "audit.unseen=b",
                                           "model.name_or_path=m", "audit.attacks=[con_recall]"])  # fmt: skip


def _api_inputs(audit_inputs) -> tuple[dict, dict]:
    """The keyword arguments and settings that make the API run :func:`_audit`'s tiny audit."""
    models = audit_inputs["root"] / "models"
    flags = {"model": str(models / "tiny"), "suspected": str(audit_inputs["suspected"]),
             "unseen": str(audit_inputs["unseen"]), "reference": str(models / "tiny-ref")}  # fmt: skip
    settings = dict(a.split("=", 1) for a in SETTINGS if a != "--set")
    settings["data.labels"] = str(audit_inputs["labels"])
    return flags, settings


def test_the_python_api_runs_the_same_audit_with_the_same_numbers(
    tiny_audit, audit_inputs, tmp_path, numbers_of
):
    import mia_ray

    cli_out, cli_report = tiny_audit
    flags, settings = _api_inputs(audit_inputs)
    r = mia_ray.audit(**flags, settings=settings, out=tmp_path / "api")
    assert numbers_of(r.report) == numbers_of(cli_report)
    assert r.report == json.loads((tmp_path / "api" / "report.json").read_text())
    assert r.p_value == cli_report["dataset_test"]["p_value"] and r.verdict.startswith("Evidence")
    assert r.html == tmp_path / "api" / "report.html" and r.mode == "local"  # this session's Ray
    files = pd.read_parquet(cli_out / "files.parquet")
    pd.testing.assert_frame_equal(r.files, files)
    assert len(r.snippets) == len(pd.read_parquet(cli_out / "snippet_scores.parquet"))


def test_the_notebook_runs_the_audit_through_the_api_and_draws_it(
    tiny_audit, audit_inputs, tmp_path, run_notebook, monkeypatch, numbers_of
):
    import ray

    cli_out, cli_report = tiny_audit
    out = tmp_path / "notebook"
    shutil.copytree(cli_out, out)  # its stages: the notebook's run reuses them by key
    flags, settings = _api_inputs(audit_inputs)
    monkeypatch.setenv("MIA_RAY_CONFIG", "")
    monkeypatch.setenv("MIA_RAY_FLAGS", json.dumps(flags))
    monkeypatch.setenv("MIA_RAY_SETTINGS", json.dumps(settings))
    monkeypatch.setenv("MIA_RAY_OUT", str(out))
    # The kernel attaches to this session's Ray instead of starting its own.
    monkeypatch.setenv("MIA_RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    _, text = run_notebook("audit.ipynb", out, timeout=600)
    report = json.loads((out / "report.json").read_text())
    assert numbers_of(report) == numbers_of(cli_report)
    assert f"p = {cli_report['dataset_test']['p_value']:.4g}" in text
    n = cli_report["per_file"]["n_flagged"]
    assert f"{n} of {len(cli_report['files'])} suspected files flagged at 10% FDR (BH)" in text
    png = out / "audit_notebook.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
