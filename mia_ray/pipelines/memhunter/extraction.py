"""Extraction: MemHunter's k sampled prompts per pair, timed; Manual, MiniPrompt (GCG) at the same wall clock, and GCG as a plug-in; each a stage."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from mia_ray.actors.target import TargetPool
from mia_ray.pipelines.common import (
    fingerprint,
    log,
)
from mia_ray.pipelines.memhunter.keys import extraction_key, pairs_key


def extract_all(cfg, hunter, target: TargetPool, pairs: pd.DataFrame, out: Path, adapter: str):
    """For each budget k, the k trials of every pair of a split run side by side (MemHunter
    extracts with inference alone, its k prompts in parallel): trial j samples pair p's
    prompt from seed (p, j), so a budget's prompts are the first k of the largest one's, and
    the batch's wall clock is that budget's cost. Rows: split, budget, pair_id, trial, prompt,
    out_ids, mu, loss, round_s. Cached per split."""
    from mia_ray.stages import frame_stage

    ks = sorted(set(cfg.extraction.trials))
    fp = extraction_key(cfg, adapter)
    frames = []
    for split in cfg.extraction.splits:
        part = pairs[pairs["split"] == split]
        if part.empty:
            continue
        key = fingerprint(fp, pairs_key(part))
        frames.append(
            frame_stage(
                out,
                f"extraction/{split}",
                key,
                lambda s=split, p=part: extract_split(cfg, hunter, target, s, p, ks),
            )
        )
    return pd.concat(frames, ignore_index=True)


def extract_split(
    cfg, hunter, target: TargetPool, split: str, part: pd.DataFrame, ks
) -> pd.DataFrame:
    """One split's extraction rows (see :func:`extract_all`)."""
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


def cached_rows(out: Path, name: str, fp: str, compute) -> tuple[list[dict], pd.DataFrame]:
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


def memhunter_rows(runs: pd.DataFrame) -> list[dict]:
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


def manual_rows(cfg, target: TargetPool, pairs: pd.DataFrame) -> tuple[list[dict], pd.DataFrame]:
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


def random_prompt(allowed: np.ndarray, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).choice(allowed, n)]


def miniprompt_rows(
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
                "prompt_ids": random_prompt(
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


def plugin_rows(cfg, target: TargetPool, pairs, trials) -> tuple[list[dict], pd.DataFrame]:
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
            random_prompt(allowed, e.gcg_prompt_tokens, pair_seed(e.seed, "gcg", p))
            for p in test["pair_id"]
        ],
    }
    rows, per_pair = [], []
    for method, inits in starts.items():
        jobs = []
        for pid, x, y, init in zip(
            test["pair_id"], test["x_ids"], test["y_ids"], inits, strict=True
        ):
            init = list(init) or random_prompt(allowed, 1, pair_seed(e.seed, "pad", pid))
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


def lcss_by_method(outputs: list[pd.DataFrame], split: str = "test") -> dict[str, list[float]]:
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


def example_rows(trials: pd.DataFrame, pairs: pd.DataFrame, outputs, tok, n: int = 5) -> list[dict]:
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
