"""Whether a fault map fits a tensor's format: a map records the format it was drawn for,
and applying it to a tensor stored in another is an error unless converted explicitly."""

from __future__ import annotations

import json
from typing import Any

from bitfault.errors import ArgumentError
from bitfault.formats import Format
from bitfault.maps.faultmap import FaultMap


def check_map_format(fmap: FaultMap, fmt: Format, argument: str = "fmap") -> None:
    """ArgumentError naming ``argument`` unless ``fmap`` was drawn for ``fmt`` or records no
    format (``FaultMap.format``); ``fmap.for_format(fmt)`` converts one explicitly."""
    recorded = fmap.meta.get("format")
    if recorded is None:
        return
    try:
        drawn: Any = fmap.format  # parsed once per map
    except ValueError:  # a format this bitfault does not know: name what it records
        drawn = recorded
    if drawn == fmt:
        return
    # a subclass of a format (or one this bitfault cannot parse) records its base's fields:
    # the map fits when what it records is what ``fmt`` records
    if _format_key(recorded) == _format_key(fmt.to_dict()):
        return
    raise ArgumentError(argument, fmap, f"a map drawn for {fmt}",
                        requirement=f"{argument} {fmap.name!r} was drawn for {drawn}, the "
                                    f"tensor is stored in {fmt}; its bit positions mean other "
                                    "things there (draw a map for this format, or convert it "
                                    "explicitly: fmap.for_format(fmt))")


def _format_key(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str)


__all__ = ["check_map_format"]
