"""``inject_file``: apply a fault spec or saved fault maps to a saved model, write the copy.

A spec's ``targets`` choose the tensors as they do in ``inject_`` / ``inject``.
PyTorch: the file is a ``state_dict`` (``.pt``/``.pth``), chosen by
``bitfault.torch.targets.state_dict_targets``: the weights are the float ``*.weight``
tensors with two or more dimensions (Linear, Conv and Embedding weights: on a model
built of those modules exactly what ``inject_`` faults), the biases the ``*.bias``
beside them; include/exclude patterns narrow them (include patterns may name any float
tensor); a tied tensor is faulted once. Keras: a ``.keras`` file; the kernels, biases
and statistics of every layer kind bitfault.keras faults (``bitfault.keras.select_report``;
what it leaves out is listed with the reason), named and mapped in PyTorch layout as
everywhere in bitfault. GGUF: a ``.gguf`` file, each
tensor faulted in the layout the file stores (``bitfault.files.gguf_memory``: Q8_0/Q4_0/Q4_1
codes, scales and minimums, F32/F16/BF16 words; maps named by the GGUF tensor name,
``"<name>:scale"`` for a plane), the spec's format unused; the copy differs from the
input exactly at the faulted bits. An existing output is replaced only with
``overwrite`` (``--overwrite``).
Maps are applied to the tensors they name. Each chosen tensor becomes
``bitfault.inject(tensor, format, fault, map)``: stored in the format, faulted,
decoded, exactly what the chip would hand back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bitfault.config import read_config_file
from bitfault.errors import ArgumentError
from bitfault.faults.models import BitFlip, FaultModel, fault_from_dict
from bitfault.formats import format_from_dict
from bitfault.inject import inject_with_stats
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec
from bitfault.targets import Targets

SAVED_KINDS = ("weights", "biases")  # what a saved model holds (activations: at run time)
FRAMEWORK_BY_SUFFIX = {".pt": "torch", ".pth": "torch", ".keras": "keras", ".gguf": "gguf"}
Saver = Callable[[str], Any]


def load_spec(source: str | os.PathLike[str] | FaultSpec | dict[str, Any]) -> FaultSpec:
    """A FaultSpec from a spec, its dict, or a ``.json``/``.yaml``/``.toml`` file of that
    dict."""
    if isinstance(source, (FaultSpec, dict)):
        return FaultSpec.coerce(source)
    path = os.fspath(source)
    data = read_config_file(path, what="spec")
    try:
        return FaultSpec.coerce(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def _spec_from_maps(maps: dict[str, FaultMap], spec: FaultSpec | None) -> FaultSpec:
    if spec is not None:
        return spec.replace(maps=maps, persistence="permanent")
    formats = {json.dumps(m.meta.get("format"), sort_keys=True) for m in maps.values()}
    faults = {json.dumps(m.meta.get("fault"), sort_keys=True) for m in maps.values()}
    if "null" in formats or len(formats) != 1:
        raise ValueError("the maps record no format, or different ones; give --spec to say "
                         "how the tensors are stored (its format and fault model are used)")
    fmt = format_from_dict(json.loads(formats.pop()))
    fault_data = json.loads(faults.pop()) if len(faults) == 1 else None
    fault = fault_from_dict(fault_data) if fault_data else BitFlip()
    return FaultSpec(format=fmt, fault=fault, maps=maps)


def _load_maps(paths: Sequence[str | os.PathLike[str]]) -> dict[str, FaultMap]:
    maps: dict[str, FaultMap] = {}
    for p in paths:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{os.fspath(p)}: no such fault map file")
        fmap = FaultMap.load(p)
        if fmap.name in maps:
            raise ValueError(f"{os.fspath(p)}: a second map for tensor {fmap.name!r}")
        maps[fmap.name] = fmap
    return maps


def detect_framework(model_file: str | os.PathLike[str], framework: str | None) -> str:
    suffix = Path(model_file).suffix.lower()
    found = FRAMEWORK_BY_SUFFIX.get(suffix)
    if framework is not None and found is not None and framework != found:
        raise ValueError(f"{os.fspath(model_file)}: a {suffix} file is a {found} model, not "
                         f"{framework}")
    if framework is None and found is None:
        raise ValueError(f"{os.fspath(model_file)}: cannot tell the framework from the suffix "
                         f"{suffix!r} (.pt/.pth: torch, .keras: keras, .gguf: a GGUF file); "
                         "pass --framework")
    return framework or found


def check_output(model_file: str | os.PathLike[str], output: str | os.PathLike[str],
                 overwrite: bool = True) -> None:
    """Refuse an output that is the input model (also through another path or a link), a
    directory, or (unless ``overwrite``) an existing file: the clean weights must survive."""
    if os.path.isdir(output):
        raise IsADirectoryError(f"--output {os.fspath(output)}: is a directory; give the file "
                                "to write")
    if os.path.exists(output) and os.path.samefile(model_file, output):
        raise ValueError(f"--output {os.fspath(output)}: is the input model "
                         f"{os.fspath(model_file)}; writing the faulty copy there would "
                         "replace the clean weights (choose another output path)")
    if os.path.exists(output) and not overwrite:
        raise ArgumentError("output", os.fspath(output), "a path that does not exist, or "
                            "--overwrite", requirement=f"--output {os.fspath(output)}: exists; "
                            "pass --overwrite (overwrite=True) to replace it")


def write_atomically(output: str | os.PathLike[str], save: Callable[[str], Any]) -> None:
    """``save(tmp)`` into a temporary file beside ``output``, then rename it over ``output``:
    a failed or killed write leaves ``output`` as it was."""
    target = Path(output)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.tmp{target.suffix}")
    try:
        save(str(tmp))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def inject_file(model_file: str | os.PathLike[str], output: str | os.PathLike[str], *,
                spec: Any = None, maps: Sequence[str | os.PathLike[str]] = (),
                framework: str | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Write a faulty copy of ``model_file`` to ``output``; returns what was faulted.

    ``spec``: a FaultSpec (or its dict or file); ``maps``: fault map files (npz), each
    applied to the tensor it names. With both, the spec's format and fault model apply
    to the maps; with maps only, the format and fault model the maps record (a GGUF file:
    the formats it stores, the fault model of the spec or the maps, else bit flips).
    ``overwrite``: replace an existing ``output``.
    """
    if spec is None and not maps:
        raise ValueError("give a fault spec (--spec) or at least one fault map (--map)")
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"{os.fspath(model_file)}: no such model file")
    framework = detect_framework(model_file, framework)
    fspec = None if spec is None else load_spec(spec)
    if framework == "gguf":
        return _inject_gguf(model_file, output, fspec, _load_maps(maps) if maps else None,
                            overwrite)
    if maps:
        fspec = _spec_from_maps(_load_maps(maps), fspec)
    saved = tuple(k for k in fspec.targets.kinds if k in SAVED_KINDS)
    if fspec.maps is None and (not saved or ("activations" in fspec.targets
                               and not fspec.targets.include)):
        raise ValueError("spec targets 'activations': activation faults happen at run time "
                         "(bitfault.torch.inject_ / bitfault.keras.inject); a saved model "
                         "holds weights and biases only")
    check_output(model_file, output, overwrite)
    if framework == "keras" and not os.fspath(output).endswith(".keras"):
        raise ValueError(f"{os.fspath(output)}: a Keras model is written as a .keras file")
    targets = Targets(saved or SAVED_KINDS, fspec.targets.include, fspec.targets.exclude)
    extra: dict[str, Any] = {}
    if framework == "torch":
        tensors, save = _inject_torch(model_file, fspec, targets)
    else:
        tensors, save, extra["left_out"] = _inject_keras(model_file, fspec, targets)
    write_atomically(output, save)
    return {**extra, "input": os.fspath(model_file), "output": os.fspath(output),
            "framework": framework, "format": fspec.format.to_dict(),
            "fault": fspec.fault.to_dict(), "tensors": tensors,
            "faults": sum(t["faults"] for t in tensors.values()),
            "changed_values": sum(t["changed_values"] for t in tensors.values())}


def _inject_gguf(model_file: Any, output: Any, spec: FaultSpec | None,
                 maps: dict[str, FaultMap] | None, overwrite: bool) -> dict[str, Any]:
    from bitfault.files.gguf_memory import GGUFMemory

    check_output(model_file, output, overwrite)
    memory = GGUFMemory.open(model_file)
    if maps is not None:
        fault = spec.fault if spec is not None else _recorded_fault(maps)
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


def _recorded_fault(maps: dict[str, FaultMap]) -> FaultModel:
    """The fault model the maps record, when they agree; bit flips otherwise."""
    faults = {json.dumps(m.meta.get("fault"), sort_keys=True) for m in maps.values()}
    data = json.loads(faults.pop()) if len(faults) == 1 else None
    return fault_from_dict(data) if data else BitFlip()


def _apply(name: str, clean: np.ndarray, spec: FaultSpec) -> tuple[np.ndarray, dict[str, Any]]:
    fmap = spec.map_for(name, tuple(clean.shape), values=clean)  # a data-dependent memory's
    faulty, stats = inject_with_stats(clean, spec.format, spec.fault, fmap)
    return faulty, {"shape": list(clean.shape), "faults": stats.faults,
                    "changed_values": stats.changed_values, "saturated": stats.saturated}


def _check_names(wanted: list[str], available: list[str]) -> None:
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        raise ValueError(f"fault maps name tensor(s) {unknown} the model does not have; its "
                         f"tensors are {sorted(available)}")


def _inject_torch(model_file: Any, spec: FaultSpec, targets: Targets
                  ) -> tuple[dict[str, Any], Saver]:
    import torch

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
        _check_names(names, floats)
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
        faulty, tensors[name] = _apply(name, clean, spec)
        out[name] = torch.from_numpy(faulty).to(t.dtype)
        for other, u in state.items():  # a tied tensor is one memory: its other names too
            if other != name and u is not t and _same_memory(u, t):
                out[other] = out[name]
    return tensors, lambda path: torch.save(out, path)


def _same_memory(a: Any, b: Any) -> bool:
    return (a.numel() > 0 and a.data_ptr() == b.data_ptr() and a.shape == b.shape
            and a.stride() == b.stride() and a.dtype == b.dtype)


def _inject_keras(model_file: Any, spec: FaultSpec, targets: Targets
                  ) -> tuple[dict[str, Any], Saver, list[dict[str, Any]]]:
    import dataclasses

    import keras

    from bitfault.keras.targets import select_report

    try:
        model = keras.saving.load_model(model_file, compile=False)
    except Exception as exc:
        raise ValueError(f"{os.fspath(model_file)}: not a loadable Keras model "
                         f"({type(exc).__name__}: {exc})") from None
    chosen, left = select_report(model, SAVED_KINDS if spec.maps is not None else targets)
    slots = {s.name: s for s in chosen}
    if spec.maps is not None:
        _check_names(list(spec.maps), list(slots))
        left += [dataclasses.replace(_as_left_out(s), reason="no fault map names it")
                 for n, s in slots.items() if n not in spec.maps]
        slots = {n: slots[n] for n in spec.maps}
    if not slots:
        raise ValueError(f"{os.fspath(model_file)}: no tensor to fault (left out: "
                         f"{[(t.name, t.reason) for t in left][:8]})")
    tensors = {}
    for name, slot in slots.items():
        faulty, tensors[name] = _apply(name, slot.to_torch(slot.variable.numpy()), spec)
        slot.variable.assign(slot.to_keras(faulty))
    return tensors, model.save, [dataclasses.asdict(t) for t in left]


def _as_left_out(slot: Any) -> Any:
    """A chosen Keras tensor as a ``LeftOut`` (its reason to be filled in)."""
    from bitfault.keras.targets import LeftOut

    return LeftOut(slot.name, tuple(slot.torch_shape), str(slot.variable.dtype), "")


__all__ = ["check_output", "detect_framework", "inject_file", "load_spec",
           "write_atomically"]
