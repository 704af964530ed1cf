"""The package itself: what ``import bitfault`` pulls in, and the public names."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import bitfault

HEAVY = ("torch", "tensorflow", "keras", "jax", "ray")


def modules_after(statement: str) -> list[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))\n"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_bitfault_loads_no_framework():
    loaded = modules_after("import bitfault")
    assert "bitfault" in loaded and "numpy" in loaded
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    assert heavy == []


def test_core_modules_load_no_framework():
    loaded = modules_after("import bitfault.formats, bitfault.faults, bitfault.maps, "
                            "bitfault.inject, bitfault.spec")
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []


def test_public_names():
    for name in bitfault.__all__:
        assert getattr(bitfault, name) is not None, name
    assert {"FixedPoint", "IntQuant", "Float", "BitFlip", "StuckAt", "FaultMap", "FaultSpec",
            "inject", "inject_with_stats", "InjectionStats"} <= set(bitfault.__all__)
    assert isinstance(bitfault.__version__, str) and bitfault.__version__.count(".") == 2


def test_every_format_is_public_and_formats_exports_no_helpers():
    import bitfault.formats as formats

    classes = {name for name in formats.__all__ if name[0].isupper() and name.isidentifier()
               and isinstance(getattr(formats, name), type)}
    concrete = {"FixedPoint", "IntQuant", "Float", "MX", "NVFP4", "GGUF", "GroupwiseInt"}
    assert concrete <= classes and concrete <= set(bitfault.__all__)
    functions = sorted(n for n in formats.__all__ if n[0].islower())
    assert functions == ["fixed_point_for", "format_from_dict"], functions
    assert callable(formats.is_format) and callable(formats.plane_formats)  # still importable


def test_memory_and_fault_classes_from_their_packages():
    import bitfault.faults as faults
    import bitfault.memory as memory

    for name in ("Memory", "StoredArray", "Storage", "WordLayout", "Parity", "SecDed",
                 "NoProtection"):
        assert name in memory.__all__ and isinstance(getattr(memory, name), type), name
    for name in ("BitFlip", "StuckAt", "IndependentBits", "MultiBitUpset", "RowFaults",
                 "ColumnFaults", "Asymmetric"):
        assert name in faults.__all__ and isinstance(getattr(faults, name), type), name


def test_moved_modules_resolve_to_the_new_ones_with_a_warning():
    import importlib
    import warnings

    for old, new in bitfault.MOVED_MODULES.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
                   for w in caught), old


def test_framework_test_folders_never_pass_for_the_frameworks():
    """tests/torch and tests/keras are on sys.path's tests/ entry: without the real
    framework they must not be found as (empty namespace) packages, or the framework
    tests would be collected and fail instead of skipping (the framework-free CI run)."""
    import importlib.util

    for name in ("torch", "keras", "tensorflow"):
        spec = importlib.util.find_spec(name)
        assert spec is None or spec.origin is not None, f"{name} resolves to {spec}"
