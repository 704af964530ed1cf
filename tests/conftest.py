"""Shared fixtures and settings for the core tests.

Hypothesis runs derandomized (a fixed example sequence, no example database
written into the tree), so every run of the suite checks the same cases.
"""

from __future__ import annotations

import sys
from importlib.machinery import SOURCE_SUFFIXES, FileFinder, ModuleSpec, SourceFileLoader
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# `import reference` in the tests works under any --import-mode (importlib adds no path)
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

# With tests/ on sys.path, the folders tests/torch and tests/keras would pass for the
# frameworks as empty namespace packages when those are not installed (and every
# importorskip would "find" them). tests/ gets a path-entry finder that does not offer
# those folders as packages, so the frameworks resolve as they do outside the suite.
FRAMEWORK_FOLDERS = frozenset({"torch", "keras", "tensorflow"})


class _TestsFolderFinder:
    """The finder of the tests/ path entry, minus the framework-named folders."""

    def __init__(self, path: str) -> None:
        self._inner = FileFinder(path, (SourceFileLoader, SOURCE_SUFFIXES))

    def find_spec(self, fullname: str, target: object = None) -> ModuleSpec | None:
        if fullname in FRAMEWORK_FOLDERS:
            return None
        return self._inner.find_spec(fullname, target)

    def invalidate_caches(self) -> None:
        self._inner.invalidate_caches()


TESTS_DIR = str(Path(__file__).parent)
sys.path_importer_cache[TESTS_DIR] = _TestsFolderFinder(TESTS_DIR)

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
