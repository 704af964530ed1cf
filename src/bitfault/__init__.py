"""bitfault: emulate hardware bit faults in neural networks, train through them, measure them.

The core (formats, fault models, fault maps, injection, specs) needs NumPy only;
``bitfault.torch`` and ``bitfault.keras`` import their framework when used.
"""

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults import BitFlip, StuckAt
from bitfault.formats import FixedPoint, Float, IntQuant, QuantParams
from bitfault.inject import InjectionStats, StoredArray, inject, inject_with_stats
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "BitFlip",
    "FaultMap",
    "FaultSpec",
    "FixedPoint",
    "Float",
    "InjectionStats",
    "IntQuant",
    "QuantParams",
    "StoredArray",
    "StuckAt",
    "__version__",
    "inject",
    "inject_with_stats",
]
