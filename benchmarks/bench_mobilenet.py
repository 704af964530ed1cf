"""MobileNetV2 at 224x224: a single-weight-fault campaign, bitfault vs pytorchfi 0.6.0.

The claim of issue #17: on a MobileNetV2-style CNN (inverted residual blocks with
depthwise convolutions, 224x224 inputs) bitfault's single-fault campaign runs at least
10x more faults per second than pytorchfi 0.6.0, with identical predictions.

The network is written here: stem conv 3x3 stride 2 + BN + ReLU6; the standard MobileNetV2
stage table of inverted residual blocks (1x1 expand + BN + ReLU6, 3x3 depthwise + BN +
ReLU6, 1x1 project + BN, residual when shapes match); 1x1 conv to 1280 + BN + ReLU6;
global average pool; Linear to 10 classes. ``--head view`` writes the head as many
published implementations do, ``bs = x.size(0)`` ... ``x.view(bs, -1)`` (the batch size
read from the input: the single-fault shortcut computes it again for its stacked rows;
``TorchEvaluator.plan()`` is printed for it); ``--head flatten`` (default) uses
``flatten(1)``. Seeded random weights; BN statistics set by a
few train-mode passes on random images (no training: both sides predict on random inputs).

Each fault flips one bit of one float32 weight element (``bf.Float("float32")``), drawn
uniformly over every Conv2d/Linear weight bit. Three ways, one process, alternating:

- bitfault: ``TorchEvaluator`` + ``campaign.run(single_faults(...))`` (evaluator built,
  traced and its clean run recorded inside the timed part, as a user would), once per
  ``--max-mib`` bound on its caches (default 256 MiB, the evaluator's default, and 2 GiB:
  16 images' clean activations take about 1.2 GB);
- pytorchfi 0.6.0: ``declare_weight_fi`` with a custom bit-flip function, one corrupted
  model per fault (as ``bench_campaign.py``);
- a hand loop: flip the bit in the weight, run the model, restore.

Every fault's predictions on every image are asserted identical across the three, and
the model's weights bit for bit unchanged afterwards. One thread (``torch.set_num_threads(1)``).
Times are this process's CPU seconds (on a shared machine the work done; the ratios use
them) and wall seconds (printed too). Faults per second and the ratios are printed, and
bitfault's fixed part (a 1-fault campaign); ``--json`` writes the rows to a new file;
``--profile N`` prints the top N cProfile entries (CPU time) of one more bitfault run.
``--rank-one-ablation`` adds two bitfault runs (at the first ``--max-mib``) with the
single-fault path's rank-one updates switched off for the run only (docs/campaigns.md
"Rank-one changes"): ``single_faults.channel_map`` returning None (no rank-one update:
whole rows from the layer after the changed channel) and ``single_faults.carry`` returning
None (only that first layer updated, not carried on); their predictions are asserted
identical too.

Run: python benchmarks/bench_mobilenet.py [--width 1.0] [--images 16] [--faults 60]
     [--head flatten|view]
     [--max-mib 256 2048] [--repeats 1] [--seed 0] [--profile 25] [--json rows.json]
     [--rank-one-ablation]
Needs pytorchfi 0.6.0 (``pip install pytorchfi==0.6.0``; benchmark-only).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import bitfault as bf
from bitfault.campaign import run, single_faults
from bitfault.torch import TorchEvaluator
from bitfault.torch.evaluate import single_faults as shortcut

F32 = bf.Memory(bf.Float("float32"), bf.BitFlip())
# (expansion t, output channels c, repeats n, first stride s): MobileNetV2's table
STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
          (6, 160, 3, 2), (6, 320, 1, 1))
Fault = tuple[str, int, int]
Clock = tuple[float, float]  # (wall seconds, this process's CPU seconds)


def clock(start: Clock | None = None) -> Clock:
    """Wall and process CPU time now, or elapsed since ``start``. With one thread the CPU
    time is the work done, whatever else the machine runs; the wall time is not."""
    now = (time.perf_counter(), time.process_time())
    return now if start is None else (now[0] - start[0], now[1] - start[1])


def divisible(v: float, d: int = 8) -> int:
    """Channels rounded to a multiple of ``d``, never below 90% of ``v`` (MobileNetV2's)."""
    out = max(d, int(v + d / 2) // d * d)
    return out + d if out < 0.9 * v else out


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
            act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups,
                                         bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """1x1 expand (unless t == 1), 3x3 depthwise, 1x1 linear project; residual if shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
        super().__init__()
        hidden = cin * t
        layers = [conv_bn(cin, hidden, 1)] if t != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden),
                   conv_bn(hidden, cout, 1, act=False)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, width: float = 1.0, classes: int = 10, head: str = "flatten") -> None:
        super().__init__()
        self.head = head
        cin = divisible(32 * width)
        last = divisible(1280 * max(1.0, width))
        blocks: list[nn.Module] = [conv_bn(3, cin, 3, stride=2)]
        for t, c, n, s in STAGES:
            cout = divisible(c * width)
            for i in range(n):
                blocks.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        blocks.append(conv_bn(cin, last, 1))
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(last, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.head == "view":  # the batch size read from the input
            bs = x.size(0)
            y = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(y.view(bs, -1))
        y = nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        return self.classifier(y)


def random_images(n: int, seed: int) -> torch.Tensor:
    """Random 224x224 RGB images: smooth random colour fields (7x7 noise, bilinear) plus
    pixel noise, so that the images differ as wholes and predictions differ between them."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(n, 3, 7, 7, generator=g)
    smooth = nn.functional.interpolate(coarse, size=(224, 224), mode="bilinear",
                                       align_corners=False)
    return (smooth + 0.5 * torch.randn(n, 3, 224, 224, generator=g)).contiguous()


def mobilenet_v2(width: float, seed: int, bn_passes: int = 3, bn_batch: int = 8,
                 head: str = "flatten") -> MobileNetV2:
    """Seeded random weights (MobileNetV2's init; random BN scale and shift), BN running
    statistics as the cumulative average of ``bn_passes`` train-mode passes on random
    images, the head's bias centred on random images' features; in eval mode."""
    torch.manual_seed(seed)
    model = MobileNetV2(width, head=head)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.normal_(m.bias, 0.0, 0.1)
            m.momentum = None  # cumulative average over the passes below
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.normal_(m.bias, 0.0, 0.01)
    model.train()
    with torch.no_grad():
        for p in range(bn_passes):
            model(random_images(bn_batch, seed=10_000 + p))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.momentum = 0.1
        model.eval()
        # centre the head on the pooled features of random images, so that what decides a
        # prediction is how an image differs from the others (not the features they share)
        pooled = nn.functional.adaptive_avg_pool2d(
            model.features(random_images(bn_batch, seed=20_000)), 1).flatten(1)
        model.classifier.bias.copy_(-model.classifier(pooled).mean(0) +
                                    model.classifier.bias)
    return model


def weight_names(model: nn.Module) -> list[str]:
    return [f"{m}.weight" for m, mod in model.named_modules()
            if isinstance(mod, (nn.Linear, nn.Conv2d))]


def random_faults(model: nn.Module, n: int, seed: int = 0) -> list[Fault]:
    """(tensor, flat element, bit), uniform over every weight bit of Conv2d/Linear layers."""
    names = weight_names(model)
    sizes = np.array([model.get_parameter(nm).numel() for nm in names])
    rng = np.random.default_rng(seed)
    flat = rng.integers(0, sizes.sum(), n)
    bits = rng.integers(0, 32, n)
    layer = np.searchsorted(np.cumsum(sizes), flat, side="right")
    start = np.concatenate([[0], np.cumsum(sizes)])
    return [(names[k], int(f - start[k]), int(b))
            for k, f, b in zip(layer, flat, bits, strict=True)]


def downstream_share(model: nn.Module) -> float:
    """The mean, over faults uniform on weight elements, of the share of the model's
    Conv/Linear multiply-adds after the faulty layer: what recomputing downstream of each
    fault exactly costs, in full forwards (the faulty layer's own channel not counted)."""
    names, macs = weight_names(model), {}
    hooks = [model.get_submodule(n[:-len(".weight")]).register_forward_hook(
        lambda m, i, o, n=n: macs.__setitem__(n, o.numel() * m.weight[0].numel()))
        for n in names]
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))
    for h in hooks:
        h.remove()
    flops = np.array([macs[n] for n in names], np.float64)
    after = (flops.sum() - np.cumsum(flops)) / flops.sum()
    sizes = np.array([model.get_parameter(n).numel() for n in names], np.float64)
    return float(np.sum(sizes / sizes.sum() * after))


def argmax(logits: torch.Tensor) -> list[int]:
    """Predicted class per row; a NaN logit never wins."""
    logits = logits.double()
    return torch.where(torch.isnan(logits), -torch.inf, logits).argmax(1).tolist()


def int32_mask(bit: int) -> int:
    """1 << bit as the int32 value with that bit pattern (bit 31: -2**31)."""
    return int(np.uint32(1 << bit).view(np.int32))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (float32 compared as int32: NaN and -0.0 too)."""
    if a.dtype == torch.float32:
        a, b = a.view(torch.int32), b.view(torch.int32)
    return torch.equal(a, b)


def predictions(labels: np.ndarray, clean: np.ndarray, faulty: np.ndarray) -> dict[str, int]:
    """A campaign metric that keeps every image's predicted class (p0, p1, ...)."""
    return {f"p{i}": int(v) for i, v in enumerate(faulty)}


def bitfault_campaign(model: nn.Module, x: torch.Tensor, faults: list[Fault], store: Path,
                      max_bytes: int, plans: list[Any] | None = None
                      ) -> tuple[Clock, list[list[int]]]:
    """The campaign, timed; its evaluator's plan appended to ``plans`` (untimed)."""
    labels = np.zeros(len(x), np.int64)  # unused: the metric keeps the predictions
    t = clock()
    ev = TorchEvaluator(model, x, labels, max_bytes=max_bytes)
    trials = single_faults(faults)
    res = run(ev, trials, F32, store, metric=predictions, batch=len(trials))
    dt = clock(t)
    if plans is not None:
        plans.append(ev.plan())
    by_key = {r.trial_key: [r.metrics[f"p{i}"] for i in range(len(x))] for r in res.records}
    return dt, [by_key[tr.key] for tr in trials]


def without(name: str, campaign: Any) -> Any:
    """``campaign`` run with ``bitfault.torch.evaluate.single_faults.<name>`` returning None (a
    rank-one step switched off), put back afterwards."""
    def ablated(*args: Any) -> Any:
        original = getattr(shortcut, name)
        setattr(shortcut, name, lambda *a, **k: None)
        try:
            return campaign(*args)
        finally:
            setattr(shortcut, name, original)
    return ablated


def pytorchfi_campaign(model: nn.Module, x: torch.Tensor,
                       faults: list[Fault]) -> tuple[Clock, list[list[int]]]:
    from pytorchfi.core import fault_injection

    def flip(bit: int) -> Any:
        def fn(weight: torch.Tensor, idx: tuple[Any, ...]) -> torch.Tensor:
            v = weight[idx].detach().reshape(1).clone()
            v.view(torch.int32).bitwise_xor_(torch.tensor(int32_mask(bit), dtype=torch.int32))
            return v.reshape(weight[idx].shape)
        return fn

    layers, out = weight_names(model), []
    t = clock()
    pfi = fault_injection(model, len(x), input_shape=list(x.shape[1:]),
                          layer_types=[nn.Conv2d, nn.Linear], use_cuda=False)
    for name, element, bit in faults:
        shape = model.get_parameter(name).shape
        idx = [int(i) for i in np.unravel_index(element, shape)] + [None] * (4 - len(shape))
        corrupt = pfi.declare_weight_fi(function=flip(bit), layer_num=[layers.index(name)],
                                        k=[idx[0]], dim1=[idx[1]], dim2=[idx[2]], dim3=[idx[3]])
        with torch.no_grad():
            out.append(argmax(corrupt(x)))
    return clock(t), out


def hand_loop(model: nn.Module, x: torch.Tensor,
              faults: list[Fault]) -> tuple[Clock, list[list[int]]]:
    """Flip the bit in the weight, run the whole model, put the weight back."""
    out = []
    t = clock()
    with torch.no_grad():
        for name, element, bit in faults:
            bits = model.get_parameter(name).detach().view(-1).view(torch.int32)
            old = bits[element].clone()
            bits[element] ^= int32_mask(bit)
            out.append(argmax(model(x)))
            bits[element] = old
    return clock(t), out


def profile_bitfault(model: nn.Module, x: torch.Tensor, faults: list[Fault], store: Path,
                     max_bytes: int, top: int) -> str:
    prof = cProfile.Profile(time.process_time)  # CPU time: the machine may be shared
    prof.enable()
    bitfault_campaign(model, x, faults, store, max_bytes)
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).strip_dirs()
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return text.getvalue()


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=float, default=1.0, help="width multiplier (default 1.0)")
    p.add_argument("--images", type=int, default=16, help="random 224x224 inputs (default 16)")
    p.add_argument("--faults", type=int, default=60, help="random single faults (default 60)")
    p.add_argument("--repeats", type=int, default=1, help="alternating timed runs (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--head", choices=("flatten", "view"), default="flatten",
                   help="the classifier's input: flatten(1), or view(bs, -1) with bs = "
                        "x.size(0) read from the input (default flatten)")
    p.add_argument("--max-mib", type=int, nargs="+", default=[256, 2048], metavar="MIB",
                   help="TorchEvaluator's max_bytes in MiB, one bitfault run each "
                        "(default: 256, the evaluator's default, and 2048)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="print the top N cProfile entries of one more bitfault run")
    p.add_argument("--json", default=None, help="write the rows here (a new file)")
    p.add_argument("--rank-one-ablation", action="store_true",
                   help="also run bitfault without its rank-one updates, and with only the "
                        "first layer after the changed channel updated")
    args = p.parse_args(argv)
    for name in ("images", "faults", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if min(args.max_mib) < 1:
        p.error(f"--max-mib takes positive integers, got {args.max_mib}")
    if args.width <= 0:
        p.error(f"--width must be a positive number, got {args.width}")
    if args.profile < 0:
        p.error(f"--profile must be 0 (off) or a positive integer, got {args.profile}")
    if args.json and Path(args.json).exists():
        p.error(f"--json {args.json}: exists; choose a new file")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    try:
        import pytorchfi  # noqa: F401
    except ImportError:
        sys.exit("pytorchfi is not installed (pip install pytorchfi==0.6.0)")
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench_mobilenet_"))
    model = mobilenet_v2(args.width, args.seed, head=args.head)
    x = random_images(args.images, seed=args.seed + 1)
    faults = random_faults(model, args.faults, args.seed)
    with torch.no_grad():
        clean = argmax(model(x))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"MobileNetV2 width {args.width}, head {args.head}: {n_params:,} parameters, "
          f"{len(weight_names(model))} Conv2d/Linear weights; {args.images} images 224x224 "
          f"({len(set(clean))} distinct clean predictions); {args.faults} single float32 "
          f"weight bit flips; 1 thread")
    share = downstream_share(model)
    print(f"exact recomputation downstream of each fault: {share:.3f} of a forward per "
          f"fault on average, at most {1 / share:.1f}x a full rerun per fault")
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    plans: list[Any] = []
    runs: dict[str, Any] = {
        f"bitfault {mib} MiB": lambda r, mib=mib: bitfault_campaign(
            model, x, faults, tmp / f"s{r}_{mib}.db", mib << 20, plans)
        for mib in args.max_mib}
    if args.rank_one_ablation:
        mib = args.max_mib[0]
        for label, name in (("no rank-one", "channel_map"), ("rank-one 1 layer", "carry")):
            runs[f"bitfault {label}"] = lambda r, mib=mib, name=name: without(
                name, bitfault_campaign)(model, x, faults, tmp / f"a{r}_{name}.db", mib << 20)
    runs.update({"pytorchfi": lambda r: pytorchfi_campaign(model, x, faults),
                 "hand loop": lambda r: hand_loop(model, x, faults)})
    times: dict[str, list[Clock]] = {k: [] for k in runs}
    for r in range(args.repeats):
        preds = {}
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:  # alternating
            dt, preds[name] = runs[name](r)
            times[name].append(dt)
        for name, p in preds.items():
            assert p == preds["hand loop"], f"{name}: predictions differ from the hand loop's"
    assert all(same_bits(v, before[k]) for k, v in model.state_dict().items()), \
        "the model's weights were not restored bit for bit"
    plan = plans[0]
    on = [e for e in plan if e.path == "shortcut"]
    print(f"plan: {len(on)} of {len(plan)} weights take the single-fault shortcut; it "
          f"evaluated {sum(e.shortcut_faults for e in plan)} of {args.faults} faults; "
          f"fallbacks: {sorted(e.tensor for e in plan if e.fallback) or 'none'}")
    assert all(not e.fallback for p in plans for e in p), "a fast path fell back"
    changed = [sum(a != b for a, b in zip(p, clean, strict=True)) for p in preds["hand loop"]]
    print(f"predictions identical for every fault and image; {sum(c > 0 for c in changed)} "
          f"of {args.faults} faults change a prediction ({sum(changed)} of "
          f"{args.faults * args.images} (fault, image) pairs)")
    rows = table(args, times)
    for mib, row in zip(args.max_mib, rows, strict=False):
        row["fixed_cpu_s"] = bitfault_campaign(model, x, faults[:1], tmp / f"one{mib}.db",
                                               mib << 20)[0][1]
        print(f"{row['method']}: {row['vs_pytorchfi']:.1f}x pytorchfi (target >= 10x), "
              f"{row['vs_hand_loop']:.1f}x the hand loop (CPU time); its fixed part (a "
              f"1-fault campaign: evaluator, trace, golden and clean runs, store) "
              f"{row['fixed_cpu_s']:.2f} CPU s")
    if args.json:
        with open(args.json, "x") as f:  # never over an existing file
            json.dump(rows, f, indent=1)
    for mib in args.max_mib if args.profile else ():
        print(f"---- cProfile (CPU time) of bitfault, max_bytes {mib} MiB ----")
        print(profile_bitfault(model, x, faults, tmp / f"profile{mib}.db", mib << 20,
                               args.profile))


def table(args: argparse.Namespace, times: dict[str, list[Clock]]) -> list[dict[str, Any]]:
    """One row per method (medians over the repeats), printed; ratios to pytorchfi and to
    the hand loop in CPU time (and in wall time)."""
    rows = []
    for k, v in times.items():
        wall, cpu = statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)
        rows.append({"method": k, "width": args.width, "head": args.head, "images": args.images,
                     "faults": args.faults, "repeats": args.repeats, "seed": args.seed,
                     "cpu_s": cpu, "wall_s": wall, "faults_per_cpu_s": args.faults / cpu,
                     "faults_per_wall_s": args.faults / wall})
    base = {r["method"]: r for r in rows}
    for row in rows:
        row["vs_pytorchfi"] = base["pytorchfi"]["cpu_s"] / row["cpu_s"]
        row["vs_hand_loop"] = base["hand loop"]["cpu_s"] / row["cpu_s"]
        row["vs_pytorchfi_wall"] = base["pytorchfi"]["wall_s"] / row["wall_s"]
    w = max(len(r["method"]) for r in rows)
    print(f"{'method':<{w}} {'CPU s':>7} {'faults/CPU s':>13} {'vs pytorchfi':>13} "
          f"{'vs hand loop':>13} {'wall s':>7} {'(wall) vs pytorchfi':>20}")
    for r in rows:
        print(f"{r['method']:<{w}} {r['cpu_s']:7.2f} {r['faults_per_cpu_s']:13.2f} "
              f"{r['vs_pytorchfi']:12.1f}x {r['vs_hand_loop']:12.1f}x {r['wall_s']:7.2f} "
              f"{r['vs_pytorchfi_wall']:19.1f}x")
    return rows

if __name__ == "__main__":
    main()
