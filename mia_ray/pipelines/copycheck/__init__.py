"""CopyCheck (Li et al.): which suspected files has the model seen? No threshold, no labels.

files → snippets (pseudo-label 1 suspected / 0 surely unseen; ``inputs``) → 12 fine-tunes per
experiment as Ray Tune trials (MC dropout, BLoB, 10 ensemble members; ``training``) → Sampler
actors give 10 predictions p("1") per suspected snippet and sampler (``sampling``) → 13
uncertainty metrics each (39; ``features``) → standardize, PCA 10, max-pool per file →
clustering (GMM default) oriented by rule → verdicts (``detection``). Baselines go through the
same file pipeline: Min-K% at 10 ratios (Prob-Tool), neighbour LOSS / PPL, and the supervised
Meeus et al. meta-classifier; plus the blind baseline.
"""

from mia_ray.pipelines.copycheck.features import score_target
from mia_ray.pipelines.copycheck.inputs import experiments_of, snippets_for
from mia_ray.pipelines.copycheck.pipeline import resolve, run
from mia_ray.pipelines.copycheck.sampling import members_mapper, sample_experiment
from mia_ray.pipelines.copycheck.training import finetune_jobs

__all__ = [
    "experiments_of", "finetune_jobs", "members_mapper", "resolve", "run", "sample_experiment",
    "score_target", "snippets_for",
]  # fmt: skip
