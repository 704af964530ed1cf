"""Campaign speed, as ratios measured in one process (alternating runs, medians).

1. Single-weight-fault campaign (random (weight, bit) faults, 1,000 MNIST test
   inputs, float32 bit flips) with bitfault's TorchEvaluator vs pytorchfi 0.6.0
   (``declare_weight_fi`` + a custom bit-flip function, one corrupted model per
   fault): identical accuracies asserted, faults per second compared. MLP
   784-256-256-10 and the two-conv CNN. Skipped if pytorchfi is not installed
   (``pip install pytorchfi==0.6.0``; a benchmark-only dependency).
2. Rate sweep at ber 1e-3 (every map touches every layer): campaign wall time /
   time of the same number of clean inferences over the same data.
3. The same rate sweep with executor="ray" on 2 workers vs the local executor.
4. Rate sweeps in formats the compiled pass lacks (Float32, Float16, FixedPoint "wrap"):
   the replica patched with only each map's faulty elements vs the whole faulty tensor
   computed and copied per map (the evaluator before session 5), identical results.

Run: python benchmarks/bench_campaign.py   (about 4-6 minutes on 2 cores)
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import bitfault as bf
from bitfault.campaign import rate_sweep, run, single_faults
from bitfault.data import split_embedded_mnist
from bitfault.models.torch import seed_mlp, small_cnn
from bitfault.torch import TorchEvaluator

F32 = bf.Memory(bf.Float("float32"), bf.BitFlip())
SEED = bf.Memory(bf.FixedPoint(32, 28, rounding="trunc"), bf.BitFlip())
TMP = Path(tempfile.mkdtemp(prefix="bench_campaign_"))
_n = 0


def store() -> Path:
    global _n
    _n += 1
    return TMP / f"s{_n}.db"


def train(model: torch.nn.Module, steps: int) -> torch.nn.Module:
    (x, y), _ = split_embedded_mnist()
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    for s in range(steps):
        i = torch.arange(s * 128, s * 128 + 128) % len(xt)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt[i]), yt[i]).backward()
        opt.step()
    return model.eval()


def argmax(logits: torch.Tensor) -> np.ndarray:
    logits = logits.double()
    return torch.where(torch.isnan(logits), -torch.inf, logits).argmax(1).numpy()


def random_faults(model: torch.nn.Module, n: int, seed: int = 0) -> list[tuple[str, int, int]]:
    """(tensor, flat element, bit), uniform over every weight bit of Linear/Conv layers."""
    names = [f"{m}.weight" for m, mod in model.named_modules()
             if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d))]
    sizes = np.array([model.get_parameter(nm).numel() for nm in names])
    rng = np.random.default_rng(seed)
    flat = rng.integers(0, sizes.sum(), n)
    bits = rng.integers(0, 32, n)
    layer = np.searchsorted(np.cumsum(sizes), flat, side="right")
    start = np.concatenate([[0], np.cumsum(sizes)])
    return [(names[k], int(f - start[k]), int(b))
            for k, f, b in zip(layer, flat, bits, strict=True)]


def bitfault_campaign(model, x, y, faults) -> tuple[float, list[int]]:
    t = time.perf_counter()
    ev = TorchEvaluator(model, x, y)
    res = run(ev, single_faults(faults), F32, store(), batch=256)
    dt = time.perf_counter() - t
    by_key = {r.trial_key: r.metrics["correct"] for r in res.records}
    return dt, [by_key[t.key] for t in single_faults(faults)]


def pytorchfi_campaign(model, x, y, faults, input_shape) -> tuple[float, list[int]]:
    from pytorchfi.core import fault_injection

    def flip(bit):
        def fn(weight, idx):
            v = weight[idx].detach().reshape(1).clone()
            v.view(torch.int32).bitwise_xor_(torch.tensor(np.int32(np.uint32(1 << bit)
                                                                   .view(np.int32))))
            return v.reshape(weight[idx].shape)
        return fn

    layers = [f"{m}.weight" for m, mod in model.named_modules()
              if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d))]
    xt, correct = torch.from_numpy(x), []
    t = time.perf_counter()
    pfi = fault_injection(model, len(x), input_shape=input_shape,
                          layer_types=[torch.nn.Linear, torch.nn.Conv2d], use_cuda=False)
    for name, element, bit in faults:
        shape = model.get_parameter(name).shape
        idx = list(np.unravel_index(element, shape)) + [None] * (4 - len(shape))
        corrupt = pfi.declare_weight_fi(function=flip(bit), layer_num=[layers.index(name)],
                                        k=[int(idx[0])], dim1=[int(idx[1])],
                                        dim2=[idx[2] if idx[2] is None else int(idx[2])],
                                        dim3=[idx[3] if idx[3] is None else int(idx[3])])
        with torch.no_grad():
            correct.append(int(np.sum(argmax(corrupt(xt)) == y)))
    return time.perf_counter() - t, correct


def single_fault_bench(label, model, x, y, n_faults, repeats, input_shape, target) -> None:
    faults = random_faults(model, n_faults)
    try:
        import pytorchfi  # noqa: F401
    except ImportError:
        print(f"{label}: pytorchfi not installed (pip install pytorchfi==0.6.0): skipped")
        return
    ours, theirs = [], []
    for _ in range(repeats):  # alternating
        dt, acc_ours = bitfault_campaign(model, x, y, faults)
        ours.append(dt)
        dt, acc_theirs = pytorchfi_campaign(model, x, y, faults, input_shape)
        theirs.append(dt)
        assert acc_ours == acc_theirs, "accuracies differ from pytorchfi"
    a, b = n_faults / statistics.median(ours), n_faults / statistics.median(theirs)
    print(f"{label}: {n_faults} single weight faults on {len(x)} inputs, identical accuracies; "
          f"bitfault {a:.0f} faults/s, pytorchfi {b:.1f} faults/s: {a / b:.1f}x "
          f"(target >= {target}x)")


def rate_bench(label, model, x, y, chips, repeats) -> float:
    """Campaign time / clean time, as the median over repeats of each repeat's own ratio
    (the two alternate, order flipping, so that drift in the machine's speed hits both).
    A one-chip campaign splits the time into a fixed part (evaluator, digests, golden
    run, store) and a part per chip. Every run draws new chips (new seeds), as a real
    campaign would."""
    xt = torch.from_numpy(x)

    def campaign(n: int, seed: int) -> float:
        t = time.perf_counter()
        run(TorchEvaluator(model, x, y), rate_sweep([1e-3], n, seed), SEED, store(), batch=16)
        return time.perf_counter() - t

    def clean() -> float:
        t = time.perf_counter()
        with torch.no_grad():
            for _ in range(chips):
                argmax(model(xt))
        return time.perf_counter() - t

    ratios, per_chip, fixed, inference = [], [], [], []
    for r in range(repeats):
        if r % 2:
            k, c = clean(), campaign(chips, 10_000 * r)
        else:
            c, k = campaign(chips, 10_000 * r), clean()
        one = campaign(1, 10_000 * r + 5_000)
        ratios.append(c / k)
        per_chip.append((c - one) / (chips - 1))
        fixed.append(one - per_chip[-1])
        inference.append(k / chips)
    med = statistics.median
    print(f"{label}: rate sweep at ber 1e-3, {chips} chips on {len(x)} inputs: campaign / "
          f"{chips} clean inferences = {med(ratios):.2f} (target <= 1.2; repeats "
          f"{min(ratios):.2f}-{max(ratios):.2f}); per chip {med(per_chip) * 1e3:.2f} ms vs "
          f"{med(inference) * 1e3:.2f} ms for a clean inference, fixed {med(fixed) * 1e3:.0f} ms")
    return med(ratios)


class WholeTensorEvaluator(TorchEvaluator):
    """The baseline of ``patch_bench``: every faulty tensor computed whole and copied."""

    def _patch_stored(self, name, fmap, memory) -> bool:
        return False


def patch_bench(model, x, y, chips, repeats) -> None:
    memories = {"Float32": F32, "Float16": bf.Memory(bf.Float("float16"), bf.BitFlip()),
                "FixedPoint(16,12,wrap)": bf.Memory(bf.FixedPoint(16, 12, overflow="wrap"),
                                                    bf.BitFlip())}
    for label, memory in memories.items():
        ratios = []
        for r in range(repeats + 1):  # the first pair warms up and is not counted
            trials = rate_sweep([1e-3], chips, 30_000 * r)
            times, results = {}, {}
            for cls in ((TorchEvaluator, WholeTensorEvaluator) if r % 2 else
                        (WholeTensorEvaluator, TorchEvaluator)):
                t = time.perf_counter()
                res = run(cls(model, x, y), trials, memory, store(), batch=16)
                times[cls] = time.perf_counter() - t
                results[cls] = [rec.metrics for rec in res.records]
            assert results[TorchEvaluator] == results[WholeTensorEvaluator]
            if r:
                ratios.append(times[TorchEvaluator] / times[WholeTensorEvaluator])
        print(f"{label}: {chips}-chip rate sweep, patched replica / whole tensors = "
              f"{statistics.median(ratios):.2f} (repeats {min(ratios):.2f}-{max(ratios):.2f}), "
              f"identical results")


def ray_bench(model, x, y, chips, repeats) -> None:
    """Local vs Ray with 2 workers. The first Ray campaign also starts the workers (each
    imports torch and loads the compiled kernels): reported apart, then the two executors
    alternate on warm workers."""
    try:
        import ray
    except ImportError:
        print("ray: not installed, skipped")
        return
    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    start = time.perf_counter() - t
    local, remote = [], []
    try:
        t = time.perf_counter()
        run(TorchEvaluator(model, x, y), rate_sweep([1e-3], chips, 99_000), SEED, store(),
            batch=8, executor="ray", workers=2)
        cold = time.perf_counter() - t
        for r in range(repeats):
            trials = rate_sweep([1e-3], chips, 10_000 * r)
            t = time.perf_counter()
            a = run(TorchEvaluator(model, x, y), trials, SEED, store(), batch=8)
            local.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = run(TorchEvaluator(model, x, y), trials, SEED, store(), batch=8,
                    executor="ray", workers=2)
            remote.append(time.perf_counter() - t)
            assert [r.metrics for r in a.records] == [r.metrics for r in b.records]
    finally:
        ray.shutdown()
    print(f"ray: {chips}-chip rate sweep, 2 workers vs local: speedup "
          f"{statistics.median(local) / statistics.median(remote):.2f}x on warm workers "
          f"(identical results; local {statistics.median(local):.2f}s, first Ray run "
          f"{cold:.1f}s while the workers start; ray.init {start:.1f}s not counted)")


def main() -> None:
    torch.manual_seed(0)
    _, (x, y) = split_embedded_mnist()
    x, y = x[:1000], y[:1000]
    mlp = train(seed_mlp(hidden=256), 150)
    cnn = train(small_cnn(), 40)
    single_fault_bench("MLP 784-256-256-10", mlp, x, y, 400, 3, [784], 10)
    single_fault_bench("CNN conv16-conv32-fc", cnn, x, y, 200, 2, [784], 5)
    rate_bench("MLP 784-256-256-10", mlp, x, y, chips=50, repeats=7)
    rate_bench("CNN conv16-conv32-fc", cnn, x, y, chips=20, repeats=5)
    patch_bench(mlp, x, y, chips=50, repeats=4)
    ray_bench(mlp, x, y, chips=128, repeats=3)


if __name__ == "__main__":
    main()
