"""What does a protected campaign cost next to the same campaign unprotected? (issue 18)

study_protection.py's worst case (the SmallCNN, int8 weights in 64-bit words, multi-bit
upsets of 1/2/3 adjacent bits with probability 0.7/0.2/0.1, 6 rates x 10 chips) run
under SEC-DED (72,64) and under no protection, in ABBA order (none, secded, secded,
none, ...) in one process, so drifts of a shared machine fall on both. Printed: each
campaign's time and the ratio secded / none (sums and minimums), the model's work per
campaign (convolution and linear calls through ``torch.nn.functional``: a trial whose
faults were all corrected reuses the clean run), and the time the memory's maps take
alone (every trial's tensors drawn and decoded, as the campaign does).

    python benchmarks/bench_protection_cost.py                 # 2 ABBA rounds
    python benchmarks/bench_protection_cost.py --rounds 1 --train 2000
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from study_formats import SETTINGS, data

import bitfault as bf
from bitfault.campaign import rate_sweep, run
from bitfault.recipes import Recipe
from bitfault.torch import TorchEvaluator
from bitfault.torch.train import fit

RATES = (1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2)
MBU = {"kind": "mbu", "sizes": {1: 0.7, 2: 0.2, 3: 0.1}}


def counting() -> dict[str, int]:
    """Count conv2d / linear calls through torch.nn.functional (the model's work)."""
    calls = {"conv2d": 0, "linear": 0}
    for name in calls:
        inner = getattr(F, name)

        def wrapped(*args, _inner=inner, _name=name, **kwargs):
            calls[_name] += 1
            return _inner(*args, **kwargs)

        setattr(F, name, wrapped)
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds")
    parser.add_argument("--train", type=int, default=2000, help="training images")
    parser.add_argument("--test", type=int, default=2000, help="test images")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--chips", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    calls = counting()
    xtr, ytr, xte, yte = data("cnn", argparse.Namespace(cnn_train=args.train,
                                                        cnn_test=args.test))
    fmt = bf.IntQuant(8)
    model = SETTINGS["cnn"]["build"]()
    fit(model, xtr, ytr, Recipe.normal(fmt), epochs=args.epochs, batch_size=100,
        lr=SETTINGS["cnn"]["lr"], seed=0)
    evaluator = TorchEvaluator(model, xte, yte)
    trials = rate_sweep(RATES, args.chips, base_seed=1000)
    memories = {s: bf.Memory(fmt, bf.BitFlip(), storage={"word_bits": 64, "protection": s,
                                                         "pattern": MBU})
                for s in ("none", "secded")}
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    times: dict[str, list[float]] = {s: [] for s in memories}
    maps: dict[str, list[float]] = {s: [] for s in memories}
    work: dict[str, dict[str, int]] = {}
    stores = Path(tempfile.mkdtemp(prefix="bench_protection_cost_"))
    try:
        for i, scheme in enumerate(["none", "secded", "secded", "none"] * args.rounds):
            calls.update(conv2d=0, linear=0)
            start = time.perf_counter()
            run(evaluator, trials, memories[scheme], stores / f"{scheme}-{i}.db")
            times[scheme].append(time.perf_counter() - start)
            work[scheme] = dict(calls)
            start = time.perf_counter()
            for trial in trials:
                for name, shape in shapes.items():
                    memories[scheme].random_map(shape, ber=trial.ber, seed=trial.seed,
                                                name=name)
            maps[scheme].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(stores, ignore_errors=True)
    print("campaign seconds:", {k: [round(v, 2) for v in vs] for k, vs in times.items()})
    print(f"secded / none: {sum(times['secded']) / sum(times['none']):.2f}x (sums), "
          f"{min(times['secded']) / min(times['none']):.2f}x (minimums)")
    print("work per campaign (calls):", work)
    print("maps alone, seconds per campaign (min):",
          {k: round(min(v), 3) for k, v in maps.items()},
          f"= {100 * min(maps['secded']) / min(times['secded']):.1f}% of the SEC-DED campaign")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
