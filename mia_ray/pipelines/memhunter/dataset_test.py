"""The dataset-level tests: the models they name (fine-tuned here when asked, each a stage), the probes every model reads, their LCSS, the paired tests (``stats.hypothesis``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pandas as pd

from mia_ray import storage
from mia_ray.actors.target import TargetPool
from mia_ray.errors import MiaError
from mia_ray.models.identity import model_key
from mia_ray.pipelines.common import (
    check_model_early,
    fingerprint,
    log,
)
from mia_ray.pipelines.memhunter.keys import SCORING, target_key
from mia_ray.runtime import ray_options
from mia_ray.stages import remote_folder_stage


def finetune_spec(epochs: float, lr: float):
    from mia_ray.train.lm import FinetuneSpec

    # Empty target_modules: LoRA on every linear layer, whatever the architecture.
    return FinetuneSpec(epochs=epochs, lr=lr, target_modules=())


def finetune_model_task(texts, base, root, rel, marker, epochs, lr, seed, threads):
    """A dataset-test fine-tune (the proxy, ``@finetune:...``) on whichever node Ray gives it:
    the model is saved into a temp folder of that node, then put into storage
    (``root``/``rel``, its stage ``marker`` last). Returns the training record."""
    from mia_ray.train.lm import finetune_causal_lm

    spec = finetune_spec(epochs, lr)
    tmp = tempfile.mkdtemp(prefix="mia-finetune-")
    try:
        record = finetune_causal_lm(
            texts, storage.localize(base), tmp, spec, seed=seed, threads=threads
        )
        storage.open_storage(root).put_dir(tmp, rel, marker)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def named_model(cfg, name: str) -> str | None:
    """The path (or hub name) a dataset-test model name stands for; None for ``@finetune:``
    models, which this run trains."""
    from mia_ray.demo.world import model_dir

    alias = {"@target": cfg.model.name_or_path, "@reference": cfg.model.reference}
    if name in alias:
        if not alias[name]:
            raise MiaError(f"dataset_test names {name} but it is not set (model section)")
        return alias[name]
    if name.startswith("@finetune:"):
        if name.split(":", 1)[1] not in ("members", "nonmembers"):
            raise MiaError(f"dataset_test: {name}: use @finetune:members or @finetune:nonmembers")
        return None
    if name.startswith("@world:"):
        return str(model_dir(cfg.world.resolved_root(), name[7:]))
    if name.startswith("@"):
        raise MiaError(
            f"dataset_test: unknown model {name!r} (use a path, a hub name, @target, "
            "@reference, @world:<model>, @finetune:members or @finetune:nonmembers)"
        )
    return name


def finetune_key(cfg, which: str, texts: list[str], base: str | None = None) -> str:
    """A dataset-test fine-tune by what decides its weights: the base model's content, the
    recipe, the seed and the documents. ``base``: where the base model is, when not where
    ``dataset_test.base`` names it (a sweep cell's copy on its node)."""
    from dataclasses import asdict
    from types import SimpleNamespace

    d = cfg.dataset_test
    base = base or named_model(cfg, d.base)
    if base is None:
        raise MiaError(f"dataset_test.base cannot be {d.base}: fine-tune an existing model")
    # The fine-tune trains in float32 in a task with resources.trainer.gpus: its device is part
    # of what it gives (a GPU's kernels round otherwise).
    trains = SimpleNamespace(dtype="float32", device="auto")
    return fingerprint(which, model_key(trains, cfg.resources.trainer.gpus > 0, base), asdict(finetune_spec(d.finetune_epochs,
                       d.finetune_lr)), d.finetune_seed, texts)  # fmt: skip


def model_paths(
    cfg, docs_by_label: dict[int, list[str]], out: Path, named: dict[str, str] | None = None
) -> dict[str, str]:
    """Every model the dataset test names -> a path; ``@finetune:...`` models are trained
    here once (a Ray task each, which puts the model into storage; the run pulls it into
    ``out/models``) and reused while their key holds. ``named``: names already resolved
    (a sweep cell's copies of the driver's models on its node)."""
    import ray

    d = cfg.dataset_test
    named = named or {}
    names = [*d.suspects, d.reference, d.proxy]
    paths: dict[str, str] = {}
    # The target actors are gone by now: a fine-tune may take what they and the hunter held.
    res = cfg.resources
    cpus = res.scorer.actors * res.scorer.cpus + res.trainer.cpus
    threads = max(1, int(cpus))
    task = ray.remote(finetune_model_task).options(
        **ray_options(res, cpus, res.trainer.gpus),
        # Run again elsewhere if its node dies: it writes its temp folder, then storage.
        max_retries=3,
    )
    for name in dict.fromkeys(names):
        path = named.get(name) or named_model(cfg, name)
        if path is not None:
            if name.startswith("@world:") and not (Path(path) / "config.json").is_file():
                raise MiaError(f"dataset_test: {name}: the demo world has no model {path}")
            if not name.startswith("@"):
                check_model_early(path, "dataset_test model")
            paths[name] = path
            continue
        which = name.split(":", 1)[1]
        base = named.get(d.base) or named_model(cfg, d.base)
        texts = docs_by_label[1 if which == "members" else 0]

        def launch(root, rel, marker, texts=texts, base=base, which=which):
            log(f"dataset test: fine-tuning {base} on {len(texts)} {which} documents")
            ray.get(
                task.remote(
                    texts, storage.for_remote(base), root, rel, marker, d.finetune_epochs,
                    d.finetune_lr, d.finetune_seed, threads,
                )
            )  # fmt: skip

        key = finetune_key(cfg, which, texts, base)
        dest, _ = remote_folder_stage(out, f"models/finetune-{which}", key, launch)
        paths[name] = str(dest)
    return paths


def probes_of(cfg, hunter, pairs: pd.DataFrame, trials: pd.DataFrame, split: str) -> pd.DataFrame:
    """The dataset test's hunter prompts on one split: ``dataset_test.trials`` per pair, with
    the seeds extraction used, so extraction's own rows (and the target's mu on them) serve
    when it ran that split with enough trials."""
    from mia_ray.train.hunter import pair_seed

    d = cfg.dataset_test
    part = pairs[pairs["split"] == split]
    cols = ["pair_id", "trial", "prompt", "x_ids", "y_ids"]
    done = trials[(trials["split"] == split) & (trials["trial"] < d.trials)]
    if done["trial"].nunique() == d.trials and set(done["pair_id"]) == set(part["pair_id"]):
        probes = done[["pair_id", "trial", "prompt", "mu"]].merge(
            part[["pair_id", "x_ids", "y_ids"]], on="pair_id"
        )
        cols.append("mu")
    else:
        rows = []
        for j in range(d.trials):
            seeds = [pair_seed(cfg.extraction.seed, "trial", p, j) for p in part["pair_id"]]
            prompts = hunter.sample(
                list(part["x"]), cfg.hunter.prompt_tokens, cfg.hunter.sample_top_k,
                cfg.hunter.sample_temperature, seeds,
            )  # fmt: skip
            rows.append(part.assign(prompt=[hunter.decode(p) for p in prompts], trial=j))
        probes = pd.concat(rows, ignore_index=True)
    probes = probes[cols].assign(split=split)
    return probes.sort_values(["pair_id", "trial"]).reset_index(drop=True)


def test_row(kind: str, suspect: str, against: str, fn, *args, alpha: float) -> dict:
    """One hypothesis row: the test's result, or its reason to be undefined."""
    try:
        r = fn(*args, alpha=alpha)
    except MiaError as e:
        r = {"test": kind, "h0": "", "statistic": None, "df": None, "p_value": None,
             "reject_h0": False, "verdict": f"undefined: {e}"}  # fmt: skip
    extra = ("n_pairs", "mean_diff", "mean_gap_member", "mean_gap_nonmember", "n_nonmember_pairs")
    return {
        "suspect": suspect,
        "against": against,
        "kind": kind,
        **{k: r.get(k) for k in ("test", "h0", "statistic", "df", "p_value")},
        "alpha": alpha,
        "reject_h0": bool(r.get("reject_h0")),
        "verdict": r["verdict"],
        **{k: r[k] for k in extra if k in r},
    }


def lcss_of(cfg, name: str, path: str, probes: pd.DataFrame) -> pd.DataFrame:
    """The dataset test's probes scored by model ``path`` (split, pair_id, trial, mu)."""
    log(f"dataset test: LCSS of {name} ({path})")
    pool = TargetPool(path, cfg.model, cfg.resources)
    try:
        cols = ["split", "pair_id", "trial", "prompt", "x_ids", "y_ids"]
        return pool.frame(probes[cols])[["split", "pair_id", "trial", "mu"]]
    finally:
        pool.close()


def run_dataset_test(
    cfg,
    hunter,
    pairs: pd.DataFrame,
    trials: pd.DataFrame,
    docs_by_label,
    out: Path,
    named: dict[str, str] | None = None,
):
    """Each model's LCSS on the member pairs of ``dataset_test.split`` and on the nonmember
    pairs (best of ``trials`` hunter prompts, the same prompts for every model), then per
    suspect: the paper's t-test vs the proxy (unpaired Welch, reported as the paper's), the
    one-sided paired t-test vs the reference, the paired TOST against the proxy, and the
    verdict: the suspect's gain over the reference on members vs on nonmembers."""
    from mia_ray.stages import frame_stage
    from mia_ray.stats.hypothesis import gap_greater, paired_greater, paired_tost, paper_ttest

    d = cfg.dataset_test
    part = pairs[pairs["split"] == d.split]
    if len(part) < 2:
        raise MiaError(f"dataset_test: the {d.split} split has {len(part)} pairs; need at least 2")
    paths = model_paths(cfg, docs_by_label, out, named)
    splits = [d.split] + (["nonmember"] if (pairs["split"] == "nonmember").sum() >= 2 else [])
    probes = pd.concat(
        [probes_of(cfg, hunter, pairs, trials, s) for s in splits], ignore_index=True
    )
    probe_key = fingerprint(
        list(probes["split"]), list(probes["pair_id"]), [int(t) for t in probes["trial"]],
        list(probes["prompt"]), [[int(t) for t in v] for v in probes["x_ids"]],
        [[int(t) for t in v] for v in probes["y_ids"]], SCORING,
    )  # fmt: skip
    lcss: dict[str, pd.Series] = {}
    for name, path in dict.fromkeys(paths.items()):
        mine = path == cfg.model.name_or_path
        if mine and "mu" in probes and probes["mu"].notna().all():
            res = probes[["split", "pair_id", "trial", "mu"]]
        else:
            safe = name.strip("@").replace(":", "-").replace("/", "_")
            key = fingerprint(target_key(cfg, path), probe_key)
            res = frame_stage(
                out, f"dataset_test/{safe}", key, lambda n=name, p=path: lcss_of(cfg, n, p, probes)
            )
        lcss[name] = res.groupby(["split", "pair_id"])["mu"].max().sort_index()

    def on(name: str, split: str) -> pd.Series:
        return lcss[name].xs(split, level="split") if split in splits else pd.Series(dtype=float)

    member = {k: on(k, d.split) for k in lcss}
    non = {k: on(k, "nonmember") for k in lcss}
    ref, proxy = member[d.reference], member[d.proxy]
    out_rows = []
    for s in d.suspects:
        mine = member[s]
        assert mine.index.equals(ref.index) and mine.index.equals(proxy.index)  # paired by id
        out_rows += [
            test_row("paper", s, d.proxy, paper_ttest, mine.values, proxy.values, alpha=d.alpha),
            test_row("paired_greater", s, d.reference, paired_greater, mine.values, ref.values,
                      alpha=d.alpha),
            test_row("paired_tost", s, d.proxy, paired_tost, mine.values, proxy.values,
                      d.margin, alpha=d.alpha),
            test_row("gap_vs_nonmember", s, d.reference, gap_greater, mine.values, ref.values,
                      non[s].values, non[d.reference].values, alpha=d.alpha),
        ]  # fmt: skip
        for r in out_rows[-4:]:
            other = proxy if r["kind"] in ("paper", "paired_tost") else ref
            r["mean_suspect"], r["mean_other"] = float(mine.mean()), float(other.mean())
    # Power: a proxy that did train on the data must itself beat the reference (and by more
    # on the dataset than outside it), or these samples cannot tell training from no
    # training and "no evidence" means little.
    power = test_row("paired_greater", d.proxy, d.reference, paired_greater, proxy.values,
                      ref.values, alpha=d.alpha)  # fmt: skip
    power.update(proxy=d.proxy, reference=d.reference, mean_suspect=float(proxy.mean()),
                 mean_reference=float(ref.mean()))  # fmt: skip
    power_gap = test_row("gap_vs_nonmember", d.proxy, d.reference, gap_greater, proxy.values,
                          ref.values, non[d.proxy].values, non[d.reference].values,
                          alpha=d.alpha)  # fmt: skip
    power_gap.update(proxy=d.proxy, reference=d.reference)
    summary = {
        "splits": {"member": d.split, "nonmember": "nonmember" if len(splits) > 1 else None},
        "pair_ids": [str(p) for p in ref.index],
        "nonmember_pair_ids": [str(p) for p in non[d.reference].index],
        "mean_lcss": {k: float(v.mean()) for k, v in member.items()},
        "mean_lcss_nonmember": {k: float(v.mean()) if len(v) else None for k, v in non.items()},
        "lcss": {k: v.tolist() for k, v in member.items()},
        "lcss_nonmember": {k: v.tolist() for k, v in non.items()},
        "power_check": power,
        "power_check_gap": power_gap,
    }
    return out_rows, summary
