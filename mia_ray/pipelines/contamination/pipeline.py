"""`mia-ray contamination`: the benchmark's shards in published order against shuffles of the
same examples, scored by the model on the shared Scorer pool."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from mia_ray.errors import MiaError
from mia_ray.pipelines.common import check_target_early, log, world_copy
from mia_ray.pipelines.contamination.config import ContaminationJobConfig
from mia_ray.registry import pipeline
from mia_ray.runtime import describe

PREMISE = (
    "the published order is exchangeable with the shuffles for a model that never saw the "
    "benchmark: it holds when the order carries no pattern a model would prefer anyway "
    "(a benchmark sorted by length, topic or difficulty breaks it)"
)


def read_in_order(path: str, fields: list[str]) -> list[str]:
    """The benchmark's examples in file order: a .jsonl's records (``fields`` joined by a
    newline) or a text file's non-empty lines."""
    p = Path(path).expanduser()
    lines = p.read_text(encoding="utf-8").splitlines()
    if p.suffix != ".jsonl":
        return [x for x in lines if x.strip()]
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise MiaError(f"{p}: line {i} is not JSON") from None
        missing = [f for f in fields if f not in rec]
        if missing:
            raise MiaError(f"{p}: line {i} has no field {missing[0]!r} (contamination.fields)")
        out.append("\n".join(str(rec[f]) for f in fields))
    return out


def shards_of(examples: list[str], size: int, tok, limit: int, sep: str) -> list[list[int]]:
    """Consecutive example indices per shard: ``size`` each, or (``size`` 0) as many as fit
    ``limit`` tokens together; a last shard of one example is dropped (it has no order)."""
    if size:
        out = [list(range(i, min(i + size, len(examples)))) for i in range(0, len(examples), size)]
    else:
        n = [len(tok(e + sep, add_special_tokens=False)["input_ids"]) for e in examples]
        out, cur, used = [], [], 0
        for i, k in enumerate(n):
            if cur and used + k > limit:
                out.append(cur)
                cur, used = [], 0
            cur.append(i)
            used += k
        out.append(cur)
    return [s for s in out if len(s) >= 2]


def read_shards(cfg: ContaminationJobConfig) -> tuple[list[str], list[list[int]]]:
    """The benchmark's examples in order and its shards, sized to fit the target's window (and
    the reference's: both score the same texts)."""
    from mia_ray.models.hf import load_tokenizer
    from mia_ray.models.spans import context_limit

    c, m = cfg.contamination, cfg.model
    examples = read_in_order(c.benchmark, c.fields)
    tok = load_tokenizer(m.name_or_path, m.revision, m.trust_remote_code, m.gguf_file)
    limit = context_limit(m.name_or_path, m.max_length, m.revision, m.trust_remote_code,
                          m.gguf_file)  # fmt: skip
    if m.reference:
        limit = min(limit, context_limit(m.reference, m.max_length, "", m.trust_remote_code))
    shards = shards_of(examples, c.shard_size, tok, limit, c.separator)
    if not shards:
        raise MiaError(f"{c.benchmark}: {len(examples)} example(s) make no shard of 2 or more")
    return examples, shards


def orderings(shards: list[list[int]], permutations: int, seed: int) -> list[list[list[int]]]:
    """Per shard: the published order first, then ``permutations`` uniform shuffles of it
    (seeded per shard, drawn with replacement: a shuffle may repeat the published order,
    which the rank test counts against the benchmark, as it must)."""
    out = []
    for s, idx in enumerate(shards):
        rng = np.random.default_rng([seed, s])
        out.append([list(idx)] + [list(rng.permutation(idx)) for _ in range(permutations)])
    return out


def shard_loglik(cfg: ContaminationJobConfig, examples: list[str], shards, out: Path,
                 reference: bool = False):  # fmt: skip
    """(shards, 1 + permutations) log-likelihoods under the model (``reference``: under
    ``model.reference``): per shard its published order first, then its shuffles (the Scorer
    pool's plain pass, a resumable stage)."""
    from mia_ray.scoring.pools import score_pool

    c, m = cfg.contamination, cfg.model
    name, prefix = (m.reference, "ref_") if reference else (m.name_or_path, "")
    orders = orderings(shards, c.permutations, c.seed)
    rows = pd.DataFrame(
        [
            {"snippet_id": f"{s:05d}/{j:05d}", "text": c.separator.join(examples[i] for i in o)}
            for s, per in enumerate(orders)
            for j, o in enumerate(per)
        ]  # fmt: skip
    )
    log(f"{len(examples)} examples in {len(shards)} shards, each against {c.permutations} "
        f"shuffles: {len(rows)} texts{' under the reference model' if reference else ''}")  # fmt: skip
    scored = score_pool(rows, m, cfg.resources, name, prefix, False, False,
                        out / "rows" / f"{prefix}orders", what="orderings")  # fmt: skip
    scored = scored.set_index("snippet_id").loc[rows["snippet_id"]]
    # Log-likelihood of every scored token: orders of the same examples may tokenize to a
    # slightly different count, so the total, not the mean.
    ll = -scored[f"{prefix}loss"] * (scored[f"{prefix}n_tokens"] - 1)
    return ll.to_numpy().reshape(len(shards), -1)


def order_test(ll: np.ndarray, c) -> tuple[np.ndarray, float, float]:
    """Per-shard exact rank p-values of the published order and their Fisher combination:
    (p per shard, statistic, p)."""
    from mia_ray.stats.ranks import combined_pvalue, rank_pvalue

    p_shard = np.array([rank_pvalue(r[0], r[1:]) for r in ll])
    stat, p = combined_pvalue(p_shard, c.permutations + 1, c.draws, c.seed)
    return p_shard, stat, p


def verdict_text(model: str, c, p: float, n_shards: int, p_ref: float | None = None,
                 reference: str = "") -> str:  # fmt: skip
    """The verdict; with a reference model's p-value, the premise is checked first: a model
    that never saw the benchmark preferring its published order too means the order itself
    is predictable, and then the test cannot speak."""
    where = (f"{Path(c.benchmark).name} in its published order: p = {p:.2g} over {n_shards} "
             f"shards (each ranked among {c.permutations} shuffles, Fisher's combination)")  # fmt: skip
    if p_ref is not None and p_ref <= 0.05:
        return (
            f"No verdict on {model}: the reference model {reference}, which never saw the "
            f"benchmark, prefers its published order too (p = {p_ref:.2g}), so the order "
            f"carries a pattern any model prefers and the premise fails ({model}: {where})."
        )
    checked = (
        f" Premise checked: the reference model {reference} does not prefer the published "
        f"order (p = {p_ref:.2g})." if p_ref is not None else
        " Premise not checked: give model.reference (a model that never saw the benchmark)."
    )  # fmt: skip
    return (
        f"{'Evidence' if p <= 0.05 else 'No evidence'} that {model} trained on {where}. "
        f"Exact if {PREMISE}.{checked}"
    )


def resolve(cfg: ContaminationJobConfig) -> ContaminationJobConfig:
    """The demo world's model, its reference (which never saw the benchmark) and its
    published benchmark filled in."""
    cfg, info = world_copy(cfg, "benchmarks", "benchmark")
    if info:
        cfg.contamination.benchmark = cfg.contamination.benchmark or info["benchmarks"]["published"]
        cfg.model.name_or_path = cfg.model.name_or_path or info["model"]
        cfg.model.reference = cfg.model.reference or info["reference"]
    return cfg


@pipeline(
    "contamination",
    ContaminationJobConfig,
    help="the order test: did the model train on this benchmark as published?",
    flags=(
        ("benchmark", "contamination.benchmark", "the benchmark file, in its published order"),
        ("model", "model.name_or_path", "the model to test: a hub name or a local folder"),
        (
            "reference",
            "model.reference",
            "a model that never saw the benchmark: checks the premise",
        ),
    ),
    resolve=resolve,
)
def run(cfg: ContaminationJobConfig, out: Path) -> dict:
    from mia_ray.reports.io import write_json, write_parquet
    from mia_ray.reports.marks import render_contamination_report

    t0 = time.time()
    c, m = cfg.contamination, cfg.model
    check_target_early(m)
    examples, shards = read_shards(cfg)
    ll = shard_loglik(cfg, examples, shards, out)
    p_shard, stat, p = order_test(ll, c)
    ref = order_test(shard_loglik(cfg, examples, shards, out, True), c) if m.reference else None
    p_ref = ref[2] if ref else None
    premise_holds = p_ref is None or p_ref > 0.05
    reject = bool(p <= 0.05 and premise_holds)
    text = verdict_text(m.name_or_path, c, p, len(shards), p_ref, m.reference)
    log(text)
    table = pd.DataFrame({"shard": range(len(shards)), "examples": [len(s) for s in shards],
                          "published_ll": ll[:, 0], "shuffled_ll_mean": ll[:, 1:].mean(axis=1),
                          "p_value": p_shard})  # fmt: skip
    if ref:
        table["reference_p_value"] = ref[0]
    write_parquet(out / "shards.parquet", table)
    report = {
        "pipeline": "contamination",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": m.name_or_path,
        "benchmark": c.benchmark,
        "n_examples": len(examples),
        "premise": {
            "statement": "M never trained on the benchmark in its published order (H0)",
            "kind": "exchangeability of the published order",
            "proof": PREMISE,
            "checked_by": m.reference or None,
            "reference_p_value": p_ref,
            "holds": premise_holds if p_ref is not None else None,
        },  # fmt: skip
        "test": {
            "statistic": "Fisher: -2 sum log p over shards",
            "value": stat,
            "p_value": p,
            "reject": bool(reject),
            "shards": len(shards),
            "permutations": c.permutations,
            "draws": c.draws,
            "smallest_p_value": 1 / (c.draws + 1),
            "published_preferred": int((ll[:, 0] > ll[:, 1:].mean(axis=1)).sum()),
        },  # fmt: skip
        "shards": table.to_dict(orient="records"),
        "verdict": {"text": text, "contaminated": bool(reject) if premise_holds else None},
        "runtime": describe(),
        "timings": {"total_s": round(time.time() - t0, 2)},
    }
    write_json(out / "report.json", report)
    render_contamination_report(report, out / "report.html")
    return report
