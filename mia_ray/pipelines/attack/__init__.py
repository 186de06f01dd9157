"""Membership attacks (LOSS, zlib, Min-K%, Min-K%++, lowercase, reference, ReCaLL, Con-ReCall,
DC-PDD, PAC, SaMIA, neighbourhood, gradient norm), evaluated honestly.

documents → snippets → Scorer actor pools (target, reference) → attack scores (pure
functions) → document scores → metrics with CIs, blind baseline, n-gram overlap → report.

Package: ``pools`` (Scorer pools as stages), ``scoring`` (scores per snippet and document),
``passes`` (the passes beyond the target's plain one), ``evaluation``, ``report``,
``pipeline`` (``run``).
"""

from mia_ray.pipelines.attack.pipeline import run
from mia_ray.pipelines.attack.pools import score_pool, scorer_key, scorer_mapper
from mia_ray.pipelines.attack.scoring import crop_to_scored_span, score_attacks

__all__ = [
    "crop_to_scored_span", "run", "score_attacks", "score_pool", "scorer_key", "scorer_mapper",
]  # fmt: skip
