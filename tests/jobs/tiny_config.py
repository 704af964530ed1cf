"""The tiny PyTorch run the job tests share (trained once per session by conftest)."""

from __future__ import annotations

from typing import Any

TINY: dict[str, Any] = {
    "framework": "torch",
    "seed": 0,
    "title": "tiny",
    "data": {"source": "embedded", "train_limit": 600, "test_limit": 200},
    "model": {"name": "seed_mlp", "kwargs": {"hidden": 16}},
    "train": {"epochs": 3, "batch_size": 25, "lr": 0.05},
    "recipes": [{"name": "int8", "format": {"kind": "int_quant", "bits": 8}},
                {"name": "clip", "format": {"kind": "int_quant", "bits": 8},
                 "weight_clip": 0.1}],
    "campaign": {"bers": [1e-3, 1e-2], "chips": 2, "seed": 5, "layers": True,
                 "sensitivity_bers": [1e-2]},
}
