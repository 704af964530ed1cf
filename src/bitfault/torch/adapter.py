"""The PyTorch adapter of ``bitfault.frameworks``: what the jobs and the CLI ask of PyTorch.

A trained model is saved as its ``state_dict`` (``model.pt``) plus, in model.json, the
bounds of its bounded ReLUs; a saved model file to fault is a ``state_dict``
(``.pt``/``.pth``), its tensors chosen by ``bitfault.torch.targets.state_dict_targets``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bitfault.jobs.inject import apply_spec, check_map_names, inject_saved
from bitfault.jobs.run_dir import atomic_path
from bitfault.spec import FaultSpec
from bitfault.targets import Targets


class TorchAdapter:
    """PyTorch: ``nn.Module`` models, ``state_dict`` files."""

    name = "torch"
    title = "PyTorch"
    model_type = "a torch.nn.Module"
    model_file = "model.pt"
    output_suffix: str | None = None

    def builtin(self, name: str) -> Callable[..., Any]:
        from bitfault.models import torch as zoo

        return getattr(zoo, name)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_threads(self, threads: int) -> None:
        torch.set_num_threads(threads)

    def is_model(self, obj: Any) -> bool:
        return isinstance(obj, nn.Module)

    def run_sample(self, model: Any, x: Any) -> None:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                model(torch.as_tensor(x))
        finally:
            model.train(was_training)

    def save_model(self, model: Any, path: Path) -> dict[str, Any]:
        from bitfault.torch import relu_bounds

        info = {"relu_bounds": relu_bounds(model)}
        with atomic_path(path) as tmp:
            torch.save(model.state_dict(), tmp)
        return info

    def prepare_model(self, info: Mapping[str, Any], build: Callable[[], Any]) -> Any:
        model = build()
        if info.get("relu_bounds"):
            from bitfault.torch.recipes import bound_relus_

            bound_relus_(model, info["relu_bounds"])
        return model

    def read_model(self, path: Path) -> Any:
        return torch.load(path, weights_only=True)

    def restore_model(self, prepared: Any, content: Any) -> Any:
        prepared.load_state_dict(content)
        return prepared.eval()

    def fit(self, model: Any, x: Any, y: Any, recipe: Any, **settings: Any) -> list[Any]:
        from bitfault.torch.train import fit

        return fit(model, x, y, recipe, **settings)

    def check_campaign(self, campaign: Any) -> None:
        return None  # PyTorch campaigns fault every target kind

    def make_evaluator(self, model: Any, x: Any, y: Any, targets: Any) -> Any:
        from bitfault.torch import TorchEvaluator

        return TorchEvaluator(model, x, y, targets=targets, batch_size=1000)

    def inject_file(self, model_file: Any, output: Any, spec: Any, maps: Any,
                    overwrite: bool) -> dict[str, Any]:
        return inject_saved(self, model_file, output, spec, maps, overwrite, _open_state_dict)


def _open_state_dict(model_file: Any, spec: FaultSpec, targets: Targets
                     ) -> tuple[dict[str, Any], Callable[[str], Any], None]:
    from bitfault.torch.targets import state_dict_targets

    try:
        state = torch.load(model_file, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{os.fspath(model_file)}: not a loadable state_dict "
                         f"({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise ValueError(f"{os.fspath(model_file)}: expected a state_dict (a dict of tensors, "
                         "as model.state_dict() saves)")
    floats = [n for n, t in state.items() if t.is_floating_point()]
    if spec.maps is not None:
        names = list(spec.maps)
        check_map_names(names, floats)
    else:
        names = state_dict_targets(state, targets)
    if not names:
        raise ValueError(f"{os.fspath(model_file)}: no tensor to fault (no float *.weight "
                         "tensor with two or more dimensions)")
    out = dict(state)
    tensors = {}
    for name in names:
        t = state[name]
        clean = t.detach().to(torch.float32).numpy() if t.dtype == torch.bfloat16 \
            else t.detach().numpy()
        faulty, tensors[name] = apply_spec(name, clean, spec)
        out[name] = torch.from_numpy(faulty).to(t.dtype)
        for other, u in state.items():  # a tied tensor is one memory: its other names too
            if other != name and u is not t and _same_memory(u, t):
                out[other] = out[name]
    return tensors, lambda path: torch.save(out, path), None


def _same_memory(a: Any, b: Any) -> bool:
    return (a.numel() > 0 and a.data_ptr() == b.data_ptr() and a.shape == b.shape
            and a.stride() == b.stride() and a.dtype == b.dtype)


ADAPTER = TorchAdapter()

__all__ = ["ADAPTER", "TorchAdapter"]
