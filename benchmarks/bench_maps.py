"""Fault-map generation vs a dense per-bit Bernoulli draw, and inject vs a plain copy.

Claim (issue 2): on a 25-million-element float32 tensor, ``FaultMap.random`` is
>= 100x faster than a dense per-bit draw at ber <= 1e-5 and never more than 1.2x
slower at any ber in 1e-7 .. 1e-1. Every number printed is a ratio of two timings
taken in this process, alternating, median of ``--repeats``.

    python benchmarks/bench_maps.py            # the full claim (takes a few minutes)
    python benchmarks/bench_maps.py --size 1000000 --repeats 3   # quick look
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import bitfault as bf


def dense_bernoulli_mask(n: int, width: int, ber: float, seed: int) -> np.ndarray:
    """The baseline: one uniform draw per bit, compared with ber, packed into a uint32 mask."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(n, dtype=np.uint32)
    for bit in range(width):
        mask |= (rng.random(n) < ber).astype(np.uint32) << np.uint32(bit)
    return mask


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(a: Callable[[], object], b: Callable[[], object],
              repeats: int) -> tuple[float, float]:
    """Median times of a and b, run alternately so that machine noise hits both alike."""
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(timed(a))
        tb.append(timed(b))
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, fmt = args.size, bf.Float("float32")
    print(f"tensor: {n:,} float32 elements x 32 bits; median of {args.repeats}, alternating")
    print(f"{'ber':>8} {'faults':>12} {'dense/ours':>11}  ours is")
    for ber in (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1):
        fmap = bf.FaultMap.random((n,), fmt, ber=ber, seed=0, name="w")
        t_ours, t_dense = alternate(
            lambda ber=ber: bf.FaultMap.random((n,), fmt, ber=ber, seed=0, name="w"),
            lambda ber=ber: dense_bernoulli_mask(n, 32, ber, 0),
            args.repeats)
        ratio = t_dense / t_ours
        verdict = f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
        print(f"{ber:>8.0e} {fmap.n_faults:>12,} {ratio:>11.2f}  {verdict}")

    x = np.random.default_rng(1).normal(0, 0.05, n).astype(np.float32)
    fault = bf.BitFlip()
    print("\ninject (encode + fault + decode) vs a plain copy, ber 1e-3")
    fmap = bf.FaultMap.random((n,), fmt, ber=1e-3, seed=0, name="w")
    for f in (bf.FixedPoint(32, 28, rounding="trunc"), bf.IntQuant(8), bf.Float("float32"),
              bf.Float("bfloat16")):
        fm = bf.FaultMap.random((n,), f, ber=1e-3, seed=0, name="w") if f.bits != 32 else fmap
        t_inject, t_copy = alternate(lambda f=f, fm=fm: bf.inject(x, f, fault, fm),
                                     lambda: x.copy(), args.repeats)
        print(f"  {f!r:60} {t_inject / t_copy:6.1f}x a copy")


if __name__ == "__main__":
    main()
