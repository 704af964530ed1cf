"""Peak memory of a layer sweep on a MobileNetV2-style CNN at 224x224, by ``max_bytes``.

The claim of issue #17: every cache of ``TorchEvaluator`` is bounded by ``max_bytes``
(over the bound, work is chunked over the data, never an out-of-memory crash), and peak
memory stays within twice the model's float32 size plus the bounded caches.

The network is written here: MobileNetV2's stage table (stem 3x3 stride 2 + BN + ReLU6;
inverted residual blocks: 1x1 expand + BN + ReLU6, 3x3 depthwise + BN + ReLU6, 1x1
project + BN, residual where shapes match; 1x1 conv to 1280 + BN + ReLU6; global average
pool; Linear to 10 classes), seeded random weights, BN statistics from two train-mode
passes on 4 random images and a head on features centred on their mean (so that
predictions differ between images). The data: 32
random 224x224 images, in batches of ``--batch-size``.

Each setting runs in a fresh subprocess (peak RSS is per process): the child reads its
peak resident set (``VmHWM`` in ``/proc/self/status``; tracemalloc does not see torch's
allocations) before the evaluator exists (torch, the model, the data) and after a layer
sweep (FixedPoint(32, 28) bit flips, one chip per chosen weight), and times, in the same
process, the sweep's trials against one clean inference of the same data (process CPU
time: with one thread, the work done whatever else the machine runs). The kernels are
compiled before the baseline is read (Numba's LLVM takes about 120 MiB in any setting). Settings:
plain inference only (the working set of a forward pass, for scale), then
``TorchEvaluator`` with ``max_bytes`` = the model's float32 size, 64 MiB and 1 GiB. The
parent asserts that every setting gives the same predictions, trial for trial.

Run: python benchmarks/bench_torch_memory.py [--images 32] [--batch-size 8] [--layers 6]
     [--threads 1] [--ber 1e-4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
          (6, 160, 3, 2), (6, 320, 1, 1))  # (expansion, channels, repeats, first stride)
MIB = 1 << 20


def peak_rss() -> int:
    """This process's peak resident set in bytes (``VmHWM``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def mobilenet_v2(classes: int = 10) -> Any:
    import torch
    from torch import nn

    def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
                act: bool = True) -> nn.Sequential:
        bn = nn.BatchNorm2d(cout, momentum=None)  # statistics: the average of the passes
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                  bn]
        return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
            super().__init__()
            h = cin * t
            layers = [conv_bn(cin, h, 1)] if t != 1 else []
            layers += [conv_bn(h, h, 3, stride, groups=h), conv_bn(h, cout, 1, act=False)]
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.body(x) if self.residual else self.body(x)

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[nn.Module] = [conv_bn(3, 32, 3, 2)]
            cin = 32
            for t, c, n, s in STAGES:
                for i in range(n):
                    layers.append(Block(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers.append(conv_bn(cin, 1280, 1))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(1280, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(x).mean((2, 3)))

    torch.manual_seed(0)
    model = MobileNetV2()
    with torch.no_grad():  # BN statistics from two train-mode passes on 4 random images
        for _ in range(2):
            model(torch.randn(4, 3, 224, 224))
        model.eval()
        # the head scores features centred on those images' mean (random features share a
        # large mean, which would give every image one class)
        mean = model.features(torch.randn(4, 3, 224, 224)).mean((0, 2, 3))
        model.classifier.weight.mul_(20.0)
        model.classifier.bias.copy_(-model.classifier.weight @ mean)
    return model


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One setting, in this (fresh) process."""
    import hashlib

    import numpy as np
    import torch

    import bitfault as bf
    from bitfault.campaign import layer_sweep, trial_maps
    from bitfault.torch import TorchEvaluator

    torch.set_num_threads(args.threads)
    model = mobilenet_v2()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.images, 3, 224, 224, generator=g)
    y = np.arange(args.images) % 10
    f32_bytes = sum(p.numel() * 4 for p in model.parameters()) + \
        sum(b.numel() * 4 for b in model.buffers() if b.is_floating_point())
    batches = [slice(i, min(i + args.batch_size, args.images))
               for i in range(0, args.images, args.batch_size)]

    def inference() -> float:
        t = time.process_time()
        with torch.no_grad():
            for b in batches:
                model(x[b])
        return time.process_time() - t

    out: dict[str, Any] = {"setting": args.setting, "model_f32_bytes": f32_bytes,
                           "params": sum(p.numel() for p in model.parameters())}
    memory = bf.Memory(bf.FixedPoint(32, 28, rounding="trunc"), bf.BitFlip())
    # compile the kernels first (Numba/LLVM take ~120 MiB, whatever the model): a tiny
    # evaluator runs a faulty trial, in every setting, before the baseline is read
    tiny = TorchEvaluator(torch.nn.Linear(4, 2), np.zeros((2, 4), np.float32), [0, 1])
    tiny.predict([{"weight": bf.FaultMap.random((2, 4), memory.format, ber=0.1,
                                                name="weight")}], memory)
    base = peak_rss()
    if args.setting == "inference":
        times = [inference() for _ in range(2)]
        out.update(base=base, peak=peak_rss(), inference_s=min(times))
        return out
    max_bytes = f32_bytes if args.setting == "model" else int(args.setting)
    ev = TorchEvaluator(model, x, y, batch_size=args.batch_size, max_bytes=max_bytes)
    names = list(ev.tensor_shapes())
    step = max(1, len(names) // args.layers)
    chosen = names[::step][:args.layers]
    maps = [trial_maps(t, memory, ev.tensor_shapes())
            for t in layer_sweep([args.ber], 1, chosen)]
    t = time.process_time()
    ev.golden(memory)
    ev._clean_env(memory)  # traces the model, records its clean run within max_bytes
    setup_s = time.process_time() - t
    trial_s, preds = [], []
    for m in maps:
        t = time.process_time()
        preds += ev.predict([m], memory)
        trial_s.append(time.process_time() - t)
    envs = ev._envs.get(ev._key(memory)) or []
    kept = [("none" if e is None else "complete" if e.complete else "layer") for e in envs]
    out.update(base=base, peak=peak_rss(), max_bytes=max_bytes, layers=chosen,
               setup_s=setup_s, trial_s=statistics.median(trial_s),
               inference_s=min(inference() for _ in range(2)),
               cached=ev.cached_bytes(), budget_peak=ev._budget.peak, kept=kept,
               preds=hashlib.sha256(b"".join(p.tobytes() for p in preds)).hexdigest(),
               classes=len(np.unique(ev.golden(memory))),
               changed=sum(not np.array_equal(p, ev.golden(memory)) for p in preds))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6, help="weights in the layer sweep")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ber", type=float, default=1e-4)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setting:
        print(json.dumps(child(args)))
        return
    rows = []
    for setting in ("inference", "model", str(64 * MIB), str(1 << 30)):
        cmd = [sys.executable, __file__, "--setting", setting, "--images", str(args.images),
               "--batch-size", str(args.batch_size), "--layers", str(args.layers),
               "--threads", str(args.threads), "--ber", str(args.ber)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"setting {setting} failed:\n{done.stderr}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    runs = [r for r in rows if r["setting"] != "inference"]
    assert len({r["preds"] for r in runs}) == 1, "settings gave different predictions"
    floor = rows[0]["peak"] - rows[0]["base"]
    r0 = runs[0]
    print(f"MobileNetV2-style, {r0['params'] / 1e6:.2f}M parameters (float32 "
          f"{r0['model_f32_bytes'] / MIB:.1f} MiB), {args.images} images 224x224, batches "
          f"of {args.batch_size}, {args.threads} thread(s); layer sweep over "
          f"{len(r0['layers'])} weights, FixedPoint(32, 28) bit flips")
    print(f"plain inference: peak RSS {rows[0]['peak'] / MIB:.0f} MiB, "
          f"{floor / MIB:.0f} MiB above the baseline (torch, model, data: "
          f"{rows[0]['base'] / MIB:.0f} MiB); {rows[0]['inference_s']:.2f} s")
    for r in runs:
        label = "model's f32 size" if r["setting"] == "model" else f"{r['max_bytes'] / MIB:.0f} MiB"
        above = r["peak"] - r["base"]
        print(f"max_bytes {label:>16}: peak RSS {r['peak'] / MIB:6.0f} MiB, "
              f"{above / MIB:5.0f} MiB above the baseline ({(above - floor) / MIB:+.0f} vs "
              f"plain inference); cached {r['cached'] / MIB:.1f} MiB (peak "
              f"{r['budget_peak'] / MIB:.1f}); batches kept {r['kept']}; golden + clean run "
              f"{r['setup_s']:.2f} s, a trial {r['trial_s']:.2f} s = "
              f"{r['trial_s'] / r['inference_s']:.2f}x a clean inference "
              f"({r['inference_s']:.2f} s)")
    print(f"identical predictions in every setting ({r0['changed']} of "
          f"{len(r0['layers'])} trials change some prediction; the clean run predicts "
          f"{r0['classes']} classes; sha256 of the predictions {r0['preds'][:16]})")


if __name__ == "__main__":
    main()
