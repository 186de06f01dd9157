"""CopyCheck's fine-tuning recipe: step counts, BLoB's KL weight, the defaults (no model)."""

import pytest

from mia_ray.train.config import FinetuneConfig
from mia_ray.train.copycheck import blob_kl_pi, steps_per_epoch


def test_optimizer_steps_per_epoch_count_accumulation_and_workers():
    assert steps_per_epoch(16, 4) == 4
    assert steps_per_epoch(16, 4, grad_accum=2) == 2
    assert steps_per_epoch(16, 4, grad_accum=2, world_size=2) == 1
    assert steps_per_epoch(17, 4, grad_accum=2) == 3  # the last step takes the odd snippet
    assert steps_per_epoch(3, 4, grad_accum=2, world_size=2) == 1


def test_blob_kl_weight_is_one_over_optimizer_steps_per_epoch():
    # One worker, no accumulation: the reference code's 1 / len(train_loader) = 1 / 4.
    assert blob_kl_pi(16, FinetuneConfig(batch_size=4)) == 0.25
    # The KL step runs once per optimizer step: 2 steps an epoch weigh 1/2 each, not 1/4.
    assert blob_kl_pi(16, FinetuneConfig(batch_size=4, grad_accum=2)) == 0.5
    assert blob_kl_pi(16, FinetuneConfig(batch_size=4), world_size=2) == 0.5
    assert blob_kl_pi(16, FinetuneConfig(batch_size=4, grad_accum=2), world_size=2) == 1.0
    spec = FinetuneConfig(batch_size=4, grad_accum=2, blob_kl_weight=0.3)
    assert blob_kl_pi(17, spec) == pytest.approx(0.1, abs=1e-15)  # 0.3 / 3 steps


def test_warmup_is_the_authors_six_percent():
    assert FinetuneConfig().warmup_ratio == 0.06
