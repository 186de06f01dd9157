"""LUMIA: membership signal per layer from probes on mean hidden states (González-Manzano et al.).

samples → ActivationReader pool (one forward pass each, mean activation per block, parquet
parts) → per layer, one Ray task training the probes on repeated grouped 80/20 splits →
AUC by layer (mean ± std), best layer l* → the classic attacks and the blind baseline on the
very same test folds → n-gram overlap of members vs non-members → report.

Honest where the public code is not (../shared/methods/README.md): splits are seeded and
grouped by document, and early stopping / model selection use a validation fold carved
from the training part; the test part's labels only score the finished probe.
"""

from mia_ray.pipelines.lumia.baselines import baseline_attacks, fold_metrics
from mia_ray.pipelines.lumia.pipeline import run, run_target

__all__ = ["baseline_attacks", "fold_metrics", "run", "run_target"]
