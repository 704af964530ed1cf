"""Block formats in PyTorch: a fault-aware training step vs a clean step, in one process.

The models, batch, optimizer and timing of ``bench_torch_fat.py``, the formats of
``bench_block_formats.py`` (imported from them): an MLP 784-256-256-10 and its small CNN,
batch 100, SGD, one thread. Every weight is stored in the format with faults at ber 1e-3
in every plane (``inject_``, permanent map), for Float("float8_e4m3fn"), MX float4_e2m1fn
(MXFP4), NVFP4, GGUF Q4_1, GroupwiseInt(4, 32) and IntQuant(8); and with transient maps
(a fresh map every optimizer step, ``handle.attach``) for IntQuant(8) and MXFP4. Clean
and fault-aware steps alternate one by one; a ratio is the median over rounds of
(fault-aware time / clean time).

    python benchmarks/bench_torch_blocks.py            # full run, a few minutes
    python benchmarks/bench_torch_blocks.py --quick    # a smoke run, seconds
    python benchmarks/bench_torch_blocks.py --models MLP --maps transient --only MX
"""

from __future__ import annotations

import copy

import torch
from bench_block_formats import TRAINING_FORMATS, TRANSIENT_FORMATS
from bench_torch_fat import BATCH, BER, arguments, cnn, mlp, ratio, setup, trainer

import bitfault as bf
from bitfault.torch import inject_


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--only", default="", help="run formats whose name contains this")
    parser.add_argument("--models", default="MLP,CNN", help="comma-separated: MLP, CNN")
    parser.add_argument("--maps", default="permanent,transient",
                        help="comma-separated: permanent, transient")
    args = parser.parse_args()
    x, y = setup(args)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), batch {BATCH}, "
          f"ber {BER} in every plane, SGD; ratio = fault-aware step / clean step (median of "
          f"{args.rounds} alternating rounds x {args.per_round} steps)")
    print(f"{'model':5} {'format':24} {'maps':10} {'clean ms':>9} {'faulty ms':>9} {'ratio':>7}")
    models = [m for m in (("MLP", mlp), ("CNN", cnn)) if m[0] in args.models.split(",")]
    for model_name, build in models:
        torch.manual_seed(0)
        base = build()
        clean_step, _ = trainer(copy.deepcopy(base), x, y)
        for fmt_name, fmt in TRAINING_FORMATS.items():
            if args.only not in fmt_name:
                continue
            for persistence in ("permanent", "transient"):
                if persistence not in args.maps.split(",") or (
                        persistence == "transient" and fmt_name not in TRANSIENT_FORMATS):
                    continue
                model = copy.deepcopy(base)
                handle = inject_(model, bf.FaultSpec(format=fmt, ber=BER, seed=0,
                                                     persistence=persistence))
                step, opt = trainer(model, x, y)
                if persistence == "transient":
                    handle.attach(opt)
                r, tc, tv = ratio(clean_step, step, args.rounds, args.per_round)
                print(f"{model_name:5} {fmt_name:24} {persistence:10} {tc:9.2f} {tv:9.2f} "
                      f"{r:7.2f}", flush=True)
                handle.remove()


if __name__ == "__main__":
    main()
