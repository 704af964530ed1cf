"""Encoding a large float32 tensor into the small floats vs ml_dtypes' casts (issue 16).

For each element float, ``Float(dtype, overflow=policy).encode(x)`` is timed against
``x.astype(ml_dtypes.<dtype>)`` on the same array, alternating, median of ``--repeats``;
the policy is the one whose semantics are ml_dtypes' (docs/formats.md): "nan" for
float8_e4m3fn / float8_e5m2 / float8_e8m0fnu, "saturate" for float6 / float4. The stored
bits are asserted identical to ml_dtypes' on values inside the range (NaN-free; E8M0:
positive). Decoding (``Float.decode``, a table lookup) is timed against ml_dtypes'
``astype(float32)`` the same way.

    python benchmarks/bench_small_floats.py                # 25,000,000 elements
    python benchmarks/bench_small_floats.py --size 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import ml_dtypes
import numpy as np

import bitfault as bf

POLICY = {"float8_e4m3fn": "nan", "float8_e5m2": "nan", "float8_e8m0fnu": "nan",
          "float6_e2m3fn": "saturate", "float6_e3m2fn": "saturate",
          "float4_e2m1fn": "saturate"}


def alternate(a, b, repeats: int) -> tuple[float, float]:
    """Median times of ``a()`` and ``b()`` over ``repeats`` runs, alternating."""
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
    rng = np.random.default_rng(0)
    print(f"{args.size:,} float32 elements; ratio = bitfault time / ml_dtypes time "
          f"(median of {args.repeats}, alternating)")
    print(f"{'dtype':16} {'policy':9} {'encode':>8} {'decode':>8}  bits")
    for name, policy in POLICY.items():
        fmt = bf.Float(name, overflow=policy)
        theirs = getattr(ml_dtypes, name)
        lo, hi = fmt.range
        x = rng.uniform(max(lo, -hi), hi, args.size).astype(np.float32)
        if name == "float8_e8m0fnu":
            x = np.abs(x) + np.float32(2.0**-100)
        ours_words = fmt.encode(x)
        ref = x.astype(theirs)
        same = np.array_equal(ours_words.view(np.uint8), ref.view(np.uint8))
        assert same, f"{name}: stored bits differ from ml_dtypes"
        t_ours, t_theirs = alternate(lambda f=fmt, v=x: f.encode(v),
                                     lambda v=x, d=theirs: v.astype(d), args.repeats)
        d_ours, d_theirs = alternate(lambda f=fmt, w=ours_words: f.decode(w),
                                     lambda r=ref: r.astype(np.float32), args.repeats)
        print(f"{name:16} {policy:9} {t_ours / t_theirs:7.2f}x {d_ours / d_theirs:7.2f}x  "
              f"identical")


if __name__ == "__main__":
    main()
