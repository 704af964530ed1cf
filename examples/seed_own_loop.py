"""The seed program with the user's own training loop, in Keras and in PyTorch, side by side.

The seed MLP (784-256-256-10, ReLU) stores its weights as FixedPoint(32, 28, trunc), whose
range is [-8, 8), with a permanent fault map at ber 2e-3 (map seed 0). Each framework is
used the way its README shows, with no bitfault training loop:

* Keras: ``bitfault.keras.inject(model, spec)``, then the user's own ``compile`` and ``fit``
  (SGD, sparse cross-entropy on logits);
* PyTorch: ``bitfault.torch.inject_(model, spec)``, then a plain ``optimizer.step()`` loop.

Both start from the same initial weights (the Keras initialiser's, copied into PyTorch)
and train on the 4,000 / 1,000 split of the embedded MNIST digits; test accuracy is
through the faults. Afterwards every clean weight is checked to lie inside the format's
range. Each ``--seeds`` value draws its own initial weights and batch order.

    python examples/seed_own_loop.py                    # 12 epochs, seeds 0-7: ~5-20 min
    python examples/seed_own_loop.py --seeds 0 --epochs 2 --hidden 64   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import bitfault as bf
from bitfault.data import split_embedded_mnist


def keras_run(weights: list[np.ndarray], hidden: int, spec: bf.FaultSpec,
              data: tuple[Any, ...], args: argparse.Namespace, seed: int
              ) -> tuple[float, list[np.ndarray]]:
    """Test accuracy through the faults and the trained clean kernels, in Keras."""
    import keras

    from bitfault.keras import inject
    from bitfault.models.keras import seed_mlp

    (xtr, ytr), (xte, yte) = data
    keras.utils.set_random_seed(seed)
    model = seed_mlp(hidden=hidden, seed=seed)
    model.set_weights(weights)
    fmodel = inject(model, spec)
    if args.no_projection:  # what Keras did before: nothing keeps the weights in range
        for variable in fmodel.trainable_variables:
            variable.constraint = None
    fmodel.compile(keras.optimizers.SGD(args.lr),
                   keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=["accuracy"])
    fmodel.fit(xtr, ytr, epochs=args.epochs, batch_size=args.batch, shuffle=True, verbose=0)
    accuracy = float(fmodel.evaluate(xte, yte, batch_size=1000, verbose=0)[1])
    kernels = [v.numpy() for v in fmodel.trainable_variables if v.path.endswith("kernel")]
    return accuracy, kernels


def torch_run(weights: list[np.ndarray], hidden: int, spec: bf.FaultSpec,
              data: tuple[Any, ...], args: argparse.Namespace, seed: int
              ) -> tuple[float, list[np.ndarray]]:
    """The same in PyTorch: ``inject_`` and a plain SGD loop."""
    import torch
    import torch.nn.functional as F

    from bitfault.models.torch import SeedMLP
    from bitfault.torch import inject_

    (xtr, ytr), (xte, yte) = (tuple(torch.from_numpy(a) for a in pair) for pair in data)
    model = SeedMLP(hidden=hidden, seed=seed)
    with torch.no_grad():  # Keras kernels are (in, out), PyTorch weights (out, in)
        for layer, (kernel, bias) in zip((model.fc1, model.fc2, model.fc3),
                                         zip(weights[::2], weights[1::2], strict=True),
                                         strict=True):
            layer.weight.copy_(torch.from_numpy(kernel.T))
            layer.bias.copy_(torch.from_numpy(bias))
    handle = inject_(model, spec, project=False) if args.no_projection else inject_(model, spec)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(args.epochs):
        order = torch.randperm(len(xtr), generator=g)
        for i in range(0, len(xtr), args.batch):
            idx = order[i:i + args.batch]
            opt.zero_grad()
            F.cross_entropy(model(xtr[idx]), ytr[idx].long()).backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(xte).argmax(1) == yte).float().mean().item()
    kernels = [layer.weight.detach().numpy().copy() for layer in (model.fc1, model.fc2, model.fc3)]
    handle.remove()
    return accuracy, kernels


def main(argv: list[str] | None = None) -> dict[str, list[tuple[float, float, bool]]]:
    """Runs the comparison, prints a table; returns per framework (accuracy, largest |clean
    kernel value|, every kernel value in range) per seed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", nargs="+", default=["keras", "torch"],
                        choices=["keras", "torch"])
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(8)),
                        help="initial weights and batch order (default 0-7)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--ber", type=float, default=2e-3)
    parser.add_argument("--map-seed", type=int, default=0, help="seed of the fault maps")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-projection", action="store_true",
                        help="turn off what keeps the clean weights in range (to compare)")
    args = parser.parse_args(argv)

    if "torch" in args.frameworks:
        import torch
        torch.set_num_threads(args.threads)
    if "keras" in args.frameworks:
        import tensorflow as tf
        try:
            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # already initialised in this process
            pass
    fmt = bf.FixedPoint(32, 28, rounding="trunc")
    spec = bf.FaultSpec(format=fmt, ber=args.ber, seed=args.map_seed, persistence="permanent")
    lo, hi = fmt.range
    data = split_embedded_mnist()
    print(f"MLP 784-{args.hidden}-{args.hidden}-10, {fmt}, ber {args.ber} (map seed "
          f"{args.map_seed}), SGD lr {args.lr}, batch {args.batch}, {args.epochs} epochs; "
          f"{len(data[0][0])} training / {len(data[1][0])} test digits; range [{lo}, {hi}]")
    print(f"{'seed':>4} {'framework':9} {'accuracy':>8} {'max |w|':>9} {'in range':>8} {'s':>6}")
    runs = {"keras": keras_run, "torch": torch_run}
    results: dict[str, list[tuple[float, float, bool]]] = {f: [] for f in args.frameworks}
    for seed in args.seeds:
        import keras

        from bitfault.models.keras import seed_mlp
        keras.utils.set_random_seed(seed)
        weights = seed_mlp(hidden=args.hidden, seed=seed).get_weights()
        for name in args.frameworks:
            start = time.perf_counter()
            accuracy, kernels = runs[name](weights, args.hidden, spec, data, args, seed)
            largest = max(float(np.abs(k).max()) for k in kernels)
            inside = all(bool(((k >= lo) & (k <= hi)).all()) for k in kernels)
            results[name].append((accuracy, largest, inside))
            print(f"{seed:4} {name:9} {accuracy:8.3f} {largest:9.3f} {inside!s:>8} "
                  f"{time.perf_counter() - start:6.1f}", flush=True)
    for name, rows in results.items():
        accs = [r[0] for r in rows]
        print(f"{name}: median accuracy {statistics.median(accs):.3f} (mean "
              f"{statistics.fmean(accs):.3f}) over seeds {args.seeds}")
    return results


if __name__ == "__main__":
    main()
