"""Formats against the independent reference (tests/reference.py), bit for bit."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
from bitfault.formats import FixedPoint, Float, IntQuant, QuantParams, format_from_dict

FIXED_SHAPES = [(32, 28), (32, 16), (32, 0), (24, 20), (16, 8), (12, 5), (8, 4), (8, 0), (8, 8),
                (4, 2), (2, 1), (2, 0)]
F32_MAX = float(np.finfo(np.float32).max)
F32_TINY_SUB = float(np.finfo(np.float32).smallest_subnormal)


def fixed_edges(bits: int, frac: int) -> list[float]:
    """0, -0.0, max, min, one past each end, half steps, ties, NaN, +-inf, subnormals."""
    res = 2.0**-frac
    lo, hi = -(2 ** (bits - 1)) * res, (2 ** (bits - 1) - 1) * res
    return [0.0, -0.0, hi, lo, hi + res, lo - res, hi + res / 2, lo - res / 2, hi + res / 4,
            res / 2, -res / 2, 1.5 * res, -1.5 * res, 2.5 * res, -2.5 * res, 0.75 * res,
            -0.75 * res, res, -res, math.nan, math.inf, -math.inf, 5e-324, -5e-324,
            F32_TINY_SUB, -F32_TINY_SUB, 1e30, -1e30, F32_MAX, -F32_MAX]


def fixed_values(bits: int, frac: int, rng: np.random.Generator) -> np.ndarray:
    res = 2.0**-frac
    span = 2 ** (bits - 1) * res
    random = rng.uniform(-1.3 * span, 1.3 * span, 300)
    on_grid = rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), 50) * res
    ties = (rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1, 50) + 0.5) * res
    return np.concatenate([fixed_edges(bits, frac), random, on_grid, ties])


# ---- FixedPoint ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bits,frac", FIXED_SHAPES)
@pytest.mark.parametrize("rounding", ["nearest", "trunc"])
@pytest.mark.parametrize("overflow", ["saturate", "wrap"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fixed_point_encode_matches_reference(bits, frac, rounding, overflow, dtype, rng):
    fmt = FixedPoint(bits, frac, rounding=rounding, overflow=overflow)
    x = fixed_values(bits, frac, rng).astype(dtype)
    words, n_saturated = fmt.encode_counting(x)
    assert words.dtype == np.dtype(np.int8 if bits <= 8 else np.int16 if bits <= 16 else np.int32)
    assert words.shape == x.shape
    expected = [ref.fixed_point_code(v, bits, frac, rounding, overflow) for v in x.tolist()]
    assert ref.low_words(words, bits) == [ref.pattern(code, bits) for code, _ in expected]
    assert n_saturated == sum(sat for _, sat in expected)
    assert np.array_equal(fmt.encode(x), words)


@pytest.mark.parametrize("bits,frac", FIXED_SHAPES)
def test_fixed_point_error_policy_raises_on_first_bad_value(bits, frac, rng):
    fmt = FixedPoint(bits, frac, overflow="error")
    res = 2.0**-frac
    good = rng.uniform(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1, (3, 4)) * res
    expected = [ref.fixed_point_code(v, bits, frac, "nearest", "error")[0]
                for v in good.ravel().tolist()]
    assert ref.low_words(fmt.encode(good), bits) == [ref.pattern(c, bits) for c in expected]
    past = [(2 ** (bits - 1)) * res, (-(2 ** (bits - 1)) - 1) * res]  # one past either end
    for bad in [math.nan, math.inf, -math.inf, *past]:
        x = good.copy()
        x[2, 1] = bad
        x[2, 3] = bad
        with pytest.raises(ValueError, match=r"index \(2, 1\)") as info:
            fmt.encode(x)
        assert repr(float(bad)) in str(info.value)
        assert "overflow" in str(info.value)
        with pytest.raises(ref.OverflowPolicyError):
            ref.fixed_point_code(bad, bits, frac, "nearest", "error")


@pytest.mark.parametrize("bits,frac", FIXED_SHAPES)
def test_fixed_point_decode_reads_only_the_low_bits(bits, frac, rng):
    fmt = FixedPoint(bits, frac)
    container = fmt.container
    info = np.iinfo(container)
    words = rng.integers(info.min, info.max, 2000, endpoint=True).astype(container)
    low = ref.low_words(words, bits)
    exact = [ref.fixed_point_value(w, bits, frac) for w in low]
    as64 = fmt.decode(words, dtype=np.float64)
    assert as64.dtype == np.float64
    assert as64.tolist() == exact
    as32 = fmt.decode(words)
    assert as32.dtype == np.float32
    assert ref.float_bits_of(as32) == [ref.float32_bits(v) for v in exact]


def test_seed_format_is_int32_trunc_of_w_times_2_to_28(rng):
    fmt = FixedPoint(32, 28, rounding="trunc")
    w = np.concatenate([rng.normal(0, 0.3, 5000), rng.uniform(-8, 8, 5000)]).astype(np.float32)
    w = np.concatenate([w, np.float32([0.0, -0.0, 7.9999995, -8.0, 2**-28, -(2**-28), 1e-9])])
    words = fmt.encode(w)
    assert words.dtype == np.int32
    # the seed program, in Python ints: int32(trunc(w * 2**28))
    assert words.tolist() == [math.trunc(float(v) * 2**28) for v in w.tolist()]
    # ... and as the seed wrote it in array code
    assert np.array_equal(words, np.trunc(w.astype(np.float64) * 2**28).astype(np.int32))
    back = fmt.decode(words)
    assert back.dtype == np.float32
    assert np.array_equal(back, (words * 2.0**-28).astype(np.float32))
    assert np.array_equal(back, words.astype(np.float32) / np.float32(2**28))


@given(
    shape=st.sampled_from(FIXED_SHAPES),
    rounding=st.sampled_from(["nearest", "trunc"]),
    unit=st.floats(0.0, 1.0),
)
@settings(max_examples=150)
def test_fixed_point_round_trip_error_within_resolution(shape, rounding, unit):
    bits, frac = shape
    fmt = FixedPoint(bits, frac, rounding=rounding, overflow="error")
    lo, hi = fmt.range
    x = np.float64(lo + unit * (hi - lo))
    err = abs(float(fmt.decode(fmt.encode(x), dtype=np.float64)) - float(x))
    if rounding == "nearest":
        assert err <= fmt.resolution / 2
    else:
        assert err < fmt.resolution


@pytest.mark.parametrize("bits,frac", FIXED_SHAPES)
def test_fixed_point_properties(bits, frac):
    fmt = FixedPoint(bits, frac)
    assert fmt.bits == bits
    assert fmt.word_mask == 2**bits - 1
    assert fmt.resolution == 2.0**-frac
    assert fmt.range == (-(2 ** (bits - 1)) * 2.0**-frac, (2 ** (bits - 1) - 1) * 2.0**-frac)
    fields = ref.field_positions("fixed_point", bits, frac)
    for name in ("sign", "integer", "fraction"):
        assert list(fmt.bit_fields[name]) == fields[name]
    assert fmt.calibrate(np.zeros(3)) is None


# ---- IntQuant ------------------------------------------------------------------------------------


def _slices(x: np.ndarray, axis: int | None):
    """(channel-of-each-element in C order, list of channel value lists)."""
    if axis is None:
        return [0] * x.size, [x.ravel().tolist()]
    axis %= x.ndim
    channel = np.indices(x.shape)[axis].ravel().tolist()
    return channel, [np.take(x, i, axis=axis).ravel().tolist() for i in range(x.shape[axis])]


def int_quant_cases():
    for bits in (2, 3, 4, 8, 12, 16, 32):
        for symmetric in (True, False):
            for codes in ("signed", "unsigned"):
                for per_channel in (False, True, 1, -1):
                    yield bits, symmetric, codes, per_channel


@pytest.mark.parametrize("bits,symmetric,codes,per_channel", list(int_quant_cases()))
@pytest.mark.parametrize("rounding", ["nearest", "trunc"])
def test_int_quant_matches_reference(bits, symmetric, codes, per_channel, rounding, rng):
    fmt = IntQuant(bits, symmetric=symmetric, per_channel=per_channel, codes=codes,
                   rounding=rounding)
    x = (rng.normal(0, 1, (5, 7)) * rng.uniform(0.01, 3, (5, 1))).astype(np.float32)
    x[0, :3] = [0.0, -0.0, F32_TINY_SUB]
    x[1] = np.abs(x[1])  # a channel with no negative value
    x[2] = 0.0  # an all-zero channel: scale float32 eps
    x[3, 4] = -F32_TINY_SUB
    channel, slices = _slices(x, fmt.axis)
    params_ref = [ref.int_quant_params(s, bits, symmetric) for s in slices]

    params = fmt.calibrate(x)
    assert isinstance(params, QuantParams)
    scale = np.broadcast_to(params.scale, x.shape).ravel().tolist()
    zero = np.broadcast_to(params.zero_point, x.shape).ravel().tolist()
    assert scale == [params_ref[c][0] for c in channel]
    assert zero == [params_ref[c][1] for c in channel]

    words, n_saturated = fmt.encode_counting(x, params)
    assert words.dtype == fmt.container and words.shape == x.shape
    expected = [ref.int_quant_word(v, *params_ref[c], bits, symmetric, codes, rounding,
                                   per_tensor=fmt.axis is None)
                for v, c in zip(x.ravel().tolist(), channel, strict=True)]
    assert ref.low_words(words, bits) == [w for w, _ in expected]
    assert n_saturated == sum(s for _, s in expected) == 0
    words2, params2 = fmt.quantize(x)
    assert np.array_equal(words2, words)
    assert np.array_equal(params2.scale, params.scale)

    # decode of any (faulty) pattern uses the clean scale and zero point
    info = np.iinfo(fmt.container)
    faulty = rng.integers(info.min, info.max, x.shape, endpoint=True).astype(fmt.container)
    faulty.ravel()[: words.size // 2] = words.ravel()[: words.size // 2]
    exact = [ref.int_quant_value(w, *params_ref[c], bits, symmetric, codes)
             for w, c in zip(ref.low_words(faulty, bits), channel, strict=True)]
    assert fmt.decode(faulty, params, dtype=np.float64).ravel().tolist() == exact
    as32 = fmt.decode(faulty, params)
    assert as32.dtype == np.float32
    assert ref.float_bits_of(as32) == [ref.float32_bits(v) for v in exact]


@pytest.mark.parametrize("symmetric", [True, False])
def test_int_quant_saturates_values_outside_the_clean_range(symmetric, rng):
    fmt = IntQuant(8, symmetric=symmetric)
    clean = rng.normal(0, 1, 50).astype(np.float32)
    params = fmt.calibrate(clean)
    scale, zero = ref.int_quant_params(clean.tolist(), 8, symmetric)
    wild = np.float32([0.0, 100.0, -100.0, float(clean.max()) * 1.2, float(clean.min()) * 1.2])
    words, n = fmt.encode_counting(wild, params)
    expected = [ref.int_quant_word(v, scale, zero, 8, symmetric, fmt.codes) for v in wild.tolist()]
    assert ref.low_words(words, 8) == [w for w, _ in expected]
    assert n == sum(s for _, s in expected) == 4


def test_int_quant_rejects_non_finite_clean_tensor():
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match=r"index \(1,\)"):
            IntQuant(8).calibrate(np.array([0.5, bad, 1.0]))


def test_int_quant_decode_needs_params():
    with pytest.raises(ValueError, match="params"):
        IntQuant(8).decode(np.zeros(3, np.int8))


@given(
    bits=st.integers(2, 16),
    symmetric=st.booleans(),
    values=st.lists(st.floats(-1e6, 1e6, allow_subnormal=False), min_size=1, max_size=20),
)
@settings(max_examples=150)
def test_int_quant_round_trip_error_within_half_a_step(bits, symmetric, values):
    fmt = IntQuant(bits, symmetric=symmetric)
    x = np.array(values, dtype=np.float64)
    words, params = fmt.quantize(x)
    err = np.abs(fmt.decode(words, params, dtype=np.float64) - x)
    step = float(params.scale)
    # symmetric: within half a step; asymmetric: the zero point's rounding may push the
    # top value one code over the end, so within one step there
    bound = step / 2 if symmetric else step
    # float32 arithmetic: x rounded to float32, x * float32(1/s) rounded, (2**-24 each)
    assert np.all(err <= bound * (1 + 1e-6) + np.abs(x) * 2.0**-22)


def test_int_quant_properties():
    assert IntQuant(8).codes == "signed"
    assert IntQuant(8, symmetric=False).codes == "unsigned"
    assert IntQuant(8).range == (-127.0, 127.0) and IntQuant(8).resolution == 1.0
    assert IntQuant(8, symmetric=False).range == (0.0, 255.0)
    fields = ref.field_positions("int_quant", 12)
    assert {k: list(v) for k, v in IntQuant(12).bit_fields.items()} == {
        k: fields[k] for k in ("sign", "magnitude")}
    assert IntQuant(12).container == np.int16


def _torch_observer(symmetric: bool, per_channel: bool):
    """torch.ao's min/max observer for IntQuant(8, symmetric) (restricted -127..127 range)."""
    torch = pytest.importorskip("torch")
    from torch.ao.quantization import MinMaxObserver, PerChannelMinMaxObserver

    if symmetric:
        kw = dict(dtype=torch.qint8, quant_min=-127, quant_max=127,
                  qscheme=torch.per_channel_symmetric if per_channel
                  else torch.per_tensor_symmetric)
    else:
        kw = dict(dtype=torch.quint8, quant_min=0, quant_max=255,
                  qscheme=torch.per_channel_affine if per_channel else torch.per_tensor_affine)
    return PerChannelMinMaxObserver(ch_axis=0, **kw) if per_channel else MinMaxObserver(**kw)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("per_channel", [False, True])
def test_int_quant_zero_scale_is_torch_eps_floor(symmetric, per_channel, rng):
    torch = pytest.importorskip("torch")
    x = rng.normal(0, 0.1, (4, 6)).astype(np.float32)
    x[1] = 0.0  # a pruned row
    x[2] = np.float32([1e-9, -3e-10, 0, 0, 2e-10, 0])  # below the floor
    cases = [x] if per_channel else [np.zeros(5, np.float32), x[2]]
    for arr in cases:
        fmt = IntQuant(8, symmetric=symmetric, per_channel=per_channel)
        params = fmt.calibrate(arr)
        obs = _torch_observer(symmetric, per_channel)
        obs(torch.from_numpy(arr))
        t_scale, t_zero = obs.calculate_qparams()
        ours = params.scale.ravel()
        floored = t_scale.numpy() == np.float32(fmt.min_scale)
        assert floored.any() and np.all(ours[floored] == fmt.min_scale)
        assert np.array_equal(ours, t_scale.numpy())  # float32 arithmetic: the same bits
        assert np.array_equal(params.zero_point.ravel(), t_zero.numpy().ravel())
        qt = torch.quint8 if not symmetric else torch.qint8
        if per_channel:
            qx = torch.quantize_per_channel(torch.from_numpy(arr), t_scale.double(), t_zero,
                                            0, qt)
        else:
            qx = torch.quantize_per_tensor(torch.from_numpy(arr), float(t_scale), int(t_zero), qt)
        words = fmt.encode(arr, params)
        assert np.array_equal(words.view(qx.int_repr().numpy().dtype), qx.int_repr().numpy())


@pytest.mark.parametrize("symmetric", [True, False])
def test_int_quant_flipped_top_bit_in_a_zero_tensor_stays_tiny(symmetric):
    fmt = IntQuant(8, symmetric=symmetric)
    bias = np.zeros(4, np.float32)
    params = fmt.calibrate(bias)
    words = fmt.encode(bias, params) ^ fmt.container.type(-128)
    assert np.all(np.abs(fmt.decode(words, params)) <= 128 * 2.0**-23)


# ---- Float ---------------------------------------------------------------------------------------


def float_edges() -> list[float]:
    f16 = np.finfo(np.float16)
    return [
        0.0, -0.0, 1.0, -1.0, F32_MAX, -F32_MAX, F32_TINY_SUB, -F32_TINY_SUB, 1e-40, -1e-40,
        float(np.finfo(np.float32).tiny), math.nan, -math.nan, math.inf, -math.inf,
        float(f16.max), -float(f16.max), 65519.99, 65520.0, -65520.0, 65536.0, 1e5,
        float(f16.smallest_subnormal), float(f16.smallest_subnormal) / 2,
        float(f16.smallest_subnormal) * 0.75, float(f16.smallest_subnormal) * 1.5,
        float(f16.tiny), float(f16.tiny) * 0.999, 2.0**-149, 3.0e38, 3.5e38, -3.5e38, 1e300,
        -1e300, 5e-324, -5e-324,
        # bfloat16 ties: low 16 bits exactly 0x8000 with an even and an odd high half
        struct.unpack("<f", struct.pack("<I", 0x3F808000))[0],
        struct.unpack("<f", struct.pack("<I", 0x3F818000))[0],
        struct.unpack("<f", struct.pack("<I", 0x3F808001))[0],
        struct.unpack("<f", struct.pack("<I", 0x7F7F8000))[0],  # rounds up to inf
        struct.unpack("<f", struct.pack("<I", 0x7F7F7FFF))[0],
        struct.unpack("<f", struct.pack("<I", 0x7F7F0000))[0],  # the largest bfloat16
    ]


def float_values(rng: np.random.Generator) -> np.ndarray:
    wide = rng.choice([-1, 1], 2000) * np.exp2(rng.uniform(-160, 130, 2000))
    normal = rng.normal(0, 1, 2000)
    patterns = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns among them
        return np.concatenate([float_edges(), wide, normal, patterns.astype(np.float64)])


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_float_encode_matches_reference(name, dtype, rng):
    fmt = Float(name)
    with np.errstate(over="ignore"):
        x = float_values(rng).astype(dtype)
    words = fmt.encode(x)
    assert words.dtype == (np.int32 if name == "float32" else np.int16)
    values = x.tolist()
    got = ref.low_words(words, fmt.bits)
    want = [ref.float_bits(v, name) for v in values]
    nan = [math.isnan(v) for v in values]
    assert [g for g, n in zip(got, nan, strict=True) if not n] == [
        w for w, n in zip(want, nan, strict=True) if not n]
    for g in (g for g, n in zip(got, nan, strict=True) if n):  # NaN stays NaN
        assert math.isnan(ref.float_from_bits(g, name))
    assert fmt.encode_counting(x)[0].tolist() == words.tolist()


def test_float_default_nan_patterns_are_the_quiet_nans():
    nan = np.array([np.nan, -np.nan], dtype=np.float32)
    assert ref.low_words(Float("float32").encode(nan), 32) == [0x7FC00000, 0xFFC00000]
    assert ref.low_words(Float("float16").encode(nan), 16) == [0x7E00, 0xFE00]
    assert ref.low_words(Float("bfloat16").encode(nan), 16) == [0x7FC0, 0xFFC0]
    # a signalling float32 NaN whose payload lies in the low half stays a NaN in bfloat16
    snan = np.array([0x7F800001], dtype=np.uint32).view(np.float32)
    assert ref.low_words(Float("bfloat16").encode(snan), 16) == [0x7FC0]


def test_bfloat16_agrees_with_ml_dtypes(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with np.errstate(over="ignore"):
        x = float_values(rng).astype(np.float32)
    finite_or_inf = ~np.isnan(x)
    mine = Float("bfloat16").encode(x).view(np.uint16)
    theirs = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(mine[finite_or_inf], theirs[finite_or_inf])
    assert np.all(np.isnan(x.astype(ml_dtypes.bfloat16)[~finite_or_inf].astype(np.float32)))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_float16_decode_every_pattern(name):
    fmt = Float(name)
    words = np.arange(-(2**15), 2**15, dtype=np.int64).astype(np.int16)
    low = ref.low_words(words, 16)
    exact = [ref.float_from_bits(w, name) for w in low]
    for dtype in (np.float32, np.float64):
        got = fmt.decode(words, dtype=dtype)
        assert got.dtype == dtype
        got_list = got.tolist()
        for g, e in zip(got_list, exact, strict=True):
            assert (math.isnan(g) and math.isnan(e)) or (g == e and math.copysign(1, g) ==
                                                         math.copysign(1, e))
    # non-NaN patterns re-encode to themselves (the layout is a bijection off NaN)
    keep = [not math.isnan(e) for e in exact]
    back = ref.low_words(fmt.encode(fmt.decode(words)), 16)
    assert [b for b, k in zip(back, keep, strict=True) if k] == [
        w for w, k in zip(low, keep, strict=True) if k]


def test_float32_decode_random_patterns(rng):
    fmt = Float("float32")
    words = rng.integers(-(2**31), 2**31, 20000).astype(np.int32)
    words[:6] = np.array([0, -(2**31), 0x7F800000, 0x7FC00000, 1, 0x7F7FFFFF]).astype(np.int32)
    got = fmt.decode(words)
    assert got.dtype == np.float32
    # float32 is a plain view: the very same bits, NaN payloads included
    assert ref.float_bits_of(got) == ref.low_words(words, 32)
    exact = [ref.float_from_bits(w, "float32") for w in ref.low_words(words, 32)]
    as64 = fmt.decode(words, dtype=np.float64).tolist()
    assert [a for a, e in zip(as64, exact, strict=True) if not math.isnan(e)] == [
        e for e in exact if not math.isnan(e)]


@given(name=st.sampled_from(["float16", "bfloat16", "float32"]),
       x=st.floats(allow_nan=False, allow_infinity=False, width=32))
@settings(max_examples=200)
def test_float_round_trip_error_within_half_an_ulp(name, x):
    fmt = Float(name)
    hi = fmt.range[1]
    back = float(fmt.decode(fmt.encode(np.float32(x)), dtype=np.float64))
    if abs(x) > hi:
        assert math.isinf(back) or abs(back) == hi
        return
    _, e, m = ref.FLOAT_LAYOUTS[name]
    min_exp = 2 - 2 ** (e - 1)  # the exponent of the smallest normal
    exp = max(math.frexp(x)[1] - 1, min_exp) if x else min_exp
    assert abs(back - x) <= 2.0 ** (exp - m) / 2


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_float_properties(name):
    fmt = Float(name)
    width, e, m = ref.FLOAT_LAYOUTS[name]
    assert fmt.bits == width and fmt.word_mask == 2**width - 1
    assert fmt.resolution == 2.0**-m
    hi = ref.float_from_bits((2**e - 2) << m | (2**m - 1), name)
    assert fmt.range == (-hi, hi)
    fields = ref.field_positions("float", width, dtype=name)
    assert {k: list(v) for k, v in fmt.bit_fields.items()} == {
        k: fields[k] for k in ("sign", "exponent", "mantissa")}
    assert fmt.calibrate(np.zeros(2, np.float32)) is None


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_float_overflow_to_infinity_is_counted_and_quiet(name):
    fmt = Float(name)
    x = np.array([1e300, -1e300, 1.0, math.inf, math.nan], dtype=np.float64)
    with np.errstate(all="raise"):
        words, n = fmt.encode_counting(x)
    assert ref.low_words(words[:3], fmt.bits) == [ref.float_bits(v, name) for v in (1e300, -1e300,
                                                                                      1.0)]
    assert n == 2  # finite values that became +-inf; inf and NaN are stored as they are


# ---- common to every format --------------------------------------------------------------------


ALL_FORMATS = [FixedPoint(32, 28, "trunc"), FixedPoint(8, 3, "nearest", "wrap"),
               FixedPoint(16, 0, overflow="error"), IntQuant(8), IntQuant(4, symmetric=False),
               IntQuant(16, per_channel=True, codes="unsigned"), IntQuant(8, per_channel=1),
               IntQuant(6, rounding="trunc"), Float("float32"), Float("float16"),
               Float("bfloat16")]


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=repr)
def test_format_dict_round_trip(fmt):
    data = json.loads(json.dumps(fmt.to_dict()))
    assert format_from_dict(data) == fmt
    assert type(fmt).from_dict(data) == fmt


def test_format_from_dict_rejects_unknown_kind_and_keys():
    with pytest.raises(ValueError, match=r"kind.*fixed_point"):
        format_from_dict({"kind": "posit", "bits": 8})
    with pytest.raises(ValueError, match=r"unknown key.*'scale'.*allowed"):
        format_from_dict({"kind": "fixed_point", "bits": 8, "scale": 2})
    with pytest.raises(ValueError, match="kind"):
        format_from_dict({"bits": 8})


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=repr)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.complex64, object])
def test_non_float_input_is_a_type_error_naming_x(fmt, dtype):
    with pytest.raises(TypeError, match=r"x must be a float16, float32 or float64 array"):
        fmt.encode(np.ones(3, dtype=dtype))


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=repr)
def test_encode_never_mutates_its_input(fmt, rng):
    x = rng.normal(0, 3, (4, 6)).astype(np.float32)
    tolerant = not isinstance(fmt, IntQuant) and getattr(fmt, "overflow", "") != "error"
    if tolerant:  # values the format has to map, not only store
        x[0, :3] = [np.nan, 1e30, -np.inf]
    before = x.copy()
    words, params = fmt.quantize(x)
    fmt.decode(words, params)
    fmt.encode_counting(x, params)
    assert np.array_equal(x, before, equal_nan=True)


@pytest.mark.parametrize("bits", [0, 1, 33, 64, -8])
def test_bits_outside_2_to_32_rejected(bits):
    with pytest.raises(ValueError, match=r"bits must be an integer in 2\.\.32"):
        FixedPoint(bits, 0)
    with pytest.raises(ValueError, match=r"bits must be an integer in 2\.\.32"):
        IntQuant(bits)


@pytest.mark.parametrize("bits", [8.0, "8", True, None])
def test_bits_of_wrong_type_rejected(bits):
    with pytest.raises(TypeError, match=r"bits must be an integer in 2\.\.32"):
        FixedPoint(bits, 0)
    with pytest.raises(TypeError, match=r"bits must be an integer in 2\.\.32"):
        IntQuant(bits)


def test_frac_outside_0_to_bits_rejected():
    with pytest.raises(ValueError, match=r"frac must be an integer in 0\.\.bits \(8\), got 9"):
        FixedPoint(8, 9)
    with pytest.raises(ValueError, match=r"frac must be an integer in 0\.\.bits"):
        FixedPoint(8, -1)
    with pytest.raises(TypeError, match=r"frac must be an integer"):
        FixedPoint(8, 2.5)


def test_policy_names_rejected_with_the_allowed_values():
    with pytest.raises(ValueError, match=r"rounding must be one of \('nearest', 'trunc'\)"):
        FixedPoint(8, 4, rounding="floor")
    with pytest.raises(ValueError,
                       match=r"overflow must be one of \('saturate', 'wrap', 'error'\)"):
        FixedPoint(8, 4, overflow="clip")
    with pytest.raises(ValueError, match=r"rounding must be one of"):
        IntQuant(8, rounding="up")
    with pytest.raises(ValueError, match=r"codes must be one of \('signed', 'unsigned'\)"):
        IntQuant(8, codes="offset")
    with pytest.raises(TypeError, match="symmetric must be True or False"):
        IntQuant(8, symmetric="yes")
    with pytest.raises(TypeError, match="per_channel must be"):
        IntQuant(8, per_channel="rows")
    with pytest.raises(ValueError, match="per_channel axis 2 is out of range"):
        IntQuant(8, per_channel=2).calibrate(np.zeros((2, 2)))
    with pytest.raises(ValueError,
                       match=r"dtype must be one of \('float32', 'float16', 'bfloat16', "
                             r"'float8_e4m3fn', .*'float8_e8m0fnu'\), got 'float64'"):
        Float("float64")


def test_int_quant_per_channel_true_and_axis_one_are_different_formats():
    """bool == int in Python: per_channel=True (axis 0) must not equal per_channel=1, nor
    per_channel=False (per tensor) equal per_channel=0 (axis 0); caches key on equality."""
    assert IntQuant(8, per_channel=True) != IntQuant(8, per_channel=1)
    assert IntQuant(8, per_channel=False) != IntQuant(8, per_channel=0)
    assert IntQuant(8, per_channel=True) == IntQuant(8, per_channel=True)
    assert hash(IntQuant(8, per_channel=1)) == hash(IntQuant(8, per_channel=1))
    assert len({IntQuant(8, per_channel=True), IntQuant(8, per_channel=1)}) == 2
