"""The leakage survey's model side: output rate and detection rate (Kaneko et al., §3-4).

scan matches → instances per category (seeded sample; the first ``max(shots)/2`` are the
few-shot pool, the next ``eval.instances`` are evaluated) → non-leaked counterparts
(``features/leaks.py``) → per target model, in one Ray actor holding a prompting backend
(local transformers or an OpenAI-compatible API):

- output rate: the share of leaked instances whose mean per-token log-prob after their
  eliciting prompt beats the mean of the 8 refusals' (each refusal scored the same way); the
  words the prompt gives away (its quote of the instance's start, the person it names) are
  context, not scored, so copying them from the prompt earns nothing;
- detection rate: accuracy on leaked instances and their counterparts of self-detection
  (the model answers 1/0 after the few-shot examples), LOSS, zlib and Min-K% (thresholds
  chosen on the few-shot pool, never on the instances scored) and their majority vote;
- the few-shot curve: self-detection's accuracy for each count in ``eval.few_shot_curve``.

Every model's rows are written under ``<out>/eval/<model>/``; a rerun of the same model
(by content: :func:`target_key`), instances and settings reads them back.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mia_ray.config import to_dict
from mia_ray.errors import MiaError
from mia_ray.features.leaks import CATEGORIES
from mia_ray.pipelines.common import fingerprint, log
from mia_ray.pipelines.leakage.config import LeakageJobConfig
from mia_ray.stats.metrics import wilson_interval

METHODS = ("self_detection", "loss", "zlib", "min_k", "majority_vote")
# Bumped when a model's rows mean something else for the same inputs (2: the output rate
# scores only what the eliciting prompt does not give away), so earlier results are redone.
EVAL_FORMAT = 2


def target_key(cfg: LeakageJobConfig, path: str) -> str:
    """What a target's numbers depend on besides the instances: a model loaded here (local,
    or served on loopback) by its weights' content, dtype and the device it runs on (``auto``
    dtype is bfloat16 on a GPU); a remote API's model by its endpoint and name, all that can
    be known of it."""
    from mia_ray.models.identity import model_key

    b = cfg.backend
    if b.kind == "openai" and not b.serve:
        return fingerprint("api", b.base_url.rstrip("/"), path)
    if b.serve:  # the server runs in this process
        from mia_ray.models.hf import pick_device

        return model_key(b, pick_device(b.device) == "cuda", path)
    return model_key(b, cfg.resources.scorer.gpus > 0, path)


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
    leaked, 0 counterpart), ``text``, ``prompt`` (eliciting prompt, leaked rows), ``given``
    (JSON list of the [start, end) spans of ``text`` the prompt gives away)."""
    from mia_ray.features.leaks import counterpart, eliciting_prompt, given_spans

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
            v0 = int(m.start) - a if c == "pii" else None
            rows.append({**base, "label": 1, "text": text,
                         "prompt": eliciting_prompt(text, c, m.type, name, source, v0),
                         "given": json.dumps(given_spans(text, c, name, inside, v0))})  # fmt: skip
            rows.append({**base, "label": 0, "text": clean, "prompt": "", "given": "[]"})
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


def output_rows(ask, leaked: pd.DataFrame) -> pd.DataFrame:
    """Output-rate rows of the leaked instances (rows of :func:`instances`): the mean per-token
    log-prob of what the eliciting prompt does not give away (:func:`scored_pieces`: the
    quoted words and the named person are context, not scored) against the mean of the 8
    refusals' mean log-probs after the same prompt. ``ask``: (context, continuation) pairs
    -> per-token log-probs of each continuation."""
    from mia_ray.features.leaks import REFUSALS, scored_pieces

    pieces = [
        scored_pieces(p, t, [tuple(g) for g in json.loads(given)])
        for p, t, given in zip(leaked["prompt"], leaked["text"], leaked["given"], strict=True)
    ]
    pairs = [pair for own in pieces for pair in own]
    pairs += [(p, r) for p in leaked["prompt"] for r in REFUSALS]
    lps = ask(pairs) if pairs else []
    n, at, leak_mean, scored = len(leaked), 0, [], []
    for own in pieces:
        tokens = [x for lp in lps[at : at + len(own)] for x in lp]
        at += len(own)
        leak_mean.append(float(np.mean(tokens)))
        scored.append(len(tokens))
    refusal = np.array([np.mean(lp) for lp in lps[at:]]).reshape(n, len(REFUSALS)).mean(axis=1)
    return leaked[["category", "item", "role"]].assign(
        leaked_logprob=leak_mean,
        scored_tokens=scored,
        refusal_logprob=refusal,
        emitted=np.array(leak_mean) > refusal,
    )


def _model_rows(cfg: LeakageJobConfig, actor, inst: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Every number of one model: per-instance output and score rows, self-detection answers."""
    import ray

    from mia_ray.features.leaks import REFUSALS, detection_prompt, shot_order

    def ask(pairs: list[tuple[str, str]]) -> list[list[float]]:
        return ray.get(actor.loglikelihood.remote(pairs)) if pairs else []

    e = cfg.eval
    # Output rate: each evaluated leaked instance and the 8 refusals after its eliciting prompt.
    leaked = inst[(inst["label"] == 1) & (inst["role"] == "eval")]
    output = output_rows(ask, leaked)
    log(
        f"eval: output rate: {len(leaked)} leaked instances x (1 + {len(REFUSALS)} refusals) "
        "scored, each without what its prompt gives away"
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


def backend_spec(cfg: LeakageJobConfig, path: str, ident: str, out: Path) -> dict[str, Any]:
    """The BackendActor's spec for one target (``ident``: its :func:`target_key`)."""
    b = cfg.backend
    return {
        **to_dict(b),
        "model": path,
        "torch_threads": cfg.resources.scorer.torch_threads,
        "cache_dir": str(out / "backend-cache") if b.kind == "openai" or b.serve else "",
        # A served model's port changes from run to run; its answers are those of its
        # weights (by content), dtype and device, whatever URL it sat at. A remote API's
        # answers are keyed by its URL, the model name and the request (the backend's own).
        "cache_scope": f"mia-ray-serve:{ident}" if b.serve else "",
    }


def run_eval(cfg: LeakageJobConfig, found: pd.DataFrame, out: Path) -> dict[str, Any]:
    """Instances, then every target in turn; returns ``{"instances", "models": {name: ...}}``,
    or ``{"skipped": why}`` when there are too few instances and ``eval.too_few`` is skip."""
    from mia_ray.features.leaks import DETECTION_HEADER, REFUSALS
    from mia_ray.reports.io import write_parquet
    from mia_ray.stages import folder_stage

    inst = instances(cfg, found)
    if inst.empty and cfg.eval.too_few == "skip":
        pool = max([cfg.eval.shots, *cfg.eval.few_shot_curve]) // 2
        return {
            "skipped": f"the scan found fewer than {pool + 1} instances of any category (the "
            "few-shot pool and one more)"
        }
    if inst.empty:
        raise MiaError(
            "eval: no category has enough instances for the few-shot pool and one more; "
            "lower eval.shots and eval.few_shot_curve, or scan a larger sample"
        )
    write_parquet(out / "eval" / "instances.parquet", inst)
    counts = inst[inst["label"] == 1].groupby(["category", "role"]).size().unstack(fill_value=0)
    log(f"eval: leaked instances per category and role: {counts.to_dict('index')}")
    b = cfg.backend
    models: dict[str, Any] = {}
    for name in cfg.eval.targets:
        # serve: a local model behind `mia-ray serve` on loopback, reached over real HTTP.
        path = resolve_target(cfg, name) if b.loads_model or b.serve else name
        safe = name.strip("@").replace(":", "-").replace("/", "_")
        ident = target_key(cfg, path)
        fp = fingerprint(
            EVAL_FORMAT, ident, to_dict(cfg.eval), to_dict(b), list(inst["text"]),
            list(inst["prompt"]), list(inst["given"]), REFUSALS, DETECTION_HEADER,
        )  # fmt: skip
        _, got = folder_stage(
            out, f"eval/{safe}", fp,
            lambda d, name=name, path=path, ident=ident: _evaluate(cfg, name, path, ident, inst, d, out),
            reused=f"eval: {name}: reusing the results of an earlier run",
        )  # fmt: skip
        models[name] = got["summary"]
    counts = inst[inst["label"] == 1].groupby("category").size().to_dict()
    return {"instances": {k: int(v) for k, v in counts.items()}, "models": models}


def _evaluate(cfg: LeakageJobConfig, name: str, path: str, ident: str, inst, d: Path, out: Path):
    """One model's answers (parquet per kind in ``d``) and their summary (for the marker)."""
    import ray

    from mia_ray import storage
    from mia_ray.actors.backend import BackendActor
    from mia_ray.reports.io import write_parquet
    from mia_ray.runtime import ray_options

    b, res = cfg.backend, cfg.resources
    spec = backend_spec(cfg, path, ident, out)
    stop = None
    if b.serve:
        from mia_ray.serve import serve_in_thread

        spec["base_url"], stop = serve_in_thread(path, device=b.device, dtype=b.dtype)
        spec["kind"] = "openai"
    log(f"eval: {name} ({path}) through the {spec['kind']} backend")
    if spec["kind"] != "openai":
        # The model loads in the actor, wherever Ray puts it: a driver folder goes by storage.
        spec["model"] = storage.stage(path)
        opts = ray_options(res, res.scorer.cpus, res.scorer.gpus)
    else:
        # An API client holds no model, but its answer cache is in --out and a served
        # model listens on the driver's loopback: it runs on the driver's node.
        opts = {"num_cpus": res.scorer.cpus, "num_gpus": 0, **storage.node_affinity()}
    actor = ray.remote(BackendActor).options(**opts).remote(spec)
    try:
        rows = _model_rows(cfg, actor, inst)
    finally:
        ray.kill(actor)
        if stop is not None:
            stop()
    for k, frame in rows.items():
        write_parquet(d / f"{k}.parquet", frame)
    return {"summary": {"model": path, **summarize(cfg, rows)}}
