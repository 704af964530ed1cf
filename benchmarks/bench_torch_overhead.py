"""Where a fault-aware PyTorch training step spends its extra time (issue 3).

Three copies of the MLP 784-256-256-10 trained with SGD, batch 100, one thread:
clean; ``inject_`` with FixedPoint(32, 28) at ber 1e-3; and ``inject_`` with the
encode-fault-decode kernel replaced by a plain clone, which leaves the hooks and the
straight-through autograd node. Steps alternate; medians of 20 rounds of 10 steps;
ratios to the clean step.

    python benchmarks/bench_torch_overhead.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

import bitfault as bf
from bitfault.torch import handle as adapter
from bitfault.torch import inject_


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def training_step(model: torch.nn.Module, x: torch.Tensor,
                  y: torch.Tensor) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def clone_kernel(xs, fmt, fault, faults, strict=False, buffers=None, reuse_output=False):
    return [t.clone() for t in xs]


def main() -> None:
    torch.set_num_threads(1)
    x, y = torch.rand(100, 784), torch.randint(0, 10, (100,))
    spec = bf.FaultSpec(format=bf.FixedPoint(32, 28, rounding="trunc"), ber=1e-3)
    clean, faulty, hooks_only = mlp(), mlp(), mlp()
    inject_(faulty, spec)
    inject_(hooks_only, spec)
    steps = {"clean": training_step(clean, x, y), "inject_": training_step(faulty, x, y),
             "hooks + autograd only": training_step(hooks_only, x, y)}
    real_kernel = adapter.faulty_group
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(22):
        for name, step in steps.items():
            adapter.faulty_group = clone_kernel if name.startswith("hooks") else real_kernel
            start = time.perf_counter()
            for _ in range(10):
                step()
            times[name].append((time.perf_counter() - start) / 10)
    adapter.faulty_group = real_kernel
    base = statistics.median(times["clean"][2:])
    for name, values in times.items():
        med = statistics.median(values[2:])  # the first two rounds warm up
        print(f"{name:24} {med * 1e3:7.3f} ms  {med / base:6.3f}x the clean step")


if __name__ == "__main__":
    main()
