"""Storage: how a memory holds its planes physically (word layout, protection, fault pattern).

A ``Memory`` without ``storage`` faults the format's words directly (independent bits at
the spec's rate, today's maps). With a ``Storage``, each plane's words pack into memory
words (``WordLayout``), every memory word carries the check bits of its protection
scheme (per plane if given as a mapping), the fault pattern is drawn over the physical
bits (data and check) at the spec's or the trial's rate, and the real decoder turns it
into the element-level flip map the rest of bitfault applies (``protected``,
``stored_faults``). ``protected_bits`` protects chosen bit positions of a plane only: they
sit in their own protected words, the other bits in unprotected ones (``selective``).
Decoding under policy "flag" depends only on the error pattern, so the map holds for any
data a plane stores (a weight that trains keeps it); policy "zero" and asymmetric cells
depend on the stored data (``data_dependent``): their maps are drawn with the clean
stored words (``random_map(words=)``). Each plane map's ``meta["outcomes"]`` counts raw
bit errors and the words corrected, detected (DUE) and silently corrupted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from bitfault.errors import ArgumentError, ArgumentTypeError, check_rate
from bitfault.faults.patterns import IndependentBits, pattern_from_dict
from bitfault.formats import Format, plane_formats, plane_map_name
from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap
from bitfault.memory.codes import NoProtection, Protection, protection_from_dict
from bitfault.memory.decode import RATE_FIELDS
from bitfault.memory.layout import WordLayout
from bitfault.memory.plane_maps import StoredWords, depends_on_data, plane_map, rated
from bitfault.memory.selective import Part, check_protected_bits, split_overhead, split_parts

_KEYS = ("word_bits", "row_words", "interleave", "protection", "pattern", "protected_bits",
         "protected_tensors")


def _scheme(value: Any, argument: str) -> Protection:
    if isinstance(value, (str, Mapping)):
        return protection_from_dict(value)
    if not hasattr(value, "check_bits") or not hasattr(value, "decode"):
        raise ArgumentTypeError(argument, value, "'none', 'parity', 'secded', a mapping "
                                "{kind, policy} or a protection scheme")
    return value


def _pattern(value: Any) -> Any:
    if isinstance(value, Mapping):
        kind = value.get("kind")
        rate = RATE_FIELDS.get(kind)
        value = pattern_from_dict({rate: 0.0, **value} if rate else value)
    rated(value, 0.0)  # a kind whose rate the spec sets
    return value


@dataclass(frozen=True)
class Storage:
    """Planes packed into ``layout`` words, protected by ``protection`` (one scheme, or
    ``{plane: scheme}`` with the planes left out unprotected), faulted by ``pattern``
    (its rate comes from the spec or the trial). ``protected_bits``: protect only these
    bit positions (a sequence: of the codes plane; ``{plane: positions}``), stored apart
    in protected words, the plane's other bits in unprotected words (``selective``).
    ``protected_tensors``: name patterns (``fnmatch``, e.g. ``"fc1.*"``) of the tensors the
    protection covers; the others sit in the same layout, unprotected (None: every
    tensor)."""

    layout: WordLayout = field(default_factory=WordLayout)
    protection: Protection | Mapping[str, Protection] = field(default_factory=NoProtection)
    pattern: Any = field(default_factory=lambda: IndependentBits(0.0))
    protected_bits: Any = None
    protected_tensors: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.layout, WordLayout):
            raise ArgumentTypeError("layout", self.layout, "a WordLayout")
        if isinstance(self.protection, Mapping) and "kind" not in self.protection:
            schemes = {str(k): _scheme(v, f"protection[{k!r}]")
                       for k, v in self.protection.items()}
            object.__setattr__(self, "protection", schemes)
        else:
            object.__setattr__(self, "protection", _scheme(self.protection, "protection"))
        object.__setattr__(self, "pattern", _pattern(self.pattern))
        object.__setattr__(self, "protected_bits", check_protected_bits(self.protected_bits))
        object.__setattr__(self, "protected_tensors",
                           _tensor_patterns(self.protected_tensors))

    @property
    def data_dependent(self) -> bool:
        """Whether decoded faults depend on the stored data (a scheme with policy "zero",
        asymmetric cells): maps are then drawn with the clean stored words."""
        schemes = (self.protection.values() if isinstance(self.protection, Mapping)
                   else (self.protection,))
        return any(depends_on_data(s, self.pattern) for s in schemes) or \
            depends_on_data(NoProtection(), self.pattern)

    def protects(self, name: str) -> bool:
        """Whether tensor ``name`` is under the protection (``protected_tensors``)."""
        return self.protected_tensors is None or any(
            fnmatchcase(name, g) for g in self.protected_tensors)

    def for_tensor(self, name: str) -> Storage:
        """The storage of tensor ``name``: this one, or its layout and pattern unprotected
        when ``protected_tensors`` leaves the tensor out."""
        if self.protects(name):
            return self
        return Storage(self.layout, NoProtection(), self.pattern)

    def parts(self, plane: str, bits: int) -> tuple[Part, Part] | None:
        """The protected and unprotected parts of ``plane`` (``bits``-bit elements) when
        ``protected_bits`` splits it; None when it is stored whole."""
        positions = (self.protected_bits or {}).get(plane)
        if positions is None:
            return None
        return split_parts(bits, positions, self.layout, self.scheme(plane), plane)

    def scheme(self, plane: str) -> Protection:
        """The protection of ``plane``'s words."""
        if isinstance(self.protection, Mapping):
            return self.protection.get(plane, NoProtection())
        return self.protection

    def check_for(self, fmt: Format) -> None:
        """ArgumentError unless every plane of ``fmt`` fits (whole elements per word, known
        planes in a per-plane protection and in ``protected_bits``, bits inside them)."""
        formats = plane_formats(fmt)
        for argument, named in (("protection", self.protection),
                                ("protected_bits", self.protected_bits)):
            if not isinstance(named, Mapping):
                continue
            for plane in named:
                if plane not in formats:
                    raise ArgumentError(argument, plane, f"planes of {tuple(formats)}",
                                        requirement=f"{argument} names plane {plane!r}; "
                                                    f"{type(fmt).__name__} stores "
                                                    f"{tuple(formats)}")
        for plane, pf in formats.items():
            self.layout.per_word(pf.bits)
            parts = self.parts(plane, pf.bits)
            for part in parts or ():
                part.protection.check_bits(part.layout.word_bits)

    def overhead(self, fmt: Format) -> dict[str, float]:
        """Check bits per data bit of each plane (a split plane: its protected part's
        check bits per element over the element's bits)."""
        out = {}
        for p, pf in plane_formats(fmt).items():
            positions = (self.protected_bits or {}).get(p)
            out[p] = (self.scheme(p).overhead(self.layout.word_bits) if positions is None
                      else split_overhead(pf.bits, positions, self.layout, self.scheme(p)))
        return out

    def random_map(self, shape: tuple[int, ...], fmt: Format, *, ber: Any, seed: int,
                   name: str, bits: Any = None, step: int | None = None,
                   words: StoredWords | None = None) -> FaultMap:
        """The decoded map of a tensor of ``shape`` in ``fmt``: every plane drawn at its
        rate (``ber``: one rate, or ``{plane: rate}``; planes left out are fault-free),
        over its physical words, decoded; a block format's other planes in ``planes``.
        ``words``: the tensor's clean stored words, which a ``data_dependent`` storage
        needs (the map is then the XOR map for them)."""
        if not self.protects(name):
            return self.for_tensor(name).random_map(shape, fmt, ber=ber, seed=seed, name=name,
                                                    bits=bits, step=step, words=words)
        formats = plane_formats(fmt)
        shapes = fmt.plane_shapes(shape) if len(formats) > 1 else {CODES: tuple(shape)}
        selected = _selected_planes(bits, tuple(formats))
        maps = {}
        for plane, pf in formats.items():
            rate = ber.get(plane) if isinstance(ber, Mapping) else ber
            pname = plane_map_name(name, plane)
            if rate is None or plane not in selected:
                maps[plane] = FaultMap.empty(shapes[plane], pname)
                continue
            maps[plane] = plane_map(
                shapes[plane], pf.bits, rate=check_rate(rate, f"ber[{plane!r}]"), seed=seed,
                name=pname, step=step, layout=self.layout, protection=self.scheme(plane),
                pattern=self.pattern, parts=self.parts(plane, pf.bits), plane=plane,
                words=None if words is None else words.planes[plane], stored=words)
        codes = maps.pop(CODES)
        return FaultMap(codes.shape, codes.indices, codes.masks, name,
                        {**codes.meta, "format": fmt.to_dict()}, maps)

    def to_dict(self) -> dict[str, Any]:
        protection = ({p: s.to_dict() for p, s in self.protection.items()}
                      if isinstance(self.protection, Mapping) else self.protection.to_dict())
        pattern = {k: v for k, v in self.pattern.to_dict().items()
                   if k != RATE_FIELDS.get(self.pattern.kind)}
        out = {**self.layout.to_dict(), "protection": protection, "pattern": pattern}
        if self.protected_bits is not None:  # only then: older storages keep their digests
            out["protected_bits"] = {p: list(b) for p, b in self.protected_bits.items()}
        if self.protected_tensors is not None:
            out["protected_tensors"] = list(self.protected_tensors)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Storage:
        """From ``to_dict()`` or a config's ``memory:`` section (every key optional)."""
        if not isinstance(data, Mapping):
            raise ArgumentTypeError("storage", data, f"a mapping with keys of {_KEYS}")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise ArgumentError("storage", unknown, f"keys of {_KEYS}",
                                requirement=f"unknown storage key(s) {unknown}; allowed: "
                                            f"{_KEYS}")
        layout = WordLayout(data.get("word_bits", 64), data.get("row_words"),
                            data.get("interleave", 1))
        return cls(layout, data.get("protection", "none"),
                   data.get("pattern", {"kind": "independent"}), data.get("protected_bits"),
                   data.get("protected_tensors"))


def _tensor_patterns(value: Any) -> tuple[str, ...] | None:
    """``protected_tensors`` as a tuple of name patterns (a lone string is one)."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if isinstance(items, Mapping) or not hasattr(items, "__iter__"):
        raise ArgumentTypeError("protected_tensors", value,
                                "None or tensor name patterns such as ['fc1.*']")
    items = list(items)
    if not items or not all(isinstance(g, str) and g for g in items):
        raise ArgumentError("protected_tensors", value,
                            "None or a non-empty list of non-empty tensor name patterns",
                            requirement="protected_tensors names the tensors the protection "
                                        "covers, as fnmatch patterns (e.g. ['fc1.*'])")
    return tuple(items)


def _selected_planes(bits: Any, planes: tuple[str, ...]) -> tuple[str, ...]:
    """The planes a memory's fault selection names: all (None), or plane names only."""
    if bits is None:
        return planes
    items = [bits] if isinstance(bits, str) else list(bits)
    if not all(isinstance(b, str) and b in planes for b in items):
        raise ArgumentError("bits", bits, f"None or plane names of {planes}",
                            requirement="faults in a stored memory hit whole planes "
                                        "(bits=None or plane names such as 'scale'): the "
                                        "pattern places them in memory words")
    return tuple(items)


__all__ = ["Storage"]
