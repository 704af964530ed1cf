"""The seam of the PyTorch adapter: (tensors, format, fault model, maps) -> faulty values.

The only module that chooses a kernel; every path gives the bits ``bitfault.inject`` gives:

* the compiled one-pass CPU loops (``kernels.numba``): float32 on the CPU, FixedPoint
  "saturate" and IntQuant per tensor or per channel along axis 0, when Numba imports
  and ``BITFAULT_NUMBA`` is not ``0``;
* the float32 fast paths (``fast_f32`` of ``kernels.fixed``, ``kernels.floats``,
  ``kernels.intquant``): FixedPoint "saturate", Float("float32"), the saturating small
  floats and IntQuant, on any device;
* the generic path (``kernels.generic``): every format, overflow policy and float dtype;
* block formats: on float32 CPU tensors with Numba, one compiled pass per block for MX,
  NVFP4, GGUF and GroupwiseInt (``kernels.block_numba``); otherwise every plane encoded,
  faulted and decoded in tensor ops (``kernels.blocks``: native kernels for those formats, the
  NumPy core on the host for any other ``BlockFormat``).

Each format's kernels come from ``kernels.registry`` (``kernels_for(fmt)``), registered by
format type in its family module. bfloat16 goes through float32 and is rounded back by
PyTorch's cast. ``inject_``,
``fit``, ``quantised_weights`` and ``TorchEvaluator`` all come through here.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence

import numpy as np
import torch

from bitfault.faults.models import FaultModel, check_fault_model
from bitfault.formats import BlockFormat, Format, is_format
from bitfault.maps import FaultMap
from bitfault.memory.memory import check_map_fits
from bitfault.torch.kernels import block_numba, generic, numba
from bitfault.torch.kernels import blocks as block_ops
from bitfault.torch.kernels.device import DeviceFaults
from bitfault.torch.kernels.registry import kernels_for
from bitfault.torch.storable import outside, storable_bounds

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_float_dtype(dtype: torch.dtype, argument: str) -> None:
    """Raise TypeError unless ``dtype`` is one the adapter can store and fault."""
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{argument} has dtype {dtype}; fault injection needs a floating tensor: "
                        f"one of float16, bfloat16, float32, float64")


# ---- the compiled CPU kernels (Numba) ---------------------------------------------------

@functools.cache
def numba_available() -> bool:
    """Numba imports and ``BITFAULT_NUMBA`` is not ``0``."""
    if os.environ.get("BITFAULT_NUMBA", "1").strip() == "0":
        return False
    try:
        import numba as _numba  # noqa: F401
    except ImportError:
        return False
    return True


def compiled_for(x: torch.Tensor, fmt: Format) -> bool:
    """Whether the compiled CPU kernels (``kernels.numba``) compute ``x`` in ``fmt``: float32 on
    the CPU, Numba available, a format they support."""
    if not (x.dtype == torch.float32 and x.device.type == "cpu" and numba_available()):
        return False
    compiled = kernels_for(fmt).compiled
    return compiled is not None and compiled.accepts(fmt, x.ndim)


def block_compiled_for(x: torch.Tensor, fmt: Format) -> bool:
    """Whether the compiled block kernels (``kernels.block_numba``) compute ``x`` in block format
    ``fmt``: a non-empty float32 CPU tensor, Numba available, MX, NVFP4, GGUF or GroupwiseInt."""
    return block_numba.compiled(fmt) and \
        x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() > 0 and \
        numba_available()


def compiled_pass(fmt: Format, fault: FaultModel,
                  fmap: FaultMap) -> Callable[[np.ndarray, np.ndarray], bool]:
    """The compiled kernel of one map, for a tensor ``compiled_for`` accepts: ``call(x, out)``
    writes the faulty values of the flat float32 ``x`` into the flat float32 ``out``;
    False when an IntQuant ``x`` holds NaN or inf (``out`` is then all NaN)."""
    return numba.bind_map(fmt, fault, fmap)


class _FusedPass:
    """The compiled CPU pass over one group of tensors, bound once per map (``kernels.numba``):
    each tensor's kernel, and the memory of the last output, written again once nothing
    else holds it."""

    def __init__(self, fmt: Format, fault: FaultModel, faults: DeviceFaults,
                 shapes: Sequence[tuple[int, ...]]) -> None:
        if kernels_for(fmt).blocks:  # one compiled pass per block
            self.calls = [block_numba.bind(fmt, fault, f) for f in faults.blocks]
        else:
            self.calls = [numba.bind(fmt, fault, index, masks, shape)  # type: ignore[arg-type]
                          for (index, masks), shape in zip(faults.host_parts(), shapes,
                                                           strict=True)]
        self.spans = [(o, o + n, shape) for o, n, shape in
                      zip(faults.offsets, faults.sizes, shapes, strict=True)]
        self.total = sum(faults.sizes)
        # the kept output: a flat float32 array; ``flats``: its slices, one per tensor (the
        # kernels write them), ``shaped``: the same with each tensor's shape. The tensors
        # handed out come from ``torch.from_numpy(shaped[i])``, whose storage holds a
        # reference to that array for as long as any view, alias or saved copy of it lives;
        # ``free``: an array's reference count when only this object holds it
        self.buffer: np.ndarray | None = None
        self.flats: list[np.ndarray] = []
        self.shaped: list[np.ndarray] = []
        self.free = 0

    def _views(self, out: torch.Tensor) -> list[torch.Tensor]:
        return [out[a:b].view(shape) for a, b, shape in self.spans]

    def _output(self, reuse: bool) -> tuple[list[np.ndarray], list[torch.Tensor]]:
        """Where to write: the kept output when nothing else holds it any more (no graph
        saved it, no caller kept it): warm memory, not fresh pages to fault in."""
        if not reuse:
            out = torch.empty(self.total, dtype=torch.float32)
            flat = out.numpy()
            return [flat[a:b] for a, b, _ in self.spans], self._views(out)
        free = self.free
        if self.buffer is None or any(sys.getrefcount(a) != free for a in self.shaped):
            buffer = torch.empty(self.total, dtype=torch.float32).numpy()
            self.buffer = buffer
            self.flats = [buffer[a:b] for a, b, _ in self.spans]
            self.shaped = [f.reshape(shape) for f, (_, _, shape) in
                           zip(self.flats, self.spans, strict=True)]
            del buffer
            self.free = max((sys.getrefcount(a) for a in self.shaped), default=0)  # as above
        return self.flats, [torch.from_numpy(a) for a in self.shaped]

    def __call__(self, xs: Sequence[torch.Tensor], reuse: bool,
                 check: bool = False) -> tuple[list[torch.Tensor], list[int]]:
        """The faulty tensors, and the positions whose kernel returned False (``check``:
        FixedPoint values outside the range or NaN; always: IntQuant NaN or inf)."""
        return self.run([x.numpy().reshape(-1) for x in xs], reuse, check)

    def run(self, flats: Sequence[np.ndarray], reuse: bool,
            check: bool = False) -> tuple[list[torch.Tensor], list[int]]:
        """``__call__`` on the tensors' flat float32 arrays (kept by a caller that knows
        they still are the tensors' memory)."""
        dsts, views = self._output(reuse)
        bad, args = [], (True,) if check else ()
        for i, (x, call, dst) in enumerate(zip(flats, self.calls, dsts, strict=True)):
            if not call(x, dst, *args):
                bad.append(i)
        return views, bad


def _pass_of(xs: Sequence[torch.Tensor], fmt: Format, fault: FaultModel,
             faults: DeviceFaults) -> _FusedPass:
    """The compiled pass of ``xs`` under ``faults``, bound once and kept with ``faults``."""
    kept = faults.__dict__.get("_fused")  # (fmt, fault, plan): the same objects call after call
    if kept is None or kept[0] is not fmt or kept[1] is not fault:
        if kept is None or kept[0] != fmt or kept[1] != fault:
            kept = (fmt, fault, _FusedPass(fmt, fault, faults, [x.shape for x in xs]))
        faults.__dict__["_fused"] = kept = (fmt, fault, kept[2])
    return kept[2]


def _fused_group(xs: Sequence[torch.Tensor], fmt: Format, fault: FaultModel,
                 faults: DeviceFaults, reuse_output: bool,
                 check: bool = False) -> tuple[list[torch.Tensor], list[int]]:
    """FixedPoint "saturate", IntQuant (per tensor / per channel on axis 0) or a compiled
    block format on float32 CPU tensors: one compiled pass per tensor into one flat output,
    its plan kept with ``faults``; also the positions ``_FusedPass`` flags."""
    return _pass_of(xs, fmt, fault, faults)(xs, reuse_output, check)


def checked_pass(xs: Sequence[torch.Tensor], fmt: Format, fault: FaultModel,
                 faults: DeviceFaults) -> _FusedPass | None:
    """The compiled pass ``checked_group`` runs on ``xs`` under ``faults`` (its ``run``
    takes their flat arrays), or None where ``checked_group`` takes another path."""
    if not xs or kernels_for(fmt).blocks or not all(compiled_for(x, fmt) for x in xs):
        return None
    return _pass_of(xs, fmt, fault, faults)


# ---- entry points -------------------------------------------------------------------------

def faulty_group(xs: Sequence[torch.Tensor], fmt: Format, fault: FaultModel, faults: DeviceFaults,
                 strict: bool = False, buffers: dict | None = None,
                 reuse_output: bool = False) -> list[torch.Tensor]:
    """Faulty copies of tensors ``xs`` (one dtype, one device) under ``faults``.

    Elementwise formats on float32 run as one flat pass over all the tensors;
    Each format's kernels come from ``kernels.registry`` (``kernels_for(fmt)``), registered by
format type in its family module. bfloat16 goes through float32 and is rounded back by
PyTorch's cast.
    ``buffers``: a dict the caller keeps between calls, where host scratch is reused.
    ``reuse_output``: the fused CPU kernels may write into the output of the previous call
    with the same ``faults`` once nothing else holds it; the tensors returned are then that
    output's own views, to be handed on only as fresh aliases (``detach()``, ``view_as``).
    """
    if not xs:
        return []
    dtype = xs[0].dtype
    kernels = kernels_for(fmt)
    if kernels.blocks:
        if len(faults.blocks) != len(xs):
            raise ValueError("faults for a block format come from DeviceFaults.of(maps, fmt, "
                             "fault, device)")
        if dtype == torch.bfloat16:  # through float32, rounded back by PyTorch's cast
            outs = faulty_group([x.to(torch.float32) for x in xs], fmt, fault, faults, strict)
            return [o.to(torch.bfloat16) for o in outs]
        if all(block_compiled_for(x, fmt) for x in xs):
            if strict:
                return [_strict_block(x, fmt, fault, f) for x, f in
                        zip(xs, faults.blocks, strict=True)]
            return _fused_group(xs, fmt, fault, faults, reuse_output)[0]
        return [block_ops.faulty_blocks(x, fmt, fault, f, strict)
                for x, f in zip(xs, faults.blocks, strict=True)]
    if dtype == torch.bfloat16:
        outs = faulty_group([x.to(torch.float32) for x in xs], fmt, fault, faults, strict,
                            buffers)
        return [o.to(torch.bfloat16) for o in outs]
    compiled = kernels.compiled
    if compiled is not None and (not strict or compiled.strict) and \
            all(compiled_for(x, fmt) for x in xs):
        return _fused_group(xs, fmt, fault, faults, reuse_output)[0]
    if dtype == torch.float32 and kernels.fast_f32 is not None:
        outs = kernels.fast_f32(xs, fmt, fault, faults, buffers, strict)
        if outs is not None:
            return outs
    outs = []
    for i, x in enumerate(xs):
        part = faults.part(i)
        outs.append(generic.faulty_generic(x, fmt, fault, part.index, part.masks, strict=strict))
    return outs


def checked_group(xs: Sequence[torch.Tensor], fmt: Format, fault: FaultModel,
                  faults: DeviceFaults, buffers: dict | None = None,
                  reuse_output: bool = False) -> tuple[list[torch.Tensor], list[int]]:
    """``faulty_group``, and the positions of the tensors of ``xs`` that ``fmt`` cannot store
    as they are: a value outside ``storable_bounds(fmt, dtype)``, a NaN or an inf (a format
    without bounds: a NaN or an inf). The compiled CPU kernels check while they encode; any
    other path takes one ``aminmax`` pass per tensor (``storable.outside``)."""
    if not xs:
        return [], []
    kind = (fmt, xs[0].dtype, xs[0].device, numba_available())  # one dtype and device:
    # the answer is kept with the faults (whose shapes are fixed)
    known = faults.__dict__.get("_compiled")
    if known is None or known[0] != kind:
        compiled = not kernels_for(fmt).blocks and all(compiled_for(x, fmt) for x in xs)
        faults.__dict__["_compiled"] = known = (kind, compiled)
    if known[1]:
        return _fused_group(xs, fmt, fault, faults, reuse_output, check=True)
    bad = outside(xs, storable_bounds(fmt, xs[0].dtype))
    return faulty_group(xs, fmt, fault, faults, buffers=buffers, reuse_output=reuse_output), bad


def _strict_block(x: torch.Tensor, fmt: BlockFormat, fault: FaultModel,
                  faults: block_ops.BlockFaults) -> torch.Tensor:
    """The compiled block pass of one tensor; NaN, inf or a scale the format cannot store
    raise the core's error."""
    if not bool(torch.isfinite(x).all()):
        fmt.encode(x.numpy())  # raises the core's error, naming the value
    out = torch.empty(tuple(x.shape), dtype=torch.float32)
    if not block_numba.bind(fmt, fault, faults)(x.reshape(-1).numpy(), out.view(-1).numpy()):
        fmt.encode(x.numpy())  # raises the core's error (a scale it cannot store)
    return out


def inject_tensor(x: torch.Tensor, fmt: Format, fault: FaultModel, fmap: FaultMap) -> torch.Tensor:
    """The faulty values of ``x``: encode in ``fmt``, apply ``fault`` at ``fmap``, decode.

    Bit for bit ``bitfault.inject(x.numpy(), fmt, fault, fmap)`` for float16,
    float32 and float64 tensors; bfloat16 is computed on the exact float32 copy
    and rounded back by PyTorch's cast. Returns a new tensor (no autograd graph)
    of x's shape, dtype and device; an IntQuant tensor with NaN or inf raises
    ValueError, as the core does.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_float_dtype(x.dtype, "x")
    if not is_format(fmt):
        raise TypeError(f"fmt must be a bitfault format (FixedPoint, IntQuant, Float or a block "
                        f"format), got {fmt!r}")
    check_fault_model(fault)
    check_map_fits(fmap, tuple(x.shape), fmt)
    if compiled_for(x, fmt) and not kernels_for(fmt).blocks:  # straight from the map
        out = torch.empty(tuple(x.shape), dtype=torch.float32)
        if compiled_pass(fmt, fault, fmap)(x.detach().reshape(-1).numpy(),
                                           out.view(-1).numpy()):
            return out
        # an IntQuant tensor with NaN or inf: the PyTorch path raises the core's error
    faults = DeviceFaults.of([fmap], fmt, fault, x.device)
    with torch.no_grad():
        return faulty_group([x.detach()], fmt, fault, faults, strict=True)[0]
