"""The TensorFlow encode->fault->decode equals the NumPy core bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import bitfault as bf
from bitfault.keras.seam import fault_function

SEED_FORMAT = bf.FixedPoint(32, 28, rounding="trunc")
EDGES = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e30, -1e30, 3.4e38, 7.9999995, -8.0, 8.0,
                  1e-40, -1e-40, 0.5, 1.5, 2.5, -2.5, 127.5, -128.5, 65504.0, 65520.0, 1e-7,
                  2.0**-28, 2.0**-29, -(2.0**-29)], np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


def run(fn, x: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    if mode == "eager":
        return fn(tf.constant(x), tf.constant(mask)).numpy()
    return tf.function(fn, jit_compile=mode == "xla")(tf.constant(x), tf.constant(mask)).numpy()


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_seed_formula_bit_for_bit(mode: str) -> None:
    """faulty = float32(int32(trunc(w * 2**28)) ^ fmap) / 2**28, the seed's transform."""
    rng = np.random.default_rng(11)
    w = rng.uniform(-7.9, 7.9, (64, 48)).astype(np.float32)
    w[0, :4] = [0.0, -0.0, 2.0**-28, -(2.0**-29)]
    fmap = rng.integers(-(2**31), 2**31, w.shape, dtype=np.int64).astype(np.int32)
    fmap[rng.random(w.shape) < 0.5] = 0
    expected = ((np.trunc(w.astype(np.float64) * 2**28).astype(np.int32) ^ fmap)
                .astype(np.float32) / np.float32(2**28))
    got = run(fault_function(SEED_FORMAT, bf.BitFlip()), w, fmap, mode)
    assert same_bits(got, expected)
    assert not same_bits(got, w)  # the masks did something


FORMATS = [
    bf.FixedPoint(32, 28, "trunc"), bf.FixedPoint(32, 28), bf.FixedPoint(8, 4),
    bf.FixedPoint(16, 8, "trunc"), bf.FixedPoint(26, 10), bf.FixedPoint(8, 4, overflow="wrap"),
    bf.FixedPoint(32, 28, "trunc", "wrap"),
    bf.IntQuant(8), bf.IntQuant(4, symmetric=False), bf.IntQuant(8, codes="unsigned"),
    bf.IntQuant(32), bf.IntQuant(32, symmetric=False), bf.IntQuant(16, rounding="trunc"),
    bf.Float("float32"), bf.Float("float16"), bf.Float("bfloat16"),
    bf.Float("float8_e4m3fn"), bf.Float("float8_e4m3fn", "nan"), bf.Float("float8_e5m2"),
    bf.Float("float8_e5m2", "nan"), bf.Float("float6_e2m3fn"), bf.Float("float6_e3m2fn"),
    bf.Float("float4_e2m1fn"), bf.Float("float8_e8m0fnu"), bf.Float("float8_e8m0fnu", "nan"),
]
FAULTS = [bf.BitFlip(), bf.StuckAt(0), bf.StuckAt(1)]


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@pytest.mark.parametrize("mode", ["graph", "xla"])
def test_every_format_and_fault_matches_core_inject(fmt, mode: str) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(0, 2, 3000).astype(np.float32)
    if not isinstance(fmt, bf.IntQuant):  # IntQuant rejects non-finite tensors in the core
        x[:EDGES.size] = EDGES
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.05, seed=3, name="t")
    for fault in FAULTS:
        mask = fmap.restricted(fault.eligible_mask(fmt)).to_dense(fmt.container)
        with np.errstate(all="ignore"):
            expected = bf.inject(x, fmt, fault, fmap)
        got = run(fault_function(fmt, fault), x, mask, mode)
        assert same_bits(got, expected), (fmt, fault)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_int_quant_per_channel_axis(axis: int) -> None:
    fmt = bf.IntQuant(6, symmetric=False, per_channel=axis)
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(7, 9)) * rng.uniform(0.1, 5, (1, 9))).astype(np.float32)
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.1, seed=1, name="w")
    got = run(fault_function(fmt, bf.BitFlip(), axis=axis % 2), x, fmap.to_dense(np.int8), "xla")
    assert same_bits(got, bf.inject(x, fmt, bf.BitFlip(), fmap))


@pytest.mark.parametrize("fmt", [bf.IntQuant(8), bf.IntQuant(8, symmetric=False),
                                 bf.IntQuant(8, per_channel=True),
                                 bf.IntQuant(4, symmetric=False, per_channel=True)], ids=repr)
def test_int_quant_zero_and_tiny_slices_match_core(fmt) -> None:
    """An all-zero tensor or channel (and one below the floor) gets the eps scale."""
    x = (np.random.default_rng(5).standard_normal((6, 9)) * 0.1).astype(np.float32)
    x[1], x[4] = 0.0, 1e-9
    for i, arr in enumerate([x, np.zeros((6, 9), np.float32)]):
        fmap = bf.FaultMap.random(arr.shape, fmt, ber=0.3, seed=i, name="z")
        fn = fault_function(fmt, bf.BitFlip(), axis=fmt.axis)
        got = run(fn, arr, fmap.to_dense(fmt.container), "xla")
        assert same_bits(got, bf.inject(arr, fmt, bf.BitFlip(), fmap))
        if fmt.axis is not None or not arr.any():
            assert np.abs(got[1]).max() <= 255 * fmt.min_scale


def test_restricted_bits_only_touch_eligible_positions() -> None:
    fmt, fault = bf.Float("float32"), bf.BitFlip(bits="sign")
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.5, seed=0, name="x")
    mask = fmap.restricted(fault.eligible_mask(fmt)).to_dense(np.int32)
    got = run(fault_function(fmt, fault), x, mask, "graph")
    assert np.array_equal(np.abs(got), np.abs(x)) and not np.array_equal(got, x)
    assert same_bits(got, bf.inject(x, fmt, fault, fmap))


def test_overflow_error_format_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"overflow='error'\) is not supported"):
        fault_function(bf.FixedPoint(16, 8, overflow="error"), bf.BitFlip())
    with pytest.raises(ValueError, match=r"Float\('float8_e4m3fn', overflow='error'\) is not "):
        fault_function(bf.Float("float8_e4m3fn", "error"), bf.BitFlip())


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float6_e2m3fn",
                                  "float6_e3m2fn", "float4_e2m1fn", "float8_e8m0fnu"])
@pytest.mark.parametrize("mode", ["eager", "xla"])
def test_small_floats_at_every_code_and_midpoint_match_core_inject(name: str, mode: str) -> None:
    """Every value the format holds, the ties between them, and float32 subnormals."""
    fmt = bf.Float(name)
    codes = np.arange(2**fmt.bits, dtype=np.uint8).view(np.int8)
    values = fmt.decode(codes, dtype=np.float64)
    values = np.unique(values[np.isfinite(values)])
    mids = (values[1:] + values[:-1]) / 2
    x = np.concatenate([values, mids, np.nextafter(mids.astype(np.float32), np.float32(0)),
                        -mids, [1e-40, -1e-40, 2.0**-149, np.nan, -np.nan]]).astype(np.float32)
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.05, seed=8, name="t")
    for fault in FAULTS:
        mask = fmap.restricted(fault.eligible_mask(fmt)).to_dense(fmt.container)
        got = run(fault_function(fmt, fault), x, mask, mode)
        assert same_bits(got, bf.inject(x, fmt, fault, fmap)), fault


def test_small_float_function_built_in_one_graph_runs_in_another() -> None:
    """Keras may build a layer's transform while tracing one graph and call it in another:
    the format's tables must not be tensors of the first graph."""
    fmt = bf.Float("float8_e4m3fn")
    x = np.linspace(-500, 500, 64, dtype=np.float32)
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.1, seed=2, name="g")
    mask = fmap.to_dense(fmt.container)
    built = []

    @tf.function
    def first(v: tf.Tensor) -> tf.Tensor:
        built.append(fault_function(fmt, bf.BitFlip()))
        return built[0](v, tf.zeros_like(v, tf.int8))

    first(tf.constant(x))
    for mode in ("eager", "graph"):
        assert same_bits(run(built[0], x, mask, mode), bf.inject(x, fmt, bf.BitFlip(), fmap))


@pytest.mark.parametrize("fmt", [SEED_FORMAT, bf.FixedPoint(8, 4), bf.IntQuant(8),
                                 bf.IntQuant(4, symmetric=False, per_channel=1),
                                 bf.Float("float16"), bf.Float("bfloat16"),
                                 bf.Float("float8_e4m3fn")], ids=str)
@pytest.mark.parametrize("fault", [bf.BitFlip(), bf.StuckAt(1, bits="msb")], ids=str)
def test_inject_tensor_is_the_core_inject(fmt, fault) -> None:
    """bitfault.keras.inject_tensor: one tensor, its own layout, bitfault.inject's bits."""
    from bitfault.keras import inject_tensor

    rng = np.random.default_rng(5)
    x = rng.normal(0, 0.5, (12, 7)).astype(np.float32)
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.05, seed=3, name="w")
    got = inject_tensor(tf.constant(x), fmt, fault, fmap).numpy()
    assert same_bits(got, bf.inject(x, fmt, fault, fmap))


def test_inject_tensor_refuses_what_does_not_fit() -> None:
    from bitfault.keras import inject_tensor

    fmap = bf.FaultMap.random((4, 4), SEED_FORMAT, ber=0.1, seed=0)
    with pytest.raises(TypeError, match="x must be a float32 tensor"):
        inject_tensor(tf.zeros((4, 4), tf.float64), SEED_FORMAT, bf.BitFlip(), fmap)
    with pytest.raises(ValueError, match="shape"):
        inject_tensor(tf.zeros((4, 5)), SEED_FORMAT, bf.BitFlip(), fmap)
