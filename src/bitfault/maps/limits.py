"""How large a random map may be: checked before it is drawn, so a mistyped shape or rate is
an error naming the argument instead of an int64 overflow or the kernel killing the process.

A map addresses at most ``MAX_CELLS`` (2^62) bit cells (elements x bits), holds at most
``MAX_MAP_FAULTS`` (2^31) expected faulty bits, and is not drawn when drawing it would need
more memory than the machine has available (about ``BYTES_PER_FAULT`` bytes per faulty bit
while it is drawn).
"""

from __future__ import annotations

import math
import os
from typing import Any

from bitfault.errors import ArgumentError

MAX_CELLS = 1 << 62  # element x bit cells a map addresses (int64 cell numbers)
MAX_MAP_FAULTS = 1 << 31  # expected faulty bits in one map
BYTES_PER_FAULT = 48  # peak bytes per faulty bit while a map is drawn and sorted
_DENSE_CELLS = 1 << 30  # the sampler marks cells densely up to this many (one byte each)


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``, else the free
    physical pages), None where the system does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def check_map_size(shape: tuple[int, ...], width: int, faults: float, argument: str,
                   value: Any) -> None:
    """ArgumentError naming ``argument`` (``"ber"`` or ``"count"``, given ``value``) unless a
    map of ``shape`` in ``width``-bit words with ``faults`` expected faulty bits can be
    drawn: its cells addressable, its faults within ``MAX_MAP_FAULTS`` and the memory to
    draw it available."""
    n = math.prod(shape)
    where = f"shape {tuple(shape)} ({n:,} elements x {width} bits)"
    if n * width > MAX_CELLS:
        raise ArgumentError("shape", tuple(shape), "at most 2^62 bit cells (elements x bits)",
                            requirement=f"shape {tuple(shape)} has {n * width:.3g} bit cells "
                                        f"({n:,} elements x {width} bits); a map addresses "
                                        "at most 2^62")
    if faults > MAX_MAP_FAULTS:
        raise ArgumentError(argument, value, "a rate or count for at most 2^31 faulty bits",
                            requirement=f"{argument} {value!r} on {where} means about "
                                        f"{faults:.3g} faulty bits; a map holds at most 2^31 "
                                        f"({MAX_MAP_FAULTS:,}): use a smaller shape or "
                                        f"{argument}")
    need = BYTES_PER_FAULT * faults + (n * width if faults > 2 * n and
                                       n * width <= _DENSE_CELLS else 0)
    have = available_memory() if need > 1 << 28 else None  # small maps: do not ask
    if have is not None and need > have:
        raise ArgumentError(argument, value, "a rate or count whose map fits in memory",
                            requirement=f"{argument} {value!r} on {where} means about "
                                        f"{faults:.3g} faulty bits, about {need / 2**30:.1f} "
                                        f"GiB to draw; {have / 2**30:.1f} GiB of memory is "
                                        f"available: use a smaller shape or {argument}")


__all__ = ["BYTES_PER_FAULT", "MAX_CELLS", "MAX_MAP_FAULTS", "available_memory",
           "check_map_size"]
