"""PyTorch reference models (imports torch).

ReLUs are ``nn.ReLU`` modules (``act1``, ``act2``) so that
``bitfault.torch.bound_relus_`` can swap them for bounded ones; they hold no
parameters, so ``state_dict()`` keys are the layers' own (``fc1.weight``, ...).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bitfault.errors import check_int

NORMS = (None, "batch", "group")


def _seed_init_(layer: nn.Module, generator: torch.Generator) -> None:
    """Truncated normal with stddev 1/sqrt(fan_in), cut at two stddevs; zero bias (the seed's)."""
    weight = layer.weight
    fan_in = weight[0].numel()
    std = 1.0 / math.sqrt(fan_in)
    with torch.no_grad():
        nn.init.trunc_normal_(weight, 0.0, std, -2 * std, 2 * std, generator=generator)
        if layer.bias is not None:
            layer.bias.zero_()


class SeedMLP(nn.Module):
    """784-hidden-hidden-10 with ReLU: the seed program's network (layers fc1, fc2, fc3)."""

    def __init__(self, hidden: int = 256, inputs: int = 784, classes: int = 10,
                 seed: int = 0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)
        self.act1 = nn.ReLU()
        self.act2 = nn.ReLU()
        g = torch.Generator().manual_seed(seed)
        for layer in (self.fc1, self.fc2, self.fc3):
            _seed_init_(layer, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        x = self.act1(self.fc1(x))
        x = self.act2(self.fc2(x))
        return self.fc3(x)


def _norm(kind: str | None, channels: int, groups: int) -> nn.Module | None:
    if kind is None:
        return None
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    return nn.GroupNorm(math.gcd(groups, channels), channels)


class SmallCNN(nn.Module):
    """Two 3x3 conv layers (conv1, conv2) with max pooling, then one linear layer (fc).

    ``norm``: None, ``"batch"`` (BatchNorm2d) or ``"group"`` (GroupNorm with ``groups``
    groups, fewer if the channels do not divide) after each conv (``norm1``, ``norm2``),
    before its ReLU. Norm layers are not Linear/Conv modules, so ``inject_``'s default
    filter leaves their affine weights unfaulted (pass ``filter_fn`` to include them).
    """

    def __init__(self, channels: tuple[int, int] = (16, 32), classes: int = 10,
                 seed: int = 0, norm: str | None = None, groups: int = 4) -> None:
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        groups = check_int(groups, "groups", 1)
        c1, c2 = channels
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc = nn.Linear(c2 * 7 * 7, classes)
        self.norm = norm
        if norm is not None:
            self.norm1 = _norm(norm, c1, groups)
            self.norm2 = _norm(norm, c2, groups)
        self.act1 = nn.ReLU()
        self.act2 = nn.ReLU()
        g = torch.Generator().manual_seed(seed)
        for layer in (self.conv1, self.conv2, self.fc):
            _seed_init_(layer, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 1, 28, 28)
        x = self.conv1(x)
        if self.norm is not None:
            x = self.norm1(x)
        x = torch.max_pool2d(self.act1(x), 2)
        x = self.conv2(x)
        if self.norm is not None:
            x = self.norm2(x)
        x = torch.max_pool2d(self.act2(x), 2)
        return self.fc(x.flatten(1))


def seed_mlp(hidden: int = 256, seed: int = 0) -> SeedMLP:
    return SeedMLP(hidden=hidden, seed=seed)


def small_cnn(channels: tuple[int, int] = (16, 32), seed: int = 0,
              norm: str | None = None) -> SmallCNN:
    return SmallCNN(channels=channels, seed=seed, norm=norm)


__all__ = ["NORMS", "SeedMLP", "SmallCNN", "seed_mlp", "small_cnn"]
