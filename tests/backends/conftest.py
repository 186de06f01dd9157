"""Shared by the backend tests: the test world's tiny model, local and behind `mia-ray serve`."""

import threading

import pytest


@pytest.fixture(scope="session")
def tiny(test_world):
    return test_world["model"]


@pytest.fixture(scope="session")
def local(tiny):
    from mia_ray.backends.local import LocalHFBackend

    backend = LocalHFBackend(tiny, device="cpu", batch_size=2)
    yield backend
    backend.close()


def start(server):
    """Run ``server`` on a thread; returns a function that stops it."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()
        thread.join(5)

    return stop


@pytest.fixture(scope="session")
def served(tiny):
    """`mia-ray serve`'s server for the tiny model on a free loopback port, no API key."""
    from mia_ray.serve import make_server

    server = make_server(tiny, port=0, device="cpu")
    stop = start(server)
    yield server
    stop()


@pytest.fixture(scope="session")
def served_with_key(tiny):
    """The same server, requiring ``Authorization: Bearer sekret``."""
    from mia_ray.serve import make_server

    server = make_server(tiny, port=0, api_key="sekret", device="cpu")
    stop = start(server)
    yield server
    stop()
