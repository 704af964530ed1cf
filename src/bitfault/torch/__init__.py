"""PyTorch adapter: inject faults into any ``nn.Module`` and train through them.

    import bitfault as bf
    from bitfault.torch import inject_

    spec = bf.FaultSpec(format=bf.FixedPoint(32, 28, rounding="trunc"), ber=1e-3, seed=0)
    handle = inject_(model, spec)       # in place: hooks only, weights stay clean
    ...train or evaluate as usual...    # forward sees faulty values, gradients reach W
    handle.remove()                     # the model is exactly as before

``inject_tensor`` is the tensor-level twin of ``bitfault.inject``: the same bits, on a
torch tensor, on its device. ``fit`` trains for bit-error robustness as a
``bitfault.recipes.Recipe`` says (weight clipping, RandBET, bounded ReLUs;
docs/recipes.md). ``TorchEvaluator`` runs campaigns (``bitfault.campaign``) on a
model and dataset. ``select_tensors`` is what all of them fault for a
``bitfault.Targets`` (docs/torch.md). Importing this module imports torch.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without torch
    raise ModuleNotFoundError(
        "bitfault.torch needs PyTorch: pip install 'bitfault[torch]' (or torch itself)") from exc

from bitfault import MOVED_MODULES
from bitfault.torch.evaluate import OutputEvaluator, TorchEvaluator
from bitfault.torch.handle import FaultHandle, batch_map
from bitfault.torch.inject import inject_
from bitfault.torch.recipes import (
    BoundedReLU,
    ClipHandle,
    bound_relus_,
    calibrate_relu_thresholds,
    clip_weights_,
    relu_bounds,
)
from bitfault.torch.seam import inject_tensor
from bitfault.torch.targets import DEFAULT_MODULES, Selected, select_report, select_tensors
from bitfault.torch.train import (
    evaluate,
    fit,
    quantised_weights,
    randbet_step,
    stored_weights,
)

# the evaluator's modules live in bitfault.torch.evaluate; the old paths still import
MOVED_MODULES.update({f"bitfault.torch.{m}": f"bitfault.torch.evaluate.{m}" for m in (
    "activations", "batch_roles", "budget", "channel_ops", "conv_calls", "graph", "outputs",
    "rank_one", "replica", "single_faults", "stack_reuse", "unread_rows")})
MOVED_MODULES["bitfault.torch.plan"] = "bitfault.torch.evaluate.planner"
MOVED_MODULES["bitfault.torch.gguf_eval"] = "bitfault.torch.gguf.evaluate"
MOVED_MODULES["bitfault.torch.gguf_patch"] = "bitfault.torch.gguf.patch"

__all__ = ["DEFAULT_MODULES", "BoundedReLU", "ClipHandle", "FaultHandle", "OutputEvaluator",
           "Selected", "TorchEvaluator", "batch_map", "bound_relus_", "calibrate_relu_thresholds",
           "clip_weights_", "evaluate", "fit", "inject_", "inject_tensor", "quantised_weights",
           "randbet_step", "relu_bounds", "select_report", "select_tensors", "stored_weights"]
