"""Faults: what a fault does to a stored bit (``models``: flip, stuck-at) and how faults
cluster in memory words (``patterns``: independent bits, multi-bit upsets, rows,
columns, asymmetric cells; ``word_faults``: the faulty physical bits they draw).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it (imported on first use, so that
# importing one submodule never runs the others)
_EXPORTS = {
    "BitFlip": "bitfault.faults.models",
    "FaultModel": "bitfault.faults.models",
    "StuckAt": "bitfault.faults.models",
    "as_fault_model": "bitfault.faults.models",
    "bit_names": "bitfault.faults.models",
    "check_fault_model": "bitfault.faults.models",
    "fault_from_dict": "bitfault.faults.models",
    "resolve_bits": "bitfault.faults.models",
    "resolve_plane_bits": "bitfault.faults.models",
    "PATTERNS": "bitfault.faults.patterns",
    "Asymmetric": "bitfault.faults.patterns",
    "ColumnFaults": "bitfault.faults.patterns",
    "IndependentBits": "bitfault.faults.patterns",
    "MultiBitUpset": "bitfault.faults.patterns",
    "Pattern": "bitfault.faults.patterns",
    "RowFaults": "bitfault.faults.patterns",
    "pattern_from_dict": "bitfault.faults.patterns",
    "poisson_cells": "bitfault.faults.patterns",
    "WordFaults": "bitfault.faults.word_faults",
    "bit_values": "bitfault.faults.word_faults",
    "full_masks": "bitfault.faults.word_faults",
    "interleaved_cells": "bitfault.faults.word_faults",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(_EXPORTS)


__all__ = sorted(_EXPORTS)
