"""The adapter registry (``bitfault.frameworks``): names, lazy imports, the protocol."""

from __future__ import annotations

import importlib.util

import pytest

from bitfault.frameworks import (
    Adapter,
    adapter,
    framework_for_suffix,
    register_adapter,
    registered,
    registration,
)
from test_package import HEAVY, modules_after


def test_import_frameworks_loads_no_framework() -> None:
    loaded = modules_after("import bitfault.frameworks\n"
                            "bitfault.frameworks.registration('torch')\n"
                            "bitfault.frameworks.framework_for_suffix('.keras')")
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []


def test_unknown_name_lists_the_registered_ones() -> None:
    for call in (adapter, registration):
        with pytest.raises(ValueError) as info:
            call("jaxx")
        message = str(info.value)
        assert "'jaxx'" in message
        assert all(name in message for name in registered())
    assert {"torch", "keras", "gguf"} <= set(registered())


def test_suffixes_name_their_framework() -> None:
    assert framework_for_suffix(".pt") == framework_for_suffix(".PTH") == "torch"
    assert framework_for_suffix(".keras") == "keras"
    assert framework_for_suffix(".gguf") == "gguf"
    assert framework_for_suffix(".onnx") is None


def _installed(name: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in registration(name).requires)


@pytest.mark.parametrize("name", ["torch", "keras", "gguf"])
def test_each_registered_adapter_satisfies_the_protocol(name: str) -> None:
    if not _installed(name):
        pytest.skip(f"{name} is not installed")
    found = adapter(name)
    assert isinstance(found, Adapter)
    assert found.name == name
    assert found.model_file.startswith("model.")


def test_register_adapter_adds_a_name_imported_on_use() -> None:
    register_adapter("test-missing", "bitfault_no_such_module.adapter", suffixes=(".none",))
    try:
        assert "test-missing" in registered()
        assert framework_for_suffix(".none") == "test-missing"
        with pytest.raises(ModuleNotFoundError):
            adapter("test-missing")
    finally:
        from bitfault import frameworks

        frameworks.unregister_adapter("test-missing")
    assert "test-missing" not in registered()
