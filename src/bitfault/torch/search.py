"""``TorchSearchModel``: a PyTorch classifier as the worst-case search sees it.

The attack loss (cross-entropy on the attack examples) and its gradient with respect to
the searched tensors' stored values come from ``torch.func.functional_call`` with those
values in place of the parameters; the held-out metric is accuracy on the test examples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


class TorchSearchModel:
    """``model`` (eval mode) with attack data ``(attack_x, attack_y)`` and held-out data
    ``(test_x, test_y)``; ``names``: the parameters searched (default: every weight with
    two or more dimensions, as ``inject_``'s ``"weights"``); ``batch_size``: examples per
    forward on the held-out data."""

    metric_name = "accuracy"
    lower_is_worse = True

    def __init__(self, model: Any, attack_x: Any, attack_y: Any, test_x: Any, test_y: Any, *,
                 names: Sequence[str] | None = None, batch_size: int = 1000) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model.eval()
        params = dict(model.named_parameters())
        if names is None:
            names = [n for n, p in params.items() if n.endswith("weight") and p.ndim >= 2]
        unknown = sorted(set(names) - set(params))
        if unknown:
            raise ValueError(f"names: unknown parameter(s) {unknown}; the model has "
                             f"{sorted(params)}")
        self.names = list(names)
        self._params = params
        self.attack = (torch.as_tensor(np.asarray(attack_x)), torch.as_tensor(
            np.asarray(attack_y)).long())
        self.test = (torch.as_tensor(np.asarray(test_x)), torch.as_tensor(
            np.asarray(test_y)).long())
        self.batch_size = int(batch_size)

    def tensor_values(self) -> dict[str, np.ndarray]:
        return {n: self._params[n].detach().cpu().numpy().copy() for n in self.names}

    def _tensors(self, values: Mapping[str, np.ndarray], grad: bool = False) -> dict[str, Any]:
        import torch

        out = {}
        for n, v in values.items():
            t = torch.as_tensor(np.ascontiguousarray(v), dtype=self._params[n].dtype)
            out[n] = t.requires_grad_(grad)
        return out

    def _loss(self, tensors: Mapping[str, Any]) -> Any:
        import torch
        from torch.func import functional_call

        logits = functional_call(self.model, dict(tensors), (self.attack[0],))
        return torch.nn.functional.cross_entropy(logits.float(), self.attack[1])

    def loss_and_gradients(self, values: Mapping[str, np.ndarray]
                           ) -> tuple[float, dict[str, np.ndarray]]:
        import torch

        tensors = self._tensors(values, grad=True)
        loss = self._loss(tensors)
        grads = torch.autograd.grad(loss, [tensors[n] for n in self.names], allow_unused=True)
        return float(loss.detach()), {n: (np.zeros(values[n].shape) if g is None else g.numpy())
                             for n, g in zip(self.names, grads, strict=True)}

    def attack_losses(self, values: Mapping[str, np.ndarray],
                      changes: Sequence[tuple[str, np.ndarray]]) -> np.ndarray:
        import torch

        base = self._tensors(values)
        out = np.empty(len(changes))
        with torch.no_grad():
            for k, (name, value) in enumerate(changes):
                out[k] = float(self._loss({**base, **self._tensors({name: value})}))
        return out

    def metric(self, values: Mapping[str, np.ndarray]) -> float:
        import torch
        from torch.func import functional_call

        from bitfault.campaign.evaluator import predicted_labels

        tensors = self._tensors(values)
        x, y = self.test
        right = 0
        with torch.no_grad():
            for i in range(0, len(y), self.batch_size):
                logits = functional_call(self.model, tensors, (x[i:i + self.batch_size],))
                pred = predicted_labels(logits.float().numpy())
                right += int((pred == y[i:i + self.batch_size].numpy()).sum())
        return right / len(y)


__all__ = ["TorchSearchModel"]
