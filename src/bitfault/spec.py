"""FaultSpec: one validated description of a fault experiment, shared by every adapter.

A spec says how tensors are stored (format), what a fault does (fault model),
where faults come from (a bit error rate, an exact count per tensor, or
explicit maps by tensor name), which tensors are hit (targets), whether the
faults stay (permanent: one chip) or change (transient: a fresh map every step
or every forward call), and how gradients flow ("ste" straight through to the
clean weights, or "blocked" as in the seed program's bug). It round-trips
through JSON, so the CLI, PyTorch and Keras all read the same thing. It composes
smaller values: ``spec.memory`` (format + fault model: what evaluators and stored
tensors take) and ``spec.source`` (rate | count | maps, and the seed); its targets
are a ``bitfault.targets.Targets``: kinds, narrowed by include/exclude name patterns.

Tensor names follow PyTorch: ``"<module path>.weight"``, ``"<module path>.bias"``
and ``"<module path>.output"`` for activations; layouts are PyTorch's too
(a Dense kernel is mapped as ``(out, in)``), so one seed gives the same faulty
weights in every framework.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice, check_rate, check_seed
from bitfault.faults.models import BitFlip, FaultModel
from bitfault.formats import FixedPoint, Format, is_block_format, plane_formats, plane_map_name
from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory, check_map_fits
from bitfault.targets import Targets

TARGETS = ("weights", "biases", "activations", "buffers")
PERSISTENCES = ("permanent", "transient")
RESAMPLES = ("step", "forward")
GRADIENTS = ("ste", "blocked")
_SOURCES = ("ber", "count", "maps")
SPEC_KEYS = ("format", "fault", "ber", "count", "maps", "seed", "targets", "persistence",
             "resample", "gradient", "storage")

Rate = float | Sequence[float] | Mapping[Any, float]


def _map_from_json(name: str, value: Any) -> FaultMap:
    """The FaultMap ``maps[name]`` gives; a file or dict it cannot be read from is an
    ArgumentError (ArgumentTypeError) of ``maps[name]`` with the reader's message."""
    argument, allowed = f"maps[{name!r}]", "a FaultMap, an .npz path or a dict with shape, " \
                                           "indices and masks"
    if isinstance(value, FaultMap):
        return value
    try:
        if isinstance(value, (str, os.PathLike)):
            return FaultMap.load(value, name=None)
        if isinstance(value, Mapping) and {"shape", "indices", "masks"} <= set(value):
            return FaultMap(tuple(value["shape"]), np.asarray(value["indices"], np.int64),
                            np.asarray(value["masks"], np.uint32), str(value.get("name", name)),
                            dict(value.get("meta", {})))
    except TypeError as exc:
        raise ArgumentTypeError(argument, value, allowed, requirement=str(exc)) from exc
    except ValueError as exc:
        raise ArgumentError(argument, value, allowed, requirement=str(exc)) from exc
    raise ArgumentError(argument, value, allowed, tail=f"; got {type(value).__name__}")


def _rates(ber: Any) -> tuple[float, ...]:
    """One rate per bit position as floats (checked against the format later)."""
    rates = []
    for i, v in enumerate(ber):
        try:
            rates.append(float(v))
        except TypeError as exc:
            raise ArgumentTypeError(f"ber[{i}]", v, "a number", requirement=str(exc)) from None
        except ValueError as exc:
            raise ArgumentError(f"ber[{i}]", v, "a number", requirement=str(exc)) from None
    return tuple(rates)


@dataclass(frozen=True)
class Source:
    """Where faults come from: a bit error rate (``ber``: one, one per bit position, or by
    bit name), an exact ``count`` of faulty bits per tensor, or explicit ``maps`` by tensor
    name; exactly one of them, with the ``seed`` of the random ones."""

    ber: Rate | None = None
    count: int | None = None
    maps: Mapping[str, FaultMap] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        sources = [s for s in _SOURCES if getattr(self, s) is not None]
        if len(sources) != 1:
            raise ArgumentError("source", sources, "exactly one of ber=, count= or maps=",
                                requirement="give exactly one of ber=, count= or maps=",
                                tail=f"; got {sources or 'none'}")
        if self.ber is not None:
            b = self.ber
            if isinstance(b, Mapping):
                object.__setattr__(self, "ber", dict(b))
            elif isinstance(b, (Sequence, np.ndarray)) and not isinstance(b, str):
                object.__setattr__(self, "ber", _rates(b))
            else:
                object.__setattr__(self, "ber", check_rate(b, "ber"))
        if self.count is not None and (isinstance(self.count, bool) or not isinstance(
                self.count, (int, np.integer)) or self.count < 0):
            raise ArgumentError("count", self.count, "a non-negative integer (faulty bits per "
                                "tensor)")
        if self.maps is not None:
            if not isinstance(self.maps, Mapping) or not self.maps:
                allowed = "a non-empty mapping from tensor name to FaultMap"
                raise ArgumentError("maps", self.maps, allowed,
                                    requirement=f"maps must be {allowed}")
            object.__setattr__(self, "maps", {str(k): _map_from_json(str(k), v)
                                              for k, v in self.maps.items()})
        object.__setattr__(self, "seed", check_seed(self.seed))

    def check_for(self, memory: Memory) -> None:
        """Raise unless the rate fits ``memory`` (one rate per bit of its format, bit names
        of its format, within the fault model's eligible bits)."""
        if self.ber is not None:
            axis = memory.format.axis if is_block_format(memory.format) else 0  # must exist
            shape = (1,) * (axis + 1 if axis >= 0 else -axis)
            FaultMap.random(shape, memory.format, ber=self.ber, bits=memory.fault.bits)

    def map_for(self, name: str, shape: tuple[int, ...], memory: Memory,
                step: int | None = None, values: Any = None) -> FaultMap:
        """The fault map of tensor ``name`` stored in ``memory``; ``step`` None: permanent;
        ``values``: the clean tensor, which a data-dependent memory draws with.

        With explicit maps, a tensor without an entry gets an empty map; a block-format
        tensor's other planes come from the entries named ``"<name>:<plane>"``.
        """
        if self.maps is not None:
            fmap = self.maps.get(name) or FaultMap.empty(shape, name)
            if tuple(fmap.shape) != tuple(shape):
                raise ArgumentError(f"maps[{name!r}]", fmap, f"a map for shape {tuple(shape)}",
                                    requirement=f"maps[{name!r}] is for shape "
                                                f"{tuple(fmap.shape)}, the tensor has shape "
                                                f"{tuple(shape)}")
            planes = {p: m for p in plane_formats(memory.format) if p != CODES
                      and (m := self.maps.get(plane_map_name(name, p))) is not None}
            if planes:  # a block format's other planes, by their own names ("w:scale")
                fmap = FaultMap(fmap.shape, fmap.indices, fmap.masks, fmap.name, fmap.meta,
                                {**fmap.planes, **planes})
                check_map_fits(fmap, tuple(shape), memory.format, f"maps[{name!r}]")
            return fmap
        return memory.random_map(shape, ber=self.ber, count=self.count, seed=self.seed,
                                 name=name, bits=memory.fault.bits, step=step, values=values)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the keys ber, count, maps, seed of a spec's ``to_dict``)."""
        ber: Any = self.ber
        if isinstance(ber, tuple):
            ber = list(ber)
        maps = None
        if self.maps is not None:
            maps = {k: {"name": m.name, "shape": list(m.shape), "indices": m.indices.tolist(),
                        "masks": m.masks.tolist(), "meta": m.meta} for k, m in self.maps.items()}
        return {"ber": ber, "count": None if self.count is None else int(self.count),
                "maps": maps, "seed": self.seed}


@dataclass(frozen=True)
class FaultSpec:
    """What to fault, how, and how gradients flow. Exactly one of ber, count, maps."""

    format: Format = field(default_factory=lambda: FixedPoint(32, 28, rounding="trunc"))
    fault: FaultModel = field(default_factory=BitFlip)
    ber: Rate | None = None
    count: int | None = None
    maps: Mapping[str, FaultMap] | None = None
    seed: int = 0
    targets: Targets | str | Sequence[str] | Mapping[str, Any] = ("weights",)
    persistence: Literal["permanent", "transient"] = "permanent"
    resample: Literal["step", "forward"] = "step"
    gradient: Literal["ste", "blocked"] = "ste"
    storage: Any = None

    def __post_init__(self) -> None:
        memory = Memory(self.format, self.fault, storage=self.storage)
        object.__setattr__(self, "storage", memory.storage)
        if self.storage is not None and self.count is not None:
            raise ArgumentError("count", self.count, "None with storage= (give ber=)",
                                requirement="count= cannot place a stored memory's faults: "
                                            "its pattern draws at a rate (give ber=)")
        object.__setattr__(self, "format", memory.format)
        object.__setattr__(self, "fault", memory.fault)
        source = Source(self.ber, self.count, self.maps, self.seed)
        source.check_for(memory)
        for key in ("ber", "count", "maps", "seed"):
            object.__setattr__(self, key, getattr(source, key))
        object.__setattr__(self, "targets", Targets.coerce(self.targets, kinds=TARGETS))
        check_choice(self.persistence, PERSISTENCES, "persistence")
        check_choice(self.resample, RESAMPLES, "resample")
        check_choice(self.gradient, GRADIENTS, "gradient")
        if self.persistence == "transient" and self.maps is not None:
            raise ArgumentError("persistence", self.persistence, "'permanent' with maps=",
                                requirement="persistence='transient' needs ber= or count= "
                                            "(fresh maps are drawn each step); explicit maps= "
                                            "are permanent")
        self.__dict__["_memory"], self.__dict__["_source"] = memory, source

    @property
    def memory(self) -> Memory:
        """How tensors are stored and what a fault does: the format and the fault model."""
        return self.__dict__["_memory"]

    @property
    def source(self) -> Source:
        """Where the faults come from: the rate, count or maps, and the seed."""
        return self.__dict__["_source"]

    # ---- maps ----------------------------------------------------------------------------

    def map_for(self, name: str, shape: tuple[int, ...], step: int | None = None,
                values: Any = None) -> FaultMap:
        """The fault map of tensor ``name`` (shape in PyTorch layout) at ``step``.

        Permanent specs ignore ``step``. With explicit maps, a tensor without an
        entry gets an empty map. ``values``: the clean tensor (NumPy, PyTorch layout),
        which a data-dependent memory (``memory.data_dependent``) needs: its map is the
        XOR map for those values.
        """
        use_step = step if self.persistence == "transient" else None
        return self.source.map_for(name, shape, self.memory, step=use_step, values=values)

    def replace(self, **changes: Any) -> FaultSpec:
        """A copy with some fields changed (validated again).

        Giving one of ber=, count= or maps= clears the other two.
        """
        sources = ("ber", "count", "maps")
        if any(k in changes for k in sources):
            for k in sources:
                changes.setdefault(k, None)
        return dataclasses.replace(self, **changes)

    # ---- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``FaultSpec.from_dict`` rebuilds an equal spec."""
        return {**self.memory.to_dict(), **self.source.to_dict(),
                "targets": self.targets.describe(), "persistence": self.persistence,
                "resample": self.resample, "gradient": self.gradient}

    @classmethod
    def coerce(cls, spec: Any) -> FaultSpec:
        """A FaultSpec from a FaultSpec or its ``to_dict()`` form; TypeError otherwise."""
        if isinstance(spec, FaultSpec):
            return spec
        if isinstance(spec, Mapping):
            return cls.from_dict(spec)
        raise ArgumentTypeError("spec", spec, "a bitfault.FaultSpec (or its to_dict() form)",
                                tail=f", got {type(spec).__name__}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultSpec:
        if not isinstance(data, Mapping):
            raise ArgumentTypeError("data", data, "a mapping", requirement="a spec must be a "
                                    "mapping", tail=f", got {type(data).__name__}")
        unknown = sorted(set(data) - set(SPEC_KEYS))
        if unknown:
            raise ArgumentError("data", unknown, f"keys of {list(SPEC_KEYS)}",
                                requirement=f"unknown spec key(s) {unknown}; allowed: "
                                            f"{list(SPEC_KEYS)}")
        args = dict(data)
        if isinstance(args.get("ber"), Mapping):
            args["ber"] = {(int(k) if str(k).isdigit() else k): v for k, v in args["ber"].items()}
        return cls(**args)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> FaultSpec:
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FaultSpec):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


__all__ = ["SPEC_KEYS", "FaultSpec", "Source"]
