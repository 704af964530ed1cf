"""Fault-aware training step vs a clean step, in one process.

Models: an MLP 784-256-256-10 and a small CNN (two 3x3 convs + linear) on 28x28
inputs, batch 100, SGD (``--threads``, default 2). For FixedPoint(32, 28, trunc) and
IntQuant(8) at ber 1e-3, fault-aware variants are timed against the clean model (same
initial weights): ``inject_`` with a permanent map (every clean weight in range, the
common case: the storability check rides on the kernel); the same with ``project=False``;
the user-loop projection case, where the loop itself puts one weight of the first layer
outside the format's range after every optimizer step (the clean step does the same
write), so that ``inject_`` projects it back and computes the faulty values again before
each forward (FixedPoint only: IntQuant has no range); ``inject_`` with transient maps
drawn every optimizer step (``handle.attach(optimizer)``); the naive inline transform
(encode, XOR, decode as separate ops, ``w + (faulty - w).detach()``; not bit-exact: no
clamping, float32 IntQuant arithmetic). Clean and variant steps alternate one by one
within each round; a ratio is the median over rounds of (variant time / clean time).

    python benchmarks/bench_torch_fat.py                 # full run, about 3-4 minutes
    python benchmarks/bench_torch_fat.py --models mlp    # the seed's MLP only
    python benchmarks/bench_torch_fat.py --quick         # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import bitfault as bf
from bitfault.torch import inject_

BATCH = 100
BER = 1e-3


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256),
                         nn.ReLU(), nn.Linear(256, 10))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


class Naive(nn.Module):
    """The seed's transform inline: encode, XOR a dense mask, decode, ``w + (f - w).detach()``."""

    def __init__(self, model: nn.Module, fmt: bf.FixedPoint | bf.IntQuant) -> None:
        super().__init__()
        self.model, self.fmt = model, fmt
        self.masks = {}
        for name, p in model.named_parameters():
            if name.endswith("weight"):
                fmap = bf.FaultMap.random(tuple(p.shape), fmt, ber=BER, seed=0, name=name)
                dtype = torch.int32 if fmt.bits == 32 else torch.int8
                self.masks[name] = torch.from_numpy(fmap.to_dense(np.int32)).to(dtype)

    def transform(self, name: str, w: torch.Tensor) -> torch.Tensor:
        if isinstance(self.fmt, bf.FixedPoint):
            words = (w * 2.0**self.fmt.frac).to(torch.int32)
            faulty = (words ^ self.masks[name]).to(torch.float32) * 2.0**-self.fmt.frac
        else:
            scale = w.detach().abs().max() / 127
            words = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
            faulty = (words ^ self.masks[name]).to(torch.float32) * scale
        return w + (faulty - w).detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, module in self.model.named_children():
            w = getattr(module, "weight", None)
            if w is None:
                x = module(x)
            elif isinstance(module, nn.Linear):
                x = F.linear(x, self.transform(f"{name}.weight", w), module.bias)
            else:
                x = module._conv_forward(x, self.transform(f"{name}.weight", w), module.bias)
        return x


def trainer(model: nn.Module, x: torch.Tensor, y: torch.Tensor, push: float | None = None):
    """One SGD step of ``model`` on (x, y); ``push``: after it, the loop writes this value
    into one weight of the first layer (the user-loop projection case)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first = next(p for p in model.parameters() if p.ndim > 1)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if push is not None:
            with torch.no_grad():
                first.view(-1)[0] = push

    return step, opt


def ratio(clean_step, step, rounds: int, per_round: int) -> tuple[float, float, float]:
    """Median over rounds of (variant time / clean time), and the median step times in ms.

    Within a round the two steps alternate one by one, the order flipping every
    step, so that whatever else the machine does hits both alike.
    """
    for _ in range(3):
        clean_step()
        step()
    ratios, tc, tv = [], [], []
    for r in range(rounds):
        spent = {clean_step: 0.0, step: 0.0}
        for i in range(per_round):
            for fn in ((clean_step, step) if (r + i) % 2 == 0 else (step, clean_step)):
                t0 = time.perf_counter()
                fn()
                spent[fn] += time.perf_counter() - t0
        ratios.append(spent[step] / spent[clean_step])
        tc.append(spent[clean_step] / per_round)
        tv.append(spent[step] / per_round)
    return statistics.median(ratios), statistics.median(tc) * 1e3, statistics.median(tv) * 1e3


def arguments(doc: str) -> argparse.ArgumentParser:
    """The options every PyTorch training-step benchmark takes (a caller may add more)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 steps: a smoke run")
    return parser


def setup(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """Applies ``--quick`` and ``--threads``; the seeded batch (images, labels)."""
    if args.quick:
        args.rounds, args.per_round = 3, 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.rand(BATCH, 1, 28, 28)
    return x, torch.randint(0, 10, (BATCH,))


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn"])
    parser.set_defaults(threads=2)  # the seed's setup; --threads 1 for one
    args = parser.parse_args()
    x_flat, y = setup(args)
    formats = {"FixedPoint(32,28)": bf.FixedPoint(32, 28, rounding="trunc"),
               "IntQuant(8)": bf.IntQuant(8)}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), batch {BATCH}, "
          f"ber {BER}, SGD; ratio = fault-aware step / clean step (median of {args.rounds} "
          f"alternating rounds x {args.per_round} steps)")
    print(f"{'model':5} {'format':18} {'variant':24} {'clean ms':>9} {'faulty ms':>9} {'ratio':>7}")
    for model_name, build in (("MLP", mlp), ("CNN", cnn)):
        if model_name.lower() not in args.models:
            continue
        torch.manual_seed(0)
        base = build()
        clean = copy.deepcopy(base)
        clean_step, _ = trainer(clean, x_flat, y)
        for fmt_name, fmt in formats.items():
            variants = {}
            perm = copy.deepcopy(base)
            inject_(perm, bf.FaultSpec(format=fmt, ber=BER, seed=0))
            variants["inject_ permanent"] = (clean_step, trainer(perm, x_flat, y)[0])
            off = copy.deepcopy(base)
            inject_(off, bf.FaultSpec(format=fmt, ber=BER, seed=0), project=False)
            variants["inject_ project=False"] = (clean_step, trainer(off, x_flat, y)[0])
            if isinstance(fmt, bf.FixedPoint):  # the loop leaves the range every step
                pushed = copy.deepcopy(base)
                inject_(pushed, bf.FaultSpec(format=fmt, ber=BER, seed=0))
                variants["inject_ projecting"] = (
                    trainer(copy.deepcopy(base), x_flat, y, push=100.0)[0],
                    trainer(pushed, x_flat, y, push=100.0)[0])
            trans = copy.deepcopy(base)
            handle = inject_(trans, bf.FaultSpec(format=fmt, ber=BER, seed=0,
                                                 persistence="transient", resample="step"))
            step, opt = trainer(trans, x_flat, y)
            handle.attach(opt)
            variants["inject_ transient/step"] = (clean_step, step)
            naive = Naive(copy.deepcopy(base), fmt)
            variants["naive inline"] = (clean_step, trainer(naive, x_flat, y)[0])
            for variant, (baseline, step) in variants.items():
                r, tc, tv = ratio(baseline, step, args.rounds, args.per_round)
                print(f"{model_name:5} {fmt_name:18} {variant:24} {tc:9.2f} {tv:9.2f} {r:7.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
