"""Memory: how stored words sit in memory and what protection does.

``Memory`` (format + fault model + storage), ``StoredArray``; ``storage``: how planes pack
into memory words (``layout``, ``lanes``) under a protection code (``codes``: parity,
SEC-DED; ``selective``: chosen bit positions in their own protected words);
``decode``: physical faults decoded to element-level maps; ``plane_maps``: a stored
memory's plane maps drawn over physical words.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it (imported on first use, so that
# importing one submodule never runs the others)
_EXPORTS = {
    "Memory": "bitfault.memory.memory",
    "StoredArray": "bitfault.memory.memory",
    "StoredBlocks": "bitfault.memory.memory",
    "check_format": "bitfault.memory.memory",
    "check_map_fits": "bitfault.memory.memory",
    "eligible_faults": "bitfault.memory.memory",
    "masks_as_words": "bitfault.memory.memory",
    "plane_faults": "bitfault.memory.memory",
    "Storage": "bitfault.memory.storage",
    "WordLayout": "bitfault.memory.layout",
    "check_interleave": "bitfault.memory.layout",
    "CORRECTED": "bitfault.memory.codes",
    "DUE": "bitfault.memory.codes",
    "OK": "bitfault.memory.codes",
    "POLICIES": "bitfault.memory.codes",
    "SCHEMES": "bitfault.memory.codes",
    "NoProtection": "bitfault.memory.codes",
    "Parity": "bitfault.memory.codes",
    "Protection": "bitfault.memory.codes",
    "SecDed": "bitfault.memory.codes",
    "hamming_positions": "bitfault.memory.codes",
    "parity": "bitfault.memory.codes",
    "protection_from_dict": "bitfault.memory.codes",
    "PROTECTED": "bitfault.memory.selective",
    "UNPROTECTED": "bitfault.memory.selective",
    "Part": "bitfault.memory.selective",
    "check_protected_bits": "bitfault.memory.selective",
    "part_layout": "bitfault.memory.selective",
    "split_overhead": "bitfault.memory.selective",
    "split_parts": "bitfault.memory.selective",
    "RATE_FIELDS": "bitfault.memory.decode",
    "DecodedFaults": "bitfault.memory.decode",
    "Outcomes": "bitfault.memory.decode",
    "decode_faults": "bitfault.memory.decode",
    "draw_decoded_map": "bitfault.memory.decode",
    "pattern_at": "bitfault.memory.decode",
    "stored_words": "bitfault.memory.decode",
    "DATA_DEPENDENT": "bitfault.memory.plane_maps",
    "OUTCOME_KEYS": "bitfault.memory.plane_maps",
    "StoredWords": "bitfault.memory.plane_maps",
    "TensorWords": "bitfault.memory.plane_maps",
    "as_stored_words": "bitfault.memory.plane_maps",
    "depends_on_data": "bitfault.memory.plane_maps",
    "plane_map": "bitfault.memory.plane_maps",
    "rated": "bitfault.memory.plane_maps",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(_EXPORTS)


__all__ = sorted(_EXPORTS)
