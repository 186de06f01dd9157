"""`mia-ray audit`: did model M train on these files?

suspected + unseen files → sources (a group field, near-duplicates) → the same number of
full-size snippets per file (``inputs``) → one Scorer pass per model (target, reference) →
attack features per snippet → file rows → a cross-fitted monotone discriminant with a
permutation test of the whole procedure (``detectors.dataset_inference``, after Maini et al.
2024), a null check (unseen vs unseen) and a blind check (text only, Das et al. 2024) →
per-file conformal p-values against every unseen file → Benjamini-Hochberg in exact arithmetic (``analysis``) →
the verdict and report (``report``); more evidence from the other pipelines (``methods``).
"""

from mia_ray.pipelines.audit.analysis import analyse, design_of, feature_columns
from mia_ray.pipelines.audit.inputs import (
    SIDES,
    assign_sources,
    check_counts,
    read_inputs,
    select_snippets,
)
from mia_ray.pipelines.audit.pipeline import run
from mia_ray.pipelines.audit.report import verdict

__all__ = [
    "SIDES", "analyse", "assign_sources", "check_counts", "design_of", "feature_columns",
    "read_inputs", "run", "select_snippets", "verdict",
]  # fmt: skip
