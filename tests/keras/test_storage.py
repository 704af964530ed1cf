"""Keras through a protected memory (issue 18): what a layer computes with is the decoded
words, the same maps and bits as the NumPy core; fault-aware training trains through it."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import bitfault as bf
from bitfault.keras import FaultyLayer, inject

STORAGE = {"word_bits": 32, "protection": "secded",
           "pattern": {"kind": "mbu", "sizes": {1: 0.6, 2: 0.3, 3: 0.1}}}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


@pytest.mark.parametrize("fmt", [bf.IntQuant(8), bf.MX("float4_e2m1fn")], ids=repr)
@pytest.mark.parametrize("persistence", ["permanent", "transient"])
def test_a_layer_computes_with_the_decoded_words_of_the_core(fmt, persistence) -> None:
    spec = bf.FaultSpec(format=fmt, ber=0.2, seed=4, persistence=persistence,
                        storage=STORAGE)
    wrapper = FaultyLayer(keras.layers.Dense(32), spec, tensor_prefix="m")
    wrapper.build((None, 64))
    kernel = wrapper.layer.weights[0].numpy()
    in_torch = np.ascontiguousarray(kernel.T)  # maps are drawn in PyTorch's (out, in) layout
    fmap = wrapper.maps["m.weight"]
    step = 0 if persistence == "transient" else None
    core = spec.map_for("m.weight", in_torch.shape, step)
    assert np.array_equal(fmap.indices, core.indices) and np.array_equal(fmap.masks,
                                                                         core.masks)
    assert core.meta["outcomes"]["words"] > 0 and core.meta["outcomes"]["corrected"] > 0
    expected = bf.inject(in_torch, fmt, spec.fault, core).T
    assert same_bits(wrapper.faulty_weights()["m.weight"], expected)


def test_fault_aware_training_through_a_protected_memory_updates_the_clean_weights(mlp, data
                                                                                    ) -> None:
    x, y = data
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=0.6, seed=2, storage=STORAGE)
    fmodel = inject(mlp, spec)
    before = [w.copy() for w in fmodel.get_layer("fc1").layer.get_weights()]
    layer = fmodel.get_layer("fc1")
    stored = bf.inject(np.ascontiguousarray(before[0].T), spec.format, spec.fault,
                       bf.FaultMap.empty(before[0].T.shape))
    assert not same_bits(layer.faulty_weights()["fc1.weight"], stored.T)  # faults seen
    fmodel.compile(keras.optimizers.SGD(0.1),
                   keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = fmodel.fit(x, y, epochs=2, batch_size=20, verbose=0)
    after = fmodel.get_layer("fc1").layer.get_weights()
    assert np.isfinite(history.history["loss"]).all()
    assert not np.array_equal(after[0], before[0])  # the straight-through gradient reached W
