"""Encoding a large float32 tensor into block formats vs the reference libraries (issue 16).

Each case times bitfault's ``fmt.encode(x)`` (scale selection, rounding, the planes in
their containers) against a baseline on the same tensor, alternating in one process,
median of ``--repeats``. MX and NVFP4: the baseline is ml_dtypes' cast of the already
scaled tensor ``(x / X).astype(ml_dtypes.<element>)`` (the element rounding alone, no
scale selection); the codes are asserted identical to that cast where it saturates
nowhere. GGUF: ``to_bytes(GGUF(type).encode(x))`` (llama.cpp's block bytes) and the planes
alone against ``gguf.quants.quantize(x, Q8_0 | Q4_0 | Q4_1)``; bytes asserted identical.

    python benchmarks/bench_block_formats.py                 # 25,000,000 elements
    python benchmarks/bench_block_formats.py --size 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from bench_small_floats import alternate

import bitfault as bf
from bitfault.formats.gguf import GGUF
from bitfault.formats.groupwise import GroupwiseInt
from bitfault.formats.mx import MX
from bitfault.formats.nvfp4 import NVFP4

# the formats the PyTorch and Keras training-step benchmarks (bench_*_blocks.py) store
# every weight in, and those of them also run with transient maps
TRAINING_FORMATS = {
    'Float("float8_e4m3fn")': bf.Float("float8_e4m3fn"),
    'MX("float4_e2m1fn")': MX("float4_e2m1fn"),
    "NVFP4()": NVFP4(),
    'GGUF("q4_1")': GGUF("q4_1"),
    "GroupwiseInt(4, 32)": GroupwiseInt(4, 32),
    "IntQuant(8)": bf.IntQuant(8),
}
TRANSIENT_FORMATS = ("IntQuant(8)", 'MX("float4_e2m1fn")')


@dataclass
class Case:
    """One format against its baseline: ``prepare(x)`` returns (ours, theirs, check)."""

    name: str
    prepare: Callable[[np.ndarray], tuple[Callable[[], object], Callable[[], object],
                                          Callable[[], None]]]


def mx_case(element: str) -> Case:
    def prepare(x: np.ndarray):
        fmt = MX(element)
        planes = fmt.encode(x)
        scale = np.exp2(planes["scale"].view(np.uint8).astype(np.float32) - 127)
        scaled = (x.reshape(-1, 32) / scale.reshape(-1, 1)).astype(np.float32)
        theirs = getattr(ml_dtypes, element)

        def check() -> None:
            inside = np.abs(scaled) <= float(ml_dtypes.finfo(theirs).max)
            ref = scaled.astype(theirs).view(np.uint8)
            ours = planes["codes"].reshape(-1, 32).view(np.uint8)
            assert np.array_equal(ours[inside], ref[inside]), f"MX {element}: codes differ"

        return (lambda: fmt.encode(x)), (lambda: scaled.astype(theirs)), check
    return Case(f"MX {element}", prepare)


def nvfp4_case() -> Case:
    def prepare(x: np.ndarray):
        fmt = NVFP4()
        planes = fmt.encode(x)
        s = fmt.plane("scale").format.decode(planes["scale"]).reshape(-1, 1)
        t = np.float32(planes["tensor_scale"].view(np.float32))
        scaled = x.reshape(-1, 16) / (s * t)

        def check() -> None:
            inside = np.abs(scaled) <= 6.0
            ref = scaled.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
            ours = planes["codes"].reshape(-1, 16).view(np.uint8)
            assert np.array_equal(ours[inside], ref[inside]), "NVFP4: codes differ"

        return (lambda: fmt.encode(x)), (lambda: scaled.astype(ml_dtypes.float4_e2m1fn)), check
    return Case("NVFP4", prepare)


def gguf_case(kind: str, bytes_too: bool) -> Case:
    def prepare(x: np.ndarray):
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        fmt, qt = GGUF(kind), getattr(GGMLQuantizationType, kind.upper())

        def check() -> None:
            assert np.array_equal(fmt.to_bytes(fmt.encode(x)), quantize(x, qt)), \
                f"GGUF {kind}: bytes differ"

        ours = (lambda: fmt.to_bytes(fmt.encode(x))) if bytes_too else (lambda: fmt.encode(x))
        return ours, (lambda: quantize(x, qt)), check
    return Case(f"GGUF {kind} {'bytes' if bytes_too else 'planes'}", prepare)


CASES = [mx_case(e) for e in ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn",
                              "float6_e3m2fn", "float4_e2m1fn")] + [nvfp4_case()] + [
    gguf_case(k, b) for k in ("q8_0", "q4_0", "q4_1") for b in (True, False)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    size = args.size // 3200 * 3200
    x = np.random.default_rng(0).standard_normal(size).astype(np.float32).reshape(-1, 3200)
    print(f"{size:,} float32 elements; ratio = bitfault encode / baseline (median of "
          f"{args.repeats}, alternating)")
    for case in CASES:
        ours, theirs, check = case.prepare(x)
        check()
        t_ours, t_theirs = alternate(ours, theirs, args.repeats)
        print(f"{case.name:22} {t_ours / t_theirs:6.2f}x  ({t_ours * 1e3:7.1f} ms vs "
              f"{t_theirs * 1e3:7.1f} ms)  bits identical")


if __name__ == "__main__":
    main()
