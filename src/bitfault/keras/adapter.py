"""The Keras adapter of ``bitfault.frameworks``: what the jobs and the CLI ask of Keras 3.

A trained model is saved whole (``model.keras``); a saved model file to fault is a
``.keras`` file, its kernels, biases and statistics chosen by
``bitfault.keras.targets.select_report`` (what it leaves out is listed with the reason).
Keras campaigns fault kernels only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keras

from bitfault.config import ConfigError, targets_value
from bitfault.jobs.inject import SAVED_KINDS, apply_spec, check_map_names, inject_saved
from bitfault.jobs.run_dir import atomic_path
from bitfault.spec import FaultSpec
from bitfault.targets import Targets


class KerasAdapter:
    """Keras 3: ``keras.Model`` models, ``.keras`` files."""

    name = "keras"
    title = "Keras"
    model_type = "a keras.Model"
    model_file = "model.keras"
    output_suffix: str | None = ".keras"

    def builtin(self, name: str) -> Callable[..., Any]:
        from bitfault.models import keras as zoo

        return getattr(zoo, name)

    def seed(self, seed: int) -> None:
        keras.utils.set_random_seed(seed)

    def set_threads(self, threads: int) -> None:
        return None  # TensorFlow reads TF_NUM_INTRAOP_THREADS when it is imported

    def is_model(self, obj: Any) -> bool:
        return isinstance(obj, keras.Model)

    def run_sample(self, model: Any, x: Any) -> None:
        model(x, training=False)

    def save_model(self, model: Any, path: Path) -> dict[str, Any]:
        with atomic_path(path) as tmp:
            model.save(tmp)
        return {}

    def prepare_model(self, info: Mapping[str, Any], build: Callable[[], Any]) -> Any:
        return None  # the .keras file holds the whole model

    def read_model(self, path: Path) -> Any:
        return keras.saving.load_model(path, compile=False)

    def restore_model(self, prepared: Any, content: Any) -> Any:
        return content

    def fit(self, model: Any, x: Any, y: Any, recipe: Any, **settings: Any) -> list[Any]:
        from bitfault.keras.train import fit

        return fit(model, x, y, recipe, **settings)

    def check_campaign(self, campaign: Any) -> None:
        c = campaign
        if c.targets == "weights+biases" or (
                isinstance(c.targets, Targets) and c.targets.kinds != ("weights",)) or (
                isinstance(c.targets, tuple) and any(not t.endswith(".weight")
                                                     for t in c.targets)):
            raise ConfigError("campaign.targets", targets_value(c.targets), "'weights', a list "
                              "of '<layer>.weight' names or {kinds: [weights], include, "
                              "exclude} for framework 'keras' (Keras campaigns fault kernels)")

    def make_evaluator(self, model: Any, x: Any, y: Any, targets: Any) -> Any:
        from bitfault.keras import KerasEvaluator

        return KerasEvaluator(model, x, y, targets=targets)

    def inject_file(self, model_file: Any, output: Any, spec: Any, maps: Any,
                    overwrite: bool) -> dict[str, Any]:
        return inject_saved(self, model_file, output, spec, maps, overwrite, _open_keras_file)


def _open_keras_file(model_file: Any, spec: FaultSpec, targets: Targets
                     ) -> tuple[dict[str, Any], Callable[[str], Any], list[dict[str, Any]]]:
    from bitfault.keras.targets import select_report

    try:
        model = keras.saving.load_model(model_file, compile=False)
    except Exception as exc:
        raise ValueError(f"{os.fspath(model_file)}: not a loadable Keras model "
                         f"({type(exc).__name__}: {exc})") from None
    chosen, left = select_report(model, SAVED_KINDS if spec.maps is not None else targets)
    slots = {s.name: s for s in chosen}
    if spec.maps is not None:
        check_map_names(list(spec.maps), list(slots))
        left += [dataclasses.replace(_as_left_out(s), reason="no fault map names it")
                 for n, s in slots.items() if n not in spec.maps]
        slots = {n: slots[n] for n in spec.maps}
    if not slots:
        raise ValueError(f"{os.fspath(model_file)}: no tensor to fault (left out: "
                         f"{[(t.name, t.reason) for t in left][:8]})")
    tensors = {}
    for name, slot in slots.items():
        faulty, tensors[name] = apply_spec(name, slot.to_torch(slot.variable.numpy()), spec)
        slot.variable.assign(slot.to_keras(faulty))
    return tensors, model.save, [dataclasses.asdict(t) for t in left]


def _as_left_out(slot: Any) -> Any:
    """A chosen Keras tensor as a ``LeftOut`` (its reason to be filled in)."""
    from bitfault.keras.targets import LeftOut

    return LeftOut(slot.name, tuple(slot.torch_shape), str(slot.variable.dtype), "")


ADAPTER = KerasAdapter()

__all__ = ["ADAPTER", "KerasAdapter"]
