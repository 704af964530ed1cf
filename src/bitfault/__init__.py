"""bitfault: emulate hardware bit faults in neural networks, train through them, measure them.

The core (formats, fault models, fault maps, memories, injection, targets, specs) needs NumPy only;
``bitfault.torch`` and ``bitfault.keras`` import their framework when used.
"""

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults import BitFlip, StuckAt
from bitfault.formats import (
    GGUF,
    MX,
    NVFP4,
    FixedPoint,
    Float,
    IntQuant,
    QuantParams,
    fixed_point_for,
)
from bitfault.inject import InjectionStats, inject, inject_with_stats
from bitfault.maps import FaultMap
from bitfault.memory import Memory, StoredArray
from bitfault.spec import FaultSpec
from bitfault.targets import Targets

__version__ = "0.1.0"

__all__ = [
    "GGUF",
    "MX",
    "NVFP4",
    "ArgumentError",
    "ArgumentTypeError",
    "BitFlip",
    "FaultMap",
    "FaultSpec",
    "FixedPoint",
    "Float",
    "InjectionStats",
    "IntQuant",
    "Memory",
    "QuantParams",
    "StoredArray",
    "StuckAt",
    "Targets",
    "__version__",
    "fixed_point_for",
    "inject",
    "inject_with_stats",
]
