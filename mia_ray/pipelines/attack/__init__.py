"""Classic attacks: LOSS, zlib, Min-K%, Min-K%++, lowercase and reference, evaluated honestly.

documents → snippets → Scorer actor pools (target, reference) → attack scores (pure
functions) → document scores → metrics with CIs, blind baseline, n-gram overlap → report.

Package: ``scoring`` (Scorer pools as stages, scores per snippet and document),
``evaluation``, ``report``, ``pipeline`` (``run``).
"""

from mia_ray.pipelines.attack.pipeline import run
from mia_ray.pipelines.attack.scoring import (
    crop_to_scored_span,
    score_attacks,
    score_pool,
    scorer_key,
    scorer_mapper,
)

__all__ = [
    "crop_to_scored_span", "run", "score_attacks", "score_pool", "scorer_key", "scorer_mapper",
]  # fmt: skip
