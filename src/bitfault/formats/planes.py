"""Which plane of a stored tensor a bit selection or a rate names.

A plain format stores one plane, ``codes``; a block format (``formats.blocks``) several.
``"scale"`` names every bit of the scale plane, ``"scale.exponent"`` a field of it,
``"scale.7"`` its bit 7; any other entry (a position, a field name) the codes plane.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError
from bitfault.formats.base import Format
from bitfault.formats.blocks import CODES, FIELD_SEPARATOR, BlockFormat
from bitfault.formats.intquant import IntQuant


def is_block_format(fmt: Any) -> bool:
    """Whether ``fmt`` stores several planes (a ``BlockFormat``)."""
    return isinstance(fmt, BlockFormat)


def channel_axis(fmt: Any) -> int | None:
    """The axis a format's quantisation parameters run along (an ``IntQuant``'s per-channel
    axis, possibly negative); None where one set covers the tensor, and for block formats,
    whose blocks follow their layout's axis."""
    return fmt.axis if isinstance(fmt, IntQuant) else None


def plane_formats(fmt: Format) -> dict[str, Format]:
    """Every plane's word format by plane name; a plain format is its own codes plane."""
    if isinstance(fmt, BlockFormat):
        return {p.name: p.format for p in fmt.planes}
    return {CODES: fmt}


def _split_key(key: Any, fmt: Format, argument: str) -> tuple[str, Any]:
    """(plane, the key within the plane) of one bit selection entry or rate key."""
    names = tuple(plane_formats(fmt))
    if isinstance(key, str) and FIELD_SEPARATOR in key:
        plane, field = key.split(FIELD_SEPARATOR, 1)
        if plane not in names:
            raise ArgumentError(argument, key, f"'<plane>.<field>' with a plane of {names}",
                                requirement=f"{argument}: {key!r} names no plane of "
                                            f"{type(fmt).__name__}; its planes: {names}")
        return plane, int(field) if field.isdigit() else field  # "scale.7": bit 7 of a scale
    if isinstance(key, str) and key in names and len(names) > 1:
        return key, "all"
    codes = plane_formats(fmt)[CODES]
    if isinstance(key, str) and len(names) > 1 and key not in {*codes.bit_fields, "msb",
                                                                 "lsb", "all"}:
        allowed = f"a plane of {names}, '<plane>.<field>' or a field of the codes " \
                  f"{sorted(codes.bit_fields)}"
        raise ArgumentError(argument, key, allowed,
                            requirement=f"{argument}: {key!r} is neither a plane of "
                                        f"{type(fmt).__name__} nor a field of its codes; "
                                        f"allowed: {allowed}")
    return CODES, key


def split_by_plane(selection: Any, fmt: Format, argument: str = "bits") -> dict[str, Any]:
    """A bit selection (or a rate mapping) split by plane: ``{plane: its part}``, only the
    planes it selects. None selects every bit of every plane; ``"scale"`` every bit of the
    scale plane; ``"scale.exponent"`` a field of it and ``"scale.7"`` its bit 7; other
    entries the codes plane."""
    names = tuple(plane_formats(fmt))
    if selection is None:
        return dict.fromkeys(names)
    if isinstance(selection, Mapping):
        parts: dict[str, dict[Any, Any]] = {}
        for key, value in selection.items():
            plane, sub = _split_key(key, fmt, argument)
            parts.setdefault(plane, {})[sub] = value
        return {n: parts[n] for n in names if n in parts}
    items = [selection] if isinstance(selection, (str, int, np.integer)) else list(selection)
    lists: dict[str, list[Any]] = {}
    for item in items:
        plane, sub = _split_key(item, fmt, argument)
        lists.setdefault(plane, []).append(sub)
    return {n: lists[n] for n in names if n in lists}


__all__ = ["channel_axis", "is_block_format", "plane_formats", "split_by_plane"]
