"""MemHunter: how much of a dataset a model reproduces, and did it train on the dataset?

documents → (x, y) pairs of the target dataset (members; split train / test / val by
document) → the hunter trained to write memory-inducing prompts (Algorithm 1: beam search
scored by a pool of TargetLM actors, rejection-sampled prompt pool, LoRA fine-tune as a Ray
task, one checkpoint per iteration) → extraction on held-out pairs with k sampled prompts
per pair, timed → Manual and MiniPrompt (GCG) at the same wall-clock budget, GCG as a
plug-in → the dataset-level tests → report.

Sound where the paper is not (../shared/methods/README.md): the paper's t-test and its rule
"reject H0 if p > alpha" are reported as the paper's. Every model reads the same hunter
prompts on the same pairs, so the tests we stand behind are paired: a one-sided paired t-test
against a model that surely never saw the data, a paired equivalence test (TOST) against the
proxy, and the verdict: the suspect's gain over the reference on the dataset's pairs against
the same gain on pairs of text outside it (the ``nonmember`` split), so that a model that only
follows the hunter's prompts better than the reference is not flagged.

Every cached stage (hunter iterations, extraction, Manual / MiniPrompt / plug-in, the dataset
test's fine-tunes and LCSS values, sweep cells) is keyed on what decides its numbers: the
models by content (``models.identity``), the pairs' tokens, the options, the adapter's bytes.

On a cluster without a shared disk (``mia_ray.storage``): actors load staged models, the
fine-tunes (the hunter's, the dataset test's) train in a temp folder of their node and put the
result into storage, from where the run pulls it into ``--out``; each checkpoint goes to
storage as it is written; a sweep cell runs on any node with its own workspace, storage's
``cells/<name>``, and runs again on another node if its node dies, resuming from there.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray import storage
from mia_ray.config import MemHunterJobConfig, to_dict
from mia_ray.errors import MiaError
from mia_ray.keys import file_sha256, listing_sha256
from mia_ray.models.identity import model_key, tree_sha256
from mia_ray.pipelines.common import (
    check_model_early,
    check_target_early,
    fingerprint,
    labelled_documents,
    log,
    resolve_world,
)
from mia_ray.registry import pipeline
from mia_ray.runtime import describe, ray_options

# How a context is built and scored; part of every cache key, so that rows cached by code
# that built contexts otherwise (before the BOS went in front of p + x) are never reused.
_SCORING = "context=bos+prompt+x; mu=LCSS/|y| on tokens; loss=mean NLL of y; v2"


def _target_key(cfg: MemHunterJobConfig, path: str | None = None) -> str:
    """A model the target pool loads (the target, or ``path``), by content, with the dtype
    and device it resolves to in the pool's actors."""
    return model_key(cfg.model, cfg.resources.gpus_per_actor > 0, path)


def _hunter_key(cfg: MemHunterJobConfig) -> str:
    """The hunter LM, loaded in the driver with the target's device and ``dtype: auto``."""
    from types import SimpleNamespace

    from mia_ray.models.hf import pick_device

    loads = SimpleNamespace(name_or_path=cfg.hunter.model, dtype="auto", device=cfg.model.device)
    return model_key(loads, pick_device(cfg.model.device) == "cuda")


def _adapter_key(adapter: str) -> str:
    return tree_sha256(adapter) if adapter else ""


def _pairs_key(part: pd.DataFrame) -> str:
    """The pairs by content: ids, x's text (the hunter reads it) and the token ids."""
    return fingerprint(
        [str(p) for p in part["pair_id"]],
        [str(x) for x in part["x"]],
        [[int(t) for t in v] for v in part["x_ids"]],
        [[int(t) for t in v] for v in part["y_ids"]],
    )


def _workspace(out: Path) -> storage.Workspace:
    """The workspace whose ``local`` holds ``out``: the CLI's run, or a sweep cell's own;
    outside a run (a test calling ``run`` directly), ``out`` itself on this machine, where
    every storage call below is a plain path."""
    ws = storage.current()
    if ws is not None and _inside(out, ws.local) is not None:
        return ws
    return storage.Workspace(Path(out))


def _inside(path: str | os.PathLike, folder: Path) -> str | None:
    """``path`` relative to ``folder`` (posix), or None when it is not inside it."""
    try:
        return Path(path).expanduser().resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return None


def _remote(path: str) -> str:
    """What remote code (an actor, a task) loads for a model or adapter folder ``path`` of
    this process: on one machine the path itself; on a distributed run, for a folder of the
    run that remote code put into storage (a fine-tune's output, complete), its URL there,
    and for anything else what :func:`storage.stage` makes of it (a content-hashed copy)."""
    ws = storage.current()
    if ws is None or not ws.distributed or not path:
        return path
    rel = _inside(path, ws.local)
    if rel and Path(path).is_dir() and ws.storage.complete(rel):
        return ws.url(rel)
    return ws.stage(path)


def _resolve(cfg: MemHunterJobConfig) -> None:
    """Demo world: target, its reference and data from ``world.target``; the hunter defaults
    to the world's tiny-ref, a small GPT trained only on the reference pool (never on members)."""
    resolve_world(cfg)
    if cfg.world.target and not cfg.hunter.model:
        from mia_ray.demo.world import ensure_world

        info = ensure_world(cfg.world, [cfg.world.target, "tiny"])
        cfg.hunter.model = info["targets"]["tiny"]["reference"]
    check_target_early(cfg.model)
    check_model_early(cfg.hunter.model, "hunter.model")


def _pairs(cfg: MemHunterJobConfig, tok) -> tuple[pd.DataFrame, dict[int, list[str]]]:
    """Member pairs split train/test/val by document, plus non-member pairs (split
    ``nonmember``), each split cut to ``pairs.max_per_split`` (first ids); and the documents'
    texts by label (1: the target dataset, 0: outside it)."""
    from mia_ray.data.pairs import make_pairs, split_pairs

    ds, labels = labelled_documents(cfg.data)
    docs = ds.select_columns(["doc_id", "text"]).to_pandas().sort_values("doc_id")
    p = cfg.pairs
    rows = []
    for label in (1, 0):
        part = docs[docs["doc_id"].map(labels) == label]
        pairs = make_pairs(
            zip(part["doc_id"], part["text"], strict=True),
            tok,
            p.prefix_tokens,
            p.target_tokens,
            p.per_doc,
        )
        if label == 1:
            pairs = split_pairs(pairs, tuple(p.splits), p.seed)
        else:
            pairs["split"] = "nonmember"
        rows.append(pairs)
    pairs = pd.concat(rows, ignore_index=True).sort_values("pair_id", kind="stable")
    if p.max_per_split:
        pairs = pairs.groupby("split", sort=False).head(p.max_per_split)
    by_label = {
        y: docs.loc[docs["doc_id"].map(labels) == y, "text"].astype(str).tolist() for y in (1, 0)
    }
    return pairs.reset_index(drop=True), by_label


class TargetPool:
    """A pool of TargetLM actors holding one model: batched scoring and GCG runs."""

    def __init__(self, path: str, cfg: MemHunterJobConfig):
        import ray
        from ray.util import ActorPool

        from mia_ray.actors.target import TargetLM

        res, m = cfg.resources, cfg.model
        threads = res.torch_threads or max(1, int(np.ceil(res.cpus_per_actor)))
        remote = ray.remote(TargetLM).options(
            **ray_options(res, res.cpus_per_actor, res.gpus_per_actor),
            # An actor whose node died starts again on another node (it loads the model from
            # storage there) and the call it was serving runs again: scoring and GCG read
            # nothing but their arguments, so a retried call gives the same rows.
            max_restarts=2,
            max_task_retries=2,
        )
        # The target's revision is the target's: other models (reference, proxy) load their
        # default one, as their cache keys (models.identity.model_cfg_key) say.
        rev = m.revision if path == m.name_or_path else ""
        name = _remote(path)  # never a path of this node's disk on a cluster
        self.actors = [
            remote.remote(name, m.device, m.dtype, rev, m.trust_remote_code, threads)
            for _ in range(max(1, res.scorer_actors))
        ]
        self.pool = ActorPool(self.actors)
        self.batch = max(1, m.batch_size)

    def frame(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Rows with prompt or prompt_ids, x_ids, y_ids -> plus out_ids, mu, loss (in order)."""
        # Batches of at most model.batch_size, and at least one per actor when rows are few.
        size = max(1, min(self.batch, -(-len(rows) // len(self.actors))))
        chunks = [rows.iloc[i : i + size] for i in range(0, len(rows), size)]
        out = list(self.pool.map(lambda a, c: a.__call__.remote(c), chunks))
        return pd.concat(out, ignore_index=True) if out else rows.iloc[:0]

    def score(self, prompts, x_ids, y_ids) -> tuple[np.ndarray, np.ndarray]:
        res = self.frame(pd.DataFrame({"prompt": prompts, "x_ids": x_ids, "y_ids": y_ids}))
        return res["mu"].to_numpy(dtype=float), res["loss"].to_numpy(dtype=float)

    def gcg(self, jobs: list[dict]) -> list[dict]:
        return list(self.pool.map(lambda a, j: a.gcg_run.remote(**j), jobs))

    def allowed(self) -> np.ndarray:
        import ray

        return ray.get(self.actors[0].allowed_tokens.remote())

    def encode(self, texts: list[str]) -> list[list[int]]:
        import ray

        return ray.get(self.actors[0].encode.remote(texts))

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)


def _finetune_task(model, adapter_in, rows, root, rel, spec, seed, xs, separator, max_x, threads):
    """One iteration's LoRA fine-tune of the hunter, on whichever node Ray gives it: it trains
    into a temp folder of that node and puts the adapter into storage (``root``/``rel``, its
    completion marker last); the driver pulls it from there. Returns the training record."""
    from mia_ray.train.hunter import finetune_hunter

    tmp = tempfile.mkdtemp(prefix="mia-hunter-adapter-")
    try:
        record = finetune_hunter(
            model, adapter_in, rows, tmp, spec, seed, xs, separator, max_x, threads
        )
        storage.open_storage(root).put_dir(tmp, rel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def _hunter_dir(cfg, out: Path, train: pd.DataFrame) -> tuple[Path, dict]:
    """Where the hunter's iterations are checkpointed, and what that folder is keyed on. The
    hunter learns from the target's scores: other weights at the same paths (target or
    hunter), or other training pairs, train a new hunter beside the old one."""
    identity = {"target": _target_key(cfg), "hunter": _hunter_key(cfg), "scoring": _SCORING,
                "pairs": _pairs_key(train)}  # fmt: skip
    return out / "hunter" / fingerprint(identity), identity


def _train(cfg, hunter, target: TargetPool, pairs: pd.DataFrame, out: Path) -> dict:
    import ray

    from mia_ray.train.hunter import train_hunter

    h = cfg.hunter
    spec = h
    train = pairs[pairs["split"] == "train"]
    xs = dict(zip(train["pair_id"], train["x"], strict=True))
    task = ray.remote(_finetune_task).options(
        **ray_options(cfg.resources, h.train_cpus, h.train_gpus),
        # A fine-tune whose node died runs again elsewhere (Ray's retries of system
        # failures): it writes only its own temp folder, then storage, marker last.
        max_retries=3,
    )
    threads = max(1, int(np.ceil(h.train_cpus)))
    ws = _workspace(out)

    def finetune(adapter_in, rows, out_dir, seed):
        rel = _inside(out_dir, ws.local)
        record = ray.get(
            task.remote(
                _remote(h.model), _remote(adapter_in), rows, ws.url(), rel, spec, seed, xs,
                h.separator, h.max_x_tokens, threads,
            )
        )  # fmt: skip
        ws.pull(rel)  # the adapter, into out_dir
        return record

    d, identity = _hunter_dir(cfg, out, train)
    log(f"hunter: training on {len(train)} pairs, {h.iterations} iterations ({d})")
    return train_hunter(hunter, target.score, finetune, train, d, spec, identity=identity)


def _extraction_key(cfg, adapter: str) -> str:
    """What decides extraction's prompts and scores, but the pairs: the hunter (base weights
    and adapter by content, its sampling options), the target by content, the seed, the k."""
    h = cfg.hunter
    return fingerprint(sorted(set(cfg.extraction.trials)), cfg.extraction.seed, h.prompt_tokens,
                       h.sample_top_k, h.sample_temperature, h.separator, h.max_x_tokens,
                       _adapter_key(adapter), _hunter_key(cfg), _target_key(cfg),
                       _SCORING)  # fmt: skip


def _extract(cfg, hunter, target: TargetPool, pairs: pd.DataFrame, out: Path, adapter: str):
    """For each budget k, the k trials of every pair of a split run side by side (MemHunter
    extracts with inference alone, its k prompts in parallel): trial j samples pair p's
    prompt from seed (p, j), so a budget's prompts are the first k of the largest one's, and
    the batch's wall clock is that budget's cost. Rows: split, budget, pair_id, trial, prompt,
    out_ids, mu, loss, round_s. Cached per split."""
    from mia_ray.stages import frame_stage

    ks = sorted(set(cfg.extraction.trials))
    fp = _extraction_key(cfg, adapter)
    frames = []
    for split in cfg.extraction.splits:
        part = pairs[pairs["split"] == split]
        if part.empty:
            continue
        key = fingerprint(fp, _pairs_key(part))
        frames.append(
            frame_stage(
                out,
                f"extraction/{split}",
                key,
                lambda s=split, p=part: _extract_split(cfg, hunter, target, s, p, ks),
            )
        )
    return pd.concat(frames, ignore_index=True)


def _extract_split(
    cfg, hunter, target: TargetPool, split: str, part: pd.DataFrame, ks
) -> pd.DataFrame:
    """One split's extraction rows (see :func:`_extract`)."""
    from mia_ray.train.hunter import pair_seed

    h = cfg.hunter
    rows = []
    for k in ks:
        batch = part.loc[part.index.repeat(k)].assign(trial=np.tile(np.arange(k), len(part)))
        t0 = time.perf_counter()
        seeds = [
            pair_seed(cfg.extraction.seed, "trial", p, j)
            for p, j in zip(batch["pair_id"], batch["trial"], strict=True)
        ]
        prompts = hunter.sample(
            list(batch["x"]), h.prompt_tokens, h.sample_top_k, h.sample_temperature, seeds
        )
        texts = [hunter.decode(p) for p in prompts]
        res = target.frame(batch[["pair_id", "trial", "x_ids", "y_ids"]].assign(prompt=texts))
        dt = time.perf_counter() - t0
        rows.append(res.assign(split=split, budget=k, round_s=dt))
        log(f"extraction [{split}]: k = {k}, {len(batch)} prompts side by side ({dt:.1f} s)")
    df = pd.concat(rows, ignore_index=True)
    cols = ["split", "budget", "pair_id", "trial", "prompt", "out_ids", "mu", "loss", "round_s"]
    return df[cols]


def _stage(out: Path, name: str, fp: str, compute) -> tuple[list[dict], pd.DataFrame]:
    """``compute() -> (rows, frame)`` as the folder stage ``stages/<name>`` (the frame in
    it, the rows in its marker); a rerun with the same key reads them back instead."""
    from mia_ray.reports.io import write_parquet
    from mia_ray.stages import folder_stage

    def fill(folder: Path) -> dict:
        rows, frame = compute()
        write_parquet(folder / "frame.parquet", frame)
        return {"rows": rows}

    reused = f"{name}: reusing the results of an earlier run"
    folder, got = folder_stage(out, f"stages/{name}", fp, fill, reused=reused)
    return got["rows"], pd.read_parquet(folder / "frame.parquet")


def _memhunter_rows(runs: pd.DataFrame) -> list[dict]:
    """One row per split and budget k, from that budget's own batch of k prompts per pair."""
    from mia_ray.features.lcss import best_of_k

    rows = []
    for (split, k), part in runs.groupby(["split", "budget"], sort=False):
        r = best_of_k(part, [int(k)]).iloc[0]
        rows.append(
            {
                "method": "memhunter",
                "split": split,
                "trials": int(k),
                "seconds": float(part["round_s"].iloc[0]),
                "avg_lcss": float(r["avg_lcss"]),
                "hit_rate": float(r["hit_rate"]),
                "pairs": int(r["pairs"]),
            }
        )
    return rows


def _manual(cfg, target: TargetPool, pairs: pd.DataFrame) -> tuple[list[dict], pd.DataFrame]:
    """The prefix alone (Carlini et al.): one greedy continuation per pair."""
    rows, frames = [], []
    for split in cfg.extraction.splits:
        part = pairs[pairs["split"] == split]
        if part.empty:
            continue
        t0 = time.perf_counter()
        res = target.frame(part[["pair_id", "x_ids", "y_ids"]].assign(prompt=""))
        dt = time.perf_counter() - t0
        frames.append(res.assign(split=split, method="manual"))
        rows.append(
            {
                "method": "manual",
                "split": split,
                "trials": 1,
                "seconds": dt,
                "avg_lcss": float(res["mu"].mean()),
                "hit_rate": float((res["mu"] >= 1).mean()),
                "pairs": len(res),
            }
        )
    return rows, pd.concat(frames, ignore_index=True)


def _random_prompt(allowed: np.ndarray, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).choice(allowed, n)]


def _miniprompt(
    cfg, target: TargetPool, pairs, mem_rows, n_actors
) -> tuple[list[dict], pd.DataFrame]:
    """MiniPrompt: GCG from random tokens per pair, given MemHunter's wall clock at each k.
    With A actors running pairs side by side, a pair's share of T seconds is T * A / n."""
    from mia_ray.train.hunter import pair_seed

    e = cfg.extraction
    allowed = target.allowed()
    rows, frames = [], []
    for split in e.miniprompt_splits:
        part = pairs[pairs["split"] == split]
        mine = [r for r in mem_rows if r["split"] == split and r["method"] == "memhunter"]
        if part.empty or not mine:
            continue
        budgets = [r["seconds"] * n_actors / len(part) for r in mine]
        jobs = [
            {
                "prompt_ids": _random_prompt(
                    allowed, e.gcg_prompt_tokens, pair_seed(e.seed, "gcg", pid)
                ),
                "x_ids": list(x),
                "y_ids": list(y),
                "budgets_s": budgets,
                "top_k": e.gcg_top_k,
                "n_candidates": e.gcg_candidates,
                "seed": pair_seed(e.seed, "gcg-steps", pid),
            }
            for pid, x, y in zip(part["pair_id"], part["x_ids"], part["y_ids"], strict=True)
        ]
        log(f"miniprompt [{split}]: GCG on {len(jobs)} pairs, up to {max(budgets):.1f} s each")
        runs = target.gcg(jobs)
        for b, r in enumerate(mine):
            snap = part[["pair_id", "x_ids", "y_ids"]].assign(
                prompt_ids=[run["snapshots"][b] for run in runs]
            )
            res = target.frame(snap)
            frames.append(res.assign(split=split, method="miniprompt", trials=r["trials"]))
            rows.append(
                {
                    "method": "miniprompt",
                    "split": split,
                    "trials": r["trials"],  # the MemHunter budget it is matched to
                    "seconds": r["seconds"],
                    "avg_lcss": float(res["mu"].mean()),
                    "hit_rate": float((res["mu"] >= 1).mean()),
                    "pairs": len(res),
                    "gcg_steps_mean": float(np.mean([run["snapshot_steps"][b] for run in runs])),
                }
            )
    return rows, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _plugin(cfg, target: TargetPool, pairs, trials) -> tuple[list[dict], pd.DataFrame]:
    """Figure 4: GCG to full recovery from MemHunter's best prompt (after its pre-search of
    k_max prompts) vs from random tokens, on the first ``plugin_pairs`` test pairs."""
    from mia_ray.train.hunter import pair_seed

    e = cfg.extraction
    test = pairs[pairs["split"] == "test"].head(e.plugin_pairs)
    if test.empty:
        return [], pd.DataFrame()
    tri = trials[trials["split"] == "test"]
    n_test = tri["pair_id"].nunique()
    presearch = float(tri["round_s"].iloc[0]) / max(1, n_test) if len(tri) else 0.0
    best = tri.sort_values(["mu", "loss"], ascending=[False, True]).groupby("pair_id").head(1)
    best = best.set_index("pair_id")["prompt"]
    allowed = target.allowed()
    starts = {
        "memhunter_gcg": target.encode([best[p] for p in test["pair_id"]]),
        "gcg": [
            _random_prompt(allowed, e.gcg_prompt_tokens, pair_seed(e.seed, "gcg", p))
            for p in test["pair_id"]
        ],
    }
    rows, per_pair = [], []
    for method, inits in starts.items():
        jobs = []
        for pid, x, y, init in zip(
            test["pair_id"], test["x_ids"], test["y_ids"], inits, strict=True
        ):
            init = list(init) or _random_prompt(allowed, 1, pair_seed(e.seed, "pad", pid))
            jobs.append(
                {
                    "prompt_ids": init,
                    "x_ids": list(x),
                    "y_ids": list(y),
                    "budgets_s": [e.plugin_max_s],
                    "top_k": e.gcg_top_k,
                    "n_candidates": e.gcg_candidates,
                    "seed": pair_seed(e.seed, "plugin", method, pid),
                    "stop_at_full": True,
                    "check_every": e.plugin_check_every,
                }
            )
        log(f"plug-in: {method} on {len(jobs)} pairs, at most {e.plugin_max_s:.0f} s each")
        runs = target.gcg(jobs)
        final = target.frame(
            test[["pair_id", "x_ids", "y_ids"]].assign(
                prompt_ids=[r["snapshots"][-1] for r in runs]
            )
        )
        pre = presearch if method == "memhunter_gcg" else 0.0
        times = []
        for pid, run, mu in zip(test["pair_id"], runs, final["mu"], strict=True):
            t = None if run["recovered_s"] is None else pre + run["recovered_s"]
            times.append(t)
            per_pair.append(
                {
                    "method": method,
                    "pair_id": pid,
                    "presearch_s": pre,
                    "seconds_to_full": t,
                    "gcg_steps": run["steps"],
                    "final_mu": float(mu),
                }
            )
        censored = [pre + e.plugin_max_s if t is None else t for t in times]
        rows.append(
            {
                "method": method,
                "split": "test",
                "trials": None,
                "seconds": float(np.mean(censored)),
                "avg_lcss": float(final["mu"].mean()),
                "hit_rate": float(np.mean([t is not None for t in times])),
                "pairs": len(test),
            }
        )
    return rows, pd.DataFrame(per_pair)


def _finetune_spec(epochs: float, lr: float):
    from mia_ray.train.lm import FinetuneSpec

    # Empty target_modules: LoRA on every linear layer, whatever the architecture.
    return FinetuneSpec(epochs=epochs, lr=lr, target_modules=())


def _finetune_model_task(texts, base, root, rel, epochs, lr, seed, threads):
    """A dataset-test fine-tune (the proxy, ``@finetune:...``) on whichever node Ray gives it:
    the model is saved into a temp folder of that node, then put into storage
    (``root``/``rel``, its completion marker last). Returns the training record."""
    from mia_ray.train.lm import finetune_causal_lm

    spec = _finetune_spec(epochs, lr)
    tmp = tempfile.mkdtemp(prefix="mia-finetune-")
    try:
        record = finetune_causal_lm(
            texts, storage.localize(base), tmp, spec, seed=seed, threads=threads
        )
        storage.open_storage(root).put_dir(tmp, rel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def _named_model(cfg, name: str) -> str | None:
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


def _finetune_key(cfg, which: str, texts: list[str], base: str | None = None) -> str:
    """A dataset-test fine-tune by what decides its weights: the base model's content, the
    recipe, the seed and the documents. ``base``: where the base model is, when not where
    ``dataset_test.base`` names it (a sweep cell's copy on its node)."""
    from dataclasses import asdict
    from types import SimpleNamespace

    d = cfg.dataset_test
    base = base or _named_model(cfg, d.base)
    if base is None:
        raise MiaError(f"dataset_test.base cannot be {d.base}: fine-tune an existing model")
    # The fine-tune trains in float32 in a task with hunter.train_gpus: its device is part
    # of what it gives (a GPU's kernels round otherwise).
    trains = SimpleNamespace(dtype="float32", device="auto")
    return fingerprint(which, model_key(trains, cfg.hunter.train_gpus > 0, base), asdict(_finetune_spec(d.finetune_epochs,
                       d.finetune_lr)), d.finetune_seed, texts)  # fmt: skip


def _model_paths(
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
    cpus = max(1, res.scorer_actors) * res.cpus_per_actor + cfg.hunter.train_cpus
    threads = max(1, int(cpus))
    task = ray.remote(_finetune_model_task).options(
        **ray_options(res, cpus, cfg.hunter.train_gpus),
        # Run again elsewhere if its node dies: it writes its temp folder, then storage.
        max_retries=3,
    )
    ws = _workspace(out)
    for name in dict.fromkeys(names):
        path = named.get(name) or _named_model(cfg, name)
        if path is not None:
            if name.startswith("@world:") and not (Path(path) / "config.json").is_file():
                raise MiaError(f"dataset_test: {name}: the demo world has no model {path}")
            if not name.startswith("@"):
                check_model_early(path, "dataset_test model")
            paths[name] = path
            continue
        which = name.split(":", 1)[1]
        base = named.get(d.base) or _named_model(cfg, d.base)
        texts = docs_by_label[1 if which == "members" else 0]
        dest = out / "models" / f"finetune-{which}-{_finetune_key(cfg, which, texts, base)}"
        rel = _inside(dest, ws.local)
        if not ws.storage.complete(rel):
            log(f"dataset test: fine-tuning {base} on {len(texts)} {which} documents")
            ray.get(
                task.remote(
                    texts, _remote(base), ws.url(), rel, d.finetune_epochs, d.finetune_lr,
                    d.finetune_seed, threads,
                )
            )  # fmt: skip
        ws.pull(rel)
        paths[name] = str(dest)
    return paths


def _probes(cfg, hunter, pairs: pd.DataFrame, trials: pd.DataFrame, split: str) -> pd.DataFrame:
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


def _test_row(kind: str, suspect: str, against: str, fn, *args, alpha: float) -> dict:
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


def _lcss_of(cfg, name: str, path: str, probes: pd.DataFrame) -> pd.DataFrame:
    """The dataset test's probes scored by model ``path`` (split, pair_id, trial, mu)."""
    log(f"dataset test: LCSS of {name} ({path})")
    pool = TargetPool(path, cfg)
    try:
        cols = ["split", "pair_id", "trial", "prompt", "x_ids", "y_ids"]
        return pool.frame(probes[cols])[["split", "pair_id", "trial", "mu"]]
    finally:
        pool.close()


def _dataset_test(
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
    paths = _model_paths(cfg, docs_by_label, out, named)
    splits = [d.split] + (["nonmember"] if (pairs["split"] == "nonmember").sum() >= 2 else [])
    probes = pd.concat([_probes(cfg, hunter, pairs, trials, s) for s in splits], ignore_index=True)
    probe_key = fingerprint(
        list(probes["split"]), list(probes["pair_id"]), [int(t) for t in probes["trial"]],
        list(probes["prompt"]), [[int(t) for t in v] for v in probes["x_ids"]],
        [[int(t) for t in v] for v in probes["y_ids"]], _SCORING,
    )  # fmt: skip
    lcss: dict[str, pd.Series] = {}
    for name, path in dict.fromkeys(paths.items()):
        mine = path == cfg.model.name_or_path
        if mine and "mu" in probes and probes["mu"].notna().all():
            res = probes[["split", "pair_id", "trial", "mu"]]
        else:
            safe = name.strip("@").replace(":", "-").replace("/", "_")
            key = fingerprint(_target_key(cfg, path), probe_key)
            res = frame_stage(
                out, f"dataset_test/{safe}", key, lambda n=name, p=path: _lcss_of(cfg, n, p, probes)
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
            _test_row("paper", s, d.proxy, paper_ttest, mine.values, proxy.values, alpha=d.alpha),
            _test_row("paired_greater", s, d.reference, paired_greater, mine.values, ref.values,
                      alpha=d.alpha),
            _test_row("paired_tost", s, d.proxy, paired_tost, mine.values, proxy.values,
                      d.margin, alpha=d.alpha),
            _test_row("gap_vs_nonmember", s, d.reference, gap_greater, mine.values, ref.values,
                      non[s].values, non[d.reference].values, alpha=d.alpha),
        ]  # fmt: skip
        for r in out_rows[-4:]:
            other = proxy if r["kind"] in ("paper", "paired_tost") else ref
            r["mean_suspect"], r["mean_other"] = float(mine.mean()), float(other.mean())
    # Power: a proxy that did train on the data must itself beat the reference (and by more
    # on the dataset than outside it), or these samples cannot tell training from no
    # training and "no evidence" means little.
    power = _test_row("paired_greater", d.proxy, d.reference, paired_greater, proxy.values,
                      ref.values, alpha=d.alpha)  # fmt: skip
    power.update(proxy=d.proxy, reference=d.reference, mean_suspect=float(proxy.mean()),
                 mean_reference=float(ref.mean()))  # fmt: skip
    power_gap = _test_row("gap_vs_nonmember", d.proxy, d.reference, gap_greater, proxy.values,
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


def _check_resources(cfg: MemHunterJobConfig) -> None:
    """The target actors stay up while the hunter's fine-tune task runs: both must fit at once,
    or the fine-tune would wait for CPUs forever."""
    import ray

    res, h = cfg.resources, cfg.hunter
    total, where = ray.cluster_resources(), "Ray has"
    custom = res.custom_resources
    if custom:  # only the nodes that hold resources.custom_resources take the work
        total, where = {}, "the nodes with resources.custom_resources have"
        for n in ray.nodes():
            own = n.get("Resources", {})
            if n.get("Alive") and all(own.get(k, 0) >= v for k, v in custom.items()):
                for kind in ("CPU", "GPU"):
                    total[kind] = total.get(kind, 0) + own.get(kind, 0)
    for kind, per_actor, train in (
        ("CPU", res.cpus_per_actor, h.train_cpus),
        ("GPU", res.gpus_per_actor, h.train_gpus),
    ):
        need = max(1, res.scorer_actors) * per_actor + train
        if need > total.get(kind, 0) + 1e-9:
            raise MiaError(
                f"resources: {max(1, res.scorer_actors)} target actors x {per_actor:g} {kind}s + "
                f"the hunter's fine-tune ({train:g}) need {need:g} {kind}s, but {where} "
                f"{total.get(kind, 0):g}: lower resources.scorer_actors, "
                f"resources.{'cpus' if kind == 'CPU' else 'gpus'}_per_actor or "
                f"hunter.train_{'cpus' if kind == 'CPU' else 'gpus'}"
            )


def _run(cfg: MemHunterJobConfig, out: Path, named: dict[str, str] | None = None) -> dict[str, Any]:
    """One MemHunter run into ``out``; ``named``: dataset-test model names already resolved to
    folders (a sweep cell's copies on its node; see :func:`_model_paths`)."""

    from mia_ray.actors.hunter import Hunter
    from mia_ray.data.pairs import bos_prefix
    from mia_ray.reports.io import write_json, write_parquet

    _resolve(cfg)
    h = cfg.hunter
    from mia_ray.models.hf import load_tokenizer

    tok = load_tokenizer(cfg.model.name_or_path, cfg.model.revision, cfg.model.trust_remote_code)
    # Read the documents before the target actors take their CPUs: Ray Data needs one.
    pairs, docs_by_label = _pairs(cfg, tok)
    counts = pairs["split"].value_counts().to_dict()
    log(f"pairs: {counts}")
    if counts.get("train", 0) < 1 or counts.get("test", 0) < 1:
        raise MiaError(f"pairs: need train and test pairs of members, got {counts}")
    write_parquet(out / "pairs.parquet", pairs)
    _check_resources(cfg)
    target = TargetPool(cfg.model.name_or_path, cfg)
    try:
        threads = cfg.resources.torch_threads or 1
        hunter = Hunter(
            h.model,
            device=cfg.model.device,
            torch_threads=threads,
            separator=h.separator,
            max_x_tokens=h.max_x_tokens,
        )
        training = _train(cfg, hunter, target, pairs, out)
        hunter.load_adapter(training["adapter"])
        runs = _extract(cfg, hunter, target, pairs, out, training["adapter"])
        extraction = _memhunter_rows(runs)
        # The largest budget's prompts (a superset of the others') serve everything after.
        trials = runs[runs["budget"] == runs["budget"].max()].drop(columns="budget")
        outputs = [trials.assign(method="memhunter")]
        methods = cfg.extraction.methods
        # Wall-clock-budgeted results cannot be recomputed identically: a rerun reads them back.
        # MiniPrompt's budgets and the plug-in's pre-search come from MemHunter's timed rows.
        fp = fingerprint(to_dict(cfg.extraction), to_dict(cfg.pairs), _target_key(cfg),
                         _hunter_key(cfg), _pairs_key(pairs), _adapter_key(training["adapter"]),
                         extraction, _SCORING)  # fmt: skip
        if "manual" in methods:
            rows, frame = _stage(out, "manual", fp, lambda: _manual(cfg, target, pairs))
            extraction += rows
            outputs.append(frame)
        if "miniprompt" in methods:
            n = len(target.actors)
            rows, frame = _stage(
                out, "miniprompt", fp, lambda: _miniprompt(cfg, target, pairs, extraction, n)
            )
            extraction += rows
            outputs.append(frame)
        plugin: list[dict] = []
        if "plugin" in methods:
            rows, per_pair = _stage(out, "plugin", fp, lambda: _plugin(cfg, target, pairs, trials))
            extraction += rows
            plugin = per_pair.to_dict("records")
    finally:
        target.close()
    hypothesis, dtest = _dataset_test(cfg, hunter, pairs, trials, docs_by_label, out, named)
    write_parquet(out / "extraction.parquet", pd.DataFrame(extraction))
    cols = ["method", "split", "pair_id", "mu"]
    write_parquet(
        out / "outputs.parquet",
        pd.concat([f[[c for c in cols if c in f]] for f in outputs], ignore_index=True),
    )
    report = {
        "pipeline": "memhunter",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {
            "target": cfg.model.name_or_path,
            "hunter": h.model,
            # What the caches are keyed on: the weights by content, with dtype and device.
            "keys": {"target": _target_key(cfg), "hunter": _hunter_key(cfg)},
        },
        "pairs": {
            "prefix_tokens": cfg.pairs.prefix_tokens,
            "target_tokens": cfg.pairs.target_tokens,
            "context_bos": bos_prefix(tok),
            "counts": {k: int(v) for k, v in counts.items()},
        },
        "training": training,
        "extraction": extraction,
        "plugin": plugin,
        "hypothesis": hypothesis,
        "dataset_test": {
            "split": cfg.dataset_test.split,
            "trials": cfg.dataset_test.trials,
            "models": {
                "suspects": list(cfg.dataset_test.suspects),
                "reference": cfg.dataset_test.reference,
                "proxy": cfg.dataset_test.proxy,
            },
            **dtest,
        },
        "lcss_by_method": _lcss_by_method(outputs),
        "examples": _examples(trials, pairs, outputs, tok),
        "notes": _notes(cfg, dtest, bos_prefix(tok)),
        "runtime": describe(),
    }
    write_json(out / "report.json", report)
    from mia_ray.reports.memhunter import render_memhunter_report

    render_memhunter_report(report, out / "report.html")
    return report


def _lcss_by_method(outputs: list[pd.DataFrame], split: str = "test") -> dict[str, list[float]]:
    """Per method, each test pair's best mu (MiniPrompt: at its largest budget)."""
    out = {}
    for f in outputs:
        f = f[f["split"] == split]
        if f.empty:
            continue
        if "trials" in f and f["method"].iloc[0] == "miniprompt":
            f = f[f["trials"] == f["trials"].max()]
        out[str(f["method"].iloc[0])] = f.groupby("pair_id")["mu"].max().sort_index().tolist()
    return out


def _examples(trials: pd.DataFrame, pairs: pd.DataFrame, outputs, tok, n: int = 5) -> list[dict]:
    """Table 7: for the test pairs with the highest MemHunter mu, x, the best prompt, the
    target's continuation with it and without it (manual), and y."""
    test = trials[trials["split"] == "test"]
    if test.empty:
        return []
    best = test.sort_values(["mu", "loss"], ascending=[False, True]).groupby("pair_id").head(1)
    best = best.sort_values(["mu", "pair_id"], ascending=[False, True]).head(n)
    manual = next((f for f in outputs if "method" in f and (f["method"] == "manual").any()), None)
    by_id = pairs.set_index("pair_id")
    rows = []
    for _, r in best.iterrows():
        row = {"pair_id": r["pair_id"], "x": by_id.loc[r["pair_id"], "x"], "prompt": r["prompt"],
               "output": tok.decode([int(t) for t in r["out_ids"]]), "mu": float(r["mu"]),
               "y": by_id.loc[r["pair_id"], "y"]}  # fmt: skip
        if manual is not None:
            m = manual[(manual["pair_id"] == r["pair_id"]) & (manual["split"] == "test")]
            if len(m):
                row["manual_output"] = tok.decode([int(t) for t in m.iloc[0]["out_ids"]])
                row["manual_mu"] = float(m.iloc[0]["mu"])
        rows.append(row)
    return rows


def _notes(cfg: MemHunterJobConfig, dtest: dict, bos: list[int]) -> list[str]:
    h, e, d = cfg.hunter, cfg.extraction, cfg.dataset_test
    power, weak = dtest["power_check"], []
    if power.get("p_value") is None or power["p_value"] >= d.alpha:
        p = power.get("p_value")
        weak.append(
            f"Power check failed: the proxy, which trained on the dataset, does not recover "
            f"more than the reference either (one-sided paired t-test p = "
            f"{'undefined' if p is None else f'{p:.3f}'}). On these samples LCSS cannot tell "
            "training from no training, so 'no evidence of memorization' is not evidence that "
            "a suspect did not train on the data; use more samples or longer continuations."
        )
    if dtest["splits"]["nonmember"] is None:
        weak.append(
            "The data holds fewer than 2 nonmember pairs: the verdict (the suspect's gain over "
            "the reference on members against the same gain on nonmembers) is undefined."
        )
    return [
        *weak,
        "mu = LCSS(output, y) / |y| on the target's tokens; Avg LCSS is the mean over pairs of "
        "the best mu among k prompts, Hit Rate the share of pairs with mu = 1.",
        "The target reads BOS + prompt + x "
        + (
            f"(its tokenizer puts token {bos} before every text, so the model expects it)."
            if bos
            else "with no BOS: its tokenizer adds none."
        ),
        f"Hunter training: {h.iterations} iterations, beam search with top-{h.top_k} and "
        f"{h.beams} beams over {h.prompt_tokens}-token prompts (paper: top-48, 4 beams, 10 "
        f"iterations), prompt pool {h.pool_size}, LoRA r {h.lora_r} / alpha {h.lora_alpha}, "
        f"{h.epochs} epochs, lr {h.lr:g}.",
        "Seconds are wall clock on this run's resources. At budget k, MemHunter samples k "
        "prompts per pair and the target continues them all in one batched pass (inference "
        "alone, in parallel, as the paper uses it); MiniPrompt (GCG from random tokens) gets, "
        "per budget, the seconds MemHunter took; Manual is one greedy continuation of the "
        "prefix alone.",
        f"Plug-in: GCG runs until mu = 1 or {e.plugin_max_s:g} s (censored there), from the "
        "hunter's best prompt (its pre-search time added) or from random tokens.",
        "Dataset test: every model reads the same hunter prompts on the same pairs, so the "
        "tests are paired (on per-pair differences). The paper's test (an unpaired Welch t, "
        "p > alpha read as memorized) is shown for comparison only: a large p-value is no "
        "evidence of sameness. The one-sided paired t-test says whether the suspect recovers "
        "more than a model that never saw the data; the paired TOST whether it recovers as "
        "much as the proxy. The verdict is the gap test: the suspect's per-pair gain over the "
        f"reference on the {d.split} pairs against the same gain on the nonmember pairs (one-"
        "sided Welch, the two are different pairs), so a model that merely follows the hunter's "
        "prompts better than the reference is not flagged.",
        "Caches (hunter iterations, extraction, baselines, the dataset test's fine-tunes and "
        "LCSS values, sweep cells) are keyed on the models' weights by content, dtype and "
        "device, the pairs' tokens and the options: other weights at the same path are "
        "scored afresh.",
    ]


def _cell_name(name: str) -> str:
    base = name[7:] if name.startswith("@world:") else Path(name.rstrip("/")).name or name
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in base.lstrip("@"))


def _sweep_cells(cfg: MemHunterJobConfig, out: Path) -> list[tuple[str, str, MemHunterJobConfig]]:
    """(dataset, model, cell config) for every cell; demo-world names resolved to paths."""
    from mia_ray.demo.world import ensure_world, model_dir, target_of_model
    from mia_ray.reports.io import read_json, write_json

    sw = cfg.sweep
    owner = {m[7:]: target_of_model(m[7:]) for m in sw.models if m.startswith("@world:")}
    world_targets = list(dict.fromkeys(owner.values()))
    info = None
    if world_targets or any(d.startswith("@world:") for d in sw.datasets):
        info = ensure_world(cfg.world, [*(world_targets or ["tiny"]), "tiny"])
    if not cfg.hunter.model:
        if info is None:
            raise MiaError("sweep: hunter.model is empty: give a small LM to train as the hunter")
        cfg.hunter.model = info["targets"]["tiny"]["reference"]
    cells = []
    for i, ds in enumerate(sw.datasets):
        labels = sw.labels[i] if sw.labels else ""
        path = ds
        if ds.startswith("@world:"):
            source = ds[7:]
            manifest = read_json(
                labels or info["targets"][world_targets[0] if world_targets else "tiny"]["manifest"]
            )
            sub = {k: v for k, v in manifest.items() if k.startswith(f"{source}/")}
            if not sub:
                raise MiaError(f"sweep: the demo world has no {source!r} documents")
            labels = str(out / "datasets" / f"{source}.json")
            write_json(Path(labels), sub)
            path = info["documents"]
        for m in sw.models:
            c = copy.deepcopy(cfg)
            c.sweep = type(cfg.sweep)()
            c.world.target = ""
            c.data.path, c.data.labels, c.data.unlabelled = path, labels, "skip"
            if m.startswith("@world:"):
                c.model.name_or_path = str(model_dir(info["root"], m[7:]))
                c.model.reference = (
                    cfg.model.reference or info["targets"][owner[m[7:]]]["reference"]
                )
            elif m != "@target":
                c.model.name_or_path = m
            cells.append((ds, m, c))
    return cells


def _identity(cfg: MemHunterJobConfig) -> dict[str, Any]:
    """A run's inputs by content, beside its config: every model it loads (weights, dtype,
    device), its data and labels files, and how it scores."""
    d = cfg.dataset_test
    models = {}
    for name in dict.fromkeys([*d.suspects, d.reference, d.proxy, d.base]):
        path = _named_model(cfg, name)
        if path is not None:
            models[name] = _target_key(cfg, path)
    data = {
        k: tree_sha256(v) if v and Path(v).expanduser().exists() else v
        for k, v in (("path", cfg.data.path), ("labels", cfg.data.labels))
    }
    return {"target": _target_key(cfg), "hunter": _hunter_key(cfg), "models": models,
            "data": data, "scoring": _SCORING}  # fmt: skip


def _stage_input(path: str) -> tuple[str, str]:
    """A driver-local input of a sweep cell, for a cell on any node: ``(where, file name)``.
    A folder (a model, a data folder) is staged as :func:`storage.stage` does; a file (a
    documents file, a labels manifest) is put into storage as a folder holding just that
    file, by content, and the cell finds it at ``localize(where)/<file name>``. Hub names,
    URIs and anything on a one-machine run pass through (file name "")."""
    ws = storage.current()
    if ws is None or not ws.distributed or not path or storage.is_uri(path):
        return path, ""
    p = Path(path).expanduser()
    if not p.is_file():
        return ws.stage(path), ""
    # The hash tree_sha256 gives the folder holding just this file (and put_dir its marker).
    digest = listing_sha256([(p.name, file_sha256(p))])
    rel, store = f"inputs/{digest[:32]}", ws.storage
    if not store.complete(rel):
        with tempfile.TemporaryDirectory() as tmp:
            os.symlink(p.resolve(), Path(tmp) / p.name)
            store.put_dir(tmp, rel, {"source": p.name})
    return store.url(rel), p.name


def _cell_inputs(c: MemHunterJobConfig) -> dict[str, Any]:
    """Every driver-local input of a cell, staged (:func:`_stage_input`): its config's model
    and data fields, and the dataset test's models named by path or ``@world:``."""
    d = c.dataset_test
    fields = {
        "model.name_or_path": c.model.name_or_path,
        "model.reference": c.model.reference,
        "hunter.model": c.hunter.model,
        "data.path": c.data.path,
        "data.labels": c.data.labels,
    }
    named = {}
    for name in dict.fromkeys([*d.suspects, d.reference, d.proxy, d.base]):
        if name.startswith("@") and not name.startswith("@world:"):
            continue  # the model section's own models, or a fine-tune the cell trains
        named[name] = _stage_input(_named_model(c, name))
    return {"fields": {k: _stage_input(v) for k, v in fields.items()}, "named": named}


def _localize_cell(cfg: MemHunterJobConfig, inputs: dict[str, Any]):
    """On the cell's node: its inputs as local folders and files (``localize``, cached per
    node by content). Sets the config's fields; returns the dataset test's names -> folders
    and each local model folder -> what it was staged as (for the cell's workspace)."""
    staged: dict[str, str] = {}

    def local(where: str, name: str) -> str:
        if not where:
            return where
        here = storage.localize(where)
        if name:
            return str(Path(here) / name)
        staged[here] = where
        return here

    for key, (where, name) in inputs["fields"].items():
        section, attr = key.split(".")
        setattr(getattr(cfg, section), attr, local(where, name))
    named = {k: local(*v) for k, v in inputs["named"].items()}
    return named, staged


@dataclass
class _CellWorkspace(storage.Workspace):
    """A sweep cell's workspace on its node: ``staged`` maps the cell's local copies of the
    driver's models to the storage URLs they came from, so that the cell's actors load those
    (never a second copy staged under the cell)."""

    staged: dict[str, str] = field(default_factory=dict)

    def stage(self, path: str) -> str:
        return self.staged.get(path) or super().stage(path)


def _cell_key(c: MemHunterJobConfig) -> str:
    """A cell by its config and its inputs' contents, but not by where it runs (the
    cluster's address, storage, custom resources), which changes no number."""
    conf = to_dict(c)
    for key in ("address", "storage", "custom_resources"):
        conf["resources"].pop(key, None)
    return fingerprint(conf, _identity(c))


def _cell_task(cfg: MemHunterJobConfig, inputs: dict, url: str, distributed: bool) -> dict:
    """One sweep cell, a whole MemHunter run, on the node Ray gives it. Its workspace: storage
    ``url`` (``cells/<name>`` of the run's storage) and, as ``--out``, that folder itself
    when storage is a folder every node mounts (on one machine: the driver's
    ``--out/cells/<name>``, as always), else a temp folder of this node that starts from what
    storage holds (a cell run again resumes there) and goes back to storage at the end. The
    driver pulls the cell from storage. Returns the cell's report and this node's id."""
    import ray

    from mia_ray.runtime import configure_data_context

    # No Ray Data bars from a worker: they arrive interleaved with other cells' output and
    # fill a job's log; each cell's progress is in its log lines.
    configure_data_context(
        no_progress_timeout_s=cfg.resources.no_progress_timeout_s, progress=False
    )
    node = ray.get_runtime_context().get_node_id()
    named, staged = _localize_cell(cfg, inputs)
    store = storage.open_storage(url)
    tmp = None if store.local else tempfile.mkdtemp(prefix="mia-cell-")
    local = Path(tmp or store.root)
    local.mkdir(parents=True, exist_ok=True)
    # The cell is the driver of its own run: reads of its (local) data stay on this node.
    ws = _CellWorkspace(local, url, distributed, node, staged=staged)
    before = storage.current()
    storage.set_current(ws)
    try:
        ws.pull()
        try:
            report = _run(cfg, local, named)
        except BaseException:
            with contextlib.suppress(Exception):
                ws.push()  # what finished is kept for the cell's next attempt
            raise
        ws.push()
        if ws.mirrored:  # the report files are the cell's results (push leaves reports out)
            for name in ("report.json", "report.html"):
                if (local / name).exists():
                    store.put_file(local / name, name)
    finally:
        storage.set_current(before)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"report": report, "node": node}


def _cell_options(cfg: MemHunterJobConfig) -> dict[str, Any]:
    """Ray options of a cell's task: an orchestrator (no CPU; its work is in actors and
    tasks), asking for ``resources.custom_resources`` and ``sweep.cell_resources`` (which
    decide which nodes cells run on and how many share one)."""
    from ray import exceptions as rx

    opts = ray_options(cfg.resources, 0)
    custom = {**opts.get("resources", {}), **cfg.sweep.cell_resources}
    if custom:
        opts["resources"] = custom
    # A cell whose node died runs again on another node (Ray retries system failures), and
    # so does one that raised because a node of its actors or fine-tunes died (and their own
    # restarts and retries ran out); it resumes from what it put into storage (the hunter's
    # finished iterations, extraction, stages), so its numbers equal an unbroken run's. A
    # cell's own errors (bad input: MiaError) are not retried.
    opts["max_retries"] = 3
    opts["retry_exceptions"] = [
        rx.RayActorError,  # ActorDiedError, ActorUnavailableError
        rx.WorkerCrashedError,
        rx.NodeDiedError,
        rx.LocalRayletDiedError,
        rx.ObjectLostError,  # OwnerDiedError
    ]
    return opts


def _cell_slots(cell_resources: dict[str, float]) -> int | None:
    """How many cells ``sweep.cell_resources`` lets run at once across the alive nodes (None
    when it asks for nothing)."""
    import ray

    if not cell_resources:
        return None
    slots = 0
    for n in ray.nodes():
        own = n.get("Resources", {})
        if n.get("Alive"):
            slots += int(min(own.get(k, 0) // v for k, v in cell_resources.items()))
    return slots


def _sweep(cfg: MemHunterJobConfig, out: Path) -> dict:
    """Every (dataset, model) cell as a Ray task; the cells' actors and tasks hold the
    resources, so as many cells run at once as those fit (``sweep.max_concurrent``, and
    ``sweep.cell_resources``: e.g. one cell per node). A cell may run on any node: its inputs
    go through storage (:func:`_cell_inputs`), it works in ``cells/<name>`` of storage
    (:func:`_cell_task`), and the driver pulls each finished cell into ``out/cells/<name>``,
    where ``cell.json`` (its key and the node it ran on) marks it done for a rerun."""
    import ray

    from mia_ray.reports.io import read_json, write_json

    cells = _sweep_cells(cfg, out)
    res = cfg.resources
    per_cell = max(1, res.scorer_actors) * res.cpus_per_actor + cfg.hunter.train_cpus
    total = ray.cluster_resources()
    fit = int(total.get("CPU", 1) // max(per_cell, 1e-9))
    gpus = max(1, res.scorer_actors) * res.gpus_per_actor + cfg.hunter.train_gpus
    if gpus:
        fit = min(fit, int(total.get("GPU", 0) // gpus))
    slots = _cell_slots(cfg.sweep.cell_resources)
    if slots is not None:
        fit = min(fit, slots)
    parallel = cfg.sweep.max_concurrent or max(1, fit)
    task, opts = ray.remote(_cell_task), _cell_options(cfg)
    ws = _workspace(out)
    results: dict[tuple[str, str], dict] = {}
    pending: dict[Any, tuple[str, str]] = {}
    todo = []
    for ds, m, c in cells:
        d = out / "cells" / f"{_cell_name(ds)}__{_cell_name(m)}"
        fp = _cell_key(c)
        done = d / "cell.json"
        if done.exists() and read_json(done).get("fingerprint") == fp:
            results[(ds, m)] = read_json(d / "report.json")
            continue
        todo.append((ds, m, c, d, fp))
    log(f"sweep: {len(cells)} cells, {len(results)} done, {parallel} at a time")
    while todo or pending:
        while todo and len(pending) < parallel:
            ds, m, c, d, fp = todo.pop(0)
            d.mkdir(parents=True, exist_ok=True)
            # Named by its cell: the dashboard and the state API tell which node runs which.
            ref = task.options(**opts, name=f"memhunter cell {d.name}").remote(
                c, _cell_inputs(c), ws.url(d), ws.distributed
            )
            pending[ref] = (ds, m, d, fp)
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        ds, m, d, fp = pending.pop(ref)
        got = ray.get(ref)
        ws.pull(d)  # the cell's folder, from storage
        results[(ds, m)] = got["report"]
        write_json(d / "cell.json", {"fingerprint": fp, "node": got["node"]})
        ws.push(d / "cell.json")  # the cell is done, for a new driver too
        log(f"sweep: cell {_cell_name(ds)} x {_cell_name(m)} done ({len(results)}/{len(cells)})")
    rows, verdicts, power = [], [], []
    for ds, m, _ in cells:
        r = results[(ds, m)]
        for e in r["extraction"]:
            rows.append({"dataset": ds, "model": m, **e})
        for h in r["hypothesis"]:
            if h["suspect"] == "@target":
                verdicts.append({"dataset": ds, "model": m, **h})
        pc = r["dataset_test"]["power_check"]
        power.append({"dataset": ds, "model": m, "proxy": pc["proxy"], "p_value": pc["p_value"],
                      "passed": bool(pc["reject_h0"]), "mean_proxy": pc["mean_suspect"],
                      "mean_reference": pc["mean_reference"]})  # fmt: skip
    failed = [
        f"{_cell_name(p['dataset'])} x {_cell_name(p['model'])}" for p in power if not p["passed"]
    ]
    weak = (
        [
            f"Power check failed in {len(failed)} of {len(power)} cells ({', '.join(failed)}): "
            "there the proxy, which trained on the dataset, recovers no more than the "
            "reference, so those cells' 'no evidence of memorization' says nothing about "
            "whether the model trained on the data."
        ]
        if failed
        else []
    )
    report = {
        "pipeline": "memhunter",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sweep": {
            "datasets": list(cfg.sweep.datasets),
            "models": list(cfg.sweep.models),
            "cells": [f"{_cell_name(d)}__{_cell_name(m)}" for d, m, _ in cells],
        },  # fmt: skip
        "extraction": rows,
        "hypothesis": verdicts,
        "power_check": power,
        "model": {"target": "sweep", "hunter": cfg.hunter.model},
        "notes": [
            *weak,
            "One cell per dataset and model: a hunter trained for that model on that dataset, "
            "then extraction and the dataset-level tests (suspect: the cell's model). Rows "
            "carry their cell's dataset and model; each cell's own report is under cells/.",
        ],
        "runtime": describe(),
    }
    write_json(out / "report.json", report)
    from mia_ray.reports.memhunter import render_memhunter_report

    render_memhunter_report(report, out / "report.html")
    return report


@pipeline("memhunter", MemHunterJobConfig, help="MemHunter: extract memorized text, test a dataset")
def run(cfg: MemHunterJobConfig, out: Path) -> dict:
    if cfg.sweep.datasets:
        return _sweep(copy.deepcopy(cfg), out)
    return _run(copy.deepcopy(cfg), out)
