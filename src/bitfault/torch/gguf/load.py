"""A transformers model loaded once from a GGUF file, faulted in the file's stored memory.

    from bitfault.torch.gguf import load_gguf_model
    gm = load_gguf_model("SmolLM2-135M-Instruct.Q4_1.gguf")     # HF_HUB_OFFLINE=1 works
    maps = gm.memory.random_maps(ber=1e-4, seed=0)               # by GGUF tensor name
    stats = gm.inject_(maps)     # faulty planes dequantised into gm.model's parameters
    ...                           # run gm.model
    gm.restore_()                 # the clean values back, in the faulted tensors only

Faults hit the bits the file stores (``bitfault.files.gguf_memory``): Q4_0/Q4_1/Q8_0 codes,
fp16 scales and minimums, F16/BF16/F32 words. The faulty planes are dequantised as
llama.cpp does and go through transformers' own GGUF tensor processing (its
``TENSOR_PROCESSORS``: llama's q/k rows are un-permuted, GPT-2's matrices transposed) and
its GGUF-to-parameter name map (``get_gguf_hf_weights_map``), exactly the path
``from_pretrained(..., gguf_file=...)`` takes after ``gguf.quants.dequantize``. A tensor
tied to another (an embedding shared with the LM head) is one parameter, written once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bitfault.errors import ArgumentError
from bitfault.faults.models import BitFlip, FaultModel, as_fault_model
from bitfault.files.gguf_memory import GGUFMemory
from bitfault.maps import FaultMap
from bitfault.torch.gguf.patch import ElementPlaces, Written, faulty_elements

MERGING = ("qwen2moe", "qwen3moe", "gpt_oss", "gpt-oss", "minimax-m2")


@dataclass
class GGUFModel:
    """``model`` (a transformers model) loaded from ``memory``'s file; ``targets`` maps
    each GGUF tensor name to the parameter name(s) its values land in."""

    memory: GGUFMemory
    model: torch.nn.Module
    targets: dict[str, str]
    processor: Any
    unmapped: list[str] = field(default_factory=list)
    faulted: set[str] = field(default_factory=set)
    patch: bool = True
    _tensors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _places: dict[str, ElementPlaces | None] = field(default_factory=dict, repr=False)
    _written: dict[str, list[Written]] = field(default_factory=dict, repr=False)

    def values(self, name: str, planes: Mapping[str, np.ndarray] | None = None
               ) -> dict[str, np.ndarray]:
        """The parameter values (by parameter name) tensor ``name``'s ``planes`` give
        (default: its clean planes), after transformers' own processing."""
        return self._processed(name, self.memory.dequantize(name, planes))

    def _processed(self, name: str, weights: np.ndarray) -> dict[str, np.ndarray]:
        """GGUF tensor ``name``'s values ``weights`` as transformers' processor turns them
        into parameter values, by parameter name."""
        parsed: dict[str, Any] = {"tensors": {}}
        result = self.processor.process(weights=weights, name=name,
                                        tensor_key_mapping=self.targets,
                                        parsed_parameters=parsed)
        out = {k: np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v)
               for k, v in parsed["tensors"].items()}
        if result.name is not None and result.name in self.targets:
            out[self.targets[result.name]] = result.weights
        return out

    def places(self, name: str) -> ElementPlaces | None:
        """Where each element of GGUF tensor ``name`` lands in its parameter(s) (found
        once by running the processor on element indices); None: the processor computes
        on the values, so the tensor is written whole."""
        if name not in self._places:
            shape = self.memory.tensor(name).shape
            self._places[name] = ElementPlaces.of(lambda w: self._processed(name, w), shape)
        return self._places[name]

    def parameter(self, hf_name: str) -> torch.Tensor:
        """The model's tensor (parameter or buffer) called ``hf_name``."""
        if not self._tensors:
            self._tensors = dict(self.model.named_parameters(remove_duplicate=False))
            self._tensors.update(dict(self.model.named_buffers(remove_duplicate=False)))
        if hf_name not in self._tensors:
            raise ArgumentError("name", hf_name, "a parameter of the model",
                                requirement=f"the model has no parameter {hf_name!r} for a "
                                            "GGUF tensor")
        return self._tensors[hf_name]

    @torch.no_grad()
    def _write(self, values: Mapping[str, np.ndarray]) -> None:
        for hf_name, v in values.items():
            p = self.parameter(hf_name)
            src = torch.from_numpy(np.ascontiguousarray(v))
            if tuple(src.shape) != tuple(p.shape):
                raise ArgumentError("shape", tuple(src.shape), f"{tuple(p.shape)}",
                                    requirement=f"GGUF values for {hf_name} have shape "
                                                f"{tuple(src.shape)}; the parameter has "
                                                f"{tuple(p.shape)}")
            p.copy_(src.to(device=p.device, dtype=p.dtype))

    def inject_(self, maps: Mapping[str, FaultMap], fault: FaultModel | None = None
                ) -> dict[str, dict[str, Any]]:
        """Write the faulty values of ``maps``' tensors (maps by GGUF name; a plane's map
        may come as ``"<name>:scale"``) into the model, in place; tensors faulted by an
        earlier call and not in ``maps`` get their clean values back first. Returns, per
        tensor, its faults and changed words. Every map is checked before any write.

        With ``patch`` (the default), only the blocks the faults touch are decoded and
        only their elements written (the clean values there kept to put back), at a cost
        in proportion to the faults; a tensor whose processor computes on its values is
        dequantised and written whole. Both give the same bits."""
        grouped = self.memory.group_maps(maps)
        unknown = [n for n in grouped if n not in self.targets]
        if unknown:
            raise ArgumentError("maps", unknown, "GGUF tensors the model computes with",
                                requirement=f"maps name GGUF tensor(s) {unknown} that "
                                            "transformers maps to no parameter of the model")
        fault = as_fault_model(BitFlip() if fault is None else fault)
        staged, stats = {}, {}
        for name, fmap in grouped.items():
            found = faulty_elements(self.memory.tensor(name), fmap, fault) \
                if self.patch and self.places(name) is not None else None
            if found is not None:
                elements, values, faults, changes = found
                stats[name] = {"faults": faults, "changed_values": changes}
                if changes:
                    staged[name] = (elements, values)
                continue
            planes, st = self.memory.faulty_planes(name, fmap, fault)
            stats[name] = {"faults": st.faults, "changed_values": st.changed_values}
            if st.changed_bits:
                staged[name] = planes
        self.restore_()
        for name, part in staged.items():
            if isinstance(part, tuple):
                self._write_elements(name, *part)
            else:
                self._write(self.values(name, part))
        self.faulted = set(staged)
        return stats

    @torch.no_grad()
    def _write_elements(self, name: str, elements: np.ndarray, values: np.ndarray) -> None:
        """Faulty ``values`` of GGUF elements ``elements`` into their places, keeping the
        clean values there to put back."""
        places = self.places(name)
        written = []
        for hf_name in places.places:
            p = self.parameter(hf_name)
            flat = p.view(-1)
            at = torch.from_numpy(places.positions(hf_name, elements)).to(p.device)
            written.append(Written(p, at, flat[at].clone()))
            flat[at] = torch.from_numpy(values).to(device=p.device, dtype=p.dtype)
        self._written[name] = written

    @torch.no_grad()
    def restore_(self, keep: set[str] | None = None) -> None:
        """The clean values back in every faulted tensor (except those in ``keep``)."""
        for name in sorted(self.faulted - (keep or set())):
            if name in self._written:
                for w in reversed(self._written.pop(name)):
                    w.parameter.view(-1)[w.positions] = w.clean
            else:
                self._write(self.values(name))
        self.faulted &= keep or set()


def load_gguf_model(path: str | os.PathLike[str], *, dtype: Any = torch.float32,
                    memory: GGUFMemory | None = None, **kwargs: Any) -> GGUFModel:
    """Open ``path`` as stored memory (every tensor type checked first) and load it once with
    ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=dtype)``; ``kwargs``
    go to ``from_pretrained``."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    memory = GGUFMemory.open(path) if memory is None else memory
    if memory.architecture in MERGING:
        raise ArgumentError("path", memory.path, "a GGUF model whose tensors map one to one "
                            "onto parameters", requirement=(
                                f"{memory.path}: architecture {memory.architecture!r} merges "
                                "several GGUF tensors into one parameter (mixture-of-experts); "
                                "bitfault writes GGUF tensors one by one and does not support it"))
    folder, name = os.path.split(os.path.abspath(memory.path))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype, **kwargs)
    model.eval()
    # the config transformers parsed from the file (what its loader hands the processor)
    processor = TENSOR_PROCESSORS.get(memory.architecture, TensorProcessor)(
        config=model.config.to_dict())
    mapping = get_gguf_hf_weights_map(model, processor)
    targets = {n: mapping[n] for n in memory.names if n in mapping}
    unmapped = [n for n in memory.names if n not in mapping]
    return GGUFModel(memory, model, targets, processor, unmapped)


__all__ = ["GGUFModel", "load_gguf_model"]
