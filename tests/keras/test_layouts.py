"""Keras layouts: a map's dense mask in Keras layout is the PyTorch-layout dense mask permuted."""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.keras.layouts import dense_mask, plan_slots

keras = pytest.importorskip("keras")


def built(layer: keras.layers.Layer, input_shape: tuple) -> keras.layers.Layer:
    layer.build(input_shape)
    return layer


LAYERS = {
    "dense": (lambda: built(keras.layers.Dense(5), (None, 7)), (7,)),
    "conv2d": (lambda: built(keras.layers.Conv2D(4, 3), (None, 6, 6, 2)), (6, 6, 2)),
    "conv1d": (lambda: built(keras.layers.Conv1D(3, 2), (None, 9, 4)), (9, 4)),
    "einsum": (lambda: built(keras.layers.EinsumDense("ab,bc->ac", output_shape=6,
                                                      bias_axes="c"), (None, 5)), (5,)),
    "embedding": (lambda: built(keras.layers.Embedding(11, 3), (None, 4)), (4,)),
}
SPECS = {
    "fixed32-bitflip": bf.FaultSpec(format=bf.FixedPoint(32, 28), ber=0.05,
                                    targets=("weights", "biases", "activations")),
    "int8-stuck1-lowbits": bf.FaultSpec(format=bf.IntQuant(8), ber=0.2,
                                        fault=bf.StuckAt(1, bits=[0, 3, 7]),
                                        targets=("weights", "biases")),
    "float16": bf.FaultSpec(format=bf.Float("float16"), ber=0.1),
}


@pytest.mark.parametrize("spec", list(SPECS.values()), ids=list(SPECS))
@pytest.mark.parametrize("layer", list(LAYERS), ids=list(LAYERS))
def test_dense_mask_is_the_torch_layout_mask_permuted(layer: str, spec: bf.FaultSpec) -> None:
    make, in_shape = LAYERS[layer]
    layer_obj = make()
    out_shape = tuple(layer_obj.compute_output_shape((None, *in_shape)))
    if layer == "embedding" and "activations" in spec.targets:
        spec = spec.replace(targets=("weights", "biases"))
    slots = plan_slots(layer_obj, "t", spec.targets, spec.format, out_shape)
    assert slots
    eligible = spec.fault.eligible_mask(spec.format)
    for k, slot in enumerate(slots):
        # a map with bits beyond the eligible ones (and beyond the format's word)
        fmap = bf.FaultMap.random(slot.torch_shape, bf.Float("float32"), ber=0.5, seed=k,
                                  name=slot.name)
        got = dense_mask(slot, fmap, spec.memory)
        want = np.transpose(fmap.restricted(eligible).to_dense(spec.format.container), slot.perm)
        assert got.dtype == np.dtype(spec.format.container) and got.shape == slot.keras_shape
        assert np.array_equal(got, want), slot.name
        assert np.count_nonzero(got) > 0
