"""OCP MX v1.0 blocks (MXFP8/6/4, MXINT8) against the independent Fraction reference of
mx_reference.py and against ml_dtypes' casts."""

from __future__ import annotations

import itertools
import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import mx_reference as ref

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.formats.base import format_from_dict
from bitfault.formats.mx import MX

ELEMENTS = ["float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn",
            "float4_e2m1fn", "int8"]
F32 = np.float32


def reference_planes(name: str, x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes in the tensor's shape, scale codes with the axis cut to blocks) by the
    reference, block by block along ``axis`` (the last block of a row shorter: zero
    padding changes neither amax nor any element)."""
    moved = np.moveaxis(x, axis, -1)
    n_blocks = math.ceil(moved.shape[-1] / 32)
    codes = np.zeros(moved.shape, np.int64)
    scales = np.zeros((*moved.shape[:-1], n_blocks), np.int64)
    for index in np.ndindex(moved.shape[:-1]):
        for b in range(n_blocks):
            chunk = [float(v) for v in moved[index][32 * b:32 * b + 32]]
            scales[(*index, b)], codes[index][32 * b:32 * b + 32] = ref.mx_block(name, chunk)
    return np.moveaxis(codes, -1, axis), np.moveaxis(scales, -1, axis)


def stored(words: np.ndarray, bits: int, signed: bool = False) -> np.ndarray:
    w = words.astype(np.int64) & ((1 << bits) - 1)
    return np.where(w >= 1 << (bits - 1), w - (1 << bits), w) if signed else w


def check_against_reference(name: str, x: np.ndarray, axis: int = -1) -> dict:
    fmt = MX(name, axis=axis)
    planes = fmt.encode(x)
    codes, scales = reference_planes(name, x, axis)
    bits = 8 if name == "int8" else fmt.bits
    assert planes["codes"].shape == x.shape
    np.testing.assert_array_equal(stored(planes["codes"], bits, name == "int8"), codes)
    np.testing.assert_array_equal(stored(planes["scale"], 8), scales)
    # decoding: element value * 2**E exactly (every clean word's product is a float32)
    out = fmt.decode(planes)
    flat_codes, flat_out = codes.ravel(), out.ravel()
    scale_of = np.moveaxis(np.repeat(np.moveaxis(scales, axis, -1), 32, -1)
                           [..., :np.moveaxis(x, axis, -1).shape[-1]], -1, axis).ravel()
    for c, s, v in zip(flat_codes.tolist(), scale_of.tolist(), flat_out.tolist(), strict=True):
        value = Fraction(c, 64) if name == "int8" else ref.element_value(name, c)
        assert Fraction(v) == value * Fraction(2) ** (s - 127)
    return planes


@pytest.mark.parametrize("name", ELEMENTS)
def test_random_blocks_match_reference(name: str) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, 64)) * np.exp2(rng.integers(-20, 20, (4, 1)))).astype(F32)
    x[0, :32] *= F32(2.0**-100)  # small blocks
    x[1, 3] = -0.0
    check_against_reference(name, x)


@pytest.mark.parametrize("name", ELEMENTS)
def test_scale_selection_edges(name: str) -> None:
    """amax a power of two, just below one, zero, huge, tiny, subnormal (E8M0 clamps)."""
    below = np.nextafter(F32(8.0), F32(0.0))
    cases = [
        [8.0, 1.0, -3.0],                       # amax exactly 2**3
        [below, 1.0, -3.0],                     # just below: floor(log2) = 2
        [-below, 0.5],
        [0.0] * 32,                             # zero block: the smallest scale
        [-0.0, 0.0],
        [3.0e38, -1.0, 1.0e30],                 # huge: near the top of E8M0
        [float(np.finfo(F32).max), 1.0],
        [1.0e-38, -2.0e-39],                    # tiny normal and subnormal inputs
        [1.0e-45, -3.0e-45, 0.0],               # subnormal only: E clamps at -127
        [2.0**-120, 2.0**-127],
    ]
    x = np.zeros((len(cases), 32), F32)
    for i, c in enumerate(cases):
        x[i, :len(c)] = c
    planes = check_against_reference(name, x)
    scale = stored(planes["scale"], 8)[:, 0] - 127
    emax = ref.EMAX[name]
    assert scale[0] == 3 - emax and scale[1] == 2 - emax
    assert scale[3] == -127 and scale[8] == -127
    assert scale[6] == 127 - emax


def test_floor_log2_is_exact_just_below_powers_of_two() -> None:
    """np.log2 in float32 rounds up just below a power of two; the scale must not."""
    k = np.arange(-100, 100)
    x = np.zeros((k.size, 32), F32)
    x[:, 0] = np.nextafter(np.exp2(k).astype(F32), F32(0))
    scale = stored(MX("float4_e2m1fn").encode(x)["scale"], 8)[:, 0] - 127
    np.testing.assert_array_equal(scale, np.maximum(k - 1 - 2, -127))


@pytest.mark.parametrize("name", ELEMENTS[:5])
def test_ties_and_saturation(name: str) -> None:
    """Every midpoint between two magnitudes rounds to the even code (one float32 step
    above or below it: to the nearer code); values between the
    largest finite value and 2**(emax+1) saturate (the scale is 1: amax = 2**emax)."""
    mags = [v for v, _ in ref.finite_magnitudes(name)]
    top = 2 ** ref.EMAX[name]
    values = [(a + b) / 2 for a, b in itertools.pairwise(mags)]
    values += [mags[-1], (mags[-1] + 2 * top) / 2, 2 * top - Fraction(top, 2 ** 20)]
    values = [float(v) for v in values]
    values += [float(np.nextafter(F32(v), F32(d))) for v in values[:-3] for d in (0, 1e9)]
    values += [-v for v in values]
    rows = math.ceil(len(values) / 31)
    x = np.zeros((rows, 32), F32)
    x[:, 0] = top
    flat = x[:, 1:].copy().ravel()
    flat[:len(values)] = values
    x[:, 1:] = flat.reshape(rows, 31)
    assert np.all(x.astype(np.float64)[:, 1:].ravel()[:len(values)] == values)
    planes = check_against_reference(name, x)
    assert np.all(stored(planes["scale"], 8) == 127)
    out = MX(name).decode(planes)
    assert np.abs(out).max() == float(mags[-1])


def test_int8_rounding_and_clamp() -> None:
    """MXINT8: rint(64 x / X) ties to even, clamped to +-127 (never -128)."""
    x = np.zeros((2, 32), F32)
    x[0, :6] = [1.0, 1.0 + 1 / 128, 1.0 + 3 / 128, 1.99, -1.999, -1.0 - 1 / 128]
    x[1, :3] = [-1.999, 1.5, 0.5 / 64]
    planes = check_against_reference("int8", x)
    codes = stored(planes["codes"], 8, signed=True)
    assert codes[0, :6].tolist() == [64, 64, 66, 127, -127, -64]
    assert codes.min() >= -127


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float4_e2m1fn", "int8"])
def test_padding_along_each_axis(name: str, axis: int) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((33, 35, 3)).astype(F32) if axis != -1 else \
        rng.standard_normal((2, 3, 45)).astype(F32)
    planes = check_against_reference(name, x, axis)
    shape = list(x.shape)
    shape[axis] = math.ceil(shape[axis] / 32)
    assert planes["scale"].shape == tuple(shape)
    assert MX(name, axis=axis).plane_shapes(x.shape) == {"codes": x.shape,
                                                          "scale": tuple(shape)}


@pytest.mark.parametrize("name", ELEMENTS)
def test_every_scale_code_decodes(name: str) -> None:
    """A fixed block of codes decoded under each of the 256 E8M0 words: element * 2**(c-127)
    rounded once to float32 (large scales overflow to inf), NaN for 0xFF."""
    rng = np.random.default_rng(3)
    fmt = MX(name)
    codes = rng.integers(-128, 128, (1, 32)).astype(np.int8)
    if name != "int8":  # a valid word of the element format, NaN codes included
        codes = (codes.astype(np.int64) & fmt.codes_format.word_mask).astype(np.int8)
    planes = {"codes": np.repeat(codes, 256, 0),
              "scale": np.arange(256, dtype=np.uint8).view(np.int8)[:, None]}
    out = fmt.decode(planes)
    for s in range(256):
        for c, v in zip(stored(codes[0], 8 if name == "int8" else fmt.bits,
                               name == "int8").tolist(), out[s].tolist(), strict=True):
            value = Fraction(c, 64) if name == "int8" else ref.element_value(name, c)
            if s == 255 or value == ref.NAN:
                assert math.isnan(v)
            elif isinstance(value, float):  # an element infinity
                assert v == value
            else:
                assert v == ref.f32(value * Fraction(2) ** (s - 127))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float6_e2m3fn",
                                  "float6_e3m2fn", "float4_e2m1fn"])
def test_element_codes_equal_ml_dtypes_casts(name: str) -> None:
    """Where the scaled value lies within the element's range, the codes are ml_dtypes'
    cast of x / X (X from the reference's scale selection)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((64, 32)) * np.exp2(rng.integers(-30, 30, (64, 1)))).astype(F32)
    planes = MX(name).encode(x)
    scales = np.array([ref.mx_block(name, [float(v) for v in row])[0] for row in x])
    y = x / np.exp2(scales.astype(np.float64) - 127)[:, None]
    inside = np.abs(y) <= float(ref.finite_magnitudes(name)[-1][0])
    theirs = y.astype(getattr(ml_dtypes, name)).view(np.uint8).astype(np.int64)
    ours = stored(planes["codes"], MX(name).bits)
    assert inside.mean() > 0.9
    np.testing.assert_array_equal(ours[inside], theirs[inside])


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float4_e2m1fn", "int8"])
def test_a_flipped_scale_bit_changes_exactly_its_block(name: str) -> None:
    rng = np.random.default_rng(5)
    fmt = MX(name, axis=0)
    x = (rng.uniform(0.5, 1.0, (70, 3)) * rng.choice([-1, 1], (70, 3))).astype(F32)
    planes = fmt.encode(x)
    clean = fmt.decode(planes)
    for bit in range(8):
        faulty = dict(planes)
        scale = planes["scale"].copy()
        scale[1, 2] ^= np.int8(np.uint8(1 << bit).view(np.int8))
        faulty["scale"] = scale
        out = fmt.decode(faulty)
        changed = ~((out == clean) | (np.isnan(out) & np.isnan(clean)))
        expected = np.zeros(x.shape, bool)
        expected[32:64, 2] = clean[32:64, 2] != 0
        np.testing.assert_array_equal(changed, expected)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ArgumentError) as e:
        MX("float8_e4m3")
    assert e.value.argument == "element" and "float4_e2m1fn" in str(e.value)
    with pytest.raises(ArgumentError) as e:
        MX(block_size=16)
    assert e.value.argument == "block_size" and "32" in str(e.value)
    with pytest.raises(ArgumentTypeError) as e:
        MX(block_size=32.0)
    assert e.value.argument == "block_size"
    with pytest.raises(ArgumentTypeError) as e:
        MX(axis="0")
    assert e.value.argument == "axis"
    with pytest.raises(ArgumentError) as e:
        MX(axis=2).encode(np.zeros((3, 4), F32))
    assert e.value.argument == "axis"
    x = np.ones((2, 40), F32)
    x[1, 7] = np.nan
    with pytest.raises(ValueError, match=r"index \(1, 7\)"):
        MX().encode(x)


@pytest.mark.parametrize("name", ELEMENTS)
def test_round_trips_through_its_dict(name: str) -> None:
    fmt = MX(name, axis=0)
    assert format_from_dict(fmt.to_dict()) == fmt
    assert fmt.to_dict() == {"kind": "mx", "element": name, "block_size": 32, "axis": 0}
    assert [p.name for p in fmt.planes] == ["codes", "scale"]
    assert fmt.plane("scale").format.bits == 8 and fmt.plane("scale").per == "block"
