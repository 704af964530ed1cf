"""Block formats in one compiled pass per block (Numba), for float32 tensors on the CPU.

The eager kernels (``kernels.block_formats``) run about a dozen tensor passes per weight (to
blocks, statistics, scale, rounding key, two lookups, product, back). The loops of
``kernels.block_loops`` visit each block once, straight from the tensor (the block axis last:
other axes are moved there first; the last block of a row padded
with zeros): its statistics, its scale words, its element codes, the faults of that block
in every plane, and the decoded values, written once into the output.

The arithmetic is the core's (``formats.mx``, ``nvfp4``, ``gguf``, ``groupwise``): the same
float32 operations in the same order, small floats rounded by the core's key table
(``formats.mx.round_to_element`` on one representative per key) and decoded by the core's
decode of every word, fp16 rounded to nearest even (inf beyond 65504) and decoded by a
table of the core's fp16 values. ``bitfault.torch.seam`` decides when these kernels run.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import numpy as np

from bitfault.faults.models import FaultModel
from bitfault.formats import BlockFormat, Float
from bitfault.formats.gguf import GGUF
from bitfault.formats.groupwise import GroupwiseInt
from bitfault.formats.minifloat import SMALL_FLOATS
from bitfault.formats.mx import EMAX_ELEM, MX, round_to_element
from bitfault.formats.nvfp4 import NVFP4
from bitfault.torch.kernels import block_loops
from bitfault.torch.kernels.blocks import BlockFaults
from bitfault.torch.kernels.numba import fault_op
from bitfault.torch.kernels.registry import kernels_for, register

_GGUF = {"q8_0": 0, "q4_0": 1, "q4_1": 2}


def compiled(fmt: BlockFormat) -> bool:
    """Whether ``fmt``'s exact type has a compiled kernel (a subclass may change the
    arithmetic: it does not)."""
    return kernels_for(fmt).block_bind is not None


# ---- the core's tables as arrays ------------------------------------------------------------

@functools.cache
def encode_table(name: str) -> tuple[np.ndarray, int, int]:
    """(the saturating code of every rounding key of small float ``name``, as uint8; the
    key's shift; its mask): ``round_to_element`` on one representative per key."""
    shift = 21 - SMALL_FLOATS[name].mantissa
    reps = (np.arange(1 << (32 - shift), dtype=np.uint32) << np.uint32(shift)).view(np.float32)
    with np.errstate(invalid="ignore"):
        table = round_to_element(reps, name).astype(np.uint8)
    return table, shift, (1 << (32 - shift)) - 1


@functools.cache
def decode_table(name: str) -> np.ndarray:
    """The float32 value of every word of ``name`` (a small float, or "float16"), as the
    core decodes it."""
    if name == "float16":
        return np.arange(1 << 16).astype(np.uint16).view(np.float16).astype(np.float32)
    fmt = Float(name)
    with np.errstate(all="ignore"):
        return np.ascontiguousarray(fmt.decode(np.arange(1 << fmt.bits)), dtype=np.float32)


# ---- compiling and binding --------------------------------------------------------------------

# no bounds checks; NumPy's error model: no zero check on a float division (none divides by
# zero: where the core's would, the loops test first), which lets the loops vectorise;
# no fast-math (it may change bits), no threads (the training step has its own)
_JIT = {"boundscheck": False, "error_model": "numpy"}


@functools.cache
def _kernels() -> dict[str, Callable]:
    """Compile on first use (cached on disk where Numba can write): the helpers first,
    inlined into the loops."""
    import numba

    def jit(fn: Callable, **options: str) -> Callable:
        try:
            return numba.njit(nogil=True, cache=True, **_JIT, **options)(fn)
        except Exception:  # no writable cache directory: compile in memory every process
            return numba.njit(nogil=True, **_JIT, **options)(fn)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Numba's notes on caching
        for name in block_loops.HELPERS:
            setattr(block_loops, name, jit(getattr(block_loops, name), inline="always"))
        return {name: jit(getattr(block_loops, name)) for name in block_loops.KERNELS}


def _small(name: str) -> tuple:
    table, shift, key_mask = encode_table(name)
    return table, np.uint32(shift), np.uint32(key_mask), decode_table(name)


# the format's constants and tables, in its loop's order after ``op``

def _mx_args(fmt: MX) -> tuple:
    e8m0 = decode_table("float8_e8m0fnu")
    if fmt.element == "int8":
        none = np.zeros(1, np.uint8), np.uint32(0), np.uint32(0), np.zeros(1, np.float32)
        return True, EMAX_ELEM["int8"], *none, 0xFF, e8m0
    bits = SMALL_FLOATS[fmt.element].bits
    return False, EMAX_ELEM[fmt.element], *_small(fmt.element), (1 << bits) - 1, e8m0


def _nvfp4_args(fmt: NVFP4) -> tuple:
    return (*_small("float4_e2m1fn"), *_small("float8_e4m3fn"))


def _gguf_args(fmt: GGUF) -> tuple:
    return _GGUF[fmt.type], decode_table("float16")


def _groupwise_args(fmt: GroupwiseInt) -> tuple:
    lo, hi = fmt.code_range
    return fmt.symmetric, fmt.bits, lo, hi, decode_table("float16")


_LOOPS: dict[type, tuple[str, Callable[..., tuple]]] = {  # by exact type, as registered
    MX: ("mx_kernel", _mx_args), NVFP4: ("nvfp4_kernel", _nvfp4_args),
    GGUF: ("gguf_kernel", _gguf_args), GroupwiseInt: ("groupwise_kernel", _groupwise_args)}


_END = np.int64(2**62)  # past every position: the kernels' lists end with it


def _sorted(pos: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pos`` ascending (already so when the block axis is last) and ``masks`` with it, each
    ending in ``_END`` (and a zero mask)."""
    if pos.size > 1 and not bool((pos[1:] >= pos[:-1]).all()):
        order = np.argsort(pos, kind="stable")
        pos, masks = pos[order], masks[order]
    return np.append(pos.astype(np.int64, copy=False), _END), \
        np.append(masks.astype(np.int64, copy=False), np.int64(0))


_NO_FAULTS = _sorted(np.zeros(0, np.int64), np.zeros(0, np.int64))  # shared: only read


def _fault_arrays(fmt: BlockFormat, faults: BlockFaults) -> tuple:
    """(cpos, cmask, b0pos, b0mask, b1pos, b1mask, tmask): every plane's faults, sorted by
    block-form position (codes ``block * k + slot``, block planes the block number), so that
    the kernels walk them block by block; cost in proportion to the faults."""
    block_planes = [p.name for p in fmt.planes if p.per == "block"]
    arrays = [*_NO_FAULTS, *_NO_FAULTS, *_NO_FAULTS]
    tmask = 0
    for name, (where, m) in faults.host.items():
        if name == "codes":
            arrays[0:2] = _sorted(where, m)
        elif name in block_planes:
            i = 2 + 2 * block_planes.index(name)
            arrays[i:i + 2] = _sorted(where, m)
        else:
            tmask = int(m[0])
    return (*arrays, tmask)


def bind(fmt: BlockFormat, fault: FaultModel, faults: BlockFaults
         ) -> Callable[[np.ndarray, np.ndarray], bool]:
    """One tensor's kernel with all but its data bound: ``call(x, out)`` sets the flat
    float32 ``out`` to decode(fault(encode(x))) of the flat float32 ``x`` (C order, the
    shape of ``faults.layout``); False when a GroupwiseInt scale does not fit float16
    (where the core raises). A block axis other than the last is moved last first."""
    name, format_args = _LOOPS[type(fmt)]
    kernel = _kernels()[name]
    lay = faults.layout
    rows = lay.n_blocks // lay.n_blocks_per_row if lay.n_blocks else 0
    args = (rows, lay.length, lay.k, lay.n_blocks_per_row, *_fault_arrays(fmt, faults),
            fault_op(fault), *format_args(fmt))
    if lay.axis == len(lay.shape) - 1:
        def call(x: np.ndarray, out: np.ndarray) -> bool:
            return bool(kernel(x, out, *args))

        return call
    shape, moved = lay.shape, lay.moved_shape

    def call_moved(x: np.ndarray, out: np.ndarray) -> bool:
        xm = np.ascontiguousarray(np.moveaxis(x.reshape(shape), lay.axis, -1)).reshape(-1)
        om = np.empty_like(xm)
        ok = bool(kernel(xm, om, *args))
        np.copyto(out.reshape(shape), np.moveaxis(om.reshape(moved), -1, lay.axis))
        return ok

    return call_moved


for _type in _LOOPS:
    register(_type, exact=True, block_bind=bind)

__all__ = ["bind", "compiled", "decode_table", "encode_table"]
