"""Shared fixtures and settings for the core tests.

Hypothesis runs derandomized (a fixed example sequence, no example database
written into the tree), so every run of the suite checks the same cases.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# `import reference` in the tests works under any --import-mode (importlib adds no path)
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

settings.register_profile(
    "bitfault",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("bitfault")


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh generator with a fixed seed for each test."""
    return np.random.default_rng(20240611)
