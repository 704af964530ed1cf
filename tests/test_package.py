"""The package itself: what ``import bitfault`` pulls in, and the public names."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import bitfault

HEAVY = ("torch", "tensorflow", "keras", "jax", "ray")


def _modules_after(statement: str) -> list[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))\n"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_bitfault_loads_no_framework():
    loaded = _modules_after("import bitfault")
    assert "bitfault" in loaded and "numpy" in loaded
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    assert heavy == []


def test_core_modules_load_no_framework():
    loaded = _modules_after("import bitfault.formats, bitfault.faults, bitfault.maps, "
                            "bitfault.inject, bitfault.spec")
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []


def test_public_names():
    for name in bitfault.__all__:
        assert getattr(bitfault, name) is not None, name
    assert {"FixedPoint", "IntQuant", "Float", "BitFlip", "StuckAt", "FaultMap", "FaultSpec",
            "inject", "inject_with_stats", "InjectionStats"} <= set(bitfault.__all__)
    assert isinstance(bitfault.__version__, str) and bitfault.__version__.count(".") == 2


def test_framework_test_folders_never_pass_for_the_frameworks():
    """tests/torch and tests/keras are on sys.path's tests/ entry: without the real
    framework they must not be found as (empty namespace) packages, or the framework
    tests would be collected and fail instead of skipping (the framework-free CI run)."""
    import importlib.util

    for name in ("torch", "keras", "tensorflow"):
        spec = importlib.util.find_spec(name)
        assert spec is None or spec.origin is not None, f"{name} resolves to {spec}"
