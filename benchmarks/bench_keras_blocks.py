"""Block formats in Keras: a fault-aware training step vs a clean step, in one process.

The models, batch, optimizer and timing of ``bench_keras_fat.py``, the formats of
``bench_block_formats.py`` (imported from them): an MLP 784-256-256-10 and its small CNN,
batch 100, SGD, a GradientTape step inside ``tf.function`` (with and without
``jit_compile``). Every kernel is stored in the format with faults at ber 1e-3 in every
plane (``bitfault.keras.inject``, permanent map) for Float("float8_e4m3fn"), MX
float4_e2m1fn (MXFP4), NVFP4, GGUF Q4_1, GroupwiseInt(4, 32) and IntQuant(8); and with
transient maps (a fresh map every step, ``resample`` before each step as
``ResampleFaults`` does) for IntQuant(8) and MXFP4. Clean and fault-aware rounds
alternate; a ratio is the median over rounds of (fault-aware time / clean time).

    python benchmarks/bench_keras_blocks.py            # full run, several minutes
    python benchmarks/bench_keras_blocks.py --quick    # a smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf
from bench_block_formats import TRAINING_FORMATS, TRANSIENT_FORMATS
from bench_keras_fat import (
    BATCH,
    BER,
    arguments,
    clone,
    models,
    ratio,
    setup,
    trainer,
    transient_trainer,
)

import bitfault as bf
from bitfault.keras import inject


def main() -> None:
    parser = arguments(__doc__, rounds=9)
    parser.add_argument("--jit", nargs="+", default=["off", "on"], choices=["off", "on"],
                        help="jit_compile of the training step (the fault pass is XLA anyway)")
    parser.add_argument("--only", default="", help="run formats whose name contains this")
    args = parser.parse_args()
    images, y = setup(args)
    print(f"tensorflow {tf.__version__}, keras {keras.__version__}, {args.threads} thread(s), "
          f"batch {BATCH}, ber {BER} in every plane, SGD; ratio = fault-aware step / clean step "
          f"(median of {args.rounds} alternating rounds x {args.per_round} steps; CNN: half "
          "of each)")
    print(f"{'model':5} {'jit':5} {'format':24} {'maps':10} {'clean ms':>9} {'faulty ms':>9} "
          f"{'ratio':>7}")
    for model_name, base, x in models(args, images):
        rounds, per_round = args.rounds, args.per_round
        if model_name == "CNN":  # slower steps: fewer, shorter rounds
            rounds, per_round = max(3, rounds // 2), max(1, per_round // 2)
        for jit in (False, True):
            if ("on" if jit else "off") not in args.jit:
                continue
            clean_step = trainer(clone(base), x, y, jit)
            for fmt_name, fmt in TRAINING_FORMATS.items():
                if args.only not in fmt_name:
                    continue
                spec = bf.FaultSpec(format=fmt, ber=BER, seed=0)
                variants = {"permanent": trainer(inject(base, spec), x, y, jit)}
                if fmt_name in TRANSIENT_FORMATS:
                    transient = spec.replace(persistence="transient")
                    variants["transient"] = transient_trainer(inject(base, transient), x, y, jit)
                for maps, step in variants.items():
                    r, tc, tv = ratio(clean_step, step, rounds, per_round)
                    print(f"{model_name:5} {jit!s:5} {fmt_name:24} {maps:10} {tc:9.2f} "
                          f"{tv:9.2f} {r:7.3f}", flush=True)


if __name__ == "__main__":
    main()
