"""Keras' IntQuant (``bitfault.keras.kernels.scalar.int_quant_fault``) equals the core bit
for bit on tensors full of code ties, where float32 and float64 arithmetic, or adding the zero point
before or after rounding, give different codes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import bitfault as bf
from bitfault.keras.seam import fault_function

FORMATS = [bf.IntQuant(8), bf.IntQuant(8, symmetric=False), bf.IntQuant(4, symmetric=False),
           bf.IntQuant(8, codes="unsigned"), bf.IntQuant(16, symmetric=False),
           bf.IntQuant(30, symmetric=False), bf.IntQuant(8, symmetric=False, rounding="trunc")]


def tie_tensor(fmt: bf.IntQuant, seed: int) -> np.ndarray:
    """(6, 40) float32 values, half of them at k + 1/2 codes of the core's scale (and one
    float32 ulp either side), each channel's extremes kept."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(0, 1, (6, 40)) * 10.0 ** rng.uniform(-4, 2, (6, 1))).astype(np.float32)
    if seed % 2:
        x += np.float32(rng.uniform(0, 2) * np.abs(x).max())
    params = fmt.calibrate(x)
    s = np.broadcast_to(params.scale.astype(np.float64), x.shape)
    z = np.broadcast_to(params.zero_point, x.shape)
    lo, hi = fmt.code_range
    ties = ((rng.integers(lo, hi, x.shape) + 0.5 - z) * s).astype(np.float32)
    nudge = rng.integers(-1, 2, x.shape)
    ties = np.where(nudge > 0, np.nextafter(ties, np.float32(np.inf)),
                    np.where(nudge < 0, np.nextafter(ties, np.float32(-np.inf)), ties))
    keep = np.zeros(x.shape, bool)
    if fmt.axis is None:
        keep.ravel()[[np.argmin(x), np.argmax(x)]] = True
        mn, mx = x.min(), x.max()
    else:
        rows = np.arange(x.shape[0])
        keep[rows, np.argmin(x, axis=1)] = keep[rows, np.argmax(x, axis=1)] = True
        mn, mx = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    pick = (rng.random(x.shape) < 0.5) & ~keep
    return np.where(pick, np.clip(ties, mn, mx), x).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("mode", ["eager", "xla"])
def test_keras_int_quant_equals_the_core_at_ties(fmt, per_channel, mode) -> None:
    fmt = bf.IntQuant(fmt.bits, symmetric=fmt.symmetric, per_channel=per_channel,
                      rounding=fmt.rounding, codes=fmt.codes)
    fault = bf.BitFlip()
    fn = fault_function(fmt, fault, 0 if per_channel else None)
    if mode == "xla":
        fn = tf.function(fn, jit_compile=True)
    for seed in range(4):
        x = tie_tensor(fmt, seed)
        assert np.array_equal(fmt.calibrate(x).scale, fmt.calibrate(tie_tensor(fmt, seed)).scale)
        for ber in (0.0, 0.05):
            fmap = bf.FaultMap.random(x.shape, fmt, ber=ber, seed=seed, name="t")
            mask = fmap.restricted(fault.eligible_mask(fmt)).to_dense(fmt.container)
            expected = bf.inject(x, fmt, fault, fmap)
            got = fn(tf.constant(x), tf.constant(mask)).numpy()
            assert np.array_equal(got.view(np.int32), expected.view(np.int32)), (seed, ber)
