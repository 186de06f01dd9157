"""Fixtures of the feature tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ref():
    """The frozen slow scanner (``_reference_scanner.py``) that the fast one is held to."""
    path = Path(__file__).with_name("_reference_scanner.py")
    spec = importlib.util.spec_from_file_location("_reference_scanner", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
