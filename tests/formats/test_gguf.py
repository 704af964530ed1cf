"""GGUF Q8_0 / Q4_0 / Q4_1 against the ``gguf`` package (llama.cpp's gguf-py) byte for byte
and against an independent per-block reference written here from ggml-quants.c."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.formats import format_from_dict
from bitfault.formats.gguf import GGUF

gq = pytest.importorskip("gguf.quants")
GT = pytest.importorskip("gguf").GGMLQuantizationType

TYPES = ["q8_0", "q4_0", "q4_1"]
F = np.float32


def qtype(t: str):
    return getattr(GT, t.upper())


def sample_rows(seed: int, rows: int = 24, cols: int = 256) -> np.ndarray:
    """Random rows at scales 1e-6..1e3, plus ties, an all-zero block, outliers, signs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-6, 3, size=(rows, 1))
    x = x.astype(F)
    e = F(2.0) ** rng.integers(-10, 4)
    j = rng.integers(-8, 8, size=32).astype(F)
    x[0, :32] = (j + F(0.5)) * e  # Q8_0: x * id lands on .5 when d = e
    x[0, 0] = F(127) * e
    x[1, :32] = j * e  # Q4_0: d = e, y = j + 8.5
    x[1, 5] = F(-8) * e
    x[2, :32] = (rng.integers(0, 15, size=32) + F(0.5)) * e  # Q4_1: y = j + 1 exactly
    x[2, 0], x[2, 1] = F(0), F(15) * e
    x[3, :32] = 0  # an all-zero block
    x[4, 40] = F(1e4)  # one big outlier in a block of small values
    x[4, 32:64] *= F(1e-3)
    x[5, 64:96] = rng.choice([-1, 1], size=32).astype(F) * F(0.25)  # magnitude ties,
    x[6, 64:96] = -x[5, 64:96]  # both signs, first one wins (Q4_0)
    x[7, 96:128] = F(0.49999997)  # a constant block (Q4_1: d = 0, codes 0)
    return x


@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("seed", range(6))
def test_bytes_and_values_equal_gguf_package(t: str, seed: int) -> None:
    x = sample_rows(seed)
    fmt = GGUF(t)
    planes = fmt.encode(x)
    ref = gq.quantize(x, qtype(t))
    assert np.array_equal(fmt.to_bytes(planes), ref)
    got = fmt.decode(planes)
    want = gq.dequantize(ref, qtype(t))
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.int32), want.view(np.int32))


# ---- an independent reference: ggml-quants.c's loops, one block at a time ------------------

def fp16_bytes(v: np.float32) -> bytes:
    """GGML_FP32_TO_FP16 (round to nearest even, inf beyond the range), little-endian."""
    try:
        return struct.pack("<e", float(v))
    except OverflowError:
        return struct.pack("<H", 0x7C00 | (0x8000 if v < 0 else 0))


def c_roundf(v: np.float32) -> int:
    return int(math.copysign(math.floor(abs(float(v)) + 0.5), float(v)))


def ref_block(t: str, x: np.ndarray) -> bytes:
    xs = [F(v) for v in x]
    if t == "q8_0":
        amax = F(0)
        for v in xs:
            amax = max(amax, F(abs(v)))
        d = amax / F(127)
        inv = F(1) / d if d else F(0)
        return fp16_bytes(d) + bytes(c_roundf(v * inv) & 0xFF for v in xs)
    if t == "q4_0":
        amax, mx = F(0), F(0)
        for v in xs:
            if amax < abs(v):
                amax, mx = F(abs(v)), v
        d = mx / F(-8)
        inv = F(1) / d if d else F(0)
        q = [min(15, int(v * inv + F(8.5))) for v in xs]
        head = fp16_bytes(d)
    else:
        mn, mx = F(np.finfo(F).max), F(-np.finfo(F).max)
        for v in xs:
            mn = v if v < mn else mn
            mx = v if v > mx else mx
        d = (mx - mn) / F(15)
        inv = F(1) / d if d else F(0)
        q = [min(15, int((v - mn) * inv + F(0.5))) for v in xs]
        head = fp16_bytes(d) + fp16_bytes(mn)
    return head + bytes(q[j] | (q[j + 16] << 4) for j in range(16))


@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bytes_equal_independent_c_reference(t: str, seed: int) -> None:
    x = sample_rows(seed, rows=10, cols=128)
    want = b"".join(ref_block(t, block) for block in x.reshape(-1, 32))
    got = GGUF(t).to_bytes(GGUF(t).encode(x))
    assert got.tobytes() == want


def test_reference_sees_the_rounding_details() -> None:
    """The cases the reference exists for: roundf's away-from-zero ties, the first of two
    opposite maxima, the truncation of Q4_1 and its fp16 minimum."""
    e = F(0.5)
    x = np.zeros((1, 32), F)
    x[0, 0], x[0, 1], x[0, 2] = F(127) * e, F(2.5) * e, F(-2.5) * e
    codes = GGUF("q8_0").encode(x)["codes"][0, :3]
    assert codes.tolist() == [127, 3, -3]  # ties away from zero, not to even (2, -2)
    y = np.zeros((1, 32), F)
    y[0, 3], y[0, 9] = F(-4), F(4)
    p = GGUF("q4_0").encode(y)
    assert p["scale"][0, 0] == np.float16(0.5).view(np.int16)  # d = -4 / -8, from the -4
    assert p["codes"][0, [3, 9]].tolist() == [0, 15]  # trunc(-8 + 8.5), min(15, 16)


# ---- faults, padding, bytes round trips ----------------------------------------------------

@pytest.mark.parametrize("t", TYPES)
def test_a_flipped_scale_bit_changes_exactly_its_block(t: str) -> None:
    x = sample_rows(7)
    fmt = GGUF(t)
    planes = fmt.encode(x)
    clean = fmt.decode(planes)
    for plane in fmt.plane_names[1:]:
        for row, blk, bit in [(9, 3, 14), (12, 0, 10), (20, 7, 15)]:
            bad = {k: v.copy() for k, v in planes.items()}
            bad[plane][row, blk] ^= np.uint16(1 << bit).view(np.int16)
            out = fmt.decode(bad)
            changed = np.argwhere(out.view(np.int32) != clean.view(np.int32))
            assert changed.size
            assert set(changed[:, 0]) == {row}
            assert set(changed[:, 1] // 32) == {blk}


@pytest.mark.parametrize("t", TYPES)
def test_faulty_bytes_decode_as_the_package_dequantizes_them(t: str) -> None:
    x = sample_rows(3)
    fmt = GGUF(t)
    data = fmt.to_bytes(fmt.encode(x))
    rng = np.random.default_rng(5)
    flips = (rng.random(data.shape) < 0.05) * (1 << rng.integers(0, 8, data.shape))
    faulty = data ^ flips.astype(np.uint8)
    got = fmt.decode(fmt.from_bytes(faulty, x.shape))
    with np.errstate(invalid="ignore", over="ignore"):
        want = gq.dequantize(faulty, qtype(t))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    assert np.array_equal(got[fin].view(np.int32), want[fin].view(np.int32))


@pytest.mark.parametrize("t", TYPES)
def test_from_bytes_inverts_to_bytes(t: str) -> None:
    x = sample_rows(4).reshape(4, 6, 256)
    fmt = GGUF(t)
    planes = fmt.encode(x)
    back = fmt.from_bytes(fmt.to_bytes(planes), x.shape)
    assert back.keys() == planes.keys()
    for name in planes:
        assert back[name].dtype == planes[name].dtype
        assert np.array_equal(back[name], planes[name])


@pytest.mark.parametrize("t", TYPES)
def test_padding_is_zeros_and_never_stored(t: str) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 40)).astype(F)
    fmt = GGUF(t)
    planes = fmt.encode(x)
    assert planes["codes"].shape == (5, 40)
    assert planes["scale"].shape == (5, 2)
    padded = np.concatenate([x, np.zeros((5, 24), F)], axis=1)
    want = gq.dequantize(gq.quantize(padded, qtype(t)), qtype(t))[:, :40]
    assert np.array_equal(fmt.decode(planes).view(np.int32), want.view(np.int32))
    with pytest.raises(ArgumentError, match="multiple of 32"):
        fmt.to_bytes(planes)


@pytest.mark.parametrize("t", TYPES)
def test_blocks_along_another_axis(t: str) -> None:
    x = sample_rows(2, rows=8, cols=96)
    by_rows = GGUF(t).encode(x)
    by_cols = GGUF(t, axis=0).encode(np.ascontiguousarray(x.T))
    for name in by_rows:
        assert np.array_equal(by_cols[name], by_rows[name].T)
    assert np.array_equal(GGUF(t, axis=0).decode(by_cols), GGUF(t).decode(by_rows).T)
    with pytest.raises(ArgumentError, match="axis"):
        GGUF(t, axis=0).to_bytes(by_cols)


@pytest.mark.parametrize("t", TYPES)
def test_fast_path_equals_the_block_path(t: str) -> None:
    """The chunked encoder (last axis, whole blocks) against the base's generic path."""
    x = sample_rows(9, rows=300, cols=512)  # more than one chunk of blocks
    fmt = GGUF(t)
    lay = fmt.layout(x.shape)
    generic = fmt.encode_blocks(lay.to_blocks(x))
    fast = fmt.encode(x)
    for p in fmt.planes:
        got = np.asarray(fast[p.name]).astype(np.int64) & ((1 << p.format.bits) - 1)
        if p.per == "element":
            got = lay.to_blocks(got)
        else:
            got = lay.block_plane_to_blocks(got)
        assert np.array_equal(got, generic[p.name])


@pytest.mark.parametrize("t", TYPES)
def test_tiny_blocks_store_finite_codes(t: str) -> None:
    """A block maximum so small that 1/d overflows float32: codes are still mapped
    explicitly (no NaN reaches a float->int cast) and decode to finite values."""
    x = np.zeros((1, 64), F)
    x[0, :32] = np.float32(1e-44) * np.arange(32, dtype=F) / F(31)
    x[0, 32:] = 1.0
    fmt = GGUF(t)
    planes = fmt.encode(x)
    assert np.isfinite(fmt.decode(planes)).all()
    lo, hi = fmt.codes_format.code_range
    assert planes["codes"].min() >= lo and planes["codes"].max() <= hi


def test_planes_and_round_trip_through_dict() -> None:
    assert GGUF("q8_0").plane_names == ("codes", "scale")
    assert GGUF("q4_1").plane_names == ("codes", "scale", "min")
    assert GGUF("q8_0").bits == 8 and GGUF("q4_0").bits == 4
    assert GGUF("q4_1").plane("min").format.bits == 16
    for t in TYPES:
        fmt = GGUF(t, axis=1)
        assert format_from_dict(fmt.to_dict()) == fmt
        assert fmt.to_dict() == {"kind": "gguf", "type": t, "axis": 1}


def test_bad_input_is_named() -> None:
    with pytest.raises(ArgumentError, match="type"):
        GGUF("q5_0")
    with pytest.raises(ArgumentTypeError, match="axis"):
        GGUF("q8_0", axis="last")
    with pytest.raises(ArgumentError, match="axis"):
        GGUF("q8_0", axis=2).encode(np.zeros((2, 32), F))
    x = np.ones((2, 64), F)
    x[1, 33] = np.nan
    with pytest.raises(ValueError, match=r"\(1, 33\)"):
        GGUF("q4_0").encode(x)
    with pytest.raises(ArgumentError, match="missing"):
        GGUF("q4_1").to_bytes({"codes": np.zeros((1, 32), np.int8),
                               "scale": np.zeros((1, 1), np.int16)})
    with pytest.raises(ArgumentError, match="data"):
        GGUF("q8_0").from_bytes(np.zeros(33, np.uint8), (1, 32))
    with pytest.raises(ArgumentError, match="multiple of 32"):
        GGUF("q8_0").from_bytes(np.zeros(34, np.uint8), (1, 30))
