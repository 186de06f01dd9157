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

    from mia_ray.runtime import configure_data_context, connect

    connect(address="", num_cpus=2)
    configure_data_context(no_progress_timeout_s=600, progress=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def test_world(tmp_path_factory):
    """The small demo world (scale ``test``: tiny, tiny-ref, tiny-random), built once per session.

    Built under a session temp dir, or under ``$MIA_RAY_TEST_WORLD`` when set, so that reruns
    reuse it. Returns ``ensure_world``'s dict (paths of documents, books, manifest, models).
    """
    from mia_ray.config import WorldConfig
    from mia_ray.demo.world import ensure_world

    root = os.environ.get("MIA_RAY_TEST_WORLD") or str(tmp_path_factory.mktemp("world-test"))
    cfg = WorldConfig(root=root, scale="test", seed=0, target="tiny")
    return ensure_world(cfg, ["tiny", "tiny-random"], num_cpus=2)
