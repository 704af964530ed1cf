"""Imports: the core never loads TensorFlow; other Keras backends get a clear error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env})


def test_import_bitfault_does_not_import_keras_or_tensorflow() -> None:
    result = run_python("import sys, bitfault; print('tensorflow' in sys.modules, "
                        "'keras' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_a_non_tensorflow_backend_gets_a_clear_error() -> None:
    pytest.importorskip("torch")
    result = run_python("import bitfault.keras", KERAS_BACKEND="torch")
    assert result.returncode != 0
    assert "supports the TensorFlow backend of Keras only" in result.stderr
    assert "'torch' backend" in result.stderr
