"""The order test for benchmark contamination (Oren et al. 2023, "Proving test set
contamination in black box language models"): a model that trained on a benchmark as
published prefers its examples in their published order to random shuffles of them. Shards
of consecutive examples, each ranked among its own shuffles (exact), combined by Fisher's
statistic (``stats/ranks.py``)."""

from mia_ray.pipelines.contamination.pipeline import run

__all__ = ["run"]
