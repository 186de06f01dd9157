"""MemHunter end to end on the test world (target tiny, hunter tiny-ref), and the target role
on a model that memorised its members verbatim."""

import copy
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mia_ray.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _args(test_world, out, *extra):
    return [
        "memhunter", "--config", "jobs/memhunter_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        "--set", "world.target=tiny",
        "--set", "pairs.prefix_tokens=16", "--set", "pairs.target_tokens=16",
        "--set", "pairs.max_per_split=6",
        "--set", "extraction.trials=[2,4]", "--set", "extraction.plugin_max_s=3",
        "--set", 'dataset_test.suspects=["@target", "@finetune:nonmembers"]',
        # The recipe under which the test world's proxy was measured not to beat the reference.
        "--set", "dataset_test.finetune_epochs=3", "--set", "dataset_test.finetune_lr=0.001",
        *extra,
        "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local, test_world):
    out = tmp_path_factory.mktemp("memhunter") / "run"
    assert main(_args(test_world, out)) == 0
    return out, json.loads((out / "report.json").read_text())


def test_extraction_rows_cover_every_method_and_budget(run):
    out, report = run
    rows = pd.DataFrame(report["extraction"])
    assert set(rows["method"]) == {"memhunter", "manual", "miniprompt", "memhunter_gcg", "gcg"}
    for col in ("split", "trials", "seconds", "avg_lcss", "hit_rate"):
        assert col in rows
    mem = rows[rows["method"] == "memhunter"]
    assert set(mem["split"]) == {"test", "nonmember"}
    runs = pd.concat(pd.read_parquet(p) for p in (out / "extraction").rglob("frame.parquet"))
    for split, part in mem.groupby("split"):
        part = part.sort_values("trials")
        assert list(part["trials"]) == [2, 4]
        mine = runs[runs["split"] == split]
        # Each budget is its own batch of k prompts per pair, timed as one: its seconds.
        for _, r in part.iterrows():
            batch = mine[mine["budget"] == r["trials"]]
            assert len(batch) == r["trials"] * r["pairs"]
            assert batch["round_s"].nunique() == 1 and r["seconds"] == batch["round_s"].iloc[0]
        # Seeds are per (pair, trial): budget 2's prompts are budget 4's first two.
        small = mine[mine["budget"] == 2].set_index(["pair_id", "trial"])["prompt"]
        large = mine[mine["budget"] == 4].set_index(["pair_id", "trial"])["prompt"]
        assert small.sort_index().equals(large.loc[small.index].sort_index())
    # MiniPrompt gets MemHunter's seconds at each budget, on the test split (its default).
    mini = rows[rows["method"] == "miniprompt"].set_index(["split", "trials"])
    assert set(mini.index.get_level_values("split")) == {"test"}
    for _, r in mem[mem["split"] == "test"].iterrows():
        assert mini.loc[("test", r["trials"]), "seconds"] == pytest.approx(r["seconds"])
    # The avg LCSS is recomputed from the stored trials: the best mu per pair over k trials.
    trials = runs[(runs["split"] == "test") & (runs["budget"] == 4)]
    best4 = trials.groupby("pair_id")["mu"].max().mean()
    got = mem[(mem["split"] == "test") & (mem["trials"] == 4)]["avg_lcss"].item()
    assert got == pytest.approx(best4)
    # mu is LCSS / |y| on tokens: a multiple of 1/16 here.
    assert np.allclose((trials["mu"] * 16) % 1, 0)


def test_hypothesis_rows_state_h0_and_recompute_from_the_lcss_values(run):
    _, report = run
    hyp = pd.DataFrame(report["hypothesis"])
    assert set(hyp["suspect"]) == {"@target", "@finetune:nonmembers"}
    assert set(hyp["kind"]) == {"paper", "paired_greater", "paired_tost", "gap_vs_nonmember"}
    for col in ("suspect", "kind", "test", "h0", "verdict", "reject_h0"):
        assert col in hyp and hyp[col].notna().all(), col
    dt = report["dataset_test"]
    lcss, non = dt["lcss"], dt["lcss_nonmember"]
    # Every model is scored on the same pairs, in the same (pair id) order.
    assert all(len(v) == len(dt["pair_ids"]) for v in lcss.values())
    assert dt["nonmember_pair_ids"] and all(
        len(v) == len(dt["nonmember_pair_ids"]) for v in non.values()
    )
    assert not set(dt["pair_ids"]) & set(dt["nonmember_pair_ids"])
    for _, r in hyp.iterrows():
        s = np.array(lcss[r["suspect"]])
        if r["kind"] == "paired_greater":
            want = stats.ttest_rel(s, lcss["@reference"], alternative="greater")
            assert "on the same pairs" in r["h0"] and "never saw the data" in r["h0"]
        elif r["kind"] == "gap_vs_nonmember":
            gap_m = s - np.array(lcss["@reference"])
            gap_n = np.array(non[r["suspect"]]) - np.array(non["@reference"])
            want = stats.ttest_ind(gap_m, gap_n, equal_var=False, alternative="greater")
            assert "nonmember pairs" in r["h0"]
        elif r["kind"] == "paper":
            want = stats.ttest_ind(s, lcss["@finetune:members"], equal_var=False)
            assert "paper's rule" in r["verdict"]
        else:
            continue
        if r["p_value"] is None or np.isnan(r["p_value"]):  # no variance: said, not hidden
            assert r["verdict"].startswith("undefined:") and not r["reject_h0"]
            continue
        assert r["p_value"] == pytest.approx(want.pvalue)
        assert r["statistic"] == pytest.approx(want.statistic)
    # The test world's tiny reproduces nothing verbatim: the proxy cannot beat the reference,
    # and the report says that the dataset test has no power here.
    power = report["dataset_test"]["power_check"]
    assert power["proxy"] == "@finetune:members" and power["kind"] == "paired_greater"
    assert report["dataset_test"]["power_check_gap"]["kind"] == "gap_vs_nonmember"
    assert report["pairs"]["context_bos"] == []  # the GPT-2 tokenizer adds no BOS
    assert power["p_value"] is None or power["p_value"] >= 0.05
    assert any(n.startswith("Power check failed") for n in report["notes"])


def test_hunter_trained_and_checkpointed_every_iteration(run):
    out, report = run
    its = report["training"]["iterations"]
    assert [r["iteration"] for r in its] == [0, 1] and report["training"]["finished"]
    (hdir,) = (out / "hunter").iterdir()  # keyed on the models' contents and the pairs
    for i in range(2):
        d = hdir / f"iter-{i:02d}"
        assert (d / ".complete.json").is_file() and (d / "pool.parquet").is_file()
    pool = pd.read_parquet(hdir / "iter-01" / "pool.parquet")
    base = pd.read_parquet(hdir / "baseline" / "frame.parquet").set_index("pair_id")
    # Rejection sampling: every pooled prompt beats the prefix alone on its pair.
    b = base.loc[pool["pair_id"]]
    assert (
        (pool["mu"].to_numpy() > b["mu"].to_numpy())
        | ((pool["mu"].to_numpy() == b["mu"].to_numpy()) & (pool["loss"].to_numpy() < b["loss"].to_numpy()))
    ).all()  # fmt: skip
    html = (out / "report.html").read_text()
    assert "data:image/png" in html and "Did the suspect train on the dataset?" in html
    # The verdict's H0 is stated: the gain over the reference, members vs nonmembers.
    assert "The verdict is the gap test" in html and "mean LCSS (nonmember pairs)" in html


def test_rerun_trains_and_searches_nothing_and_gives_identical_numbers(run, test_world, capfd):
    out, report = run
    capfd.readouterr()
    assert main(_args(test_world, out)) == 0
    err = capfd.readouterr().err
    assert "hunter: iteration 2/2: reusing an earlier run's" in err
    for stage in ("manual", "miniprompt", "plugin"):
        assert f"{stage}: reusing the results of an earlier run" in err
    again = json.loads((out / "report.json").read_text())
    assert again["extraction"] == report["extraction"]
    assert again["hypothesis"] == report["hypothesis"]


def test_a_rerun_in_another_resolved_dtype_recomputes_every_model_stage(
    run, test_world, capfd, tmp_path
):
    """The target, hunter and fine-tunes are keyed on the dtype they resolve to where they run
    (``models.identity.model_key``): the same job with the target in bfloat16, into a copy of
    the same --out, reuses nothing that the target scored (before, the key left the device
    and the resolved dtype out, and a GPU rerun would have reused CPU rows)."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run[0], out)
    capfd.readouterr()
    assert main(_args(test_world, out, "--set", "model.dtype=bfloat16")) == 0
    err = capfd.readouterr().err
    assert "reusing" not in err, [x for x in err.splitlines() if "reusing" in x]
    again = json.loads((out / "report.json").read_text())
    assert again["training"]["finished"] and again["extraction"]


def test_target_recovers_a_memorised_text_and_not_an_unseen_one(tmp_path, test_world):
    """A tiny GPT trained hard on two texts continues their prefixes verbatim (mu = 1);
    on texts it never saw, mu stays low."""
    from mia_ray.actors.target import TargetLM
    from mia_ray.data.pairs import make_pairs
    from mia_ray.demo.world import SCALES, gpt2_bpe_tokenizer
    from mia_ray.train.lm import TinyLMSpec, train_causal_lm

    docs = [json.loads(x) for x in open(test_world["documents"])]
    seen, unseen = docs[:2], docs[10:14]
    tok = gpt2_bpe_tokenizer(SCALES["test"].bpe_merges)
    spec = TinyLMSpec(n_layer=2, n_embd=64, n_head=2, n_positions=64, epochs=300, batch_size=4)
    train_causal_lm([d["text"] for d in seen], tok, tmp_path / "m", spec, seed=0, threads=1)
    target = TargetLM(str(tmp_path / "m"), torch_threads=1)
    mem = make_pairs([(d["id"], d["text"]) for d in seen], target.tok, 16, 16)
    non = make_pairs([(d["id"], d["text"]) for d in unseen], target.tok, 16, 16)
    res_mem = target(mem.assign(prompt=""))
    res_non = target(non.assign(prompt=""))
    assert res_mem["mu"].min() == 1.0
    assert res_non["mu"].max() <= 0.5


def test_notebook_redraws_the_tables_from_the_run(run, run_notebook):
    out, report = run
    nb, text = run_notebook("memhunter.ipynb", out)
    mem = next(r for r in report["extraction"] if r["method"] == "memhunter")
    assert f"{100 * mem['avg_lcss']:.2f}".rstrip("0").rstrip(".") in text
    assert "one-sided paired t-test" in text and "H0:" in text
    png = out / "memhunter_lcss.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000


def test_sweep_runs_every_cell_once_and_a_rerun_skips_them(tmp_path, ray_local, test_world, capfd):
    out = tmp_path / "sweep"
    args = [
        "memhunter", "--config", "jobs/memhunter_demo.yaml",
        "--set", "world.scale=test", "--set", f"world.root={test_world['root']}",
        "--set", "world.target=",
        "--set", 'sweep.datasets=["@world:books", "@world:web"]',
        "--set", 'sweep.models=["@world:tiny", "@world:tiny-random"]',
        "--set", "pairs.prefix_tokens=16", "--set", "pairs.target_tokens=16",
        "--set", "pairs.max_per_split=3", "--set", "hunter.iterations=1",
        "--set", "hunter.prompt_tokens=2", "--set", "extraction.trials=[1,2]",
        "--set", "extraction.splits=[test]", "--set", "extraction.methods=[manual]",
        "--set", "dataset_test.trials=1", "--set", 'dataset_test.proxy="@target"',
        # The demo job's suspects name smollm2-control, which the test world does not build.
        "--set", 'dataset_test.suspects=["@target"]',
        # Half a CPU per actor and fine-tune: two cells fit side by side on 2 CPUs.
        "--set", "resources.scorer.cpus=0.5", "--set", "resources.trainer.cpus=0.5",
        "--set", "resources.scorer.torch_threads=1",
        "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    err = capfd.readouterr().err
    assert "sweep: 4 cells, 0 done, 2 at a time" in err
    # The cells ran as the trials of one Ray Tune run, in the run's folder.
    trials = sorted(re.sub(r"_[0-9a-f]+_\d{5}$", "", p.name)
                    for p in (out / "tune" / "sweep").iterdir() if p.is_dir())  # fmt: skip
    assert trials == sorted(json.loads((out / "report.json").read_text())["sweep"]["cells"])
    # The cells' own progress reaches the driver, their Ray Data progress bars do not.
    assert "hunter: training on" in err and "Running Dataset" not in err
    report = json.loads((out / "report.json").read_text())
    rows = pd.DataFrame(report["extraction"])
    cells = {(d, m) for d, m in zip(rows["dataset"], rows["model"], strict=True)}
    assert cells == {
        (d, m)
        for d in ("@world:books", "@world:web")
        for m in ("@world:tiny", "@world:tiny-random")
    }
    assert set(rows["method"]) == {"memhunter", "manual"}
    for name in report["sweep"]["cells"]:
        cell = json.loads((out / "cells" / name / "report.json").read_text())
        src = "books" if name.startswith("books") else "web"
        pairs = pd.read_parquet(out / "cells" / name / "pairs.parquet")
        # A cell's dataset is one source of the world: its pairs come from that source only.
        assert pairs["doc_id"].str.startswith(f"{src}/").all()
        assert cell["hypothesis"][0]["suspect"] == "@target"
    # Each cell's power check is in the combined report, and a failed one is named in its notes.
    failed = []
    for pc in report["power_check"]:
        name = f"{pc['dataset'][7:]}__{pc['model'][7:]}"
        own = json.loads((out / "cells" / name / "report.json").read_text())
        own = own["dataset_test"]["power_check"]
        assert (pc["p_value"], pc["passed"]) == (own["p_value"], own["reject_h0"])
        if not pc["passed"]:
            failed.append(f"{pc['dataset'][7:]} x {pc['model'][7:]}")
    # tiny-random is its own proxy here and recovers less than the trained reference: no power.
    assert {"books x tiny-random", "web x tiny-random"} <= set(failed)
    note = next(n for n in report["notes"] if n.startswith("Power check failed"))
    assert f"in {len(failed)} of 4 cells ({', '.join(failed)})" in note
    html = (out / "report.html").read_text()
    assert "Sweep: datasets x models" in html and "power check (proxy vs reference)" in html
    capfd.readouterr()
    assert main(args) == 0
    assert "sweep: 4 cells, 4 done" in capfd.readouterr().err
    assert json.loads((out / "report.json").read_text())["extraction"] == report["extraction"]


def test_target_actors_that_leave_no_cpu_for_the_fine_tune_fail_clearly(
    tmp_path, ray_local, test_world, capsys
):
    code = main(_args(test_world, tmp_path / "r", "--set", "resources.scorer.actors=2"))
    assert code != 0
    err = capsys.readouterr().err
    assert "2 target actors x 1 CPUs + the hunter's fine-tune (1) need 3 CPUs, but Ray has 2" in err
    assert "Traceback" not in err


def test_dataset_test_names_demo_world_models(test_world, tmp_path):
    from mia_ray.config import load_config
    from mia_ray.errors import MiaError
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
    from mia_ray.pipelines.memhunter.dataset_test import model_paths

    sets = [f"world.root={test_world['root']}", "world.scale=test", "model.reference=r"]
    cfg = load_config(
        MemHunterJobConfig,
        None,
        [*sets, "model.name_or_path=t", "hunter.model=h", "data.path=d",
         'dataset_test.suspects=["@world:tiny-random"]', 'dataset_test.proxy="@world:tiny"'],
    )  # fmt: skip
    paths = model_paths(cfg, {}, tmp_path)
    assert paths["@world:tiny-random"] == str(test_world["root"] + "/models/tiny-random")
    assert paths["@world:tiny"] == str(test_world["root"] + "/models/tiny")
    cfg.dataset_test.suspects = ["@world:smollm2-nope"]
    with pytest.raises(MiaError, match="the demo world has no model .*smollm2-nope"):
        model_paths(cfg, {}, tmp_path)


def test_sweep_names_any_demo_world_model_not_only_the_targets(test_world, tmp_path):
    from mia_ray.config import load_config
    from mia_ray.errors import MiaError
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
    from mia_ray.pipelines.memhunter.sweep import sweep_cells

    sets = [f"world.root={test_world['root']}", "world.scale=test", "world.target="]
    cfg = load_config(
        MemHunterJobConfig,
        None,
        [*sets, 'sweep.datasets=["@world:books"]', 'sweep.models=["@world:tiny-ref"]'],
    )
    ((ds, m, cell),) = sweep_cells(cfg, tmp_path)
    # tiny-ref is built with the target tiny, whose reference it is.
    assert cell.model.name_or_path == test_world["root"] + "/models/tiny-ref"
    assert cell.model.reference == test_world["targets"]["tiny"]["reference"]
    cfg.sweep.models = ["@world:nope"]
    with pytest.raises(MiaError, match=r"unknown demo world model 'nope' \(known: tiny, tiny-ref,"):
        sweep_cells(cfg, tmp_path)


def _fake_model(path, weights: bytes):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "gpt2"}')
    (path / "model.safetensors").write_bytes(weights)
    return str(path)


def test_every_cache_key_follows_the_models_contents_not_their_paths(tmp_path):
    """Other weights at the same path (target, hunter, reference, a dataset-test model) and
    another dtype give other keys for the hunter's folder, extraction, the dataset test's
    fine-tunes and LCSS values, and the sweep cells; the same contents give the same keys."""
    from mia_ray.config import load_config
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
    from mia_ray.pipelines.memhunter.dataset_test import finetune_key
    from mia_ray.pipelines.memhunter.keys import extraction_key, target_key
    from mia_ray.pipelines.memhunter.sweep import sweep_identity
    from mia_ray.pipelines.memhunter.training import hunter_dir

    t, h = _fake_model(tmp_path / "t", b"target"), _fake_model(tmp_path / "h", b"hunter")
    r, o = _fake_model(tmp_path / "r", b"ref"), _fake_model(tmp_path / "o", b"other")
    adapter = _fake_model(tmp_path / "ad", b"adapter")
    cfg = load_config(
        MemHunterJobConfig,
        None,
        [f"model.name_or_path={t}", f"model.reference={r}", f"hunter.model={h}", "data.path=d",
         f'dataset_test.suspects=["@target", "{o}"]'],
    )  # fmt: skip
    train = pd.DataFrame(
        {"pair_id": ["a#0"], "x": ["x"], "x_ids": [[1, 2]], "y_ids": [[3]], "split": "train"}
    )

    def keys():
        return {
            "hunter": hunter_dir(cfg, tmp_path, train)[0].name,
            "extraction": extraction_key(cfg, adapter),
            "finetune": finetune_key(cfg, "members", ["doc"]),
            "lcss_other": target_key(cfg, o),
            "cell": json.dumps(sweep_identity(cfg), sort_keys=True),
        }

    first = keys()
    assert keys() == first
    # The target retrained into the same folder: everything that read it changes.
    _fake_model(tmp_path / "t", b"target, retrained")
    after = keys()
    assert {k for k in first if after[k] != first[k]} == {"hunter", "extraction", "cell"}
    _fake_model(tmp_path / "h", b"hunter, retrained")
    again = keys()
    assert {k for k in after if again[k] != after[k]} == {"hunter", "extraction", "cell"}
    # The fine-tunes' base (the reference) and a suspect given by path.
    _fake_model(tmp_path / "r", b"ref, retrained")
    _fake_model(tmp_path / "o", b"other, retrained")
    last = keys()
    assert {k for k in again if last[k] != again[k]} == {"finetune", "lcss_other", "cell"}
    # The final adapter's bytes decide extraction's prompts.
    _fake_model(tmp_path / "ad", b"adapter, retrained")
    assert keys()["extraction"] != last["extraction"]
    cfg.model.dtype = "bfloat16"
    assert keys()["hunter"] != last["hunter"] and keys()["lcss_other"] != last["lcss_other"]


def test_a_cells_inputs_reach_a_node_that_lacks_the_drivers_disk(tmp_path, monkeypatch):
    """A sweep cell on another node gets no path of the driver's disk: its models, documents
    and labels go through storage (pyarrow's mock://, as an object store) and come back on
    the node as local copies with the same contents, so its cache keys are the driver's."""
    import uuid

    from mia_ray import storage
    from mia_ray.config import load_config
    from mia_ray.models.identity import tree_sha256
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
    from mia_ray.pipelines.memhunter.keys import target_key
    from mia_ray.pipelines.memhunter.sweep import CellWorkspace, cell_inputs, localize_cell

    t, h = _fake_model(tmp_path / "t", b"target"), _fake_model(tmp_path / "h", b"hunter")
    r, o = _fake_model(tmp_path / "r", b"ref"), _fake_model(tmp_path / "o", b"other")
    (tmp_path / "docs.jsonl").write_text('{"id": "a", "text": "x"}\n')
    (tmp_path / "labels.json").write_text('{"a": 1}')
    cfg = load_config(
        MemHunterJobConfig,
        None,
        [f"model.name_or_path={t}", f"model.reference={r}", f"hunter.model={h}",
         f"data.path={tmp_path / 'docs.jsonl'}", f"data.labels={tmp_path / 'labels.json'}",
         f'dataset_test.suspects=["@target", "{o}"]', 'dataset_test.proxy="@target"'],
    )  # fmt: skip
    uri = f"mock:///bucket-{uuid.uuid4().hex[:8]}/run"
    storage.set_current(storage.Workspace(tmp_path / "out", uri, distributed=True))
    try:
        inputs = cell_inputs(cfg)
    finally:
        storage.set_current(None)
    # Nothing the cell loads is on the driver's disk (a model named by path keeps its name).
    assert str(tmp_path) not in json.dumps([inputs["fields"], list(inputs["named"].values())])
    # On the node (its own home, its own node cache):
    monkeypatch.setenv("MIA_RAY_HOME", str(tmp_path / "node"))
    cell = copy.deepcopy(cfg)
    named, staged = localize_cell(cell, inputs)
    cache = tmp_path / "node" / "node-cache"
    for mine, theirs in ((cell.model.name_or_path, t), (cell.model.reference, r),
                         (cell.hunter.model, h), (named[o], o)):  # fmt: skip
        assert Path(mine).parent == cache and tree_sha256(mine) == tree_sha256(theirs)
    assert Path(cell.data.path).read_text() == (tmp_path / "docs.jsonl").read_text()
    assert Path(cell.data.labels).name == "labels.json" and Path(cell.data.labels).is_file()
    assert target_key(cell) == target_key(cfg) and target_key(cell, named[o]) == target_key(cfg, o)
    # The cell's actors load what was staged, not a second copy staged under the cell.
    ws = CellWorkspace(tmp_path / "cell", f"{uri}/cells/c", True, "", staged=staged)
    assert ws.stage(cell.model.name_or_path) == inputs["fields"]["model.name_or_path"][0]
    assert not ws.storage.files()
    # On one machine nothing is staged: the cell reads the driver's paths, as always.
    storage.set_current(storage.Workspace(tmp_path / "out"))
    try:
        local = cell_inputs(cfg)
    finally:
        storage.set_current(None)
    assert local["fields"]["model.name_or_path"] == (t, "")
    assert local["fields"]["data.path"] == (str(tmp_path / "docs.jsonl"), "")


def test_cell_trials_ask_for_cell_resources_and_retry_only_after_a_lost_node():
    from ray import exceptions as rx

    from mia_ray.config import load_config
    from mia_ray.errors import MiaError
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
    from mia_ray.pipelines.memhunter.sweep import retried, trial_resources

    sets = ["model.name_or_path=t", "hunter.model=h", "data.path=d",
            "resources.custom_resources={gpu_node: 1}"]  # fmt: skip
    cfg = load_config(MemHunterJobConfig, None, sets)
    # No CPU: the trial orchestrates; its cell's actors ask for their own, outside its bundle.
    assert trial_resources(cfg) == {"memory": 1, "gpu_node": 1}
    cfg = load_config(MemHunterJobConfig, None, [*sets, "sweep.cell_resources={slot: 1}"])
    assert trial_resources(cfg) == {"memory": 1, "gpu_node": 1, "slot": 1}
    assert retried(rx.ActorDiedError()) and retried(rx.NodeDiedError("n"))
    assert retried(rx.RayTaskError("f", "tb", rx.WorkerCrashedError()))
    assert not retried(MiaError("bad input")) and not retried(ValueError("a bug"))
    assert not retried(rx.RayTaskError("f", "tb", MiaError("bad input")))
    with pytest.raises(MiaError, match="sweep.cell_resources must map resource names"):
        load_config(MemHunterJobConfig, None, [*sets, "sweep.cell_resources={slot: 0}"])


def test_custom_resources_that_no_node_holds_fail_clearly(ray_local):
    """Actors and fine-tunes that ask for resources.custom_resources fit only on the nodes
    that hold them: counted there, not over the whole cluster (else they would wait forever)."""
    from mia_ray.config import load_config
    from mia_ray.errors import MiaError
    from mia_ray.pipelines.memhunter.config import MemHunterJobConfig
    from mia_ray.pipelines.memhunter.inputs import check_resources

    sets = ["model.name_or_path=t", "hunter.model=h", "data.path=d"]
    check_resources(load_config(MemHunterJobConfig, None, sets))
    cfg = load_config(MemHunterJobConfig, None, [*sets, "resources.custom_resources={gpu_node: 1}"])
    with pytest.raises(MiaError, match="need 2 CPUs, but the nodes with resources.custom_"
                       "resources have 0: lower"):  # fmt: skip
        check_resources(cfg)


def test_report_numbers_match_the_snapshot(run, report_snapshot):
    """All but what the wall clock decides: MiniPrompt and the GCG plug-in run for as long as
    MemHunter took (their steps and what they recover differ between two runs of the same
    code, measured on the code before the stage layer), and the seconds."""
    report = run[1]
    clocked = {
        i for i, r in enumerate(report["extraction"])
        if r["method"] in ("miniprompt", "memhunter_gcg", "gcg")
    }  # fmt: skip

    def ignore(key: str) -> bool:
        head = key.split("/")
        return (
            key.endswith("_s")
            or head[0] == "plugin"
            or "gcg_steps" in key
            or (head[0] == "extraction" and int(head[1]) in clocked)
            # the same runs summarized per method (a CI run under load cut MiniPrompt short:
            # lcss_by_method/miniprompt/5 was 0.0 where the snapshot has 0.0625)
            or (head[0] == "lcss_by_method" and head[1] in ("miniprompt", "memhunter_gcg", "gcg"))
        )

    report_snapshot(report, "memhunter", ignore)
