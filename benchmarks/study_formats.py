"""Which deployment formats survive bit errors, and how much do scale faults hurt? (issue 16)

The seed's MLP on the embedded MNIST digits (4,000 train / 1,000 held out) and the
SmallCNN on Fashion-MNIST (Debian's ``dataset-fashion-mnist``; ``--cnn-train`` images of
its 60,000, ``--cnn-test`` of its 10,000 test images) stored in each 8-bit format (int8
per tensor and per channel, float8 e4m3 / e5m2, MXINT8, MXFP8) and each 4-bit format
(int4 per channel, int4 g=32, MXFP4, NVFP4, GGUF Q4_0 / Q4_1), trained two ways through
that format (normal quantisation-aware training; weight clipping + RandBET), then
evaluated on fixed simulated chips (random bit flips in the stored weights) at each
rate, twice for block formats: faults in the codes only and in every plane (codes,
scales, minimums). Robust error counts an example wrong if it is misclassified with or
without the chip's faults; the same chips (seeds) for every model, format and rate, maps
nested across rates.

    python benchmarks/study_formats.py --models mlp              # the MLP study
    python benchmarks/study_formats.py --models cnn --cnn-train 10000
    python benchmarks/study_formats.py --models mlp --formats int8,mxfp4 --epochs 3 \\
        --chips 3 --rates 0.01,0.1                                # a quick look

Writes ``study_formats.md`` (tables), ``study_formats.json`` and one plot per model and
bit width into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import bitfault as bf
from bitfault.campaign import rate_sweep, run
from bitfault.data import load_fashion_mnist, split_embedded_mnist
from bitfault.formats import plane_formats
from bitfault.models.torch import seed_mlp, small_cnn
from bitfault.recipes import Recipe
from bitfault.torch import TorchEvaluator
from bitfault.torch.train import fit

RATES = (1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2)


def formats(axis: int) -> dict[str, tuple[int, bf.formats.Format]]:
    """name -> (bit width, format); block formats' blocks run along ``axis`` (-1: a Linear
    weight's inputs; 1 for the CNN: a conv weight's input channels)."""
    return {
        "int8": (8, bf.IntQuant(8)),
        "int8/ch": (8, bf.IntQuant(8, per_channel=True)),
        "fp8-e4m3": (8, bf.Float("float8_e4m3fn")),
        "fp8-e5m2": (8, bf.Float("float8_e5m2")),
        "mxint8": (8, bf.MX("int8", axis=axis)),
        "mxfp8": (8, bf.MX("float8_e4m3fn", axis=axis)),
        "int4/ch": (4, bf.IntQuant(4, per_channel=True)),
        "int4/g32": (4, bf.formats.GroupwiseInt(4, 32, axis=axis)),
        "mxfp4": (4, bf.MX("float4_e2m1fn", axis=axis)),
        "nvfp4": (4, bf.NVFP4(axis=axis)),
        "q4_0": (4, bf.GGUF("q4_0", axis=axis)),
        "q4_1": (4, bf.GGUF("q4_1", axis=axis)),
    }


SETTINGS = {
    "mlp": {"build": lambda: seed_mlp(hidden=256, seed=0), "axis": -1, "lr": 0.05},
    "cnn": {"build": lambda: small_cnn(seed=0), "axis": 1, "lr": 0.05},
}


def recipes(fmt: bf.formats.Format, w_max: float, p_train: float,
            activation_clip: float | None = None) -> dict[str, Recipe]:
    """Normal training and clipping + RandBET (+ ReLUs bounded at ``activation_clip``); a
    block format's RandBET flips its codes only (random errors at p_train in the shared
    scales wreck whole blocks each step)."""
    robust = Recipe.randbet_clipped(w_max, p_train, seed=7, format=fmt)
    robust = robust.replace(activation_clip=activation_clip)
    fault = bf.BitFlip(bits="codes") if len(plane_formats(fmt)) > 1 else robust.randbet.fault
    robust = robust.replace(randbet=dataclasses.replace(robust.randbet, start_below=0.1,
                                                        fault=fault))
    return {"normal": Recipe.normal(fmt), "clip+randbet": robust}


def memories(fmt: bf.formats.Format) -> dict[str, bf.Memory]:
    """Faults in every plane, and (block formats) in the codes only."""
    out = {"all planes": bf.Memory(fmt, bf.BitFlip())}
    others = [p for p in plane_formats(fmt) if p != "codes"]
    if others:
        out["codes only"] = bf.Memory(fmt, bf.BitFlip(), plane_rates=dict.fromkeys(others, 0))
    return out


def evaluate(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, memory: bf.Memory,
             rates: tuple[float, ...], chips: int, store: Path) -> dict:
    result = run(TorchEvaluator(model, x, y), rate_sweep(rates, chips, base_seed=1000), memory,
                 store, batch=8)
    rows = {r["ber"]: r for r in result.summary("robust_error")}
    return {"clean_error": 1.0 - result.clean["accuracy"], "rows": [rows[p] for p in rates],
            "rates": {p: {k: rows[p][k] for k in ("mean", "max", "ci_low", "ci_high")}
                      for p in rates}}


def table(results: dict, rates: tuple[float, ...]) -> str:
    head = ("| model | format | recipe | faults in | clean | "
            + " | ".join(f"p={p:g}" for p in rates) + " |")
    lines = [head, "|---|---|---|---|---:|" + "---:|" * len(rates)]
    for (model, name, recipe, where), r in results.items():
        cells = [f"{100 * r['rates'][p]['mean']:.1f} (max {100 * r['rates'][p]['max']:.1f})"
                 for p in rates]
        lines.append(f"| {model} | {name} | {recipe} | {where} | {100 * r['clean_error']:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def data(model: str, args: argparse.Namespace) -> tuple[np.ndarray, ...]:
    if model == "mlp":
        (xtr, ytr), (xte, yte) = split_embedded_mnist()
        return xtr, ytr, xte, yte
    (xtr, ytr), (xte, yte) = load_fashion_mnist(flatten=False)
    rng = np.random.default_rng(0)
    tr = rng.permutation(len(xtr))[:args.cnn_train]
    te = rng.permutation(len(xte))[:args.cnn_test]
    return xtr[tr], ytr[tr], xte[te], yte[te]


def plots(results: dict, models: list[str], widths: dict[str, int], out: Path) -> None:
    """One figure per model and bit width: normal training left, clip+RandBET right; a
    colour per format, solid: faults in every plane, dashed: in the codes only."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots", file=sys.stderr)
        return
    recipes_seen = sorted({k[2] for k in results}, key=lambda r: r != "normal")
    for model in models:
        for width in sorted(set(widths.values())):
            keys = [k for k in results if k[0] == model and widths[k[1]] == width]
            if not keys:
                continue
            names = list(dict.fromkeys(k[1] for k in keys))
            colours = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
            fig, axes = plt.subplots(1, len(recipes_seen), figsize=(5.5 * len(recipes_seen), 4.2),
                                     sharey=True, squeeze=False)
            for ax, recipe in zip(axes[0], recipes_seen, strict=True):
                for k in (k for k in keys if k[2] == recipe):
                    rows = results[k]["rows"]
                    ax.plot([r["ber"] for r in rows], [100 * r["mean"] for r in rows],
                            "-" if k[3] == "all planes" else "--", marker="o", markersize=3,
                            color=colours[k[1]], label=f"{k[1]} ({k[3]})")
                ax.set_xscale("log")
                ax.set_title(f"{model}, {width}-bit weights, {recipe}", fontsize=9)
                ax.set_xlabel("bit error rate")
                ax.grid(alpha=0.3)
            axes[0][0].set_ylabel("robust error, mean over chips (%)")
            axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
            fig.tight_layout()
            fig.savefig(out / f"study_{model}_{width}bit.png", dpi=110, bbox_inches="tight")
            plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp,cnn")
    parser.add_argument("--formats", default=None, help="comma-separated subset of "
                        + ",".join(formats(-1)))
    parser.add_argument("--recipes", default="normal,clip+randbet")
    parser.add_argument("--epochs", type=int, default=30, help="MLP epochs")
    parser.add_argument("--cnn-epochs", type=int, default=5)
    parser.add_argument("--cnn-train", type=int, default=10000,
                        help="Fashion-MNIST training images (of 60,000)")
    parser.add_argument("--cnn-test", type=int, default=2000,
                        help="Fashion-MNIST test images (of 10,000)")
    parser.add_argument("--chips", type=int, default=25, help="MLP chips per rate")
    parser.add_argument("--cnn-chips", type=int, default=10)
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    parser.add_argument("--w-max", type=float, default=0.1)
    parser.add_argument("--p-train", type=float, default=0.1)
    parser.add_argument("--activation-clip", type=float, default=None,
                        help="clip+randbet: ReLUs bounded at this value")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="study_formats")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rates = tuple(float(r) for r in args.rates.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stores = Path(tempfile.mkdtemp(prefix="study_formats_"))
    models = args.models.split(",")
    results: dict = {}
    diverged: dict = {}
    widths: dict[str, int] = {}
    for model_name in models:
        setting = SETTINGS[model_name]
        xtr, ytr, xte, yte = data(model_name, args)
        chosen = formats(setting["axis"])
        names = args.formats.split(",") if args.formats else list(chosen)
        epochs = args.epochs if model_name == "mlp" else args.cnn_epochs
        chips = args.chips if model_name == "mlp" else args.cnn_chips
        print(f"{model_name}: {len(xtr)} training / {len(xte)} test images, {epochs} epochs, "
              f"{chips} chips per rate", file=sys.stderr)
        for name in names:
            width, fmt = chosen[name]
            widths[name] = width
            for recipe_name in args.recipes.split(","):
                recipe = recipes(fmt, args.w_max, args.p_train,
                                 args.activation_clip)[recipe_name]
                start = time.perf_counter()
                model = setting["build"]()
                try:
                    fit(model, xtr, ytr, recipe, epochs=epochs, batch_size=100,
                        lr=setting["lr"], seed=0)
                except FloatingPointError as exc:  # recorded, not hidden
                    diverged[(model_name, name, recipe_name)] = str(exc)
                    print(f"{model_name} {name} {recipe_name}: {exc}", file=sys.stderr)
                    continue
                trained = time.perf_counter() - start
                for where, memory in memories(fmt).items():
                    key = (model_name, name, recipe_name, where)
                    store = stores / f"{model_name}-{name.replace('/', '_')}-{recipe_name}-" \
                                     f"{where.replace(' ', '_')}.db"
                    results[key] = evaluate(model, xte, yte, memory, rates, chips, store)
                    r = results[key]
                    print(f"{model_name} {name} {recipe_name} ({where}): clean "
                          f"{100 * r['clean_error']:.1f}%, p={rates[-1]:g}: "
                          f"{100 * r['rates'][rates[-1]]['mean']:.1f}% ({trained:.0f} s "
                          "training)", file=sys.stderr)
    text = table(results, rates)
    if diverged:
        text += "\n\nTraining diverged (no campaign): " + "; ".join(
            f"{m} {n} {r}" for m, n, r in diverged)
    print(text)
    (out / "study_formats.md").write_text(text + "\n")
    (out / "study_formats.json").write_text(json.dumps(
        {"/".join(k): {kk: v for kk, v in r.items() if kk != "rows"}
         for k, r in results.items()}, indent=1, default=str))
    plots(results, models, widths, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
