"""Number formats: how a float tensor is stored in memory, bit for bit, and back.

``base`` holds what formats share (the ``Format`` protocol, the registry of kinds that
``format_from_dict`` reads, ``QuantParams``, the container helpers); each format is one
module: ``fixed`` (FixedPoint), ``intquant`` (IntQuant), ``floats`` (Float), whose small
floats (float8/6/4 and the E8M0 scale) use the generic codec of ``minifloat``; ``blocks``
holds what the block formats share (planes, the block layout, ``IntCodes``).
"""

from bitfault.formats.base import (
    FORMATS,
    Format,
    FormatBase,
    QuantParams,
    check_float_input,
    container_dtype,
    format_from_dict,
    gradient_bounds,
    is_format,
)
from bitfault.formats.blocks import (
    BlockFormat,
    BlockLayout,
    IntCodes,
    Plane,
    is_block_format,
    plane_formats,
    plane_map_name,
    split_by_plane,
)
from bitfault.formats.fixed import FixedPoint
from bitfault.formats.intquant import IntQuant

# isort: split
# imported last, so the registry (and its error messages) lists fixed_point, int_quant, float
from bitfault.formats.floats import Float

__all__ = [
    "FORMATS",
    "BlockFormat",
    "BlockLayout",
    "FixedPoint",
    "Float",
    "Format",
    "FormatBase",
    "IntCodes",
    "IntQuant",
    "Plane",
    "QuantParams",
    "check_float_input",
    "container_dtype",
    "format_from_dict",
    "gradient_bounds",
    "is_block_format",
    "is_format",
    "plane_formats",
    "plane_map_name",
    "split_by_plane",
]
