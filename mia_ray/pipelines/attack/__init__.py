"""Membership attacks (LOSS, zlib, Min-K%, Min-K%++, lowercase, reference, ReCaLL, Con-ReCall,
DC-PDD, PAC, SaMIA, neighbourhood, gradient norm), evaluated honestly.

documents → snippets → Scorer actor pools (target, reference) → attack scores (pure
functions) → document scores → metrics with CIs, blind baseline, n-gram overlap → report.

Package: ``evaluation``, ``report``, ``pipeline`` (``run``); the scoring itself is the layer
below the pipelines, ``mia_ray.scoring``.
"""

from mia_ray.pipelines.attack.pipeline import run

__all__ = ["run"]
