"""The audit's premise checks at token level: real documents, scored by real language models,
with text shifts users bring (``mia_ray.demo.shifts``), under H0 (no side trained on more
than the other).

    python bench/validity_tokens.py --worlds 200 --permutations 99 --out VALIDITY.md

A pool of English Wikipedia leads (none of the demo world's documents) is scored once per
model and per shift, each text through the project's Scorer (the token log-probabilities and
vocabulary moments, the lowercased text, and the text after ReCaLL's prefix of 4 pool leads
kept out of every world): ``--models`` (default the demo world's SmolLM2-135M base and its
``tiny``) and the reference ``tiny-ref``. Every world then draws 30 suspected and 40 unseen
leads at random from the pool; the suspected ones are given the scenario's shift, and the
audit's own functions run on the scores: the dataset test (weights >= 0, the audit's six
default features), the blind check as it was (word 1-2 grams alone), the blind check now
(words, characters, surface; one min-p test), and the reference check (the dataset test on
tiny-ref's scores). Under H0 every shift is a difference in kind, not training; the rate of
each claim is measured:

- *before*: the test rejects and the word check does not: "Evidence that M trained";
- *text checks*: the test rejects and the new blind check does not: what the audit says
  without a reference ("training signal, premise partly untested");
- *with a reference*: the test rejects and neither check rejects: "Evidence that M trained".

The section between the markers in ``--out`` is replaced; the rest of the file is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mia_ray.demo.shifts import SHIFTS, shifted  # noqa: E402

BEGIN, END = "<!-- token-level:begin -->", "<!-- token-level:end -->"
ATTACKS = ("loss", "zlib", "min_k", "min_k_plus_plus", "lowercase", "recall")
MIN_K_RATIOS = (0.05, 0.1, 0.2, 0.3, 0.5)
N_SUS, N_UNS, PREFIX_SHOTS = 30, 40, 4
MAX_WORDS = 100
ALPHA, ROUNDS = 0.05, 5
SCENARIOS = ("none", *SHIFTS)


def pool_texts(n: int, world_root: Path | None) -> tuple[list[str], list[str]]:
    """``n`` leads of 60-150 words (first MAX_WORDS words), none of the demo world's, and the
    ReCaLL prefix docs (the first PREFIX_SHOTS of a seeded order, kept out of every world)."""
    from mia_ray.demo.corpora import load_web

    taken: set[str] = set()
    if world_root and (world_root / "corpus" / "split.json").exists():
        taken = set(json.loads((world_root / "corpus" / "split.json").read_text()))
    docs = [d for d in load_web(n + PREFIX_SHOTS + len(taken), 60, 150, "validity-tokens")
            if d.id not in taken]  # fmt: skip
    order = np.random.default_rng(7).permutation(len(docs))
    texts = [" ".join(docs[i].text.split()[:MAX_WORDS]) for i in order]
    return texts[PREFIX_SHOTS : PREFIX_SHOTS + n], texts[:PREFIX_SHOTS]


def score_variant(model: str, texts: list[str], prefix: str, max_length: int) -> pd.DataFrame:
    """The Scorer's columns for ``texts``: token stats, lower_loss, recall_loss."""
    from mia_ray.actors.scorer import Scorer

    batch = pd.DataFrame({"snippet_id": [str(i) for i in range(len(texts))], "text": texts})
    plain = Scorer(model, max_length=max_length, lowercase=True, token_stats=True)
    rows = pd.concat([plain._score(batch.iloc[i : i + 8]) for i in range(0, len(batch), 8)])
    del plain
    rec = Scorer(model, max_length=max_length, lowercase=False, token_stats=False, context=prefix)
    got = pd.concat([rec._score(batch.iloc[i : i + 8]) for i in range(0, len(batch), 8)])
    rows["recall_loss"] = got["loss"].to_numpy()
    rows["text"] = texts
    return rows.reset_index(drop=True)


def features(rows: pd.DataFrame) -> np.ndarray:
    from mia_ray.features.attacks import score_table, stats_from_columns

    stats = stats_from_columns(rows["text"], rows["token_logprobs"], rows["mu"], rows["sigma"],
                               rows["lower_loss"], None,
                               {"recall_loss": rows["recall_loss"].tolist()})  # fmt: skip
    table = score_table(stats, ATTACKS, MIN_K_RATIOS, MIN_K_RATIOS[0])
    cols = [c for c in table if "@" in c or c in ("loss", "zlib", "lowercase", "recall")]
    return np.column_stack([table[c] for c in cols])


def scored_pool(models: dict[str, str], texts, prefix_docs, cache: Path, max_length: int):
    """{model: {scenario: feature matrix (n, d)}} and {scenario: texts}; cached per model and
    scenario under ``cache`` (keyed by the texts, the model path and max_length)."""
    prefix = "".join(t + "\n\n" for t in prefix_docs)
    variants = {s: texts if s == "none" else [shifted(s, t, str(i)) for i, t in
                                             enumerate(texts)] for s in SCENARIOS}  # fmt: skip
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, path in models.items():
        out[name] = {}
        for s, tx in variants.items():
            key = hashlib.sha256(json.dumps([path, max_length, prefix, tx]).encode()).hexdigest()
            f = cache / f"{name}-{s}-{key[:16]}.parquet"
            if not f.exists():
                t0 = time.perf_counter()
                rows = score_variant(path, tx, prefix, max_length)
                cache.mkdir(parents=True, exist_ok=True)
                rows.to_parquet(f)
                print(f"  scored {name} / {s}: {len(tx)} texts in "
                      f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
            out[name][s] = features(pd.read_parquet(f))
    return out, variants


def reference_check(d, permutations: int, seed: int) -> bool:
    """The audit's reference check (``detectors.premise.reference_check``) rejects."""
    from mia_ray.detectors.premise import reference_check as check

    return check(d, permutations, seed, ALPHA)["reject"]


def one_world(i: int, seed: int, n_pool: int, scenario: str, pool, variants, models, ref: str,
              permutations: int) -> dict:  # fmt: skip
    from mia_ray.detectors.dataset_inference import (
        Design,
        file_matrix,
        permutation_test,
        text_matrix,
    )
    from mia_ray.detectors.premise import blind_check

    rng = np.random.default_rng([seed, i])
    pick = rng.permutation(n_pool)[: N_SUS + N_UNS]
    side = np.array([1] * N_SUS + [0] * N_UNS)
    files = [f"f{j:03d}" for j in range(len(pick))]
    texts = [variants[scenario if s else "none"][k] for k, s in zip(pick, side, strict=True)]
    seeds = list(range(i, i + ROUNDS))

    def design(F, nonneg):
        return Design(F, np.arange(len(files)), side, seeds, nonneg=nonneg)

    def rows(model):
        return np.array([pool[model][scenario if s else "none"][k]
                         for k, s in zip(pick, side, strict=True)])  # fmt: skip

    t0 = time.perf_counter()
    base = design(np.zeros((len(files), 1)), False)
    words = permutation_test(design(text_matrix(files, texts, files), False), permutations, i,
                             ALPHA)  # fmt: skip
    blind = blind_check(base, files, texts, files, permutations, i, ALPHA)
    out = {"words": words["reject"], "blind": blind["reject"],
           **{f"blind_{k}": v["reject"] for k, v in blind["parts"].items()}}  # fmt: skip
    F_ref = file_matrix(files, rows(ref), files)
    out["reference"] = reference_check(design(F_ref, True), permutations, i)
    R = rows(ref)
    for m in models:
        X = rows(m)
        F = file_matrix(files, X, files)
        out[f"test:{m}"] = permutation_test(design(F, True), permutations, i, ALPHA)["reject"]
        # With a reference the audit's test also reads `ref` (LOSS minus the reference's).
        with_ref = np.column_stack([X, X[:, 0] - R[:, 0]])
        out[f"test_ref:{m}"] = permutation_test(design(file_matrix(files, with_ref, files), True),
                                                permutations, i, ALPHA)["reject"]  # fmt: skip
        F_cal = file_matrix(files, X - R, files)
        out[f"calibrated:{m}"] = permutation_test(design(F_cal, True), permutations, i,
                                                  ALPHA)["reject"]  # fmt: skip
    out["seconds"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------- feature worlds with a reference

REF_AGREEMENT = 0.8  # the reference's snippet features: 0.8 x the target's + 0.6 x fresh noise
FEATURE_SCENARIOS = {
    "easier": "VALIDITY.md's `easier`: suspected files +0.6 sd on every feature, their texts 3 % "
    "words of their own",
    "against_0.3": "matched, suspected files -0.6 sd on five features and +0.3 sd on the sixth "
    "(the lowercase mechanism: casing moves it alone)",
    "against_0.6": "the same with +0.6 sd on the sixth",
    "trained": "H1, for power: matched, 15 of the 30 suspected files trained on (+0.6 sd on "
    "every feature of the target; the reference reads their texts, not the training)",
}
TRAINED_SHIFT, TRAINED_MEMBERS = 0.6, 15  # bench/validity.py's POWER_MEMBERS, its larger shift


def feature_world(name: str, i: int, seed: int):
    """An abstract-feature world of ``mia_ray.validity.worlds`` and a reference's
    features for it: the reference reads the same texts, so it shares their differences."""
    from mia_ray.validity import worlds as V

    rng = V.world_rng(name, seed, i)
    base = None
    if name == "easier":
        w = V.make_world("easier", rng)
    elif name == "trained":
        w = V.make_world("matched", rng, TRAINED_SHIFT, TRAINED_MEMBERS)
        sd_mean = math.sqrt(V.FILE_SD**2 + V.NOISE_SD**2 / 8)
        trained = np.isin(w.unit_files, np.array(w.files, dtype=object)[w.member])
        base = w.X - np.outer(trained, np.full(V.D, TRAINED_SHIFT * sd_mean))
    else:
        w = V.make_world("matched", rng)
        up = float(name.split("_")[1])
        sd_mean = math.sqrt(V.FILE_SD**2 + V.NOISE_SD**2 / 8)
        sus = np.array([f.startswith("suspected/") for f in w.unit_files])
        w.X = w.X + np.outer(sus, np.array([-0.6] * (V.D - 1) + [up]) * sd_mean)
        w.h0 = True
    base = w.X if base is None else base  # what the texts make of the target's scores
    X_ref = REF_AGREEMENT * base + math.sqrt(1 - REF_AGREEMENT**2) * V._corr(rng, w.X.shape[0])
    return w, X_ref


def one_feature_world(i: int, seed: int, name: str, permutations: int) -> dict:
    from types import SimpleNamespace

    import pandas as pd

    from mia_ray.detectors.dataset_inference import file_matrix, permutation_test, text_matrix
    from mia_ray.detectors.premise import blind_check
    from mia_ray.pipelines.audit import design_of

    w, X_ref = feature_world(name, i, seed)
    cfg = SimpleNamespace(audit=SimpleNamespace(seed=i, rounds=ROUNDS, C=1.0))
    files = (pd.DataFrame({"doc_id": w.files, "side": w.side, "source": w.source})
             .sort_values("doc_id").reset_index(drop=True))  # fmt: skip
    ids = files["doc_id"].tolist()
    t0 = time.perf_counter()
    design = design_of(files, file_matrix(w.unit_files, w.X, ids), cfg, nonneg=True)
    out = {"test:target": permutation_test(design, permutations, i, ALPHA)["reject"]}
    ref = design.with_features(file_matrix(w.unit_files, X_ref, ids), nonneg=True)
    out["reference"] = reference_check(ref, permutations, i)
    with_ref = np.column_stack([w.X, w.X[:, 0] - X_ref[:, 0]])  # f0 as LOSS: the `ref` attack
    out["test_ref:target"] = permutation_test(
        design.with_features(file_matrix(w.unit_files, with_ref, ids), nonneg=True),
        permutations, i, ALPHA)["reject"]  # fmt: skip
    cal = design.with_features(file_matrix(w.unit_files, w.X - X_ref, ids), nonneg=True)
    out["calibrated:target"] = permutation_test(cal, permutations, i, ALPHA)["reject"]
    if w.texts is not None:
        T = text_matrix(w.unit_files, w.texts, ids)
        out["words"] = permutation_test(design.with_features(T, False), permutations, i,
                                        ALPHA)["reject"]  # fmt: skip
        blind = blind_check(design, w.unit_files, w.texts, ids, permutations, i, ALPHA)
        out["blind"] = blind["reject"]
        out.update({f"blind_{k}": v["reject"] for k, v in blind["parts"].items()})
    else:  # no text: no text check can see anything
        out.update({k: False for k in ("words", "blind", "blind_words", "blind_characters",
                                       "blind_surface")})  # fmt: skip
    out["seconds"] = time.perf_counter() - t0
    return out


def rate(flags) -> str:
    from mia_ray.validity.worlds import wilson

    flags = list(flags)
    k, n = int(sum(flags)), len(flags)
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def summarize(records: dict[str, list[dict]], models: list[str]) -> dict:
    out = {}
    for s, recs in records.items():
        r = {"worlds": len(recs)}
        for key in ("words", "blind", "blind_words", "blind_characters", "blind_surface",
                    "reference"):  # fmt: skip
            r[key] = [bool(x[key]) for x in recs]
        for m in models:
            t = [bool(x[f"test:{m}"]) for x in recs]
            t_ref = [bool(x[f"test_ref:{m}"]) for x in recs]
            checked = [a and not x["blind"] and not x["reference"]
                       for a, x in zip(t_ref, recs, strict=True)]  # fmt: skip
            r[m] = {
                "test": t,
                "test_ref": t_ref,
                "calibrated": [bool(x[f"calibrated:{m}"]) for x in recs],
                "before": [a and not x["words"] for a, x in zip(t, recs, strict=True)],
                "text_checks": [a and not x["blind"] for a, x in zip(t, recs, strict=True)],
                "reference_check_only": checked,
                "with_reference": [
                    a and bool(x[f"calibrated:{m}"]) for a, x in zip(checked, recs, strict=True)
                ],  # fmt: skip
            }
        r["seconds_median"] = float(np.median([x["seconds"] for x in recs]))
        out[s] = r
    return out


def render(summary: dict, fsummary: dict, models: dict[str, str], args, info: dict) -> str:
    names = list(models)
    lines = [
        BEGIN,
        "## Token level: real text, real language models, shifts users bring",
        "",
        f"Measured by `python bench/validity_tokens.py --worlds {args.worlds} --permutations "
        f"{args.permutations} --pool {args.pool}` ({info['minutes']:.0f} min on {info['host']}). "
        f"A pool of {args.pool} English Wikipedia leads (none of the demo world's; each cut to "
        f"its first {MAX_WORDS} words) is scored once per shift by "
        + ", ".join(f"`{n}`" for n in models)
        + f" and the reference `tiny-ref`, through the project's Scorer (the audit's six default "
        f"features: LOSS, zlib, Min-K% and Min-K%++ at 5 ratios, lowercase, ReCaLL with a prefix "
        f"of {PREFIX_SHOTS} pool leads kept out of every world). Each world draws {N_SUS} "
        f"suspected and {N_UNS} unseen leads at random from the pool (one snippet per file) and "
        "gives the suspected ones the scenario's shift (`mia_ray/demo/shifts.py`); no world's "
        "sides differ by training, so every claim of training is false. "
        f"{args.permutations} permutations per test, {ROUNDS} rounds, alpha {ALPHA}; "
        "rates in % of worlds, 95 % Wilson intervals. SmolLM2 was pretrained on web text and "
        "may have read some leads: both sides are drawn from the same pool, so its exposure is "
        "the same on both (H0 holds), as it would be for a user's exchangeable sets.",
        "",
        "Scenarios: `none` (no shift: the checks' own level); `casing` (4 % of the words in capitals), `lowercased` (the whole text), `layout` "
        "(hard-wrapped at 60 characters), `repetition` (a 12-word span repeated), "
        "`boilerplate` (a fixed notice line), `typography` (curly quotes, em dashes), "
        "`simpler` (parentheticals dropped, semicolons made full stops), `ocr` (3 % of letters "
        "swapped for look-alikes).",
        "",
        "### The checks: their level (`none`) and power on each shift",
        "",
        "| scenario | worlds | word check (before) | blind check now | · words | · characters "
        "| · surface | reference check (tiny-ref) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s, r in summary.items():
        lines.append(
            f"| {s} | {r['worlds']} | {rate(r['words'])} | {rate(r['blind'])} | "
            f"{rate(r['blind_words'])} | {rate(r['blind_characters'])} | "
            f"{rate(r['blind_surface'])} | {rate(r['reference'])} |"
        )
    lines += [
        "",
        "### Claims of training under H0 (all false)",
        "",
        "`test`: the dataset test rejects (`+ ref`: with the `ref` feature beside the six, as "
        "the audit runs it with a reference). `calibrated`: the calibrated test rejects (the "
        "dataset test on the model's scores minus tiny-ref's). *before*: the test rejects and "
        'the word check does not (the former headline "Evidence that M trained"). *text '
        "checks*: it rejects and the blind check now does not (without a reference the "
        'headline says "training signal, premise partly untested"). *reference check only*: '
        "the test `+ ref` rejects and neither the blind nor the reference check rejects (the "
        "previous commit's claim). *with a reference*: the calibrated test rejects as well "
        '(the headline "Evidence that M trained"). Each must be <= 5 % + its Monte Carlo error '
        f"({100 * 1.96 * math.sqrt(0.05 * 0.95 / args.worlds):.1f} points at {args.worlds} "
        "worlds) to hold.",
        "",
        "| scenario | model | test rejects | test + ref | calibrated | claim before | claim, text "
        "checks | claim, reference check only | claim, with a reference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s, r in summary.items():
        for m in names:
            x = r[m]
            lines.append(
                f"| {s} | {m} | {rate(x['test'])} | {rate(x['test_ref'])} | "
                f"{rate(x['calibrated'])} | "
                f"{rate(x['before'])} | {rate(x['text_checks'])} | "
                f"{rate(x['reference_check_only'])} | {rate(x['with_reference'])} |"
            )
    lines += [
        "",
        "### Feature worlds with a reference",
        "",
        "Abstract features as in the scenarios above (`mia_ray/validity/worlds.py`, 30 "
        "suspected vs 40 unseen files, 8 snippets each), with a reference model's features "
        f"beside them: {REF_AGREEMENT} x the target's plus {math.sqrt(1 - REF_AGREEMENT**2):.1f} "
        "x fresh noise of the same correlation, i.e. a reference that reads the same texts and "
        "shares their differences, not the target's training. "
        + "; ".join(f"`{k}`: {v}" for k, v in FEATURE_SCENARIOS.items())
        + ". The texts of `against_*` are of one kind (the shift is in the scores alone), so "
        "no text check can see it: only a reference can. `trained` is H1: its columns are "
        "power, the share of worlds where the claim is (rightly) made.",
        "",
        "| scenario | worlds | test rejects | test + ref | calibrated | blind check now | "
        "reference check | claim before | claim, text checks | claim, reference check only | "
        "claim, with a reference |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, r in fsummary.items():
        x = r["target"]
        lines.append(
            f"| {s} | {r['worlds']} | {rate(x['test'])} | {rate(x['test_ref'])} | "
            f"{rate(x['calibrated'])} | "
            f"{rate(r['blind'])} | {rate(r['reference'])} | {rate(x['before'])} | "
            f"{rate(x['text_checks'])} | {rate(x['reference_check_only'])} | "
            f"{rate(x['with_reference'])} |"
        )
    lines += ["", *info["verdicts"], END]
    return "\n".join(lines)


def holds(flags, level=ALPHA) -> bool:
    from mia_ray.validity.worlds import wilson

    k, n = int(sum(flags)), len(flags)
    return wilson(k, n)[0] <= level


def verdict_lines(summary: dict, names: list[str], fsummary: dict) -> list[str]:
    out = ["### Does each claim hold its level?", ""]
    for s, r in summary.items():
        parts = []
        if s == "trained":  # H1: power, not level
            x = r["target"]
            out.append(f"- `trained` (H1, power): the claim with a reference is made in "
                       f"{rate(x['with_reference'])} % of worlds, with the reference check only "
                       f"{rate(x['reference_check_only'])} %, without a reference "
                       f"{rate(x['text_checks'])} %.")  # fmt: skip
            continue
        for m in names if s not in fsummary else ["target"]:
            x = r[m]
            parts.append(
                f"{m}: before {'holds' if holds(x['before']) else 'FAILS'}, text checks "
                f"{'hold' if holds(x['text_checks']) else 'FAIL'}, with a reference "
                f"{'holds' if holds(x['with_reference']) else 'FAILS'}"
            )
        lvl = " (the checks' own level: blind "
        lvl += f"{'holds' if holds(r['blind']) else 'FAILS'}, reference "
        lvl += f"{'holds' if holds(r['reference']) else 'FAILS'})" if s == "none" else ""
        out.append(f"- `{s}`: " + "; ".join(parts) + (lvl if s == "none" else "") + ".")
    return out


_SHARED: dict = {}  # what forked workers read: the scored pool and its texts


def _token_world(job):
    i, s = job
    g = _SHARED
    return one_world(i, g["seed"], g["n_pool"], s, g["pool"], g["variants"], g["names"],
                     "tiny-ref", g["permutations"])  # fmt: skip


def _feature_world(job):
    i, s = job
    return one_feature_world(i, _SHARED["seed"], s, _SHARED["permutations"])


def run_worlds(fn, scenarios: list[str], worlds: int, jobs: int) -> dict[str, list[dict]]:
    import multiprocessing as mp

    out: dict[str, list[dict]] = {}
    ctx = mp.get_context("fork")
    with ctx.Pool(jobs) as pool:
        for s in scenarios:
            t1 = time.perf_counter()
            out[s] = pool.map(fn, [(i, s) for i in range(worlds)], chunksize=4)
            print(f"  {s}: {worlds} worlds in {time.perf_counter() - t1:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, default=200)
    ap.add_argument("--permutations", type=int, default=99)
    ap.add_argument("--pool", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--smollm2", default="", help="a SmolLM2 folder (default: the demo's base)")
    ap.add_argument("--models", default="smollm2,tiny")
    ap.add_argument("--cache", default="~/.cache/mia-ray/validity-tokens")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--feature-scenarios", default=",".join(FEATURE_SCENARIOS))
    ap.add_argument("--out", default="VALIDITY.md")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    from mia_ray.config import WorldConfig
    from mia_ray.demo.world import ensure_smollm2_base, ensure_world

    # The demo world's tiny and tiny-ref (built once, ~10 min on 2 cores) and SmolLM2's base.
    info = ensure_world(WorldConfig(scale="demo"), ["tiny"])
    root = Path(info["root"])
    smollm2 = args.smollm2 or str(ensure_smollm2_base())
    paths = {"smollm2": smollm2, "tiny": info["model"], "tiny-ref": info["reference"]}
    names = [m for m in args.models.split(",") if m]
    models = {m: paths[m] for m in names}
    t0 = time.perf_counter()
    texts, prefix_docs = pool_texts(args.pool, root)
    pool, variants = scored_pool({**models, "tiny-ref": paths["tiny-ref"]}, texts, prefix_docs,
                                 Path(args.cache).expanduser(), args.max_length)  # fmt: skip
    t_score = time.perf_counter() - t0
    _SHARED.update(seed=args.seed, n_pool=len(texts), pool=pool, variants=variants, names=names,
                   permutations=args.permutations)  # fmt: skip
    tok = run_worlds(_token_world, [x for x in args.scenarios.split(",") if x], args.worlds,
                     args.jobs)  # fmt: skip
    feat = run_worlds(_feature_world, [x for x in args.feature_scenarios.split(",") if x],
                      args.worlds, args.jobs)  # fmt: skip
    summary = summarize(tok, names)
    fsummary = summarize(feat, ["target"])
    info = {
        "minutes": (time.perf_counter() - t0) / 60,
        "score_minutes": t_score / 60,
        "host": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python "
        f"{platform.python_version()}",
    }
    info["verdicts"] = verdict_lines({**summary, **fsummary}, names, fsummary)
    section = render(summary, fsummary, models, args, info)
    out = Path(args.out)
    old = out.read_text() if out.exists() else ""
    if BEGIN in old and END in old:
        new = old[: old.index(BEGIN)] + section + old[old.index(END) + len(END) :]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    out.write_text(new)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "features": fsummary,
                                               "info": info}))  # fmt: skip
    print(f"wrote {out} in {info['minutes']:.1f} min", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
