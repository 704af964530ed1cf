"""Bit-error robustness recipes on MNIST: normal vs clipped vs clipped + RandBET (issue 7).

Reruns, at small scale, the protocol of Stutz, Chandramoorthy, Hein and Schiele,
"Bit Error Robustness for Energy-Efficient DNN Accelerators" (MLSys 2021): networks
with 8-bit weights (per-tensor symmetric codes, rounding) trained three ways, then
evaluated on fixed simulated chips (random bit flips in the stored weight codes)
at p in {0.1%, 1%, 5%, 10%, 15%, 20%}. Robust error counts an example as wrong if
it is misclassified with or without the chip's faults. The same chips (seeds)
are used for every model and rate, and maps are nested across rates.

    python benchmarks/robustness_mnist.py                  # embedded 5k MNIST, MLP + CNN
    python benchmarks/robustness_mnist.py --idx ~/mnist    # a full MNIST IDX directory
    python benchmarks/robustness_mnist.py --models mlp --epochs 5 --chips 5   # a quick look

Prints a Markdown table (clean error; robust error mean / std / max per rate, in
percent) and writes it with JSON and a plot into --out.
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
from bitfault.data import load_idx_dir, split_embedded_mnist
from bitfault.models.torch import seed_mlp, small_cnn
from bitfault.recipes import Recipe
from bitfault.torch import TorchEvaluator
from bitfault.torch.train import fit

RATES = (0.001, 0.01, 0.05, 0.10, 0.15, 0.20)
FORMAT = bf.IntQuant(8)  # per-tensor symmetric codes, rounding to nearest
# (model, recipe) settings: w_max for clipping, p_train for RandBET, learning rate; RandBET
# starts once a step's clean loss is below 0.1 (--start-below)
SETTINGS = {
    "mlp": {"build": lambda: seed_mlp(hidden=256, seed=0), "w_max": 0.1, "p_train": 0.1,
            "lr": 0.05},
    "cnn": {"build": lambda: small_cnn(seed=0), "w_max": 0.1, "p_train": 0.1, "lr": 0.05},
    "cnn-gn": {"build": lambda: small_cnn(seed=0, norm="group"), "w_max": 0.1, "p_train": 0.1,
               "lr": 0.05},
}
# the paper's MNIST CNN (robust error in %, its Table/figures) and the MLP baseline
PAPER = {"clean": "0.39-0.43", 0.05: "normal 86.4", 0.10: "normal 89.9; clip(0.025) 0.71; "
         "clip(0.05)+RandBET(20%) 0.53"}
BASELINE_MLP = {"normal": (5.7, 7.5, 17.6, 46.4, 81.8), "clipped": (6.0, 6.4, 7.4, 10.1, 27.4),
                "clipped+randbet": (5.5, 5.8, 6.3, 7.0, 10.7)}  # clean, 1%, 5%, 10%, 20%


def recipes(w_max: float, p_train: float, start_below: float | None = 0.1
            ) -> dict[str, Recipe]:
    randbet = Recipe.randbet_clipped(w_max, p_train, seed=7, format=FORMAT)
    if start_below is not None:
        randbet = randbet.replace(randbet=dataclasses.replace(randbet.randbet,
                                                              start_below=start_below))
    return {"normal": Recipe.normal(FORMAT),
            "clipped": Recipe.clipped(w_max, FORMAT),
            "clipped+randbet": randbet}


def evaluate(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, chips: int,
             store: Path) -> dict:
    evaluator = TorchEvaluator(model, x, y)
    memory = bf.Memory(FORMAT, bf.BitFlip())
    result = run(evaluator, rate_sweep(RATES, chips, base_seed=1000), memory, store, batch=8)
    rows = {r["ber"]: r for r in result.summary("robust_error")}
    return {"clean_error": 1.0 - result.clean["accuracy"],
            "rates": {p: {k: rows[p][k] for k in ("mean", "std", "min", "max", "ci_low",
                                                   "ci_high")} for p in RATES},
            "rows": [rows[p] for p in RATES]}


def table(results: dict) -> str:
    head = "| model | recipe | clean | " + " | ".join(f"p={p:.1%}" for p in RATES) + " |"
    lines = [head, "|---|---|---:|" + "---:|" * len(RATES)]
    for (model, recipe), r in results.items():
        cells = [f"{100 * r['rates'][p]['mean']:.1f} ± {100 * r['rates'][p]['std']:.1f} "
                 f"(max {100 * r['rates'][p]['max']:.1f})" for p in RATES]
        lines.append(f"| {model} | {recipe} | {100 * r['clean_error']:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn",
                        help="comma-separated: mlp,cnn,cnn-gn (GroupNorm after each conv)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--chips", type=int, default=25, help="simulated chips per rate")
    parser.add_argument("--idx", default=None, help="a full MNIST IDX directory (default: the "
                        "embedded 5,000 digits, 4,000 train / 1,000 held out)")
    parser.add_argument("--out", default="robustness_mnist", help="output directory")
    parser.add_argument("--recipes", default="normal,clipped,clipped+randbet",
                        help="comma-separated subset of: normal,clipped,clipped+randbet")
    parser.add_argument("--w-max", type=float, default=None, help="override every model's w_max")
    parser.add_argument("--p-train", type=float, default=None, help="override RandBET's p_train")
    parser.add_argument("--start-below", type=float, default=0.1,
                        help="RandBET starts once a step's clean loss is below this (default "
                        "0.1; 0: from the first step)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    (xtr, ytr), (xte, yte) = load_idx_dir(args.idx) if args.idx else split_embedded_mnist()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stores = Path(tempfile.mkdtemp(prefix="robustness_"))
    print(f"{len(xtr)} training / {len(xte)} held-out digits; {FORMAT}; {args.epochs} epochs; "
          f"{args.chips} chips per rate", file=sys.stderr)
    results: dict = {}
    for model_name in args.models.split(","):
        setting = SETTINGS[model_name]
        chosen = recipes(args.w_max or setting["w_max"], args.p_train or setting["p_train"],
                         args.start_below if args.start_below > 0 else None)
        for recipe_name in args.recipes.split(","):
            recipe = chosen[recipe_name]
            start = time.perf_counter()
            model = setting["build"]()
            history = fit(model, xtr, ytr, recipe, epochs=args.epochs, batch_size=100,
                          lr=setting["lr"], seed=0)
            trained = time.perf_counter() - start
            r = evaluate(model, xte, yte, args.chips, stores / f"{model_name}-{recipe_name}.db")
            r["recipe"] = recipe.to_dict()
            r["final_train_loss"] = history[-1].loss
            r["seconds"] = {"train": trained, "campaign": time.perf_counter() - start - trained}
            results[(model_name, recipe_name)] = r
            print(f"{model_name} {recipe_name}: clean error {100 * r['clean_error']:.1f}%, "
                  f"p=10%: {100 * r['rates'][0.10]['mean']:.1f}% "
                  f"({trained:.0f} s training)", file=sys.stderr)
    text = table(results)
    print(text)
    (out / "robustness_mnist.md").write_text(text + "\n")
    (out / "robustness_mnist.json").write_text(json.dumps(
        {f"{m}/{r}": {k: v for k, v in res.items() if k != "rows"}
         for (m, r), res in results.items()}, indent=1, default=str))
    try:
        from bitfault.report.plots import plot_rate_sweep

        curves = {f"{m} {r}": res["rows"] for (m, r), res in results.items()}
        clean = {f"{m} {r}": res["clean_error"] for (m, r), res in results.items()}
        plot_rate_sweep(curves, out / "robustness_mnist.png", metric="robust_error", clean=clean)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
