"""Per-type precision and recall of the PII scanners on the labelled sentences in
tests/features/pii_eval_cases.py, printed as the Markdown tables of docs/pii.md.

    .venv/bin/python bench/pii_precision.py            # print the tables
    .venv/bin/python bench/pii_precision.py --update   # and rewrite them in docs/pii.md

Pure Python, a second or two on one core: no model, no Ray.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mia_ray.features.pii import PII_TYPE_NAMES, PII_TYPES, evaluate  # noqa: E402

CASES_PATH = ROOT / "tests" / "features" / "pii_eval_cases.py"
DOC_PATH = ROOT / "docs" / "pii.md"
MARKERS = {
    "types": ("<!-- pii-types:begin -->", "<!-- pii-types:end -->"),
    "eval": ("<!-- pii-eval:begin -->", "<!-- pii-eval:end -->"),
}


def load_cases(path: Path = CASES_PATH) -> list:
    """The labelled cases, loaded by path (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location("pii_eval_cases", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES


def md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def types_table() -> str:
    lines = ["| type | rule and validator |", "|---|---|"]
    lines += [f"| `{t.name}` | {md_cell(t.description)} |" for t in PII_TYPES]
    return "\n".join(lines)


def eval_table(results: dict[str, tuple[float, float, int, int, int]]) -> str:
    """One row per type, then the micro-average over the 20 regex types."""
    lines = ["| type | precision | recall | TP | FP | FN |", "|---|---:|---:|---:|---:|---:|"]
    for kind, (p, r, tp, fp, fn) in results.items():
        lines.append(f"| `{kind}` | {p:.3f} | {r:.3f} | {tp} | {fp} | {fn} |")
    tp, fp, fn = (sum(results[k][i] for k in PII_TYPE_NAMES) for i in (2, 3, 4))
    lines.append(
        f"| all 20 regex types | {tp / (tp + fp):.3f} | {tp / (tp + fn):.3f} | {tp} | {fp} | {fn} |"
    )
    return "\n".join(lines)


def replace_between(doc: str, begin: str, end: str, body: str) -> str:
    i, j = doc.index(begin) + len(begin), doc.index(end)
    return doc[:i] + "\n" + body + "\n" + doc[j:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help=f"rewrite the tables in {DOC_PATH}")
    args = ap.parse_args()
    cases = load_cases()
    tables = {"types": types_table(), "eval": eval_table(evaluate(cases))}
    n_neg = sum(1 for _, labels in cases if not labels)
    print(f"{len(cases)} labelled cases ({n_neg} without any PII)\n")
    print(tables["eval"])
    if args.update:
        doc = DOC_PATH.read_text()
        for key, (begin, end) in MARKERS.items():
            doc = replace_between(doc, begin, end, tables[key])
        DOC_PATH.write_text(doc)
        print(f"\nwrote {DOC_PATH.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
