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
from bitfault.frameworks import Adapter, adapter, framework_for_suffix
from bitfault.inject import inject_with_stats
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec
from bitfault.targets import Targets

SAVED_KINDS = ("weights", "biases")  # what a saved model holds (activations: at run time)
Saver = Callable[[str], Any]
Opener = Callable[[Any, FaultSpec, Targets], tuple[dict[str, Any], Saver, Any]]


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


def load_maps(paths: Sequence[str | os.PathLike[str]]) -> dict[str, FaultMap]:
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
    found = framework_for_suffix(suffix)
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
    ``overwrite``: replace an existing ``output``. The framework's adapter
    (``bitfault.frameworks``) reads and writes the file.
    """
    if spec is None and not maps:
        raise ValueError("give a fault spec (--spec) or at least one fault map (--map)")
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"{os.fspath(model_file)}: no such model file")
    framework = detect_framework(model_file, framework)
    fspec = None if spec is None else load_spec(spec)
    return adapter(framework).inject_file(model_file, output, fspec,
                                          load_maps(maps) if maps else None, overwrite)


def inject_saved(framework: Adapter, model_file: Any, output: Any, spec: FaultSpec | None,
                 maps: dict[str, FaultMap] | None, overwrite: bool, open_saved: Opener
                 ) -> dict[str, Any]:
    """``inject_file`` for a model file of tensors: ``open_saved(model_file, spec,
    targets)`` chooses and faults them (``apply_spec``) and returns (per tensor what was
    faulted, the function that saves the faulty copy, the tensors left out or None)."""
    if maps is not None:
        spec = _spec_from_maps(maps, spec)
    assert spec is not None
    saved = tuple(k for k in spec.targets.kinds if k in SAVED_KINDS)
    if spec.maps is None and (not saved or ("activations" in spec.targets
                              and not spec.targets.include)):
        raise ValueError("spec targets 'activations': activation faults happen at run time "
                         "(bitfault.torch.inject_ / bitfault.keras.inject); a saved model "
                         "holds weights and biases only")
    check_output(model_file, output, overwrite)
    suffix = framework.output_suffix
    if suffix is not None and not os.fspath(output).endswith(suffix):
        raise ValueError(f"{os.fspath(output)}: a {framework.title} model is written as a "
                         f"{suffix} file")
    targets = Targets(saved or SAVED_KINDS, spec.targets.include, spec.targets.exclude)
    tensors, save, left = open_saved(model_file, spec, targets)
    extra: dict[str, Any] = {} if left is None else {"left_out": left}
    write_atomically(output, save)
    return {**extra, "input": os.fspath(model_file), "output": os.fspath(output),
            "framework": framework.name, "format": spec.format.to_dict(),
            "fault": spec.fault.to_dict(), "tensors": tensors,
            "faults": sum(t["faults"] for t in tensors.values()),
            "changed_values": sum(t["changed_values"] for t in tensors.values())}


def recorded_fault(maps: dict[str, FaultMap]) -> FaultModel:
    """The fault model the maps record, when they agree; bit flips otherwise."""
    faults = {json.dumps(m.meta.get("fault"), sort_keys=True) for m in maps.values()}
    data = json.loads(faults.pop()) if len(faults) == 1 else None
    return fault_from_dict(data) if data else BitFlip()


def apply_spec(name: str, clean: np.ndarray, spec: FaultSpec
               ) -> tuple[np.ndarray, dict[str, Any]]:
    """Tensor ``name``'s clean values stored, faulted and decoded as ``spec`` says; returns
    the faulty values and what happened (shape, faults, changed values, saturated)."""
    fmap = spec.map_for(name, tuple(clean.shape), values=clean)  # a data-dependent memory's
    faulty, stats = inject_with_stats(clean, spec.format, spec.fault, fmap)
    return faulty, {"shape": list(clean.shape), "faults": stats.faults,
                    "changed_values": stats.changed_values, "saturated": stats.saturated}


def check_map_names(wanted: list[str], available: list[str]) -> None:
    """A ValueError when fault maps name tensors the model does not have."""
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        raise ValueError(f"fault maps name tensor(s) {unknown} the model does not have; its "
                         f"tensors are {sorted(available)}")


__all__ = ["SAVED_KINDS", "apply_spec", "check_map_names", "check_output", "detect_framework",
           "inject_file", "inject_saved", "load_maps", "load_spec", "recorded_fault",
           "write_atomically"]
