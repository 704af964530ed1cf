"""bitfault: emulate hardware bit faults in neural networks, train through them, measure them.

The core (formats, fault models, fault maps, memories, injection, targets, specs) needs NumPy only;
``bitfault.torch`` and ``bitfault.keras`` import their framework when used.
"""

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults.models import BitFlip, StuckAt
from bitfault.formats import (
    GGUF,
    MX,
    NVFP4,
    FixedPoint,
    Float,
    GroupwiseInt,
    IntQuant,
    QuantParams,
    fixed_point_for,
)
from bitfault.inject import InjectionStats, inject, inject_with_stats
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory, StoredArray
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
    "GroupwiseInt",
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


# ---- modules that moved: the old import paths work for one more release, with a warning --
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED_MODULES = {
    "bitfault.storage": "bitfault.memory.storage",
    "bitfault.stored_faults": "bitfault.memory.plane_maps",
    "bitfault.protected": "bitfault.memory.decode",
    "bitfault.protection": "bitfault.memory.codes",
    "bitfault.selective": "bitfault.memory.selective",
    "bitfault.layout": "bitfault.memory.layout",
    "bitfault.lanes": "bitfault.memory.lanes",
    "bitfault.maps.wordfaults": "bitfault.faults.word_faults",
    "bitfault.maps.patterns": "bitfault.faults.patterns",
    "bitfault.cli_args": "bitfault.cli.args",
    "bitfault.gguf_memory": "bitfault.files.gguf_memory",
    "bitfault.stats": "bitfault.campaign.stats",
    "bitfault.text": "bitfault.data.text",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path (``MOVED_MODULES``) to the module at its new path, with a
    DeprecationWarning: the same module object, so classes and pickles stay one."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> object:
        new = MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path will be removed in the next "
                      "release", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: object) -> None:
        """The module at the new path is already executed."""


if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(MovedModuleFinder())
