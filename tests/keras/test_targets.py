"""One target vocabulary in Keras: the same Targets choose the same tensor names in inject,
KerasEvaluator, the recipes' stored weights and ``bitfault inject`` on a .keras file, and the
same names as bitfault.torch on the same architecture."""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.jobs import inject_file
from bitfault.keras import KerasEvaluator, fault_maps, inject, select_tensors, stored_weights
from bitfault.models.keras import seed_mlp, small_cnn

TARGETS = ["weights", "weights+biases", {"kinds": ["weights"], "exclude": ["fc*"]},
           {"kinds": ["weights", "biases"], "include": ["conv*", "fc2.*"]}]


def _names(model, targets) -> list[str]:
    return [s.name for s in select_tensors(model, targets)]


@pytest.mark.parametrize("which", ["mlp", "cnn"])
@pytest.mark.parametrize("targets", TARGETS, ids=str)
def test_every_entry_point_faults_the_same_tensors(which, targets, tmp_path) -> None:
    model = seed_mlp(hidden=8) if which == "mlp" else small_cnn((4, 8))
    try:
        want = _names(model, targets)
    except ValueError:
        pytest.skip("the targets name no tensor of this model")
    if not want:
        pytest.skip("the targets name no tensor of this model")
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=0.01, seed=3, targets=targets)
    assert list(fault_maps(inject(model, spec))) == want
    model.save(tmp_path / "m.keras")
    done = inject_file(tmp_path / "m.keras", tmp_path / "out.keras", spec=spec)
    assert list(done["tensors"]) == want
    kernels = [n for n in want if n.endswith(".weight")]
    if kernels == want:  # Keras campaigns fault kernels
        x = np.zeros((2, *model.input_shape[1:]), np.float32)
        ev = KerasEvaluator(model, x, np.zeros(2, np.int64), targets=targets)
        assert list(ev.tensor_shapes()) == want
    if targets == "weights":
        assert list(stored_weights(model)) == want


@pytest.mark.parametrize("targets", TARGETS, ids=str)
def test_the_same_names_as_pytorch(targets) -> None:
    torch_targets = pytest.importorskip("bitfault.torch")
    from bitfault.models import torch as torch_models

    for keras_model, torch_model in ((seed_mlp(hidden=8), torch_models.seed_mlp(hidden=8)),
                                     (small_cnn((4, 8)), torch_models.small_cnn((4, 8)))):
        try:
            want = [s.name for s in torch_targets.select_tensors(torch_model, targets)]
        except ValueError:
            continue
        assert _names(keras_model, targets) == want


def test_names_and_filters(mlp) -> None:
    assert _names(mlp, ["fc2.weight", "fc1.bias"]) == ["fc2.weight", "fc1.bias"]
    assert _names(mlp, "weights+biases") == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert [s.name for s in select_tensors(mlp, "weights", filter_fn="fc2")] == ["fc2.weight"]
    with pytest.raises(ValueError, match=r"unknown tensor\(s\) \['fc9.weight'\]"):
        select_tensors(mlp, ["fc9.weight"])
    fmodel = inject(mlp, bf.FaultSpec(ber=0.1, targets={"kinds": ["weights", "biases"],
                                                        "exclude": ["fc1.*"]}))
    assert list(fault_maps(fmodel)) == ["fc2.weight", "fc2.bias"]
