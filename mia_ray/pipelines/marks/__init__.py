"""Proofs that need no unseen set: the owner's randomized marks (Wei, Wang, Jia, ACL 2024;
Zhang, Das, Kamath, Tramèr 2025). `mia-ray mark` writes marked copies and a secret key
(``data/marks.py``); `mia-ray verify` ranks each published candidate among its unpublished
alternatives under the model (the shared Scorer pool) for an exact p-value
(``stats/ranks.py``)."""

from mia_ray.pipelines.marks.pipeline import run_mark, run_verify

__all__ = ["run_mark", "run_verify"]
