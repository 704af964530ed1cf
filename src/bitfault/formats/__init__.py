"""Number formats: how a float tensor is stored in memory, bit for bit, and back.

``base`` holds what formats share (the ``Format`` protocol, the registry of kinds that
``format_from_dict`` reads, ``QuantParams``, the container helpers); each format is one
module: ``fixed`` (FixedPoint), ``intquant`` (IntQuant), ``floats`` (Float), whose small
floats (float8/6/4 and the E8M0 scale) use the generic codec of ``minifloat``; ``blocks``
holds what the block formats share (planes, the block layout, ``IntCodes``), ``planes``
which plane a bit selection names; the block formats are ``mx`` (OCP MX), ``nvfp4``,
``gguf`` (llama.cpp's Q8_0/Q4_0/Q4_1) and ``groupwise`` (group-wise integers).
"""

import importlib
from typing import Any

from bitfault.formats.base import (
    FORMATS,
    Format,
    FormatBase,
    QuantParams,
    format_from_dict,
)
from bitfault.formats.blocks import BlockFormat, BlockLayout, IntCodes, Plane
from bitfault.formats.fit import fixed_point_for
from bitfault.formats.fixed import FixedPoint
from bitfault.formats.intquant import IntQuant

# isort: split
# imported after those, so the registry (and its error messages) lists fixed_point,
# int_quant, float, then the block formats
from bitfault.formats.floats import Float

# isort: split
from bitfault.formats.gguf import GGUF, GGUF_TYPES
from bitfault.formats.groupwise import GroupwiseInt
from bitfault.formats.mx import MX
from bitfault.formats.nvfp4 import NVFP4

# helpers the other bitfault packages use, importable from here but not part of ``__all__``
_HELPERS = {
    "channel_axis": "bitfault.formats.planes",
    "check_float_input": "bitfault.formats.base",
    "container_dtype": "bitfault.formats.base",
    "gradient_bounds": "bitfault.formats.base",
    "is_format": "bitfault.formats.base",
    "plane_map_name": "bitfault.formats.blocks",
    "is_block_format": "bitfault.formats.planes",
    "plane_formats": "bitfault.formats.planes",
    "split_by_plane": "bitfault.formats.planes",
}


def __getattr__(name: str) -> Any:
    module = _HELPERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "FORMATS",
    "GGUF",
    "GGUF_TYPES",
    "MX",
    "NVFP4",
    "BlockFormat",
    "BlockLayout",
    "FixedPoint",
    "Float",
    "Format",
    "FormatBase",
    "GroupwiseInt",
    "IntCodes",
    "IntQuant",
    "Plane",
    "QuantParams",
    "fixed_point_for",
    "format_from_dict",
]
