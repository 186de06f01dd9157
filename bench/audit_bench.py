"""The audit's analysis time: the permutation test of the whole cross-fit, beside the former
analysis (one cross-fit of logistic regressions, Welch tests, no permutations) on the same rows.

    python bench/audit_bench.py --out BENCHMARKS.md

Synthetic file rows (the analysis never sees a model): n files with d features, 40 %
suspected; the dataset test (monotone, d = 14 as the audit's default features with a
reference), the blind check (free weights, d = 64 as its text components at most), each with
1,999 permutations and 5 rounds, and the former procedure's dataset test on 4 snippets per
file (its logistic regression fitted on snippets). Medians of 3 runs, in one process.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _audit_before import LinearFeatureScorer, cross_fit, dataset_test  # noqa: E402
from _markdown import publish  # noqa: E402

from mia_ray.detectors.dataset_inference import Design, permutation_test  # noqa: E402


def _median_time(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _before(units, X, files) -> None:
    dataset_test(cross_fit(units, X, files, LinearFeatureScorer, range(5)), files, 0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--permutations", type=int, default=1999)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for n in (160, 1000):
        side = (np.arange(n) < 0.4 * n).astype(int)
        cells = []
        for d, nonneg in ((14, True), (64, False)):
            design = Design(
                rng.normal(size=(n, d)), np.arange(n), side, list(range(5)), 1.0, nonneg
            )
            cells.append(
                _median_time(partial(permutation_test, design, args.permutations, 0, 0.05))
            )
        units = np.repeat([f"f{i}" for i in range(n)], 4)
        X = rng.normal(size=(4 * n, 14))
        files = {f"f{i}": int(s) for i, s in enumerate(side)}

        cells.append(_median_time(partial(_before, units, X, files)))
        rows.append((n, *cells))
        print(n, [round(c, 2) for c in cells], flush=True)
    lines = [
        "## Audit analysis: the permutation test of the whole cross-fit",
        "",
        f"`python bench/audit_bench.py` on {platform.machine()}, 2 CPU cores, "
        f"{time.strftime('%Y-%m-%d')}. Seconds (median of 3) for the dataset test and the "
        f"blind check with {args.permutations} permutations x 5 rounds x 2 halves (each a "
        "fit and a held-out AUC), beside the former analysis (5 rounds of logistic "
        "regressions on 4 snippets per file and Welch tests, no permutations). The fits are "
        "small and batched: one permutation of 160 files costs a fraction of a millisecond.",
        "",
        "| files | dataset test, d = 14, weights >= 0 (s) | blind check, d = 64 (s) | former "
        "dataset test (s) | permutations per second (d = 14) |",
        "|---|---|---|---|---|",
    ]
    for n, t14, t64, tb in rows:
        lines.append(f"| {n} | {t14:.2f} | {t64:.2f} | {tb:.2f} | {args.permutations / t14:,.0f} |")
    text = "\n".join(lines) + "\n"
    publish(text, args.out)


if __name__ == "__main__":
    main()
