"""Fault maps: where the faults are, for one named tensor.

A map is sparse: sorted flat element indices and, for each, a mask of faulty bits
(``faultmap``). Random maps come from NumPy (PCG64) streams keyed by (seed, tensor
name, step), nested across rates, at a cost proportional to the faults
(``sampling``); maps keep their provenance in ``.npz`` files (``files``).
"""

from bitfault.maps.faultmap import FaultMap, popcount
from bitfault.maps.files import MAP_FILE_VERSION
from bitfault.maps.map_format import check_map_format
from bitfault.maps.sampling import bit_stream, cell_stream, name_key

__all__ = ["MAP_FILE_VERSION", "FaultMap", "bit_stream", "cell_stream", "check_map_format",
           "name_key", "popcount"]
