"""Campaign grids: the list of trials a campaign evaluates, each with a stable key.

A trial is one simulated chip (or one single fault) evaluated on a dataset:
- rate sweep: chip ``c`` at bit error rate ``ber``; chip ``c`` uses seed
  ``base_seed + c`` at every rate and for every model, so maps are nested across
  rates and shared across models;
- layer sensitivity: the same, with faults confined to one tensor;
- bit sensitivity: the same, with faults confined to one bit position;
- single fault: one (tensor, element, bit).
Keys are strings built from the trial's fields, so a store can tell which trials
are done whatever order they ran in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from bitfault.maps import _check_rate

TrialKind = Literal["rate", "layer", "bit", "single"]
KINDS = ("rate", "layer", "bit", "single")


@dataclass(frozen=True)
class Trial:
    """One evaluation: which faults (by seed, rate, confinement) on which chip."""

    kind: TrialKind
    ber: float | None = None
    chip: int = 0
    seed: int = 0
    target: str | None = None
    bit: int | None = None
    element: int | None = None

    @property
    def key(self) -> str:
        parts = [self.kind, f"ber={self.ber!r}", f"chip={self.chip}", f"seed={self.seed}"]
        if self.target is not None:
            parts.append(f"target={self.target}")
        if self.bit is not None:
            parts.append(f"bit={self.bit}")
        if self.element is not None:
            parts.append(f"element={self.element}")
        return "|".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_bers(bers: Iterable[float]) -> tuple[float, ...]:
    values = tuple(_check_rate(b, "bers") for b in bers)
    if not values:
        raise ValueError("bers must list at least one bit error rate")
    return values


def _check_chips(chips: int) -> int:
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise ValueError(f"chips must be a positive integer, got {chips!r}")
    return chips


def rate_sweep(bers: Sequence[float], chips: int, base_seed: int = 0) -> list[Trial]:
    """``chips`` simulated chips at each rate; chip c has seed ``base_seed + c`` everywhere."""
    bers, chips = _check_bers(bers), _check_chips(chips)
    return [Trial("rate", ber, c, base_seed + c) for ber in bers for c in range(chips)]


def layer_sweep(bers: Sequence[float], chips: int, targets: Sequence[str],
                base_seed: int = 0) -> list[Trial]:
    """A rate sweep per tensor, faults confined to that tensor."""
    bers, chips = _check_bers(bers), _check_chips(chips)
    if not targets:
        raise ValueError("targets must name at least one tensor")
    return [Trial("layer", ber, c, base_seed + c, target=t)
            for t in targets for ber in bers for c in range(chips)]


def bit_sweep(bers: Sequence[float], chips: int, bits: Sequence[int],
              base_seed: int = 0) -> list[Trial]:
    """A rate sweep per bit position, faults confined to that position."""
    bers, chips = _check_bers(bers), _check_chips(chips)
    if not bits:
        raise ValueError("bits must name at least one bit position")
    return [Trial("bit", ber, c, base_seed + c, bit=int(b))
            for b in bits for ber in bers for c in range(chips)]


def single_faults(faults: Iterable[tuple[str, int, int]]) -> list[Trial]:
    """One trial per (tensor name, flat element index, bit position)."""
    trials = [Trial("single", None, 0, 0, target=t, bit=int(b), element=int(e))
              for t, e, b in faults]
    if not trials:
        raise ValueError("faults must list at least one (tensor, element, bit)")
    return trials


__all__ = ["KINDS", "Trial", "bit_sweep", "layer_sweep", "rate_sweep", "single_faults"]
