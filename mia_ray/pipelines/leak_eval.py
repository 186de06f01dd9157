"""The leakage survey's model side: output rate and detection rate (Kaneko et al., §3-4).

scan matches → instances per category (seeded sample; the first ``max(shots)/2`` are the
few-shot pool, the next ``eval.instances`` are evaluated) → non-leaked counterparts
(``features/leaks.py``) → per target model, in one Ray actor holding a prompting backend
(local transformers or an OpenAI-compatible API):

- output rate: the share of leaked instances whose mean per-token log-prob after their
  eliciting prompt beats the mean of the 8 refusals' (each refusal scored the same way);
- detection rate: accuracy on leaked instances and their counterparts of self-detection
  (the model answers 1/0 after the few-shot examples), LOSS, zlib and Min-K% (thresholds
  chosen on the few-shot pool, never on the instances scored) and their majority vote;
- the few-shot curve: self-detection's accuracy for each count in ``eval.few_shot_curve``.

Every model's rows are written under ``<out>/eval/<model>/``; a rerun of the same model,
instances and settings reads them back.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.config import LeakageJobConfig, to_dict
from mia_ray.errors import MiaError
from mia_ray.pipelines.common import fingerprint, log
from mia_ray.pipelines.leakage import CATEGORIES

METHODS = ("self_detection", "loss", "zlib", "min_k", "majority_vote")


def resolve_target(cfg: LeakageJobConfig, name: str) -> str:
    """``@world:<model>`` → the demo world's model folder (built when missing); else as is."""
    if not name.startswith("@world:"):
        if name.startswith("@"):
            raise MiaError(
                f"eval.targets: unknown model {name!r} (a path, a hub name or @world:<model>)"
            )
        return name
    from mia_ray.demo.world import TARGETS, ensure_smollm2_base, ensure_world, model_dir

    model = name[len("@world:") :]
    if model == "smollm2-base":
        return str(ensure_smollm2_base())
    if model in TARGETS:
        return ensure_world(cfg.world, [model])["targets"][model]["model"]
    path = model_dir(cfg.world.resolved_root(), model)
    if not (path / "config.json").is_file():
        raise MiaError(f"eval.targets: {name}: the demo world has no model {path}")
    return str(path)


# --------------------------------------------------------------------- instances


def instances(cfg: LeakageJobConfig, found: pd.DataFrame) -> pd.DataFrame:
    """Per category, the leaked instances and their counterparts: rows of ``category``,
    ``role`` (``shot`` or ``eval``), ``item`` (index within the category), ``label`` (1
    leaked, 0 counterpart), ``text``, ``prompt`` (eliciting prompt, leaked rows)."""
    from mia_ray.features.leaks import counterpart, eliciting_prompt

    e = cfg.eval
    pool = max([e.shots, *e.few_shot_curve]) // 2
    lexicon = None
    rows: list[dict[str, Any]] = []
    names = found[found["type"] == "person_name"]
    for c in CATEGORIES:
        f = found[(found["category"] == c) & (found["type"] != "person_name")]
        # One instance per record: a PII sentence, or a copied text (a benchmark item's
        # passage and question can both match; the item is one instance, at its first match).
        f = f.assign(unit=f["instance_start"] if c == "pii" else f["ref"].str.split("#").str[0])
        f = f.sort_values(["shard", "doc_id", "instance_start"])
        f = f.drop_duplicates(["shard", "doc_id", "unit"])
        picked = list(f.itertuples(index=False))
        random.Random(f"leak-eval-{c}-{e.seed}").shuffle(picked)
        if len(picked) < pool + 1:
            log(f"eval: {c}: {len(picked)} instances found; need {pool + 1} (few-shot pool + 1)")
            continue
        picked = picked[: pool + e.instances]
        if c != "pii" and lexicon is None:
            from mia_ray.features.neighbors import Lexicon

            lexicon = Lexicon.from_minilm()
        for i, m in enumerate(picked):
            text, a = m.instance, int(m.instance_start)
            doc_names = names[(names["shard"] == m.shard) & (names["doc_id"] == m.doc_id)]
            inside = [
                (int(s) - a, int(t) - a)
                for s, t in zip(doc_names["start"], doc_names["end"], strict=True)
                if a <= s and t <= a + len(text)
            ]
            name = text[inside[0][0] : inside[0][1]] if inside else ""
            source = str(m.ref).split("#")[0]
            key = (c, m.shard, m.doc_id, a)
            clean = counterpart(
                text, c, key,
                value_span=(int(m.start) - a, int(m.end) - a) if c == "pii" else None,
                names=inside, lexicon=lexicon, rate=e.paraphrase_rate,
            )  # fmt: skip
            base = {"category": c, "type": m.type, "item": i, "shard": m.shard,
                    "doc_id": m.doc_id, "role": "shot" if i < pool else "eval"}  # fmt: skip
            rows.append({**base, "label": 1, "text": text,
                         "prompt": eliciting_prompt(text, c, m.type, name, source)})  # fmt: skip
            rows.append({**base, "label": 0, "text": clean, "prompt": ""})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------- scoring


def _score_methods(texts: list[str], logprobs: list[list[float]], ratio: float) -> pd.DataFrame:
    from mia_ray.features.attacks import SnippetStats, loss, min_k, zlib_ratio

    out = []
    for t, lp in zip(texts, logprobs, strict=True):
        z = np.zeros(len(lp))
        s = SnippetStats(t, np.asarray(lp), z, z)
        out.append({"loss": loss(s), "zlib": zlib_ratio(s), "min_k": min_k(s, ratio)})
    return pd.DataFrame(out)


def _model_rows(cfg: LeakageJobConfig, actor, inst: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Every number of one model: per-instance output and score rows, self-detection answers."""
    import ray

    from mia_ray.features.leaks import REFUSALS, detection_prompt, shot_order

    def ask(pairs: list[tuple[str, str]]) -> list[list[float]]:
        return ray.get(actor.loglikelihood.remote(pairs)) if pairs else []

    e = cfg.eval
    # Output rate: each evaluated leaked instance and the 8 refusals after its eliciting prompt.
    leaked = inst[(inst["label"] == 1) & (inst["role"] == "eval")]
    pairs = [(p, t) for p, t in zip(leaked["prompt"], leaked["text"], strict=True)]
    pairs += [(p, r) for p in leaked["prompt"] for r in REFUSALS]
    lps = ask(pairs)
    log(
        f"eval: output rate: {len(leaked)} leaked instances x (1 + {len(REFUSALS)} refusals) scored"
    )
    n = len(leaked)
    leak_mean = np.array([np.mean(lp) for lp in lps[:n]])
    refusal = np.array([np.mean(lp) for lp in lps[n:]]).reshape(n, len(REFUSALS))
    output = leaked[["category", "item", "role"]].assign(
        leaked_logprob=leak_mean,
        refusal_logprob=refusal.mean(axis=1),
        emitted=leak_mean > refusal.mean(axis=1),
    )
    # LOSS, zlib, Min-K%: the instance alone, scored from the start of the text.
    lps = ask([("", t) for t in inst["text"]])
    log(f"eval: LOSS, zlib, Min-K%: {len(inst)} instances scored")
    scores = pd.concat(
        [inst[["category", "item", "role", "label"]].reset_index(drop=True),
         _score_methods(list(inst["text"]), lps, e.min_k_ratio)], axis=1,
    )  # fmt: skip
    # Self-detection, each few-shot count: one call per category and count, so every prompt
    # of the call shares the examples' block (the local backend runs it once).
    answers = []
    for c, part in inst.groupby("category", sort=False):
        shot_rows = part[part["role"] == "shot"].sort_values("item")
        pool_leaked = list(shot_rows[shot_rows["label"] == 1]["text"])
        pool_clean = list(shot_rows[shot_rows["label"] == 0]["text"])
        test = part[part["role"] == "eval"]
        for k in sorted(set([e.shots, *e.few_shot_curve])):
            shots = shot_order(pool_leaked, pool_clean, k, key=c)
            prompts = [detection_prompt(shots, t) for t in test["text"]]
            lps = ask([(p, o) for p in prompts for o in (" 1", " 0")])
            lp = np.array([sum(x) for x in lps]).reshape(len(prompts), 2)
            log(f"eval: self-detection [{c}], {k} examples: {len(prompts)} instances asked")
            answers.append(
                test[["category", "item", "label"]].assign(
                    shots=k,
                    logprob_1=lp[:, 0],
                    logprob_0=lp[:, 1],
                    answer=(lp[:, 0] > lp[:, 1]).astype(int),
                )
            )
    return {
        "output": output,
        "scores": scores,
        "self_detection": pd.concat(answers, ignore_index=True),
    }


def _rate(k: int, n: int, ci: float) -> dict[str, Any]:
    from mia_ray.stats.metrics import wilson_interval

    return {"rate": k / n if n else None, "ci": list(wilson_interval(k, n, ci)), "n": n, "k": k}


def summarize(cfg: LeakageJobConfig, rows: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """output_rate, detection_rate (per category and method) and few_shot_curve of one model."""
    from mia_ray.features.leaks import best_threshold, majority_vote
    from mia_ray.stats.metrics import roc_auc

    e = cfg.eval
    out = rows["output"]
    output_rate = {}
    for c, part in out.groupby("category", sort=False):
        output_rate[c] = _rate(int(part["emitted"].sum()), len(part), e.ci)
    sd = rows["self_detection"]
    scores = rows["scores"]
    detection: dict[str, Any] = {}
    thresholds: dict[str, Any] = {}
    for c, part in scores.groupby("category", sort=False):
        shots, test = part[part["role"] == "shot"], part[part["role"] == "eval"]
        test = test.sort_values(["item", "label"]).reset_index(drop=True)
        mine = sd[(sd["category"] == c) & (sd["shots"] == e.shots)].sort_values(["item", "label"])
        votes = {"self_detection": mine["answer"].to_numpy()}
        thresholds[c] = {}
        for m in ("loss", "zlib", "min_k"):
            t = best_threshold(shots[m].to_numpy(), shots["label"].to_numpy())
            thresholds[c][m] = t
            votes[m] = (test[m].to_numpy() > t).astype(int)
        votes["majority_vote"] = majority_vote(np.column_stack([votes[m] for m in METHODS[:4]]))
        y = test["label"].to_numpy()
        detection[c] = {m: _rate(int((votes[m] == y).sum()), len(y), e.ci) for m in METHODS}
        for m in ("loss", "zlib", "min_k"):
            detection[c][m]["auc"] = roc_auc(test[m], y) if len(set(y)) == 2 else None
            detection[c][m]["threshold"] = thresholds[c][m]
    curve = []
    for (c, k), part in sd.groupby(["category", "shots"], sort=False):
        r = _rate(int((part["answer"] == part["label"]).sum()), len(part), e.ci)
        curve.append({"category": c, "shots": int(k), **r})
    return {"output_rate": output_rate, "detection_rate": detection, "few_shot_curve": curve}


def run_eval(cfg: LeakageJobConfig, found: pd.DataFrame, out: Path) -> dict[str, Any]:
    """Instances, then every target in turn; returns ``{"instances", "models": {name: ...}}``."""
    import ray

    from mia_ray.actors.backend import BackendActor
    from mia_ray.reports.io import read_json, write_json, write_parquet

    inst = instances(cfg, found)
    if inst.empty:
        raise MiaError(
            "eval: no category has enough instances for the few-shot pool and one more; "
            "lower eval.shots and eval.few_shot_curve, or scan a larger sample"
        )
    write_parquet(out / "eval" / "instances.parquet", inst)
    counts = inst[inst["label"] == 1].groupby(["category", "role"]).size().unstack(fill_value=0)
    log(f"eval: leaked instances per category and role: {counts.to_dict('index')}")
    b, res = cfg.backend, cfg.resources
    models: dict[str, Any] = {}
    for name in cfg.eval.targets:
        # serve: a local model behind `mia-ray serve` on loopback, reached over real HTTP.
        path = resolve_target(cfg, name) if b.kind == "local" or b.serve else name
        safe = name.strip("@").replace(":", "-").replace("/", "_")
        d = out / "eval" / safe
        fp = fingerprint(
            path, to_dict(cfg.eval), to_dict(b), list(inst["text"]), list(inst["prompt"])
        )
        meta = d / "summary.json"
        if meta.is_file() and read_json(meta).get("fingerprint") == fp:
            log(f"eval: {name}: reusing the results of an earlier run")
            models[name] = read_json(meta)["summary"]
            continue
        spec = {**to_dict(b), "model": path, "torch_threads": res.torch_threads,
                "cache_dir": str(out / "backend-cache") if b.kind == "openai" or b.serve else "",
                "cache_scope": f"mia-ray-serve:{path}" if b.serve else ""}  # fmt: skip
        stop = None
        if b.serve:
            from mia_ray.serve import serve_in_thread

            spec["base_url"], stop = serve_in_thread(path, device=b.device)
            spec["kind"] = "openai"
        log(f"eval: {name} ({path}) through the {spec['kind']} backend")
        actor = (
            ray.remote(BackendActor)
            .options(num_cpus=res.cpus_per_actor, num_gpus=res.gpus_per_actor)
            .remote(spec)
        )
        try:
            rows = _model_rows(cfg, actor, inst)
        finally:
            ray.kill(actor)
            if stop is not None:
                stop()
        for k, frame in rows.items():
            write_parquet(d / f"{k}.parquet", frame)
        summary = {"model": path, **summarize(cfg, rows)}
        write_json(meta, {"fingerprint": fp, "summary": summary})
        models[name] = summary
    counts = inst[inst["label"] == 1].groupby("category").size().to_dict()
    return {"instances": {k: int(v) for k, v in counts.items()}, "models": models}
