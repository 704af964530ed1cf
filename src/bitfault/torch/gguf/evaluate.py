"""Campaigns on a GGUF file: faults in the planes the file stores, one model loaded once.

``GGUFFileMemory`` is the campaign ``Memory`` of a whole file: each tensor's maps are drawn
in the format that tensor is stored in (Q4_1 codes, scales and minimums; Q8_0; F32 words),
so the campaign engine (``bitfault.campaign.run``) draws a trial's maps exactly as
``GGUFMemory.random_maps`` does (nested in the rate, seeded by the GGUF name).
``GGUFEvaluator`` scores a trial: its maps go through ``GGUFModel.inject_`` (the faulty
planes dequantised into the transformers model, the previous trial's tensors put back),
then the model runs on the token windows and an ``OutputMetric`` compares its logits with
the clean run's (the clean logits and the metric's clean side, ``CleanRows``, kept per batch
within ``max_bytes``: a trial computes only the faulty side). A trial whose faults lie in
blocks ``>= k`` (``blk.N.`` tensors, mapped to the model's ``model.layers.N``) starts from
the clean output of block ``k - 1`` (``bitfault.torch.evaluate.stack_reuse``, bounded by
``max_bytes``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import Maps, check_max_bytes, digest_arrays
from bitfault.campaign.metrics import CleanRows, OutputMetric, make_records
from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults.models import BitFlip
from bitfault.formats import GGUF, BlockFormat, Format, plane_formats
from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory
from bitfault.torch.evaluate.unread_rows import RowsBeforeStack

REPRESENTATIVE = GGUF("q4_1")  # every plane a GGUF block can have: codes, scale, min
CLEAN = "gguf"  # the key of the clean run's block outputs: the file itself, any fault model


@dataclass(frozen=True)
class GGUFFileMemory(Memory):
    """A GGUF file's memory: ``formats`` (GGUF name -> the format the file stores it in);
    ``format`` is Q4_1, whose planes (codes, scale, min) name every plane ``plane_rates``
    may weigh. A tensor takes the planes it has; a float tensor's words are its codes."""

    formats: Mapping[str, Format] = field(default_factory=dict)

    def random_map(self, shape: tuple[int, ...], *, ber: Any = None, count: int | None = None,
                   seed: int = 0, name: str = "", bits: Any = None,
                   step: int | None = None, values: Any = None, words: Any = None
                   ) -> FaultMap:
        """The map of tensor ``name`` in the format the file stores it in (``values`` /
        ``words``: unused, a file's memory is never data-dependent)."""
        if name not in self.formats:
            raise ArgumentError("name", name, "a tensor of the GGUF file")
        fmt = self.formats[name]
        rate = ber
        if isinstance(ber, Mapping):
            have = tuple(plane_formats(fmt))
            rate = ({p: v for p, v in ber.items() if p in have} if isinstance(fmt, BlockFormat)
                    else ber.get("codes", 0.0))
        return FaultMap.random(shape, fmt, ber=rate, count=count, seed=seed, name=name,
                               bits=bits, step=step, fault=self.fault)

    def to_dict(self) -> dict[str, Any]:
        types = {n: f.to_dict() for n, f in sorted(self.formats.items())}
        digest = hashlib.sha256(repr(types).encode()).hexdigest()[:16]
        return {**super().to_dict(), "format": {"kind": "gguf_file", "formats": digest}}


class GGUFEvaluator:
    """``gm`` (a ``GGUFModel``) on token ``windows`` (N, T) scored by ``metric`` against
    next-token ``labels`` (N, T); ``targets`` choose GGUF tensors (``GGUFMemory.select``).
    ``stack_reuse`` / ``stack``: as ``OutputEvaluator``'s (False: every trial runs whole)."""

    def __init__(self, gm: Any, windows: Any, labels: np.ndarray, *,
                 metric: OutputMetric | str = "language_model", targets: Any = "weights",
                 batch_size: int | None = None, max_bytes: int = 256 << 20,
                 stack_reuse: bool = True, stack: str | None = None) -> None:
        import torch

        from bitfault.torch.evaluate.stack_reuse import StackReuse

        if not isinstance(stack_reuse, bool):
            raise ArgumentTypeError("stack_reuse", stack_reuse, "True or False")
        self.gm = gm
        self.metric = metric if isinstance(metric, OutputMetric) else OutputMetric(metric)
        self.x = torch.as_tensor(np.asarray(windows, np.int64))
        self.labels = np.asarray(labels, np.int64)
        self.max_bytes = check_max_bytes(max_bytes)
        n = len(self.x)
        size = batch_size or n
        self._batches = [slice(i, min(i + size, n)) for i in range(0, n, size)]
        names = [t for t in gm.memory.select(targets) if t in gm.targets]
        if not names:
            raise ArgumentError("targets", targets, "targets choosing tensors of the file",
                                requirement=f"no tensor of {gm.memory.path} the model computes "
                                            f"with is chosen by {targets!r}")
        self.shapes = {t: tuple(gm.memory.tensors[t].shape) for t in names}
        self.memory = GGUFFileMemory(REPRESENTATIVE, BitFlip(),
                                     formats={t: gm.memory.tensors[t].format for t in names})
        self._clean: dict[int, np.ndarray] = {}
        self._clean_rows: dict[int, CleanRows] = {}  # the metric's clean side, per batch
        self._applied: Any = None
        self.stack_reuse = stack_reuse
        self.stack_cache = StackReuse(gm.model, stack, self.max_bytes)
        gm.restore_()
        first = self._outputs(self._batches[0])
        self.metric.check(first.shape, self.labels[self._batches[0]])
        self._digest = self._file_digest()
        self.rows_before_stack: RowsBeforeStack | None = None  # built after the first capture

    def with_memory(self, fault: Any, plane_rates: Mapping[str, float] | None) -> Memory:
        """The campaign memory: this file's formats, ``fault``, ``plane_rates``."""
        return GGUFFileMemory(REPRESENTATIVE, fault, plane_rates, formats=self.memory.formats)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.shapes)

    def _file_digest(self) -> str:
        h = hashlib.sha256()
        with open(self.gm.memory.path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        h.update(repr(sorted(self.shapes)).encode())
        return h.hexdigest()

    def model_digest(self) -> str:
        return self._digest

    def data_digest(self) -> str:
        return digest_arrays({"x": self.x.numpy(), "y": self.labels})

    def _outputs(self, b: slice) -> np.ndarray:
        import torch

        with torch.no_grad():
            logits = self.gm.model(self.x[b]).logits
        return logits.float().cpu().numpy()

    def _clean_output(self, i: int, b: slice) -> np.ndarray:
        import torch

        hit = self._clean.get(i)
        if hit is None:
            self.gm.restore_()
            self._applied = None
            if self.stack_reuse:
                with self.stack_cache.capture(CLEAN, i, len(self._batches)):
                    hit = self._outputs(b)
                self.stack_cache.verify(CLEAN, i, lambda: self._outputs(b), hit)
            else:
                hit = self._outputs(b)
            if self._kept_bytes() + hit.nbytes <= self.max_bytes:
                self._clean[i] = hit
        if i in self._clean and i not in self._clean_rows and self._kept_bytes() + \
                self.metric.clean_rows_nbytes(hit) <= self.max_bytes:
            rows = self.metric.clean_rows(hit, torch.get_num_threads())
            if rows is not None:
                self._clean_rows[i] = rows
        return hit

    def _kept_bytes(self) -> int:
        """Bytes of the clean logits and the metric's clean side kept (within max_bytes)."""
        return sum(v.nbytes for v in self._clean.values()) + \
            sum(v.nbytes for v in self._clean_rows.values())

    def predict(self, batch_of_maps: Sequence[Maps], memory: Memory) -> list[np.ndarray]:
        """Per-example records (``make_records``, scored on torch's threads) of each map set."""
        import torch

        out = []
        for maps in batch_of_maps:
            active = {n: m for n, m in maps.items()
                      if m.n_faults or any(p.n_faults for p in m.planes.values())}
            parts = []
            for i, b in enumerate(self._batches):
                clean = self._clean_output(i, b)
                faulty = clean
                if active:
                    k = self._start(active) if self.stack_reuse else 0  # may prove, clean
                    if self._applied is not active:
                        self._applied = None
                        self.gm.inject_(active, memory.fault)
                        self._applied = active
                    with self.stack_cache.reusing(CLEAN, i, k):
                        faulty = self._outputs(b)
                parts.append(make_records(self.metric, faulty, clean, self.labels[b],
                                          self._clean_rows.get(i), torch.get_num_threads()))
            out.append(np.concatenate(parts))
        return out

    def _start(self, active: Maps) -> int:
        """The first block a trial's faulty GGUF tensors reach (their parameters' blocks);
        a tied embedding (the LM head's weight) whose faulty rows the data never reads
        reaches nothing before the stack's end (``unread_rows.RowsBeforeStack``)."""
        paths = {n: self.gm.targets[n.partition(":")[0]] for n in active}
        unread = [paths[n] for n, rows in self._faulty_rows(active).items()
                  if self._rows_unread(paths[n], rows)]
        return self.stack_cache.start(set(paths.values()), unread)

    def _faulty_rows(self, active: Maps) -> dict[str, np.ndarray]:
        """GGUF name -> the parameter rows its faults change, for each faulty tensor that
        is a tied-embedding candidate stored in place (other tensors are left out)."""
        if self.rows_before_stack is None:
            self.rows_before_stack = RowsBeforeStack.after_capture(self.gm.model,
                                                                   self.stack_cache)
            if self.rows_before_stack is None:
                return {}
        out = {}
        for name, fmap in active.items():
            base = name.partition(":")[0]
            path = self.gm.targets[base]
            places = self.gm.places(base) if path in self.rows_before_stack.candidates else None
            if places is None or any(v is not None for v in places.places.values()):
                continue
            rows = tensor_rows(fmap, self.memory.formats[base], self.shapes[base])
            if rows is not None:
                out[name] = rows
        return out

    def _rows_unread(self, path: str, rows: np.ndarray) -> bool:
        rb = self.rows_before_stack
        if rb is None:
            return False
        if not rb.proven(CLEAN):
            self.gm.restore_()
            self._applied = None
            rb.prove(CLEAN, [lambda b=b: self._outputs(b) for b in self._batches])
        return rb.unread(CLEAN, {path: rows})


def tensor_rows(fmap: FaultMap, fmt: Format, shape: tuple[int, ...]) -> np.ndarray | None:
    """The rows (first axis) of a 2-D tensor of ``shape`` stored in ``fmt`` whose values
    ``fmap``'s faults (codes and block planes) change; None where a plane's words do not
    lie within one row (blocks across rows, a tensor-wide word)."""
    if len(shape) != 2:
        return None
    width = shape[1]
    rows = [np.asarray(fmap.indices, np.int64) // width]
    for plane in plane_formats(fmt):
        sub = fmap.plane(plane) if plane != CODES else None
        if sub is None or not sub.n_faults:
            continue
        k = getattr(fmt, "block_size", 0)
        if getattr(fmt, "axis", None) not in (-1, 1) or not k or width % k:
            return None
        rows.append(np.asarray(sub.indices, np.int64) // (width // k))
    return np.unique(np.concatenate(rows))


__all__ = ["GGUFEvaluator", "GGUFFileMemory"]
