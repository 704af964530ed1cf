"""KernelRegistry: a backend's kernels by format type, resolved along the MRO."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import bitfault as bf
from bitfault.formats.kernel_registry import KernelRegistry


@dataclass(frozen=True)
class Kernels:
    fault: object = None
    native: object = None


@dataclass(frozen=True)
class MyMX(bf.MX):
    pass


def test_roles_resolve_along_the_mro_and_exact_ones_serve_their_type_alone() -> None:
    reg: KernelRegistry[Kernels] = KernelRegistry(Kernels)
    reg.register(bf.MX, fault="mx-fault")
    reg.register(bf.MX, exact=True, native="mx-native")
    reg.register(bf.FixedPoint, fault="fixed-fault")
    mx = reg.kernels_for(bf.MX("float4_e2m1fn"))
    sub = reg.kernels_for(MyMX("float4_e2m1fn"))
    assert mx == Kernels("mx-fault", "mx-native")
    assert sub == Kernels("mx-fault", None)  # a subclass may change the arithmetic
    assert reg.kernels_for(bf.IntQuant(8)) == Kernels()
    assert reg.types_with("fault") == [bf.MX, bf.FixedPoint]
    assert reg.types_with("native") == [bf.MX]


def test_a_later_registration_replaces_the_resolved_kernels() -> None:
    reg: KernelRegistry[Kernels] = KernelRegistry(Kernels)
    reg.register(bf.FixedPoint, fault="old")
    assert reg.kernels_for(bf.FixedPoint(8, 4)).fault == "old"
    reg.register(bf.FixedPoint, fault="new")
    assert reg.kernels_for(bf.FixedPoint(8, 4)).fault == "new"


def test_unknown_roles_are_refused_naming_the_roles() -> None:
    reg: KernelRegistry[Kernels] = KernelRegistry(Kernels)
    with pytest.raises(TypeError, match=r"unknown kernel roles \['decode'\].*fault.*native"):
        reg.register(bf.FixedPoint, decode=print)
