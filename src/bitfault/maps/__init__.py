"""Fault maps: where the faults are, for one named tensor (``faultmap``)."""

from bitfault.maps.faultmap import FaultMap, bit_stream, name_key

__all__ = ["FaultMap", "bit_stream", "name_key"]
