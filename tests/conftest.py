import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance for the whole session (the `ray` tier)."""
    import ray

    from mia_ray.runtime import connect

    connect(address="", num_cpus=2)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.verbose_progress = False
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()
