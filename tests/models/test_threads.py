"""An actor's torch threads: what it asked for while the machine has room, its CPUs when not."""

import subprocess
import sys
import time

import pytest

from mia_ray.models import hf


def test_threads_for_keeps_the_wish_only_while_other_work_fits_beside_it():
    assert hf.threads_for(2, 1, others=0.0, cores=2) == 2
    assert hf.threads_for(2, 1, others=0.5, cores=2) == 2  # Ray's own processes: slack
    assert hf.threads_for(2, 1, others=0.6, cores=2) == 1
    assert hf.threads_for(2, 1, others=2.0, cores=2) == 1
    assert hf.threads_for(4, 2, others=3.0, cores=8) == 4
    assert hf.threads_for(4, 2, others=4.6, cores=8) == 2


@pytest.fixture
def asked_two_given_one(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(hf, "ray_cpus", lambda: 1)
    monkeypatch.setattr(hf, "THREADS_LOOK_S", 1.0)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    hf.set_torch_threads(2)
    yield torch
    torch.set_num_threads(before)


def _look(torch) -> int:
    """fit_threads over a second of this process idle (its first call only takes the start)."""
    hf.fit_threads()
    time.sleep(1.2)
    n = hf.fit_threads()
    assert torch.get_num_threads() == n
    return n


def test_an_actor_falls_back_to_its_cpus_while_other_work_fills_the_machine(asked_two_given_one):
    torch = asked_two_given_one
    assert _look(torch) == 2  # the machine idle but for this test
    spin = "import time\nt = time.time() + 30\nwhile time.time() < t: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        time.sleep(0.5)
        assert _look(torch) == 1
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert _look(torch) == 2  # room again: the threads it asked for


def test_no_look_where_the_threads_asked_for_are_the_cpus_given(monkeypatch):
    monkeypatch.setattr(hf, "ray_cpus", lambda: 2)
    monkeypatch.setattr(hf, "_machine_busy_s", lambda: pytest.fail("looked at the machine"))
    hf.set_torch_threads(2)
    assert hf.fit_threads() == 2
