"""inject / inject_with_stats against the reference, element by element, and the seed program."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
from bitfault import (
    BitFlip,
    FaultMap,
    FixedPoint,
    Float,
    InjectionStats,
    IntQuant,
    StoredArray,
    StuckAt,
    inject,
    inject_with_stats,
)

SEED_FORMAT = FixedPoint(32, 28, rounding="trunc")


def as_dtype(value: float, dtype) -> float:
    """A Python float rounded (nearest-even) to ``dtype``, as the library's final cast does."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return value
    if dtype == np.float32:
        return ref.float_from_bits(ref.float32_bits(value), "float32")
    return ref.float_from_bits(ref.float16_bits(value), "float16")


def reference_inject(x: np.ndarray, fmt, kind: str, value: int, selection, dense_mask: np.ndarray):
    """(faulty values as Python floats, InjectionStats) from the reference, element by element."""
    values = x.ravel().tolist()
    masks = [int(m) for m in dense_mask.astype(np.uint32).ravel().tolist()]
    eligible = ref.mask_of(ref.positions_of(fmt, selection))
    bits = fmt.bits
    if isinstance(fmt, FixedPoint):
        coded = [ref.fixed_point_code(v, bits, fmt.frac, fmt.rounding, fmt.overflow)
                 for v in values]
        words = [ref.pattern(c, bits) for c, _ in coded]
        saturated = sum(s for _, s in coded)

        def decode(w, i):
            return ref.fixed_point_value(w, bits, fmt.frac)
    elif isinstance(fmt, IntQuant):
        axis = fmt.axis
        if axis is None:
            channel = [0] * x.size
            slices = [values]
        else:
            channel = np.indices(x.shape)[axis].ravel().tolist()
            slices = [np.take(x, i, axis=axis).ravel().tolist() for i in range(x.shape[axis])]
        params = [ref.int_quant_params(s, bits, fmt.symmetric) for s in slices]
        coded = [ref.int_quant_word(v, *params[c], bits, fmt.symmetric, fmt.codes, fmt.rounding,
                                    per_tensor=axis is None)
                 for v, c in zip(values, channel, strict=True)]
        words = [w for w, _ in coded]
        saturated = 0

        def decode(w, i):
            return ref.int_quant_value(w, *params[channel[i]], bits, fmt.symmetric, fmt.codes)
    else:
        words = [ref.float_bits(v, fmt.dtype) for v in values]
        saturated = sum(1 for v, w in zip(values, words, strict=True)
                        if math.isfinite(v) and math.isinf(ref.float_from_bits(w, fmt.dtype)))

        def decode(w, i):
            return ref.float_from_bits(w, fmt.dtype)
    faulty = [ref.apply_fault(w, m & eligible, kind, value)
              for w, m in zip(words, masks, strict=True)]
    out = [as_dtype(decode(w, i), x.dtype) for i, w in enumerate(faulty)]
    stats = InjectionStats(
        faults=sum(bin(m & eligible).count("1") for m in masks),
        changed_bits=sum(bin(a ^ b).count("1") for a, b in zip(words, faulty, strict=True)),
        changed_values=sum(a != b for a, b in zip(words, faulty, strict=True)),
        saturated=saturated,
    )
    return out, stats


def assert_same_floats(got: np.ndarray, want: list[float]):
    got_list = got.ravel().tolist()
    assert len(got_list) == len(want)
    for i, (g, w) in enumerate(zip(got_list, want, strict=True)):
        if math.isnan(w):
            assert math.isnan(g), i
        else:
            assert g == w and math.copysign(1, g) == math.copysign(1, w), (i, g, w)


CASES = [
    (SEED_FORMAT, None, 0.3),
    (FixedPoint(16, 8, overflow="wrap"), "integer", 300.0),
    (FixedPoint(8, 4, rounding="trunc"), None, 10.0),
    (FixedPoint(6, 6), "msb", 0.7),
    (IntQuant(8), None, 1.0),
    (IntQuant(4, symmetric=False, per_channel=True), "magnitude", 1.0),
    (IntQuant(12, codes="unsigned", per_channel=1), ["sign", 0], 1.0),
    (IntQuant(32, symmetric=False, codes="signed"), None, 1.0),
    (Float("float32"), None, 1.0),
    (Float("float32"), "exponent", 1.0),
    (Float("float16"), ["sign", "mantissa"], 300.0),
    (Float("bfloat16"), None, 1.0),
]
FAULTS = [("flip", 0), ("stuck", 0), ("stuck", 1)]


def make_fault(kind, value, selection):
    return BitFlip(bits=selection) if kind == "flip" else StuckAt(value, bits=selection)


@pytest.mark.parametrize("fmt,selection,spread", CASES, ids=repr)
@pytest.mark.parametrize("kind,value", FAULTS, ids=["flip", "stuck0", "stuck1"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_inject_matches_reference(fmt, selection, spread, kind, value, dtype, rng):
    shape = (13, 9)
    x = (rng.normal(0, spread, shape)).astype(dtype)
    x[0, :3] = [0.0, -0.0, spread]
    if not isinstance(fmt, IntQuant):  # values the format maps by policy
        x[1, :3] = [np.nan, np.inf, -np.inf]
        x[2, 0] = 1e4 if dtype == np.float16 else 1e30
    fault = make_fault(kind, value, selection)
    fmap = FaultMap.random(shape, fmt, ber=0.08, seed=7, name="layer.weight")
    before = x.copy()
    out, stats = inject_with_stats(x, fmt, fault, fmap)
    assert out.dtype == x.dtype and out.shape == x.shape
    want, want_stats = reference_inject(x, fmt, kind, value, selection, fmap.to_dense())
    assert_same_floats(out, want)
    assert stats == want_stats
    assert stats.faults > 0
    assert np.array_equal(x, before, equal_nan=True)  # the input is never mutated
    assert np.array_equal(inject(x, fmt, fault, fmap), out, equal_nan=True)


@pytest.mark.parametrize("fmt,selection,spread", CASES[:1] + CASES[4:6] + CASES[9:], ids=repr)
def test_inject_with_a_dense_mask_matches_reference(fmt, selection, spread, rng):
    x = rng.normal(0, spread, (40, 3)).astype(np.float32)
    mask = np.where(rng.random(x.shape) < 0.3,
                    rng.integers(0, 2**fmt.bits, x.shape, dtype=np.int64), 0)
    fmap = FaultMap.from_mask(mask.astype(np.uint32).view(np.int32), name="w")
    out, stats = inject_with_stats(x, fmt, BitFlip(bits=selection), fmap)
    want, want_stats = reference_inject(x, fmt, "flip", 0, selection, mask)
    assert_same_floats(out, want)
    assert stats == want_stats


@pytest.mark.parametrize("fmt,selection,spread", CASES, ids=repr)
@pytest.mark.parametrize("kind,value", FAULTS, ids=["flip", "stuck0", "stuck1"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_stored_array_faults_many_maps_as_inject_does(fmt, selection, spread, kind, value,
                                                      dtype, rng):
    """One StoredArray, several maps (and none): the same bits as inject each time, and only
    the elements with an eligible faulty bit come back from faulty_elements."""
    shape = (13, 9)
    x = (rng.normal(0, spread, shape)).astype(dtype)
    x[0, :3] = [0.0, -0.0, spread]
    if not isinstance(fmt, IntQuant):
        x[1, :3] = [np.nan, np.inf, -np.inf]
    fault = make_fault(kind, value, selection)
    stored = StoredArray.of(x, fmt)
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}")
    for seed, ber in ((1, 0.08), (2, 0.01), (3, 0.3), (4, 0.0)):
        fmap = FaultMap.random(shape, fmt, ber=ber, seed=seed, name="layer.weight")
        got = stored.faulty(fault, fmap)
        want = inject(x, fmt, fault, fmap)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got.view(bits), want.view(bits)), (seed, ber)
        idx, values = stored.faulty_elements(fault, fmap)
        eligible = fmap.masks & np.uint32(fault.eligible_mask(fmt)) != 0
        assert np.array_equal(idx, fmap.indices[eligible])
        assert np.array_equal(values.view(bits), want.reshape(-1)[idx].view(bits))


def test_stored_array_checks_its_input():
    with pytest.raises(ValueError, match="shape"):
        StoredArray.of(np.zeros((2, 3), np.float32), SEED_FORMAT).faulty(
            BitFlip(), FaultMap.random((3, 2), SEED_FORMAT, ber=0.1))
    with pytest.raises(TypeError, match="fault"):
        StoredArray.of(np.zeros(3, np.float32), SEED_FORMAT).faulty_elements(
            "flip", FaultMap.empty((3,)))
    with pytest.raises(TypeError, match="fmt"):
        StoredArray.of(np.zeros(3, np.float32), "int8")


def test_seed_program_is_reproduced_bit_for_bit(rng):
    """bitfault.inject == float32(int32(trunc(w * 2**28)) ^ fmap) / 2**28."""
    w = np.concatenate([rng.normal(0, 0.5, 20000), rng.uniform(-8, 8, 20000)])
    w = w.astype(np.float32).reshape(200, 200)
    dense = rng.integers(-(2**31), 2**31, w.shape).astype(np.int32)  # every bit: 1/2
    sparse = np.where(rng.random(w.shape) < 0.01, np.int32(1) << rng.integers(0, 32, w.shape)
                      .astype(np.int32), 0).astype(np.int32)
    for fmap in (dense, sparse, np.zeros_like(dense)):
        seed_out = (np.trunc(w.astype(np.float64) * 2**28).astype(np.int32) ^ fmap).astype(
            np.float32) / np.float32(2**28)
        out = inject(w, SEED_FORMAT, BitFlip(), FaultMap.from_mask(fmap, name="fc1.weight"))
        assert out.dtype == np.float32
        assert np.array_equal(out, seed_out)
    # the same in Python ints for a few elements
    for i in range(0, 40000, 997):
        v, m = float(w.ravel()[i]), int(dense.ravel()[i])
        faulty = (math.trunc(v * 2**28) ^ m)
        got = inject(w.ravel()[i:i + 1], SEED_FORMAT, BitFlip(),
                     FaultMap.from_mask(dense.ravel()[i:i + 1]))
        assert float(got[0]) == ref.f32(faulty * 2.0**-28)


def test_empty_map_stores_and_reads_back_every_value(rng):
    x = rng.normal(0, 1, (5, 5)).astype(np.float32)
    x[0, 0], x[0, 1] = -0.0, np.nan
    empty = FaultMap.from_mask(np.zeros(x.shape, np.int32))
    same = inject(x, Float("float32"), BitFlip(), empty)
    assert np.array_equal(same.view(np.int32), x.view(np.int32))
    q = inject(x, FixedPoint(8, 4), BitFlip(), empty)  # the format's quantisation applies
    assert np.array_equal(q, FixedPoint(8, 4).decode(FixedPoint(8, 4).encode(x)))


@pytest.mark.parametrize("fmt", [FixedPoint(32, 28, "trunc"), IntQuant(8, per_channel=True),
                                 Float("float16")], ids=repr)
def test_non_contiguous_input_is_faulted_like_its_contiguous_copy(fmt, rng):
    base = rng.normal(0, 1, (6, 8)).astype(np.float32)
    for x in (base.T, base[:, ::2], np.asfortranarray(base)):
        fmap = FaultMap.random(x.shape, fmt, count=10, seed=1, name="t")
        out, stats = inject_with_stats(x, fmt, BitFlip(), fmap)
        want, want_stats = inject_with_stats(np.ascontiguousarray(x), fmt, BitFlip(), fmap)
        assert np.array_equal(out.view(np.int32), want.view(np.int32))  # NaN-safe, bit for bit
        assert stats == want_stats
        assert stats.changed_values > 0


def test_read_only_input_is_fine(rng):
    x = rng.normal(0, 1, 20).astype(np.float32)
    x.flags.writeable = False
    out = inject(x, Float("bfloat16"), BitFlip(), FaultMap.random(20, Float("bfloat16"),
                                                                 count=5, name="r"))
    assert out.flags.writeable and out.shape == x.shape


def test_stats_stuck_at_on_bits_already_at_the_value_changes_nothing():
    fmt = FixedPoint(8, 4)
    x = np.array([1.0, 1.0, -1.0, 0.5], np.float32)  # words 0x10, 0x10, 0xF0, 0x08
    mask = np.array([0b0001_0001, 0b0001_0000, 0b1000_0000, 0], np.uint32)
    fmap = FaultMap.from_mask(mask)
    out, stats = inject_with_stats(x, fmt, StuckAt(1), fmap)
    assert stats == InjectionStats(faults=4, changed_bits=1, changed_values=1, saturated=0)
    assert out.tolist() == [1.0625, 1.0, -1.0, 0.5]
    out, stats = inject_with_stats(x, fmt, StuckAt(0), fmap)
    assert stats == InjectionStats(faults=4, changed_bits=3, changed_values=3, saturated=0)
    assert out.tolist() == [0.0, 0.0, 7.0, 0.5]
    out, stats = inject_with_stats(x, fmt, BitFlip(), fmap)
    assert stats == InjectionStats(faults=4, changed_bits=4, changed_values=3, saturated=0)
    # only the eligible bits count as faults
    _, stats = inject_with_stats(x, fmt, BitFlip(bits="msb"), fmap)
    assert stats == InjectionStats(faults=1, changed_bits=1, changed_values=1, saturated=0)


def test_stats_saturated_counts_values_mapped_at_encode():
    x = np.array([np.nan, np.inf, -np.inf, 100.0, -8.0, -8.1, 7.9375, 0.0], np.float32)
    empty = FaultMap.from_mask(np.zeros(8, np.int32))
    _, stats = inject_with_stats(x, FixedPoint(8, 4), BitFlip(), empty)
    assert stats.saturated == 5  # NaN, +-inf, 100 and -8.1; -8 and 7.9375 fit
    _, stats = inject_with_stats(x, FixedPoint(8, 4, overflow="wrap"), BitFlip(), empty)
    assert stats.saturated == 5
    with pytest.raises(ValueError, match=r"index \(0,\)"):
        inject(x, FixedPoint(8, 4, overflow="error"), BitFlip(), empty)
    _, stats = inject_with_stats(x[3:], Float("float16"), BitFlip(), FaultMap.from_mask(
        np.zeros(5, np.int32)))
    assert stats.saturated == 0
    _, stats = inject_with_stats(np.array([1e5, -7e4, 1.0]), Float("float16"), BitFlip(),
                                 FaultMap.from_mask(np.zeros(3, np.int32)))
    assert stats.saturated == 2
    assert stats.faults == stats.changed_bits == stats.changed_values == 0


@given(data=st.data(), fmt=st.sampled_from([Float("float32"), FixedPoint(16, 8),
                                            FixedPoint(8, 4, "trunc")]),
       seed=st.integers(0, 2**32))
@settings(max_examples=60)
def test_inject_flip_twice_is_identity(data, fmt, seed):
    n = data.draw(st.integers(1, 40))
    if isinstance(fmt, Float):  # any float32 bit pattern, NaNs and infinities included
        pats = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n))
        x = np.array(pats, dtype=np.uint32).view(np.float32)
    else:  # values the format stores exactly
        codes = data.draw(st.lists(st.integers(-(2 ** (fmt.bits - 1)), 2 ** (fmt.bits - 1) - 1),
                                   min_size=n, max_size=n))
        x = (np.array(codes) * fmt.resolution).astype(np.float32)
    fmap = FaultMap.random((n,), fmt, ber=0.2, seed=seed, name="twice")
    once = inject(x, fmt, BitFlip(), fmap)
    twice = inject(once, fmt, BitFlip(), fmap)
    assert np.array_equal(twice.view(np.uint32), x.view(np.uint32))


@given(data=st.data(), value=st.sampled_from([0, 1]), seed=st.integers(0, 2**32))
@settings(max_examples=60)
def test_inject_stuck_at_is_idempotent(data, value, seed):
    fmt = FixedPoint(16, 8)
    codes = data.draw(st.lists(st.integers(-(2**15), 2**15 - 1), min_size=1, max_size=40))
    x = (np.array(codes) / 256).astype(np.float32)
    fmap = FaultMap.random(x.shape, fmt, ber=0.3, seed=seed, name="idem")
    once, s1 = inject_with_stats(x, fmt, StuckAt(value), fmap)
    twice, s2 = inject_with_stats(once, fmt, StuckAt(value), fmap)
    assert np.array_equal(once, twice)
    assert s2.changed_bits == 0 and s2.faults == s1.faults


# ---- bad input -----------------------------------------------------------------------------------


def test_shape_mismatch_between_map_and_tensor_rejected():
    fmap = FaultMap.random((4, 3), SEED_FORMAT, count=2, name="fc1.weight")
    with pytest.raises(ValueError, match=r"fmap 'fc1.weight' is for shape \(4, 3\), the tensor "
                                         r"has shape \(3, 4\)"):
        inject(np.zeros((3, 4), np.float32), SEED_FORMAT, BitFlip(), fmap)
    with pytest.raises(ValueError, match="shape"):
        inject(np.zeros(12, np.float32), SEED_FORMAT, BitFlip(), fmap)


@pytest.mark.parametrize("x", [np.arange(4), np.arange(4, dtype=np.int32), [1, 2, 3, 4],
                               np.ones(4, bool), np.ones(4, np.complex128)])
def test_non_float_input_rejected(x):
    fmap = FaultMap.from_mask(np.zeros(4, np.int32))
    with pytest.raises(TypeError, match=r"x must be a float16, float32 or float64 array, got "
                                        r"dtype"):
        inject(x, SEED_FORMAT, BitFlip(), fmap)


def test_other_bad_arguments_rejected():
    x = np.zeros(4, np.float32)
    fmap = FaultMap.from_mask(np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="fmt must be a bitfault format"):
        inject(x, "fixed", BitFlip(), fmap)
    with pytest.raises(TypeError, match=r"fault must be BitFlip\(\) or StuckAt\(0\|1\)"):
        inject(x, SEED_FORMAT, "flip", fmap)
    with pytest.raises(TypeError, match=r"fmap must be a bitfault\.FaultMap"):
        inject(x, SEED_FORMAT, BitFlip(), np.zeros(4, np.int32))
    wide = FaultMap.from_mask(np.array([0, 1 << 8, 0, 0], np.int32), name="w")
    with pytest.raises(ValueError, match=r"faults above bit 7"):
        inject(x, FixedPoint(8, 4), BitFlip(), wide)
    with pytest.raises(ValueError, match="unknown bit field 'exponent'"):
        inject(x, FixedPoint(8, 4), BitFlip(bits="exponent"), FaultMap.from_mask(np.zeros(4,
                                                                                       np.int8)))
