"""Encoding a large float32 tensor into the block formats vs the field's own library
(issue 16), one list of cases: each times bitfault's encoder against the reference
implementation on the same tensor, alternating, median of ``--repeats``, and asserts the
stored bits identical.

GGUF: ``GGUF(type).encode(x)`` (the planes) and ``to_bytes(encode(x))`` (llama.cpp's
block bytes) against ``gguf.quants.quantize(x, Q8_0 | Q4_0 | Q4_1)`` (its bytes).

    python benchmarks/bench_block_formats.py                # 25,000,000 elements
    python benchmarks/bench_block_formats.py --size 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.formats.gguf import GGUF


@dataclass(frozen=True)
class Case:
    """One comparison: ``same(ours(x), theirs(x))`` must hold (default: equal arrays)."""

    name: str
    ours: Callable[[np.ndarray], Any]
    theirs: Callable[[np.ndarray], Any]
    same: Callable[[Any, Any], bool] = np.array_equal


def gguf_cases() -> list[Case]:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    cases = []
    for t in ("q8_0", "q4_0", "q4_1"):
        fmt, qt = GGUF(t), getattr(GGMLQuantizationType, t.upper())
        cases.append(Case(f"gguf {t} bytes", lambda x, f=fmt: f.to_bytes(f.encode(x)),
                          lambda x, q=qt: quantize(x, q)))
        cases.append(Case(f"gguf {t} planes", fmt.encode, lambda x, q=qt: quantize(x, q),
                          lambda planes, ref, f=fmt: np.array_equal(f.to_bytes(planes), ref)))
    return cases


CASES: list[Callable[[], list[Case]]] = [gguf_cases]


def alternate(a, b, repeats: int) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(repeats):
        for fn, times in ((a, ta), (b, tb)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cols = 8000  # a multiple of every block size (32, 16)
    rows = max(1, args.size // cols)
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    print(f"{x.size:,} float32 elements ({rows} x {cols}); ratio = bitfault time / "
          f"reference time (median of {args.repeats}, alternating)")
    print(f"{'case':22} {'bitfault s':>10} {'reference s':>11} {'ratio':>6}  bits")
    for make in CASES:
        for case in make():
            assert case.same(case.ours(x), case.theirs(x)), f"{case.name}: bits differ"
            ours, theirs = alternate(lambda c=case: c.ours(x), lambda c=case: c.theirs(x),
                                     args.repeats)
            print(f"{case.name:22} {ours:10.3f} {theirs:11.3f} {ours / theirs:6.2f}  "
                  f"identical")


if __name__ == "__main__":
    main()
