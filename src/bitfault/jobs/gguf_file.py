"""The "gguf" adapter of ``bitfault.frameworks``: a GGUF file faulted in the layout it
stores (``bitfault.files.gguf_memory``), with no framework.

GGUF files are pretrained models: ``inject_file`` writes a faulty copy, each tensor
faulted in its stored words (Q8_0/Q4_0/Q4_1 codes, scales and minimums, F32/F16/BF16
words; maps named by the GGUF tensor name, ``"<name>:scale"`` for a plane), the spec's
format unused; the copy differs from the input exactly at the faulted bits. Training
and the campaigns of trained models do not apply: their operations raise ValueError
(GGUF campaigns run as pretrained models, ``model.kind: gguf``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from bitfault.files.gguf_memory import GGUFMemory
from bitfault.jobs.inject import SAVED_KINDS, check_output, recorded_fault
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec
from bitfault.targets import Targets


class GGUFAdapter:
    """GGUF files: faulted as stored; no model to build or train."""

    name = "gguf"
    title = "GGUF"
    model_type = "a GGUF file"
    model_file = "model.gguf"
    output_suffix: str | None = None

    def _refuse(self, what: str) -> NoReturn:
        raise ValueError(f"framework 'gguf': GGUF files are faulted as stored (bitfault "
                         f"inject) or run as pretrained models (model.kind: gguf); {what} "
                         "needs framework 'torch' or 'keras'")

    def builtin(self, name: str) -> Callable[..., Any]:
        self._refuse("a built-in model")

    def seed(self, seed: int) -> None:
        self._refuse("seeding a model")

    def set_threads(self, threads: int) -> None:
        return None  # no framework

    def is_model(self, obj: Any) -> bool:
        return False

    def run_sample(self, model: Any, x: Any) -> None:
        self._refuse("running a model")

    def save_model(self, model: Any, path: Path) -> dict[str, Any]:
        self._refuse("saving a model")

    def prepare_model(self, info: Mapping[str, Any], build: Callable[[], Any]) -> Any:
        self._refuse("loading a trained model")

    def read_model(self, path: Path) -> Any:
        self._refuse("loading a trained model")

    def restore_model(self, prepared: Any, content: Any) -> Any:
        self._refuse("loading a trained model")

    def fit(self, model: Any, x: Any, y: Any, recipe: Any, **settings: Any) -> list[Any]:
        self._refuse("training")

    def check_campaign(self, campaign: Any) -> None:
        self._refuse("a campaign of trained models")

    def make_evaluator(self, model: Any, x: Any, y: Any, targets: Any) -> Any:
        self._refuse("an evaluator")

    def inject_file(self, model_file: Any, output: Any, spec: Any, maps: Any,
                    overwrite: bool) -> dict[str, Any]:
        return inject_gguf(model_file, output, spec, maps, overwrite)


def inject_gguf(model_file: Any, output: Any, spec: FaultSpec | None,
                 maps: dict[str, FaultMap] | None, overwrite: bool) -> dict[str, Any]:
    check_output(model_file, output, overwrite)
    memory = GGUFMemory.open(model_file)
    if maps is not None:
        fault = spec.fault if spec is not None else recorded_fault(maps)
        chosen = memory.group_maps(maps)
    elif spec is not None and spec.maps is not None:
        fault, chosen = spec.fault, memory.group_maps(spec.maps)
    else:
        assert spec is not None
        saved = tuple(k for k in spec.targets.kinds if k in SAVED_KINDS)
        if not saved:
            raise ValueError("spec targets 'activations': activation faults happen at run "
                             "time; a GGUF file holds weights and biases only")
        fault = spec.fault
        chosen = memory.random_maps(ber=spec.ber, count=spec.count, seed=spec.seed,
                                    targets=Targets(saved, spec.targets.include,
                                                    spec.targets.exclude), fault=fault)
    if not chosen:
        raise ValueError(f"{os.fspath(model_file)}: no tensor to fault (targets chose none "
                         f"of {len(memory.names)} tensors)")
    tensors = memory.write(output, chosen, fault, overwrite=overwrite)
    return {"input": os.fspath(model_file), "output": os.fspath(output),
            "framework": "gguf", "format": None, "fault": fault.to_dict(),
            "tensors": tensors, "faults": sum(t["faults"] for t in tensors.values()),
            "changed_values": sum(t["changed_values"] for t in tensors.values())}


ADAPTER = GGUFAdapter()

__all__ = ["ADAPTER", "GGUFAdapter", "inject_gguf"]
