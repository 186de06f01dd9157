"""CopyCheck end to end on the test world: the report's contract, resuming, a killed sampler."""

import json
import signal
import threading
import time

import pytest

from mia_ray.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.slow]
METHODS = {
    "gmm", "hierarchical", "kmeans", "isolation_forest", "one_class_svm", "dbscan",
    "prob_tool", "neighbor_loss", "neighbor_ppl", "meeus",
}  # fmt: skip
N_UNSEEN = [2, 4]


def _args(test_world, out):
    return [
        "copycheck", "--config", "jobs/copycheck_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        "--set", "experiment.n_suspected=10", "--set", "experiment.n_unseen=8",
        "--set", f"experiment.n_unseen_in_suspected={N_UNSEEN}",
        "--set", "uncertainty.ensemble_size=3", "--set", "uncertainty.n_samples=4",
        "--set", "data.snippet_size=48", "--set", "data.max_snippets_per_doc=2",
        "--set", "finetune.max_length=128", "--set", "finetune.lr=1e-3",
        "--set", "detect.n_neighbors=3", "--set", "detect.meeus_max_docs_per_class=10",
        "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local, test_world):
    out = tmp_path_factory.mktemp("copycheck") / "run"
    assert main(_args(test_world, out)) == 0
    return out, json.loads((out / "report.json").read_text())


def _numbers(report):
    return report["results"], report["files"]


def test_results_cover_every_method_and_n_unseen_with_consistent_counts(run):
    _, report = run
    rows = report["results"]
    assert {(r["method"], r["n_unseen"]) for r in rows} == {
        (m, n) for m in METHODS for n in N_UNSEEN
    }
    for r in rows:
        assert r["tp"] + r["fp"] + r["fn"] + r["tn"] == 10  # the suspected files
        assert r["tp"] + r["fn"] == 10 - r["n_unseen"]  # truly seen among them
        assert r["acc"] == pytest.approx((r["tp"] + r["tn"]) / 10)
        tpr = r["tp"] / (r["tp"] + r["fn"])
        tnr = r["tn"] / (r["tn"] + r["fp"])
        assert r["bacc"] == pytest.approx((tpr + tnr) / 2)


def test_every_suspected_file_gets_a_verdict_and_confidence(run):
    out, report = run
    files = report["files"]
    assert len(files) == 10 * len(N_UNSEEN)
    for f in files:
        assert set(f) >= {"file_id", "verdict", "confidence", "label"}
        assert f["verdict"] in ("seen", "unseen") and 0 <= f["confidence"] <= 1
        assert f["label"] in (0, 1) and f["file_id"].startswith("books/")
    per_exp = {n: sum(f["label"] == 0 for f in files if f["n_unseen"] == n) for n in N_UNSEEN}
    assert per_exp == {n: n for n in N_UNSEEN}
    html = (out / "report.html").read_text()
    assert "Table II" in html and "Figure 1" in html and "<img" in html
    assert len(report["finetune"]["records"]) == len(N_UNSEEN) * (2 + 3)


def test_report_says_the_mc_dropout_mode_the_kl_weight_and_the_warmup(run):
    _, report = run
    notes, ft = " ".join(report["notes"]), report["finetune"]
    assert ft["mc_dropout"] == "all" and "uncertainty.mc_dropout=all" in notes
    assert "every dropout of the model switched on (model.train()" in notes
    # One epoch, batch 4, one worker, no accumulation: pi = 1 / BLoB's optimizer steps.
    steps = {r["steps"] for r in ft["records"] if r["member"] == "blob"}
    assert ft["blob_kl_pi"] == sorted(1 / s for s in steps)
    assert "optimizer steps per epoch" in notes and ft["spec"]["warmup_ratio"] == 0.06
    assert "warms up linearly over the first 6% of the steps" in notes


def test_rerun_retrains_nothing_and_gives_identical_numbers(run, test_world, capfd):
    out, report = run
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("train/*/*/.complete.json")}
    assert len(stamps) == len(N_UNSEEN) * 5
    assert main(_args(test_world, out)) == 0
    assert "10 of 10 members already trained" in capfd.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    again = json.loads((out / "report.json").read_text())
    assert _numbers(again) == _numbers(report)


def _kill_one_sampler(done: threading.Event, killed: list, since: float):
    """SIGKILL the first sampler actor process started after ``since`` (not a leftover one)."""
    import psutil

    while not done.is_set() and not killed:
        for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
            if proc.info["create_time"] < since:
                continue
            if "MapBatches(Sampler)" not in " ".join(proc.info["cmdline"] or []):
                continue
            time.sleep(1.0)  # let it load its model and take a batch
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
            killed.append(proc.info["pid"])
            return
        time.sleep(0.2)


@pytest.mark.extra
def test_a_killed_sampler_actor_is_replaced_and_the_numbers_do_not_change(run, test_world):
    import shutil

    out, report = run
    shutil.rmtree(out / "samples")
    done, killed = threading.Event(), []
    killer = threading.Thread(
        target=_kill_one_sampler, args=(done, killed, time.time()), daemon=True
    )
    killer.start()
    try:
        assert main(_args(test_world, out)) == 0
    finally:
        done.set()
        killer.join(10)
    assert killed, "no sampler actor was seen to kill"
    again = json.loads((out / "report.json").read_text())
    assert _numbers(again) == _numbers(report)


def test_notebook_redraws_figure_1_and_table_2_from_the_run(run, run_notebook):
    out, report = run
    nb, _ = run_notebook("copycheck.ipynb", out)
    assert (out / "figure1.png").stat().st_size > 5000
    table_out = "".join(o.get("data", {}).get("text/plain", "") for o in nb.cells[3].outputs)
    for method in ("gmm", "prob_tool", "meeus"):
        assert method in table_out
    assert len(table_out.strip().splitlines()) == 1 + len(report["results"])  # header + rows


def test_audit_of_own_folders_gives_each_suspected_file_a_verdict(tmp_path, ray_local, test_world):
    import shutil
    from pathlib import Path

    books = Path(test_world["root"])
    manifest = json.loads((books / "manifests" / "tiny.json").read_text())
    seen = sorted(d for d, y in manifest.items() if d.startswith("books/") and y == 1)[:4]
    unseen = sorted(d for d, y in manifest.items() if d.startswith("books/") and y == 0)
    labels = {}
    for i, d in enumerate(seen + unseen[:2]):
        dest = tmp_path / "suspected" / f"file{i}.txt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(books / d, dest)
        labels[dest.name] = manifest[d]
    for i, d in enumerate(unseen[2:8]):
        dest = tmp_path / "new" / f"new{i}.txt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(books / d, dest)
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    out = tmp_path / "audit"
    args = _args(test_world, out) + [
        "--set", "experiment.mode=audit",
        "--set", f"experiment.suspected={tmp_path / 'suspected'}",
        "--set", f"experiment.unseen={tmp_path / 'new'}",
        "--set", f"data.labels={tmp_path / 'labels.json'}",
        "--set", "uncertainty.ensemble_size=2", "--set", "uncertainty.samplers=[mcd,ensemble]",
        "--set", "detect.baselines=[prob_tool]",
    ]  # fmt: skip
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert sorted(f["file_id"] for f in report["files"]) == [
        f"suspected/file{i}.txt" for i in range(6)
    ]
    assert {f["label"] for f in report["files"]} == {0, 1}
    rows = {r["method"]: r for r in report["results"]}
    assert set(rows) == {*METHODS} - {"neighbor_loss", "neighbor_ppl", "meeus"}
    assert all(r["n_unseen"] == 2 and r["tp"] + r["fn"] == 4 for r in rows.values())


def test_one_actor_per_member_in_a_placement_group_gives_the_same_predictions(run, test_world):
    import numpy as np
    import pandas as pd
    import ray

    from mia_ray.config import load_config
    from mia_ray.pipelines import copycheck as cc
    from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig

    out, _ = run
    sets = [a for a in _args(test_world, out)[3:-2] if a != "--set"]
    cfg = load_config(
        CopyCheckJobConfig,
        "jobs/copycheck_demo.yaml",
        [*sets, "uncertainty.placement=members", "resources.sampler.cpus=0.3"],
    )
    cfg = cc.resolve(cfg)
    docs, exps = cc.experiments_of(cfg)
    snippets = pd.read_parquet(out / "snippets.parquet")
    jobs = cc.finetune_jobs(cfg, exps, snippets, out / "members-check")
    for j in jobs:  # the members trained by the run
        j["out_dir"] = str(out / "train" / j["experiment"] / j["member"])
    cfg.uncertainty.samplers = ["ensemble"]
    got = cc.sample_experiment(cfg, exps[0], snippets, jobs, out / "members-check")
    # The group's bundles are handed back once the sampling is done.
    assert all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())
    ref = pd.read_parquet(out / "uncertainty.parquet")
    ref = ref[ref["experiment"] == exps[0]["name"]].set_index("snippet_id")["p_ensemble"]
    got = got.set_index("snippet_id")["p_ensemble"]
    assert sorted(got.index) == sorted(ref.index)
    np.testing.assert_allclose(
        np.stack(got[ref.index].to_numpy()), np.stack(ref.to_numpy()), rtol=0, atol=1e-5
    )


def test_members_placement_that_would_starve_ray_data_fails_clearly(ray_local):
    from mia_ray.config import load_config
    from mia_ray.errors import MiaError
    from mia_ray.pipelines import copycheck as cc
    from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig

    cfg = load_config(
        CopyCheckJobConfig,
        "jobs/copycheck_demo.yaml",
        ["uncertainty.placement=members", "resources.sampler.cpus=0.5"],
    )
    members = [f"ens-{i}" for i in range(4)]
    with pytest.raises(MiaError, match=r"would reserve 4 x 0.5 of the cluster's 2 CPUs"):
        cc.members_mapper(cfg, members, lambda m: m, {}, "p_ensemble")


def test_every_cache_is_keyed_on_the_model_by_content_and_the_options(
    run, test_world, tmp_path, capfd
):
    import shutil
    from pathlib import Path

    import pandas as pd

    from mia_ray.config import load_config
    from mia_ray.pipelines import copycheck as cc
    from mia_ray.pipelines.copycheck.config import CopyCheckJobConfig
    from mia_ray.train.launch import finished

    out, _ = run
    sets = [a for a in _args(test_world, out)[3:-2] if a != "--set"]

    def config(*extra, model=None):
        cfg = load_config(CopyCheckJobConfig, "jobs/copycheck_demo.yaml", [*sets, *extra])
        cfg = cc.resolve(cfg)
        if model is not None:
            cfg.model.name_or_path = str(model)
        return cfg

    _, exps = cc.experiments_of(config())
    snippets = pd.read_parquet(out / "snippets.parquet")

    def jobs(cfg):  # the run's members, as the fine-tuning stage sees them under cfg
        js = cc.finetune_jobs(cfg, exps, snippets, tmp_path / "jobs")
        for j in js:
            j["out_dir"] = str(out / "train" / j["experiment"] / j["member"])
        return js

    assert all(finished(j) for j in jobs(config()))
    moved = tmp_path / "tiny"
    shutil.copytree(config().model.name_or_path, moved)
    # The same weights at another path are the same model: nothing to retrain ...
    assert all(finished(j) for j in jobs(config(model=moved)))
    # ... while a dtype or a training option that changes the numbers retrains every member.
    for change in ("model.dtype=bfloat16", "finetune.warmup_ratio=0.1", "resources.trainer.workers=2"):  # fmt: skip
        assert not any(finished(j) for j in jobs(config(change)))
    # A ZeRO config is keyed by its content: edited in place, it gives new members.
    zero = tmp_path / "zero.json"
    zero.write_text('{"zero_optimization": {"stage": 2}}')
    stage2 = {j["fingerprint"] for j in jobs(config(f"finetune.deepspeed={zero}"))}
    zero.write_text('{"zero_optimization": {"stage": 3}}')
    stage3 = {j["fingerprint"] for j in jobs(config(f"finetune.deepspeed={zero}"))}
    assert len(stage2) == len(stage3) == len(jobs(config())) and not stage2 & stage3

    rows = snippets.head(6)
    before = cc.score_target(config(model=moved), rows, tmp_path / "rows", False)
    # New weights at the same path: the members retrain and the baseline rows are rescored.
    other = Path(test_world["targets"]["tiny-random"]["model"]) / "model.safetensors"
    shutil.copy(other, moved / "model.safetensors")
    assert not any(finished(j) for j in jobs(config(model=moved)))
    capfd.readouterr()
    after = cc.score_target(config(model=moved), rows, tmp_path / "rows", False)
    assert "inputs changed since the last run; computing afresh" in capfd.readouterr().err
    fresh = cc.score_target(config(model=moved), rows, tmp_path / "fresh", False)
    loss = lambda df: df.set_index("snippet_id")["loss"].sort_index()  # noqa: E731
    pd.testing.assert_series_equal(loss(after), loss(fresh))
    assert (loss(after) - loss(before)).abs().min() > 1e-3

    # The sampled rows follow the MC dropout mode: the run's rows are reused under its own
    # mode and sampled afresh under the other.
    e = exps[0]
    shutil.copytree(
        out / "samples" / e["name"] / "mcd", tmp_path / "s" / "samples" / e["name"] / "mcd"
    )
    for mode, said in (("all", "reusing"), ("lora", "computing afresh")):
        cfg = config("uncertainty.samplers=[mcd]", f"uncertainty.mc_dropout={mode}")
        capfd.readouterr()
        cc.sample_experiment(cfg, e, snippets, jobs(cfg), tmp_path / "s")
        assert said in capfd.readouterr().err, mode


@pytest.mark.extra
def test_ctrl_c_during_fine_tuning_exits_130_saying_rerun_to_resume(tmp_path, test_world):
    """A real Ctrl-C (SIGINT to the driver) while Ray Tune trains the members."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "run"
    args = _args(test_world, out) + [
        "--set", "experiment.n_unseen_in_suspected=[2]", "--set", "uncertainty.samplers=[mcd,ensemble]",
    ]  # fmt: skip
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mia_ray", *args],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, training = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "as Ray Tune trials" in line:
                training.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert training.wait(240), "".join(lines)
        time.sleep(3)  # the trials are under way
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(10)
    log = "".join(lines)
    assert rc == 130, log
    assert "interrupted; finished parts are kept, rerun the same command to resume" in log
    assert "fine-tuning interrupted:" in log
    assert "did not finish" not in log and "sampling" not in log
    assert not (out / "report.json").exists()


def test_report_numbers_match_the_snapshot(run, report_snapshot):
    report_snapshot(run[1], "copycheck")
