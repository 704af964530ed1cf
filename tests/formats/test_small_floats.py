"""The small floats (float8/float6/float4 and the E8M0 scale) against the independent
reference (tests/reference.py), ml_dtypes and PyTorch's casts, bit for bit."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

import bitfault as bf
import reference as ref
from bitfault.formats import Float, format_from_dict
from bitfault.formats.minifloat import SMALL_FLOATS

md = pytest.importorskip("ml_dtypes")

NAMES = list(ref.SMALL_FLOAT_LAYOUTS)
NO_NAN = ["float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"]


def policies(name: str) -> list[str]:
    return ["saturate", "error"] if name in NO_NAN else ["saturate", "nan", "error"]


def width(name: str) -> int:
    return ref.small_float_width(name)


def all_codes(name: str) -> np.ndarray:
    """Every pattern of the format, in its int8 container (low bits, as encode stores them)."""
    return np.arange(1 << width(name), dtype=np.uint8).view(np.int8)


def finite_values(name: str) -> list[float]:
    return sorted({v for c in range(1 << width(name))
                   if math.isfinite(v := ref.small_float_value(c, name))})


def edges(name: str) -> list[float]:
    """Every finite value, the midpoints between neighbours (ties) and just beside them,
    the largest finite value and one step past it, subnormals, +-0, NaN, +-inf, extremes."""
    vals = finite_values(name)
    out = list(vals)
    pos = [v for v in vals if v >= 0]
    for a, b in itertools.pairwise(pos):
        mid = (a + b) / 2
        out += [mid, -mid, np.nextafter(mid, math.inf), np.nextafter(mid, -math.inf)]
    top = max(vals)
    step = top - pos[-2]
    # one step past the largest (E8M0: twice it) and the midpoint up to it
    past = top * 2 if name == "float8_e8m0fnu" else top + 2 ** (math.floor(math.log2(top))
                                                                - ref.SMALL_FLOAT_LAYOUTS[name][1])
    out += [past, -past, (top + past) / 2, -(top + past) / 2, top + step / 4,
            np.nextafter((top + past) / 2, 0.0), 0.0, -0.0, math.nan, -math.nan, math.inf,
            -math.inf, 1e30, -1e30, 5e-324, -5e-324, 1e-45, min(pos) / 2, min(pos) / 4,
            1.0, -1.0, 3.0, 1.45, 1e-300]
    return out


def sample(name: str, rng: np.random.Generator) -> np.ndarray:
    top = max(finite_values(name))
    spread = rng.standard_normal(2000) * np.exp2(rng.integers(-30, 3, 2000)) * top
    return np.concatenate([edges(name), spread, rng.uniform(-1.2 * top, 1.2 * top, 500)])


def same(a: float, b: float) -> bool:
    """Equal values, zeros of the same sign, or both NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


# ---- decoding: every code ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_every_code_decodes_to_the_reference_and_to_ml_dtypes(name, dtype):
    codes = all_codes(name)
    got = Float(name).decode(codes, dtype=dtype)
    assert got.dtype == dtype and got.shape == codes.shape
    expected = [ref.small_float_value(c, name) for c in range(1 << width(name))]
    with np.errstate(over="ignore"):
        expected = np.array(expected, np.float64).astype(dtype).tolist()
        theirs = codes.view(np.uint8).view(getattr(md, name)).astype(dtype).tolist()
    for c, (g, e, t) in enumerate(zip(got.tolist(), expected, theirs, strict=True)):
        assert same(g, e), (hex(c), g, e)
        assert same(g, t), (hex(c), g, t)


@pytest.mark.parametrize("name", NAMES)
def test_nan_codes_decode_to_the_quiet_nan_with_their_sign(name):
    fmt = Float(name)
    nan_codes = [c for c in range(1 << width(name))
                 if math.isnan(ref.small_float_value(c, name))]
    assert (not nan_codes) == (name in NO_NAN)
    signed = ref.SMALL_FLOAT_LAYOUTS[name][2]
    for c in nan_codes:
        negative = signed and c >> (width(name) - 1)
        got = fmt.decode(np.array([c], np.uint8).view(np.int8))
        assert got.view(np.uint32)[0] == (0xFFC00000 if negative else 0x7FC00000)


@pytest.mark.parametrize("name", NAMES)
def test_decode_reads_only_the_low_bits(name):
    fmt = Float(name)
    codes = all_codes(name)
    junk = (codes.view(np.uint8) | np.uint8((0xFF << width(name)) & 0xFF)).view(np.int8)
    assert np.array_equal(fmt.decode(junk), fmt.decode(codes), equal_nan=True)


# ---- encoding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_encode_matches_the_reference_under_every_policy(name, dtype, rng):
    with np.errstate(over="ignore"):
        x = sample(name, rng).astype(dtype)
    for overflow in policies(name):
        fmt = Float(name, overflow)
        expected, bad = [], []
        for i, v in enumerate(x.tolist()):
            try:
                expected.append(ref.small_float_bits(v, name, overflow))
            except ref.OverflowPolicyError:
                bad.append(i)
                expected.append(None)
        if overflow == "error":
            assert bad  # the edges hold values the format cannot store
            with pytest.raises(ValueError, match=rf"index \({bad[0]},\).*overflow='error'"):
                fmt.encode(x)
            keep = np.ones(x.size, bool)
            keep[bad] = False
            x, expected = x[keep], [e for e in expected if e is not None]
        words, n_mapped = fmt.encode_counting(x)
        assert words.dtype == np.int8 and words.shape == x.shape
        assert ref.low_words(words, width(name)) == expected, overflow
        assert np.array_equal(fmt.encode(x), words)
        if overflow == "error":
            assert n_mapped == 0


@pytest.mark.parametrize("name", NAMES)
def test_values_the_format_holds_encode_to_themselves(name):
    codes = all_codes(name)
    fmt = Float(name, "error")
    values = fmt.decode(codes, dtype=np.float64)
    finite = np.isfinite(values)
    assert np.array_equal(fmt.decode(fmt.encode(values[finite]), dtype=np.float64),
                          values[finite])
    assert np.array_equal(fmt.encode(values[finite]), codes[finite])


@pytest.mark.parametrize("name", NAMES)
def test_mapped_values_are_counted(name):
    top = max(finite_values(name))
    with np.errstate(over="ignore"):  # E8M0: 4 * 2**127 is inf in float32
        x = np.array([1.0, top * 4, -top * 4, math.inf, math.nan, 0.0], np.float32)
    expected = {"float8_e4m3fn": 3, "float8_e5m2": 3, "float8_e8m0fnu": 4}.get(name, 4)
    assert Float(name).encode_counting(x)[1] == expected  # -4*top and 0 are "low" for E8M0


# ---- the libraries where their casts follow a policy --------------------------------------------


ML_DTYPES_POLICY = {"float8_e4m3fn": "nan", "float8_e5m2": "nan", "float8_e8m0fnu": "nan",
                    "float6_e2m3fn": "saturate", "float6_e3m2fn": "saturate",
                    "float4_e2m1fn": "saturate"}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_encode_matches_ml_dtypes_casts(name, dtype, rng):
    """ml_dtypes casts as "nan" does for the formats with NaN and as "saturate" does for
    float6/float4, except NaN, which it stores as a zero with the NaN's sign flipped."""
    with np.errstate(over="ignore"):
        x = sample(name, rng).astype(dtype)
    if name in NO_NAN:
        x = x[~np.isnan(x)]
    words = Float(name, ML_DTYPES_POLICY[name]).encode(x)
    with np.errstate(over="ignore", invalid="ignore"):
        theirs = x.astype(getattr(md, name)).view(np.uint8)
    assert np.array_equal(words.view(np.uint8), theirs)


@pytest.mark.parametrize("name, policy, keep", [
    ("float8_e4m3fn", "saturate", "all"),  # PyTorch saturates E4M3, infinities too
    ("float8_e5m2", "nan", "all"),  # ... and overflows E5M2 to inf (its NaN is 0x7F)
    ("float8_e8m0fnu", "nan", "positive"),  # zero -> 2**-127 and |x| for negatives
    ("float8_e8m0fnu", "saturate", "in_range"),  # ... and overflow -> NaN
])
def test_encode_matches_pytorch_casts(name, policy, keep, rng):
    torch = pytest.importorskip("torch")
    with np.errstate(over="ignore"):
        x = sample(name, rng).astype(np.float32)
    if keep == "positive":
        x = x[(x > 0) | np.isnan(x)]
    elif keep == "in_range":
        x = x[(x >= 0) & (x < 1.5 * 2.0**127)]
    if name == "float8_e5m2":
        x = x[~np.isnan(x)]
    words = Float(name, policy).encode(x)
    theirs = torch.from_numpy(x).to(getattr(torch, name)).view(torch.uint8).numpy()
    assert np.array_equal(words.view(np.uint8), theirs)


# ---- the format object ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_properties(name):
    fmt = Float(name)
    e, m, signed, _ = ref.SMALL_FLOAT_LAYOUTS[name]
    assert fmt.bits == width(name) and fmt.container == np.int8
    assert fmt.word_mask == 2 ** width(name) - 1
    assert fmt.resolution == 2.0**-m
    vals = finite_values(name)
    assert fmt.range == ((-max(vals) if signed else min(vals)), max(vals))
    assert bf.formats.gradient_bounds(fmt) == fmt.range
    fields = ref.field_positions("float", 0, dtype=name)
    assert {k: list(v) for k, v in fmt.bit_fields.items()} == {
        k: fields[k] for k in ("sign", "exponent", "mantissa") if k in fields}
    assert fmt.calibrate(np.zeros(2, np.float32)) is None
    assert fmt.overflow == "saturate"


@pytest.mark.parametrize("fmt", [Float(n, p) for n in NAMES for p in policies(n)], ids=repr)
def test_dict_round_trip(fmt):
    data = json.loads(json.dumps(fmt.to_dict()))
    assert data == {"kind": "float", "dtype": fmt.dtype, "overflow": fmt.overflow}
    assert format_from_dict(data) == fmt


def test_ieee_floats_keep_their_dict_and_take_only_the_default_overflow():
    assert Float("float32").to_dict() == {"kind": "float", "dtype": "float32"}
    assert format_from_dict({"kind": "float", "dtype": "float16", "overflow": "saturate"}) == \
        Float("float16")
    assert format_from_dict({"kind": "float", "dtype": "float8_e4m3fn"}) == \
        Float("float8_e4m3fn", "saturate")
    with pytest.raises(ValueError, match="overflow applies to the small floats only: float32"):
        Float("float32", overflow="nan")


def test_bad_names_and_policies_are_named_errors():
    with pytest.raises(ValueError, match=r"dtype must be one of \(.*'float8_e4m3fn'.*got "
                                         r"'float8_e4m3'"):
        Float("float8_e4m3")
    with pytest.raises(ValueError, match=r"format kind must be one of"):
        format_from_dict({"kind": "float8_e4m3fn"})
    with pytest.raises(ValueError, match=r"overflow must be one of \('saturate', 'nan', 'error'\)"):
        Float("float8_e5m2", overflow="clip")
    with pytest.raises(ValueError, match="float4_e2m1fn stores neither NaN nor inf: overflow "
                                         "must be 'saturate' or 'error'"):
        Float("float4_e2m1fn", overflow="nan")
    with pytest.raises(TypeError, match="x must be a float16, float32 or float64 array"):
        Float("float8_e4m3fn").encode(np.ones(3, np.int32))


# ---- faults and stored arrays --------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fault", [bf.BitFlip(), bf.StuckAt(0), bf.StuckAt(1),
                                   bf.BitFlip(bits="exponent")], ids=repr)
def test_inject_matches_the_reference(name, fault, rng):
    fmt = Float(name)
    x = sample(name, rng)[:600].astype(np.float32).reshape(20, 30)
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.1, seed=4, name="w")
    got = bf.inject(x, fmt, fault, fmap)
    dense = fmap.restricted(fault.eligible_mask(fmt)).to_dense(np.int64).reshape(-1).tolist()
    kind = "flip" if isinstance(fault, bf.BitFlip) else "stuck"
    value = getattr(fault, "value", 0)
    expected = []
    for v, mask in zip(x.reshape(-1).tolist(), dense, strict=True):
        word = ref.small_float_bits(v, name)
        expected.append(ref.small_float_value(ref.apply_fault(word, mask, kind, value), name))
    expected = np.array(expected, np.float64).astype(np.float32)
    assert all(same(g, e) for g, e in zip(got.reshape(-1).tolist(), expected.tolist(),
                                          strict=True))
    assert (got != bf.Float(name).decode(fmt.encode(x))).any()  # the faults did something


@pytest.mark.parametrize("name", NAMES)
def test_stored_array_gives_the_faulty_values_of_inject(name, rng):
    fmt = Float(name)
    x = (rng.standard_normal((8, 16)) * 2).astype(np.float32)
    stored = bf.StoredArray.of(x, fmt)
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.05, seed=1, name="w")
    expected = bf.inject(x, fmt, bf.BitFlip(), fmap)
    assert np.array_equal(stored.faulty(bf.BitFlip(), fmap), expected, equal_nan=True)
    index, values = stored.faulty_elements(bf.BitFlip(), fmap)
    assert np.array_equal(values, expected.reshape(-1)[index], equal_nan=True)


def test_config_loads_a_small_float_format():
    from bitfault.config import load_config

    config = load_config({"recipes": [
        {"name": "fp8", "format": {"kind": "float", "dtype": "float8_e4m3fn"}},
        {"name": "fp4", "format": {"kind": "float", "dtype": "float4_e2m1fn",
                                   "overflow": "error"}}]})
    assert [r.format for r in config.recipes] == [Float("float8_e4m3fn"),
                                                  Float("float4_e2m1fn", "error")]


@pytest.mark.parametrize("name", sorted(SMALL_FLOATS))
def test_float32_lookup_encodes_as_the_exact_encoder(name: str) -> None:
    """float32 input is encoded by table lookup (sign, exponent, the round bit and a sticky
    bit): every code and mapped count equals the exact encoder's, on random bit patterns
    (every class: NaN, inf, float32 subnormals, zero) and around every midpoint."""
    layout = SMALL_FLOATS[name]
    rng = np.random.default_rng(17)
    pattern = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    pattern[:1000] &= np.uint32(0x807FFFFF)  # float32 subnormals and zeros
    mids = layout.midpoints.astype(np.float32)
    near = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(0)), -mids])
    x = np.concatenate([pattern.view(np.float32), near]).astype(np.float32)
    for overflow in ("saturate", "nan") if layout.has_nan else ("saturate",):
        codes, n = layout.encode(x, overflow)
        exact, mapped = layout.encode_exact(x, overflow)
        assert np.array_equal(codes, exact), (name, overflow)
        assert n == int(np.count_nonzero(mapped)), (name, overflow)
