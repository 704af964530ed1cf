"""GroupwiseInt against an independent per-group reference written here (numpy float32
scalars, Python's half-to-even round, struct's fp16), and its planes, padding and errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.formats.base import low_bits_signed, low_bits_unsigned
from bitfault.formats.groupwise import GroupwiseInt
from groupwise_helpers import near_ties

F = np.float32
EPS = F(2.0**-23)


def fp16(v: np.float32) -> np.float32:
    return F(struct.unpack("<e", struct.pack("<e", float(v)))[0])


def ref_group(x: list[np.float32], bits: int, symmetric: bool) -> tuple[list[int], float, int]:
    """(codes, scale, zero point) of one group, from the stated formulas."""
    lo = min([F(0), *x])
    hi = max([F(0), *x])
    if symmetric:
        qlo, qhi = -(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1
        s = max(hi, F(-lo)) / F(qhi)
    else:
        qlo, qhi = 0, 2**bits - 1
        s = (hi - lo) / F(qhi)
    s = fp16(max(s, EPS))
    z = 0 if symmetric else min(qhi, max(qlo, -round(float(lo / s))))
    inv = F(1) / s
    return [min(qhi, max(qlo, round(float(v * inv)) + z)) for v in x], float(s), z


def sample(seed: int, rows: int, cols: int, g: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-5, 2)).astype(F)
    e = F(2.0) ** int(rng.integers(-6, 3))
    w[0, :g] = (rng.integers(-3, 3, size=g) + F(0.5)) * e  # ties
    w[0, 0] = F(3) * e
    w[1, :g] = 0
    w[2, :g] = np.abs(w[2, :g])  # one-signed groups: the zero point sits at an end
    w[3, :g] = -np.abs(w[3, :g])
    return w


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_equals_the_independent_reference(bits: int, symmetric: bool, seed: int) -> None:
    g = [16, 32, 64][seed]
    fmt = GroupwiseInt(bits=bits, group_size=g, symmetric=symmetric)
    w = sample(seed, 8, 2 * g + 5, g)  # the last group of each row padded
    w[4:] = near_ties(fmt, w, seed)[4:]
    planes = fmt.encode(w)
    codes = (low_bits_signed if symmetric else low_bits_unsigned)(planes["codes"], bits)
    scales = planes["scale"].astype(np.int16).view(np.float16).astype(np.float64)
    decoded = fmt.decode(planes)
    for r in range(w.shape[0]):
        for j in range(3):
            xs = [F(v) for v in w[r, j * g:(j + 1) * g]]
            xs += [F(0)] * (g - len(xs))
            q, s, z = ref_group(xs, bits, symmetric)
            n = len(w[r, j * g:(j + 1) * g])
            assert codes[r, j * g:j * g + n].tolist() == q[:n]
            assert scales[r, j] == s
            if not symmetric:
                assert low_bits_unsigned(planes["zero_point"], bits)[r, j] == z
            want = [F(qi - z) * F(s) for qi in q[:n]]
            assert decoded[r, j * g:j * g + n].tolist() == [float(v) for v in want]


def test_ties_round_to_even() -> None:
    fmt = GroupwiseInt(bits=4, group_size=8)
    x = np.array([[7, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0]], F)
    codes = low_bits_signed(fmt.encode(x)["codes"], 4)
    assert codes.tolist() == [[7, 0, 2, 2, 0, -2, -2, 0]]


def test_a_flipped_scale_bit_changes_exactly_its_group() -> None:
    fmt = GroupwiseInt(bits=4, group_size=32, symmetric=False)
    w = sample(1, 6, 128, 32)
    planes = fmt.encode(w)
    clean = fmt.decode(planes)
    for plane, bit in [("scale", 14), ("scale", 3), ("zero_point", 2)]:
        bad = {k: v.copy() for k, v in planes.items()}
        bad[plane][4, 2] ^= 1 << bit
        changed = np.argwhere(fmt.decode(bad) != clean)
        assert changed.size
        assert set(changed[:, 0]) == {4} and set(changed[:, 1] // 32) == {2}


def test_groups_along_another_axis() -> None:
    w = sample(2, 5, 64, 32)
    a = GroupwiseInt(bits=3, group_size=32).encode(w)
    b = GroupwiseInt(bits=3, group_size=32, axis=0).encode(np.ascontiguousarray(w.T))
    for name in a:
        assert np.array_equal(b[name], a[name].T)


def test_planes_and_description() -> None:
    sym = GroupwiseInt(bits=4, group_size=128)
    asym = GroupwiseInt(bits=3, group_size=64, symmetric=False, axis=0)
    assert sym.plane_names == ("codes", "scale")
    assert asym.plane_names == ("codes", "scale", "zero_point")
    assert sym.bits == 4 and sym.code_range == (-7, 7) and asym.code_range == (0, 7)
    assert asym.plane("zero_point").format.bits == 3
    assert asym.to_dict() == {"kind": "int_quant", "bits": 3, "symmetric": False,
                              "group_size": 64, "axis": 0}
    assert sym.plane_shapes((10, 300)) == {"codes": (10, 300), "scale": (10, 3)}


def test_bad_input_is_named() -> None:
    for bits in (1, 9, 2.0, True):
        with pytest.raises((ArgumentError, ArgumentTypeError), match="bits"):
            GroupwiseInt(bits=bits)
    for g in (0, -4, 1.5):
        with pytest.raises((ArgumentError, ArgumentTypeError), match="group_size"):
            GroupwiseInt(group_size=g)
    with pytest.raises(ArgumentTypeError, match="symmetric"):
        GroupwiseInt(symmetric="yes")
    with pytest.raises(ArgumentTypeError, match="axis"):
        GroupwiseInt(axis=None)
    with pytest.raises(ArgumentError, match="axis"):
        GroupwiseInt(axis=1).encode(np.zeros(8, F))
    with pytest.raises(ValueError, match="NaN"):
        GroupwiseInt().encode(np.array([[1.0, np.nan]], F))
    with pytest.raises(ArgumentError, match="float16"):
        GroupwiseInt(bits=4, group_size=2).encode(np.array([[1e6, 1.0]], F))
