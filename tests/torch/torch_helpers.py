"""Helpers shared by the PyTorch adapter tests (import after pytest.importorskip("torch"))."""

import numpy as np
import pytest
import torch

from bitfault.spec import FaultSpec
from bitfault.torch import inject_

nn = torch.nn


def mlp(hidden: int = 16, inputs: int = 20, outputs: int = 4) -> "nn.Module":
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, outputs))


def core_faulty(t: "torch.Tensor", spec, fmap) -> "torch.Tensor":
    """``bitfault.inject`` on the tensor's NumPy twin (bfloat16: on float32, cast back)."""
    import bitfault as bf

    if t.dtype == torch.bfloat16:
        arr = bf.inject(t.detach().float().numpy(), spec.format, spec.fault, fmap)
        return torch.from_numpy(arr).to(torch.bfloat16)
    return torch.from_numpy(bf.inject(t.detach().numpy(), spec.format, spec.fault, fmap))


def bits_equal(a: "torch.Tensor", b: "torch.Tensor") -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.detach().contiguous().view(view), b.detach().contiguous().view(view))


def hook_state(model: "nn.Module") -> list:
    """Every hook dict of every module, and any instance attribute shadowing a parameter."""
    out = []
    for name, m in model.named_modules():
        shadows = sorted(k for k in m._parameters if k in m.__dict__)
        out.append((name, len(m._forward_hooks), len(m._forward_pre_hooks),
                    len(m._backward_hooks), len(getattr(m, "_forward_hooks_always_called", {})),
                    shadows))
    return out


def snapshot(model: "nn.Module") -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(model: "nn.Module", snap: dict) -> bool:
    sd = model.state_dict()
    return list(sd) == list(snap) and all(bits_equal(sd[k], snap[k]) for k in snap)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def plain_predictions(model: "nn.Module", x: np.ndarray, memory, maps: dict) -> np.ndarray:
    """The plain loop: inject_ the maps (every other weight stored in the format), forward."""
    handle = inject_(model, FaultSpec(format=memory.format, fault=memory.fault,
                                         maps=maps or None) if maps else
                     FaultSpec(format=memory.format, fault=memory.fault, count=0))
    try:
        with torch.no_grad():
            logits = model(torch.from_numpy(x)).double()
    finally:
        handle.remove()
    return torch.where(torch.isnan(logits), -torch.inf, logits).argmax(1).numpy()
