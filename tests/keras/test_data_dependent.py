"""A data-dependent memory (policy "zero") in a Keras campaign: the maps are the plain loop's
(tests/stored_reference.py) on the evaluator's clean tensors, and the evaluator's
predictions equal injecting them with bitfault.keras.inject."""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import rate_sweep, trial_maps
from bitfault.campaign.runner import evaluate_trials
from bitfault.memory.plane_maps import TensorWords
from bitfault.memory.storage import Storage

keras = pytest.importorskip("keras")
bk = pytest.importorskip("bitfault.keras")
from bitfault.keras import KerasEvaluator  # noqa: E402
from stored_reference import reference_values  # noqa: E402


def test_keras_campaign_with_policy_zero(mlp, data) -> None:
    x, y = data
    ev = KerasEvaluator(mlp, x, y)
    fmt = bf.IntQuant(8)
    storage = Storage(protection={"kind": "secded", "policy": "zero"})
    spec = bf.FaultSpec(format=fmt, ber=0.05, storage=storage)
    trials = rate_sweep([0.05], 2, base_seed=3)
    outputs = evaluate_trials(ev, trials, spec.memory, ev.tensor_shapes())
    words = TensorWords(ev, fmt)
    for t, (_, pred, outcomes) in zip(trials, outputs, strict=True):
        assert outcomes["words_due"] > 0
        maps = trial_maps(t, spec.memory, ev.tensor_shapes(), words)
        for name, fmap in maps.items():
            clean = ev.clean_tensor(name)
            want, _ = reference_values(clean, fmt, storage, t.ber, t.seed, name)
            np.testing.assert_array_equal(bf.inject(clean, fmt, bf.BitFlip(), fmap), want)
        fmodel = bk.inject(mlp, spec.replace(maps=maps, storage=None))
        logits = np.nan_to_num(fmodel.predict(x, verbose=0), nan=-np.inf)
        np.testing.assert_array_equal(pred, np.argmax(logits, axis=1))
