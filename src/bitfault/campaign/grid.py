"""Campaign grids: the list of trials a campaign evaluates, each with a stable key.

A trial is one simulated chip (or one single fault) evaluated on a dataset:
- rate sweep: chip ``c`` at bit error rate ``ber``; chip ``c`` uses seed
  ``base_seed + c`` at every rate and for every model, so maps are nested across
  rates and shared across models;
- layer sensitivity: the same, with faults confined to one tensor;
- bit sensitivity: the same, with faults confined to one bit position;
- single fault: one (tensor, element, bit); every one of chosen tensors
  (``exhaustive_single_faults``) or a random sample sized by Leveugle et al.'s
  formula (``sampled_single_faults``), in random order so that a campaign may stop
  early once its estimate is precise enough (``StopWhenPrecise``).
Keys are strings built from the trial's fields, so a store can tell which trials
are done whatever order they ran in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from bitfault.campaign.stats import fault_injection_sample_size
from bitfault.errors import check_int, check_rate, check_seed
from bitfault.faults.models import BitSelection, resolve_bits
from bitfault.formats import Format, is_format

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
    bit: int | str | None = None  # a bit position, or a field name in bit sweeps
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
    values = tuple(check_rate(b, "bers") for b in bers)
    if not values:
        raise ValueError("bers must list at least one bit error rate")
    return values


def rate_sweep(bers: Sequence[float], chips: int, base_seed: int = 0) -> list[Trial]:
    """``chips`` simulated chips at each rate; chip c has seed ``base_seed + c`` everywhere."""
    bers, chips = _check_bers(bers), check_int(chips, "chips", 1)
    return [Trial("rate", ber, c, base_seed + c) for ber in bers for c in range(chips)]


def layer_sweep(bers: Sequence[float], chips: int, targets: Sequence[str],
                base_seed: int = 0) -> list[Trial]:
    """A rate sweep per tensor, faults confined to that tensor."""
    bers, chips = _check_bers(bers), check_int(chips, "chips", 1)
    if not targets:
        raise ValueError("targets must name at least one tensor")
    return [Trial("layer", ber, c, base_seed + c, target=t)
            for t in targets for ber in bers for c in range(chips)]


def bit_sweep(bers: Sequence[float], chips: int, bits: Sequence[int | str],
              base_seed: int = 0) -> list[Trial]:
    """A rate sweep per bit position or field of the format (``"sign"``, ``"exponent"``,
    ...), faults confined to it (``run`` checks the names against the format)."""
    bers, chips = _check_bers(bers), check_int(chips, "chips", 1)
    if isinstance(bits, (str, int)) or not bits:
        raise ValueError(f"bits must list at least one bit position or field name, got "
                         f"{bits!r}")
    chosen: list[int | str] = []
    for b in bits:
        if isinstance(b, str):
            chosen.append(b)
        elif isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 0:
            chosen.append(int(b))
        else:
            raise TypeError(f"bits: each entry must be a bit position (int >= 0) or a field "
                            f"name, got {b!r}")
    return [Trial("bit", ber, c, base_seed + c, bit=b)
            for b in chosen for ber in bers for c in range(chips)]


def single_faults(faults: Iterable[tuple[str, int, int]]) -> list[Trial]:
    """One trial per (tensor name, flat element index, bit position)."""
    trials = [Trial("single", None, 0, 0, target=t, bit=int(b), element=int(e))
              for t, e, b in faults]
    if not trials:
        raise ValueError("faults must list at least one (tensor, element, bit)")
    return trials


def _single_cells(shapes: Mapping[str, Sequence[int]], fmt: Format, targets: Sequence[str] | None,
                  bits: BitSelection) -> tuple[list[str], np.ndarray, tuple[int, ...]]:
    """Chosen tensors, their element counts and the eligible bit positions."""
    if not is_format(fmt):
        raise TypeError(f"fmt must be a bitfault format (FixedPoint, IntQuant, Float), got {fmt!r}")
    if isinstance(targets, str):
        raise TypeError(f"targets must be a list of tensor names, got the string {targets!r}")
    names = list(shapes) if targets is None else list(dict.fromkeys(targets))
    unknown = [n for n in names if n not in shapes]
    if unknown or not names:
        raise ValueError(f"targets must name tensors of the model; unknown {unknown}, known "
                         f"{sorted(shapes)}")
    sizes = np.array([int(np.prod(shapes[n], dtype=np.int64)) for n in names], np.int64)
    return names, sizes, resolve_bits(bits, fmt, argument="bits")


def exhaustive_single_faults(shapes: Mapping[str, Sequence[int]], fmt: Format,
                             targets: Sequence[str] | None = None,
                             bits: BitSelection = None) -> list[Trial]:
    """One trial per (element, bit) of the ``targets`` tensors (all of ``shapes`` by
    default), ``bits`` limiting the positions (ints or field names of ``fmt``); in
    tensor, element, bit order. ``shapes``: ``evaluator.tensor_shapes()``."""
    names, sizes, positions = _single_cells(shapes, fmt, targets, bits)
    return [Trial("single", None, 0, 0, target=n, bit=b, element=e)
            for n, size in zip(names, sizes, strict=True)
            for e in range(int(size)) for b in positions]


def sampled_single_faults(shapes: Mapping[str, Sequence[int]], fmt: Format, *,
                          margin: float = 0.01, confidence: float = 0.95, p: float = 0.5,
                          size: int | None = None, seed: int = 0,
                          targets: Sequence[str] | None = None,
                          bits: BitSelection = None) -> list[Trial]:
    """A uniform random sample, without repeats, of the (element, bit) faults of
    ``exhaustive_single_faults``, in random order.

    Its size is ``stats.fault_injection_sample_size(population, margin, confidence, p)``
    (Leveugle et al., DATE 2009: enough faults to know the share of faults that cause
    a failure to within ``margin`` at ``confidence``; ``p = 0.5`` is the worst case),
    or ``size``. The same ``seed`` gives the same sample (for a given NumPy version).
    """
    names, sizes, positions = _single_cells(shapes, fmt, targets, bits)
    cells = sizes * len(positions)
    population = int(cells.sum())
    if population == 0:
        raise ValueError("the chosen tensors have no elements to fault")
    if size is None:
        size = fault_injection_sample_size(population, margin, confidence, p)
    elif isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not (
            1 <= size <= population):
        raise ValueError(f"size must be an integer in 1..{population} (the faults there are), "
                         f"got {size!r}")
    seed = check_seed(seed)
    picked = np.random.default_rng(seed).choice(population, int(size), replace=False)
    starts = np.concatenate([[0], np.cumsum(cells)])
    which = np.searchsorted(starts, picked, side="right") - 1
    local = picked - starts[which]
    elements, slots = np.divmod(local, len(positions))
    return [Trial("single", None, 0, 0, target=names[t], bit=positions[k], element=int(e))
            for t, e, k in zip(which.tolist(), elements.tolist(), slots.tolist(), strict=True)]


__all__ = ["KINDS", "Trial", "bit_sweep", "exhaustive_single_faults", "layer_sweep",
           "rate_sweep", "sampled_single_faults", "single_faults"]
