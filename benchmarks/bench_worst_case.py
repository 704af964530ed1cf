"""Worst-case search against a plain progressive bit search (PBS), in one process.

The plain PBS is written here (Rakin et al. 2019, as commonly reimplemented): int8 codes
(IntQuant(8), per tensor) only; each step one backward pass, then in every layer the one
bit whose flip has the largest gradient x value change, each of those evaluated exactly
on the attack data, the one raising the attack loss most kept. bitfault's
``worst_case`` searches the same memory with its defaults. Both stop when held-out
accuracy reaches the target or after ``--max-flips``; the table gives flips needed and
seconds per flip found, with their ratio.

    python benchmarks/bench_worst_case.py --models mlp cnn mobilenet --max-flips 25
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

from bitfault.campaign.search import worst_case
from bitfault.data.embedded import split_embedded_mnist
from bitfault.faults.models import BitFlip
from bitfault.formats import IntQuant
from bitfault.memory.memory import Memory
from bitfault.models.torch import seed_mlp, small_cnn
from bitfault.torch.search import TorchSearchModel

sys.path.insert(0, os.path.dirname(__file__))
from bench_mobilenet import mobilenet_v2, random_images

FMT = IntQuant(8)


def plain_pbs(search: TorchSearchModel, stop_at: float, max_flips: int) -> tuple[int, float,
                                                                                 list[float]]:
    """(flips, seconds, accuracy curve) of the plain progressive bit search."""
    start = time.perf_counter()
    clean = search.tensor_values()
    codes, scales = {}, {}
    for n, w in clean.items():  # int8 codes per tensor, symmetric, round to nearest
        scales[n] = float(np.abs(w).max()) / 127.0
        codes[n] = np.clip(np.rint(w / scales[n]), -127, 127).astype(np.int8)

    def values(n: str, c: np.ndarray) -> np.ndarray:
        return (c.astype(np.float32) * np.float32(scales[n])).astype(np.float32)

    now = {n: values(n, c) for n, c in codes.items()}
    curve = [search.metric(now)]
    flips = 0
    while curve[-1] > stop_at and flips < max_flips:
        _, grads = search.loss_and_gradients(now)
        cands = []
        for n, c in codes.items():
            g = grads[n].reshape(-1)
            flat = c.reshape(-1).view(np.uint8)
            best = (-np.inf, 0, 0)
            for bit in range(8):
                flipped = (flat ^ np.uint8(1 << bit)).view(np.int8)
                gain = g * (flipped.astype(np.float32) - c.reshape(-1)) * scales[n]
                k = int(np.argmax(gain))
                if gain[k] > best[0]:
                    best = (float(gain[k]), k, bit)
            new = c.reshape(-1).view(np.uint8).copy()
            new[best[1]] ^= np.uint8(1 << best[2])
            cands.append((n, new.view(np.int8).reshape(c.shape)))
        losses = search.attack_losses(now, [(n, values(n, c)) for n, c in cands])
        n, c = cands[int(np.argmax(np.where(np.isnan(losses), np.inf, losses)))]
        codes[n] = c
        now[n] = values(n, c)
        flips += 1
        curve.append(search.metric(now))
    return flips, time.perf_counter() - start, curve


def trained(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, epochs: int) -> torch.nn.Module:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    for _ in range(epochs):
        for i in range(0, len(y), 100):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xt[i:i + 100]), yt[i:i + 100]).backward()
            opt.step()
    return model.eval()


def setup(name: str) -> tuple[TorchSearchModel, float]:
    (xtr, ytr), (xte, yte) = split_embedded_mnist()
    rng = np.random.default_rng(0)
    pick = rng.choice(len(ytr), 128, replace=False)
    if name == "mlp":
        model = trained(seed_mlp(), xtr, ytr, 3)
        return TorchSearchModel(model, xtr[pick], ytr[pick], xte, yte), 0.11
    if name == "cnn":
        img = xtr.reshape(-1, 1, 28, 28)
        model = trained(small_cnn(), img, ytr, 2)
        return TorchSearchModel(model, img[pick], ytr[pick], xte.reshape(-1, 1, 28, 28),
                                yte), 0.11
    model = mobilenet_v2(0.5, seed=0)
    x = torch.nn.functional.interpolate(random_images(96, seed=1), size=(96, 96),
                                        mode="bilinear", align_corners=False)
    with torch.no_grad():
        y = model(x).argmax(1).numpy()
    return TorchSearchModel(model, x[:32].numpy(), y[:32], x[32:].numpy(), y[32:]), 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn", "mobilenet"])
    ap.add_argument("--max-flips", type=int, default=25)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':10} {'pbs flips':>9} {'ours':>5} {'pbs s/flip':>10} {'ours s/flip':>11} "
          f"{'speed-up':>8}  accuracy pbs -> / ours ->")
    for name in args.models:
        search, target = setup(name)
        flips, seconds, curve = plain_pbs(search, target, args.max_flips)
        t0 = time.perf_counter()
        ours = worst_case(search, Memory(FMT, BitFlip()), max_flips=args.max_flips,
                          stop_at=target)
        ours_s = time.perf_counter() - t0
        n = len(ours.flips)
        print(f"{name:10} {flips:9d} {n:5d} {seconds / max(flips, 1):10.3f} "
              f"{ours_s / max(n, 1):11.3f} {seconds / max(flips, 1) / (ours_s / max(n, 1)):7.2f}x"
              f"  {curve[0]:.3f}->{curve[-1]:.3f} / {ours.metric[0]:.3f}->{ours.metric[-1]:.3f}"
              f" (target {target})")


if __name__ == "__main__":
    main()
