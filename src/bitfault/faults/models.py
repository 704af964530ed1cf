"""Fault models: what a fault does to a stored word, as a bit mask.

A bit flip XORs the mask in, stuck-at-0 clears it (AND NOT), stuck-at-1 sets it
(OR). ``bits=`` limits the positions a model may touch: integers (0 is the
least significant bit) or field names of the format ("sign", "exponent",
"mantissa", "integer", "fraction", "magnitude") plus "msb", "lsb" and "all".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.formats import Format, is_block_format, plane_formats, split_by_plane
from bitfault.formats.blocks import CODES

BitSelection = int | str | Sequence[int | str] | None


def resolve_bits(bits: BitSelection, fmt: Format, argument: str = "bits") -> tuple[int, ...]:
    """Turn a bit selection into sorted, distinct bit positions of ``fmt``'s words."""
    width = fmt.bits
    if bits is None:
        return tuple(range(width))
    items = [bits] if isinstance(bits, (int, str, np.integer)) else list(bits)
    fields = {**fmt.bit_fields, "msb": (width - 1,), "lsb": (0,), "all": tuple(range(width))}
    positions: set[int] = set()
    for item in items:
        if isinstance(item, str):
            if item not in fields:
                allowed = f"{sorted(fields)} or positions 0..{width - 1}"
                raise ArgumentError(argument, item, allowed,
                                    requirement=f"{argument}: unknown bit field {item!r} for "
                                                f"{type(fmt).__name__}; allowed: {allowed}")
            positions.update(fields[item])
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            if not 0 <= int(item) < width:
                raise ArgumentError(argument, item, f"positions 0..{width - 1}",
                                    requirement=f"{argument}: bit position {item} is outside "
                                                f"0..{width - 1} for a {width}-bit word")
            positions.add(int(item))
        else:
            raise ArgumentTypeError(argument, item, "ints or field names",
                                    requirement=f"{argument}: entries must be ints or field "
                                                "names", tail=f", got {item!r}")
    if not positions:
        raise ArgumentError(argument, bits, "at least one bit position",
                            requirement=f"{argument}: selects no bit position")
    return tuple(sorted(positions))


def resolve_plane_bits(bits: BitSelection, fmt: Format, argument: str = "bits"
                       ) -> dict[str, tuple[int, ...]]:
    """``resolve_bits`` for every plane of ``fmt`` the selection names (a plain format has
    one, "codes"): ``{plane: positions}``; ``"scale.exponent"`` or ``"scale.7"`` select in
    the scale plane (``formats.split_by_plane``)."""
    formats = plane_formats(fmt)
    parts = split_by_plane(bits, fmt, argument) if is_block_format(fmt) else {CODES: bits}
    if not parts:
        raise ArgumentError(argument, bits, f"bits of at least one plane of {tuple(formats)}")
    return {plane: resolve_bits(sub, formats[plane], argument) for plane, sub in parts.items()}


def bit_names(fmt: Format, positions: dict[str, tuple[int, ...]]) -> list[int | str]:
    """Every bit of ``positions`` (``resolve_plane_bits``' result) as a bit sweep names it:
    the codes' positions as ints, another plane's as ``"scale.7"``."""
    return [p if plane == CODES else f"{plane}.{p}"
            for plane in plane_formats(fmt) for p in positions.get(plane, ())]


def positions_to_mask(positions: Sequence[int]) -> int:
    mask = 0
    for p in positions:
        mask |= 1 << int(p)
    return mask


def _normalise_bits(bits: Any) -> Any:
    """Plain Python values (NumPy ints become ints), so a model compares and serialises."""
    if bits is None or isinstance(bits, (str, bool)):
        return bits
    if isinstance(bits, (int, np.integer)):
        return int(bits)
    try:
        items = tuple(bits)
    except TypeError:
        raise ArgumentTypeError("bits", bits, "None, a bit position, a field name or a "
                                "sequence of them") from None
    return tuple(int(b) if isinstance(b, np.integer) and not isinstance(b, bool) else b
                 for b in items)


@dataclass(frozen=True)
class _FaultBase:
    bits: BitSelection = None
    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", _normalise_bits(self.bits))

    def eligible_bits(self, fmt: Format, plane: str = CODES) -> tuple[int, ...]:
        """The bit positions of ``plane``'s words of ``fmt`` this model may fault (none
        for a plane of a block format its ``bits`` leave out)."""
        if not is_block_format(fmt):
            if plane != CODES:
                raise ArgumentError("plane", plane, f"{CODES!r}: {type(fmt).__name__} "
                                    "stores one plane")
            return resolve_bits(self.bits, fmt)
        return self.eligible_planes(fmt).get(plane, ())

    def eligible_planes(self, fmt: Format) -> dict[str, tuple[int, ...]]:
        """The eligible bit positions of every plane of ``fmt`` that ``bits`` selects
        (``"scale"``, ``"scale.exponent"``, ...; see ``formats.split_by_plane``)."""
        return resolve_plane_bits(self.bits, fmt)

    def eligible_mask(self, fmt: Format, plane: str = CODES) -> int:
        """The mask of ``eligible_bits``."""
        if self.bits is None:  # every bit of the word
            return (1 << plane_formats(fmt)[plane].bits) - 1
        return positions_to_mask(self.eligible_bits(fmt, plane))

    def apply(self, words: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Apply per-word masks (same dtype and shape as ``words``); returns new words."""
        raise NotImplementedError

    def changed_bits(self, words: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """For each word, the mask of bits that applying this fault actually changes."""
        return np.bitwise_xor(self.apply(words, masks), words)

    def to_dict(self) -> dict[str, Any]:
        bits = list(self.bits) if isinstance(self.bits, tuple) else self.bits
        return {"kind": self.kind, "bits": bits}


@dataclass(frozen=True)
class BitFlip(_FaultBase):
    """Invert the faulty bits (XOR)."""

    kind: ClassVar[str] = "bit_flip"

    def apply(self, words: np.ndarray, masks: np.ndarray) -> np.ndarray:
        return np.bitwise_xor(words, masks)


@dataclass(frozen=True, init=False)
class StuckAt(_FaultBase):
    """Force the faulty bits to ``value`` (0: AND NOT, 1: OR)."""

    value: int = 0
    kind: ClassVar[str] = "stuck_at"

    def __init__(self, value: int, bits: BitSelection = None) -> None:
        if isinstance(value, bool) or value not in (0, 1):
            raise ArgumentError("value", value, "0 or 1")
        object.__setattr__(self, "value", int(value))
        object.__setattr__(self, "bits", _normalise_bits(bits))

    def apply(self, words: np.ndarray, masks: np.ndarray) -> np.ndarray:
        if self.value == 0:
            return np.bitwise_and(words, np.invert(masks))
        return np.bitwise_or(words, masks)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "value": self.value}


FaultModel = BitFlip | StuckAt


def check_fault_model(fault: Any, argument: str = "fault") -> FaultModel:
    """``fault`` if it is a fault model (BitFlip, StuckAt); TypeError naming ``argument``."""
    if not isinstance(fault, _FaultBase):
        raise ArgumentTypeError(argument, fault, "BitFlip() or StuckAt(0|1)")
    return fault  # type: ignore[return-value]


def as_fault_model(value: Any, argument: str = "fault") -> FaultModel:
    """A fault model from a fault model or its ``to_dict()`` form; TypeError otherwise."""
    if isinstance(value, Mapping):
        value = fault_from_dict(dict(value))
    return check_fault_model(value, argument)


def fault_from_dict(data: dict[str, Any]) -> FaultModel:
    """Rebuild a fault model from ``to_dict()`` output; errors are ArgumentErrors."""
    kinds = "'bit_flip' or 'stuck_at'"
    if not isinstance(data, dict) or "kind" not in data:
        raise ArgumentError("kind", data, kinds, requirement=f"a fault dict needs a 'kind' key "
                            f"({kinds})", tail=f"; got {data!r}")
    kind = data["kind"]
    rest = {k: v for k, v in data.items() if k != "kind"}
    allowed = {"bit_flip": {"bits"}, "stuck_at": {"bits", "value"}}
    if kind not in tuple(allowed):  # a tuple: an unhashable kind is just not one of them
        raise ArgumentError("fault kind", kind, kinds)
    unknown = sorted(set(rest) - allowed[kind])
    if unknown:
        raise ArgumentError("data", unknown, f"keys of {sorted(allowed[kind])}",
                            requirement=f"unknown key(s) {unknown} for fault {kind!r}; "
                                        f"allowed: {sorted(allowed[kind])}")
    bits = rest.get("bits")
    if kind == "bit_flip":
        return BitFlip(bits=bits)
    if "value" not in rest:
        raise ArgumentError("value", None, "0 or 1",
                            requirement="a 'stuck_at' fault needs 'value' (0 or 1)")
    return StuckAt(rest["value"], bits=bits)


__all__ = ["BitFlip", "FaultModel", "StuckAt", "as_fault_model", "bit_names",
           "check_fault_model", "fault_from_dict", "resolve_bits", "resolve_plane_bits"]
