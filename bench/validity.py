"""The audit's guarantees measured on synthetic worlds (``mia_ray.validity.worlds``).

    python bench/validity.py --worlds 500 --permutations 199 --out VALIDITY.md

For each scenario, each world is drawn once and audited as ``mia-ray audit`` does: the
dataset test's rejection rate at alpha 0.05, per-file and per-source P(p <= 0.05) over
suspected files not trained on, the realized FDR at q = 0.05 and 0.2, the null and blind
checks' rejection rates, and beside them the former per-file scheme on the same fits; and
power (``POWER``). ``--before`` also runs the procedure before issue 27 (its summaries go to
--json only).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

# Tiny matrices: one BLAS thread each is faster, and the cores are shared.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _audit_before as B  # noqa: E402

from mia_ray.stats.audit import benjamini_hochberg  # noqa: E402
from mia_ray.validity import worlds as V  # noqa: E402

SCHEMES = ("cross", "split")
# Power: (scenario, shift, member files). `matched` at two shifts; `wide` (200 unseen files)
# where a file can be flagged, with many members and with a few strong ones; sources.
POWER = (
    ("matched", 0.3, 15), ("matched", 0.6, 15), ("wide", 1.5, 15), ("wide", 3.0, 15),
    ("wide", 1.5, 6), ("source_size", 1.0, 15), ("mixed_sources", 1.0, 20),
)  # fmt: skip


def before_world(w: V.World, seed: int, *, null: bool = True, blind: bool = True) -> dict:
    """The former audit on one world: every snippet (a document's tail of >= 32 words too),
    files as independent units, ``LinearFeatureScorer(C=1)`` cross-fitted over 5 seeds, the
    Welch tests merged by 2 x median, conformal p-values ``cross`` and ``split``, the null
    check and the blind check (``TextScorer``) as the former pipeline ran them. Returns
    {scheme: record} in :func:`worlds.after_world`'s shape."""
    t0 = time.perf_counter()
    files = {f: int(s) for f, s in zip(w.files, w.side, strict=True)}
    seeds = list(range(seed, seed + V.ROUNDS))

    def linear():
        return B.LinearFeatureScorer(C=V.C)

    rounds = B.cross_fit(w.unit_files, w.X, files, linear, seeds)
    test = B.dataset_test(rounds, files, V.ALPHA)
    common = {
        "reject": bool(test["reject"]),
        "p_value": float(test["p_value"]),
        # One held-out half alone: the first round's first half, its own Welch p-value.
        "half_reject": bool(test["halves"][0]["p_value"] < V.ALPHA),
    }
    member_of = dict(zip(w.files, w.member, strict=True))
    out = {}
    for scheme in SCHEMES:
        pv = B.file_pvalues(rounds, files, scheme)
        names = sorted(pv)
        p = [pv[n][1] for n in names]
        flagged = {q: benjamini_hochberg(p, q)[0] for q in V.FDRS}
        member = np.array([member_of[n] for n in names], dtype=bool)
        pick = names.index(w.pick) if w.pick in names else None
        n_cal = min(pv[n][2] for n in names)
        out[scheme] = {**common, **V.verdicts(p, flagged, member, pick, n_cal)}
    if null:
        unseen = [f for f, s in files.items() if s == 0]
        rej = bool(B.null_check(w.unit_files, w.X, unseen, linear, seeds, seed, V.ALPHA)["reject"])
        for r in out.values():
            r["null"] = rej
    if blind and w.texts is not None:
        bl = B.cross_fit(w.unit_files, w.texts, files, lambda: B.TextScorer(seed=seed), seeds)
        rej = bool(B.dataset_test(bl, files, V.ALPHA)["reject"])
        for r in out.values():
            r["blind"] = rej
    secs = time.perf_counter() - t0
    for r in out.values():
        r["seconds"] = secs
    return out


def run(
    name, n_worlds, permutations, seed, shift=0.0, n_members=None, blind_before=None, checks=True,
    before_too=True,
):  # fmt: skip
    """Both procedures on the same ``n_worlds`` worlds (the former one only with
    ``before_too``); ``blind_before``: run the former blind check on the first that many
    worlds only (None: all); ``checks``: run the null and blind checks at all (the power runs
    leave them out: members change neither)."""
    after, before = [], {s: [] for s in SCHEMES}
    t0 = time.perf_counter()
    for i in range(n_worlds):
        w = V.make_world(name, V.world_rng(name, seed, i), shift, n_members)
        after.append(V.after_world(w, permutations, i, null=checks, blind=checks))
        blind = checks and (blind_before is None or i < blind_before)
        if before_too:
            for s, r in before_world(w, i, null=checks, blind=blind).items():
                before[s].append(r)
        if (i + 1) % max(1, n_worlds // 5) == 0:
            print(
                f"  {name} shift={shift:g}: {i + 1}/{n_worlds} worlds, "
                f"{time.perf_counter() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return {
        "scenario": name,
        "shift": shift,
        "n_members": n_members or 0,
        "after": V.summarize(after),
        **({f"before_{s}": V.summarize(before[s]) for s in SCHEMES} if before_too else {}),
        "seconds": time.perf_counter() - t0,
    }


# ---------------------------------------------------------------- markdown


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _rate(r: dict | None) -> str:
    if not r or r["n"] == 0:
        return "-"
    lo, hi = r["ci"]
    return f"{_pct(r['rate'])} [{_pct(lo)}, {_pct(hi)}]"


def _mean(m: dict | None) -> str:
    if not m or m["n"] == 0:
        return "-"
    lo, hi = m["ci"]
    if math.isnan(lo):
        return _pct(m["mean"])
    return f"{_pct(m['mean'])} [{_pct(max(lo, 0.0))}, {_pct(hi)}]"


def _holds(est: dict | None, level: float) -> bool | None:
    """Holds unless the 95 % interval lies wholly above the level (the Monte Carlo error)."""
    if not est or (est.get("n", 0) == 0):
        return None
    return est["ci"][0] <= level


def _guarantees(s: dict) -> dict[str, bool | None]:
    src = s.get("sources") or {}
    return {
        "test": _holds(s["reject"], V.ALPHA),
        "per_file": _holds(s["per_file"], 0.05),
        "per_source": _holds(src.get("per_source"), 0.05),
        "fdr@0.05": _holds(s["fdr@0.05"], 0.05),
        "fdr@0.2": _holds(s["fdr@0.2"], 0.2),
        "null": _holds(s.get("null"), V.ALPHA),
        "blind": _holds(s.get("blind"), V.ALPHA),
    }


def _word(ok: bool | None) -> str:
    return "n/a" if ok is None else ("holds" if ok else "FAILS")


FORMER = "0c3bcb6"  # the last VALIDITY.md with the former procedure's rows beside these


def _summary(results: list[dict], power: list[dict]) -> list[str]:
    """Generated from the numbers above: which guarantees fail where, and power."""
    out = ["## Summary", ""]
    fails = []
    for r in results:
        if V.SCENARIOS[r["scenario"]].h0:
            g = _guarantees(r["after"])
            fails += [f"{r['scenario']} ({k})" for k, ok in g.items() if ok is False]
    out.append(
        "- Every measured guarantee holds in every H0 scenario."
        if not fails
        else "- FAILS in " + ", ".join(fails) + "."
    )
    former = [
        r["scenario"]
        for r in results
        if V.SCENARIOS[r["scenario"]].h0 and _holds(r["after"]["split"]["per_file"], 0.05) is False
    ]
    if former:
        out.append(
            "- The former per-file scheme (split-conformal within halves, one file per unseen "
            "source) FAILS its per-file level in: " + ", ".join(former) + "."
        )
    for r in power:
        a, f = r["after"], r["after"]["split"]
        out.append(
            f"- `{r['scenario']}`, {r['n_members']} member files at shift {r['shift']:g}: the "
            f"dataset test rejects in {_rate(a['reject'])} % of worlds; members flagged at "
            f"q = 0.05 / 0.2: {_mean(a['members_flagged@0.05'])} / "
            f"{_mean(a['members_flagged@0.2'])} %, the former scheme "
            f"{_mean(f['members_flagged@0.05'])} / {_mean(f['members_flagged@0.2'])} %."
        )
    return out


def render(results: list[dict], power: list[dict], args, timing: dict) -> str:
    w, p = args.worlds, args.permutations
    lines = [
        "# Validity of the audit's statistics",
        "",
        f"Measured by `python bench/validity.py --worlds {w} --permutations {p} --out "
        "VALIDITY.md` on synthetic worlds (`mia_ray/validity/worlds.py`); each world is "
        "drawn once and audited as `mia-ray audit` does (equalized snippets, sources as "
        "groups, the cross-fitted monotone discriminant with its permutation test, per-file "
        "p-values against every unseen file, Benjamini-Hochberg), and on the same fits the "
        "former per-file scheme (split-conformal in the first round's halves, one file per "
        f"unseen source) is measured beside it. 5 rounds, C = 1, alpha = 0.05, {p} "
        "permutations. Nothing was tuned on these outcomes. The procedure before issue 27 "
        "(every snippet, files as independent units, Welch tests merged by twice the median) "
        f"was measured beside the current one up to commit {FORMER} "
        f"(`git show {FORMER}:VALIDITY.md`); `python bench/validity.py --before` measures it "
        "again.",
        "",
        "The guarantees, each under H0 (no suspected file trained on, suspected and unseen "
        "sources exchangeable):",
        "",
        "- **Dataset test**: P(reject at alpha = 0.05) <= 0.05 (proven: a permutation test). "
        "Measured as the share of worlds that reject, with a 95 % Wilson interval (worlds are "
        "independent).",
        "- **Per-file p-values**: P(p <= 0.05) <= 0.05 for a file of a source not trained on "
        "(proven: a score that ignores the sides, ranked against every unseen source weighed "
        "by its files). Measured as the mean over worlds of the share of such files with "
        "p <= 0.05 (`per-file`), and per source, each source counted once (`per-source`); the "
        "files of one world share unseen files, so the interval is a normal one over worlds, "
        "not a binomial one over files.",
        "- **FDR**: E[false flagged / max(flagged, 1)] <= q for Benjamini-Hochberg over the "
        "suspected files at q = 0.05 (the audit's default) and 0.2 (proven with single-file "
        "sources; measured with larger ones). Under H0 every flagged file is false, so this is "
        "P(any file flagged). Normal interval over worlds; [0.0, 0.0] means no world flagged "
        "any file.",
        "- **Null check** (unseen vs unseen, random halves): rejects at most 5 % of the time.",
        "- **Blind check** (three views of the text, one min-p test): in worlds whose texts "
        "are of one kind it should reject at most 5 %; in `easier` the texts differ and it "
        "should reject.",
        "",
        "Monte Carlo error: with n worlds a rate near 0.05 has a standard error of "
        "sqrt(0.05 x 0.95 / n) (1.0 point at n = 500); the p-value itself carries a "
        f"permutation error of sqrt(p (1 - p) / {p}) but stays exactly valid. A guarantee is "
        "said to hold when its 95 % interval reaches down to the level and to FAIL when the "
        "whole interval lies above it.",
        "",
        "## Scenarios",
        "",
    ]
    for name, sc in V.SCENARIOS.items():
        lines.append(f"- `{name}`: {sc.doc}{'' if sc.h0 else ' **(not an H0)**'}.")
    lines += [
        "",
        "## Under H0: rates in %, 95 % intervals",
        "",
        "`n_cal`: the fewest unseen files a suspected file is ranked against; `together`: the "
        "fewest files Benjamini-Hochberg can flag at once at q = 0.05 / 0.2, ceil(m / (n_cal + "
        "1) / q) for m suspected files (above m: no file can ever be flagged). `former`: the "
        "split-conformal scheme this replaced, on the same fits.",
        "",
        "| scenario | worlds | dataset test rejects | per-file P(p <= 0.05) | per-source "
        "P(p <= 0.05) | FDR q=0.05 | FDR q=0.2 | null check rejects | blind check rejects "
        "| n_cal | together | former: per-file P(p <= 0.05) | former: FDR q=0.2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s, f = r["after"], r["after"]["split"]
        lines.append(
            f"| {r['scenario']} | {s['n_worlds']} | {_rate(s['reject'])} | "
            f"{_mean(s['per_file'])} | {_mean(s['sources']['per_source'])} | "
            f"{_mean(s['fdr@0.05'])} | {_mean(s['fdr@0.2'])} | {_rate(s.get('null'))} | "
            f"{_rate(s.get('blind'))} | {s['min_n_cal']} | "
            f"{s['together@0.05']} / {s['together@0.2']} | {_mean(f['per_file'])} | "
            f"{_mean(f['fdp@0.2'])} |"
        )
    lines += ["", "## Does each guarantee hold?", ""]
    for r in results:
        sc, g = V.SCENARIOS[r["scenario"]], _guarantees(r["after"])
        if not sc.h0:
            b = r["after"].get("blind")
            lines.append(
                f"- `{r['scenario']}`: not an H0 a feature test can hold (easier text looks "
                "trained-on); the rates above are what a feature test does there, not a "
                f"guarantee. The blind check rejects in {_rate(b)} % of worlds."
            )
            continue
        part = ", ".join(f"{k.replace('_', '-')} {_word(ok)}" for k, ok in g.items()
                         if ok is not None)  # fmt: skip
        lines.append(f"- `{r['scenario']}`: {part}.")
    lines += ["", *_summary(results, power)]
    if power:
        lines += [
            "",
            "## Power",
            "",
            "Members' snippets shifted by `shift` sds of a file's mean feature on every "
            "feature; where files come in sources, whole sources are trained on. Rates in %, "
            "95 % intervals. The null and blind checks are not run here (members change "
            "neither). `per-file P`: non-member files' P(p <= 0.05) beside the members.",
            "",
            "| scenario | shift | member files | worlds | dataset test rejects | members "
            "flagged q=0.05 | q=0.2 | FDR q=0.05 | FDR q=0.2 | per-file P(p <= 0.05) | together "
            "| former: members flagged q=0.05 | q=0.2 | former: FDR q=0.2 |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in power:
            s, f = r["after"], r["after"]["split"]
            lines.append(
                f"| {r['scenario']} | {r['shift']:g} | {r['n_members']} | {s['n_worlds']} | "
                f"{_rate(s['reject'])} | {_mean(s['members_flagged@0.05'])} | "
                f"{_mean(s['members_flagged@0.2'])} | {_mean(s['fdr@0.05'])} | "
                f"{_mean(s['fdr@0.2'])} | {_mean(s['per_file'])} | "
                f"{s['together@0.05']} / {s['together@0.2']} | "
                f"{_mean(f['members_flagged@0.05'])} | {_mean(f['members_flagged@0.2'])} | "
                f"{_mean(f['fdp@0.2'])} |"
            )
    lines += [
        "",
        "## Timings",
        "",
        f"{timing['host']}; the whole run took {timing['total_s'] / 60:.1f} min. Median "
        "seconds per world (equalizing, file rows, the test with its permutations, per-file "
        "p-values in both schemes, null check, and the blind check where the world has "
        "texts):",
        "",
        "| scenario | shift | s / world | scenario total (s) |",
        "|---|---|---|---|",
    ]
    for r in [*results, *power]:
        lines.append(
            f"| {r['scenario']} | {r['shift']:g} | {r['after']['seconds_median']:.3f} | "
            f"{r['seconds']:.0f} |"
        )
    lines += ["", *(timing.get("notes") or [])]
    return "\n".join(lines) + "\n"


# Kept from the first of these on: notes written by hand on a run, then the token-level
# section bench/validity_tokens.py writes (the two benches share VALIDITY.md).
KEPT = ("<!-- kept:begin -->", "<!-- token-level:begin -->")


# The summary at the top, written by hand from the tables: kept under the title.
SUMMARY = ("<!-- summary:begin", "<!-- summary:end -->")


def _write_keeping_tokens(out: Path, text: str) -> None:
    """Write ``text`` to ``out``, keeping the hand-written summary (under the title) and what
    follows the first :data:`KEPT` marker there."""
    old = out.read_text() if out.is_file() else ""
    at = [old.index(m) for m in KEPT if m in old]
    tail = old[min(at) :] if at else ""
    if SUMMARY[0] in old and SUMMARY[1] in old:
        summary = old[old.index(SUMMARY[0]) : old.index(SUMMARY[1]) + len(SUMMARY[1])]
        title, _, body = text.partition("\n\n")
        text = f"{title}\n\n{summary}\n\n{body}"
    out.write_text(text.rstrip("\n") + "\n\n" + tail if tail else text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, default=500)
    ap.add_argument("--permutations", type=int, default=199)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="VALIDITY.md")
    ap.add_argument("--json", default="", help="also write the raw summaries here")
    ap.add_argument("--scenarios", default="", help="comma-separated subset (default: all)")
    ap.add_argument("--no-power", action="store_true")
    ap.add_argument(
        "--extend",
        default="",
        help="a --json file of an earlier run: keep its results, replace or add those run now "
        "(the scenarios of --scenarios), and write --out and --json from the union",
    )
    ap.add_argument(
        "--before",
        action="store_true",
        help="also run the procedure before issue 27 (bench/_audit_before.py) on every world "
        "and keep its summaries in --json (slow: its blind check fits 10 models a world)",
    )
    ap.add_argument(
        "--blind-before-worlds",
        type=int,
        default=-1,
        help="run the former (costly) blind check on the first N worlds only (-1: all)",
    )
    ap.add_argument(
        "--render-from",
        default="",
        help="write --out from a --json file of an earlier run (with its --worlds and "
        "--permutations) instead of running",
    )
    args = ap.parse_args(argv)
    if args.render_from:
        got = json.loads(Path(args.render_from).read_text())
        _write_keeping_tokens(
            Path(args.out), render(got["results"], got["power"], args, got["timing"])
        )
        return 0
    names = [s for s in args.scenarios.split(",") if s] or list(V.SCENARIOS)
    bb = None if args.blind_before_worlds < 0 else args.blind_before_worlds
    t0 = time.perf_counter()
    results, power = [], []
    for name in names:
        print(f"{name}: {args.worlds} worlds", file=sys.stderr, flush=True)
        results.append(run(name, args.worlds, args.permutations, args.seed, blind_before=bb,
                           before_too=args.before))  # fmt: skip
    if not args.no_power:
        for name, shift, members in POWER:
            print(f"power: {name} shift {shift}, {members} members", file=sys.stderr, flush=True)
            power.append(
                run(name, args.worlds, args.permutations, args.seed, shift, members,
                    checks=False, before_too=False)
            )  # fmt: skip
    total = time.perf_counter() - t0
    notes = []
    if bb is not None:
        notes.append(
            f"The former blind check (10 logistic fits on tf-idf per world) ran on the first "
            f"{bb} worlds of each scenario with texts only; its rates are over those worlds."
        )
    timing = {
        "host": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared), "
        f"Python {platform.python_version()}, numpy {np.__version__}",
        "total_s": total,
        "notes": notes,
    }
    if args.extend:
        old = json.loads(Path(args.extend).read_text())
        new = {(r["scenario"], r["shift"]) for r in [*results, *power]}
        results = [r for r in old["results"] if (r["scenario"], 0) not in new] + results
        order = list(V.SCENARIOS)
        results.sort(key=lambda r: order.index(r["scenario"]))
        power = [r for r in old["power"] if (r["scenario"], r["shift"]) not in new] + power
        timing["total_s"] += old["timing"]["total_s"]
        timing["notes"] = [*old["timing"]["notes"], *notes]
    _write_keeping_tokens(Path(args.out), render(results, power, args, timing))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"results": results, "power": power, "timing": timing}, indent=1)
        )
    print(f"wrote {args.out} in {total / 60:.1f} min", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
