"""What does memory protection buy, and which fault patterns still get through? (issue 18)

The seed's MLP on the embedded MNIST digits (and with ``--models mlp,cnn`` the SmallCNN on
Fashion-MNIST) with int8 and MXFP4 weights, trained normally, evaluated on fixed simulated
chips whose weight memory (64-bit words) is unprotected, parity-protected or SEC-DED
(72,64), for independent bit errors and for multi-bit upsets (1/2/3 adjacent bits with
probability 0.7/0.2/0.1 per event), plus MXFP4 with SEC-DED on its scales only; under
multi-bit upsets also SEC-DED with 4-way bit interleaving (rows of 64 words; MXFP4: on
every plane and on the scales only) and, for int8, SEC-DED on the top bits only (bits 7
and 6, and bit 7 alone, stored apart from the other bits). Per rate:
mean accuracy and the trial outcomes: detected (a word was detected uncorrectable, the
"flag" policy), silent data corruption (not detected, accuracy more than 0.5 points below
fault-free) and masked (the rest), with Wilson intervals. Also: the highest rate at which
SEC-DED keeps the mean accuracy within 0.5 points of fault-free, and the cost of a
protected campaign relative to the same campaign unprotected (one process).

    python benchmarks/study_protection.py                 # the MLP
    python benchmarks/study_protection.py --models mlp,cnn --chips 10
    python benchmarks/study_protection.py --cases secded-x4,bits76,bit7   # new cases only
    python benchmarks/study_protection.py --formats int8 --patterns mbu --rates 0.1,0.3

Writes ``study_protection.md``, ``study_protection.json`` and one plot per model and
format into ``--out``; files already there are refused unless ``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from study_formats import SETTINGS, data

import bitfault as bf
from bitfault.campaign import rate_sweep, run
from bitfault.campaign.stats import wilson_interval
from bitfault.errors import ArgumentError
from bitfault.recipes import Recipe
from bitfault.torch import TorchEvaluator
from bitfault.torch.train import fit

RATES = (1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2)
MBU = {"kind": "mbu", "sizes": {1: 0.7, 2: 0.2, 3: 0.1}}
PATTERNS = {"independent": {"kind": "independent"}, "mbu": MBU}
FORMATS = {"int8": lambda axis: bf.IntQuant(8),
           "mxfp4": lambda axis: bf.MX("float4_e2m1fn", axis=axis)}
INTERLEAVED = {"row_words": 64, "interleave": 4}
# case id -> (table label, storage keys, patterns, formats it applies to); "none" is the
# baseline of every cost ratio and always runs
CASES = {
    "none": ("none", {"protection": "none"}, ("independent", "mbu"), ("int8", "mxfp4")),
    "parity": ("parity", {"protection": "parity"}, ("independent", "mbu"), ("int8", "mxfp4")),
    "secded": ("secded", {"protection": "secded"}, ("independent", "mbu"),
               ("int8", "mxfp4")),
    "scales": ("secded scales only", {"protection": {"scale": "secded"}},
               ("independent", "mbu"), ("mxfp4",)),
    "secded-x4": ("secded 4-way interleaved", {"protection": "secded", **INTERLEAVED},
                  ("mbu",), ("int8", "mxfp4")),
    "scales-x4": ("secded scales only 4-way interleaved",
                  {"protection": {"scale": "secded"}, **INTERLEAVED}, ("mbu",), ("mxfp4",)),
    "bits76": ("secded bits 7+6 only", {"protection": "secded", "protected_bits": [7, 6]},
               ("mbu",), ("int8",)),
    "bit7": ("secded bit 7 only", {"protection": "secded", "protected_bits": [7]},
             ("mbu",), ("int8",)),
}


def memories(fmt_name: str, fmt: bf.formats.Format, cases: tuple[str, ...],
             patterns: tuple[str, ...] = tuple(PATTERNS)) -> dict[tuple[str, str], bf.Memory]:
    """(label, pattern) -> memory of 64-bit words, in the table's order (independent bits
    first, then multi-bit upsets; the earlier cases before the new ones)."""
    out = {}
    for pattern_name in patterns:
        pattern = PATTERNS[pattern_name]
        for case in cases:
            label, storage, patterns, formats = CASES[case]
            if pattern_name in patterns and fmt_name in formats:
                out[(label, pattern_name)] = bf.Memory(fmt, bf.BitFlip(), storage={
                    "word_bits": 64, **storage, "pattern": pattern})
    return out


def overhead(memory: bf.Memory, shapes: dict[str, tuple[int, ...]]) -> float:
    """Check bits per stored data bit over the faulted tensors (``Storage.overhead`` of
    each plane weighted by its elements' bits)."""
    fmt, per_plane = memory.format, memory.storage.overhead(memory.format)
    planes = bf.formats.plane_formats(fmt)
    data = check = 0.0
    for shape in shapes.values():
        plane_shapes = fmt.plane_shapes(tuple(shape)) if len(planes) > 1 else \
            {next(iter(planes)): tuple(shape)}
        for plane, pf in planes.items():
            bits = float(np.prod(plane_shapes[plane])) * pf.bits
            data += bits
            check += bits * per_plane[plane]
    return check / data


def outcomes(records: list, clean: float, rates: tuple[float, ...]) -> dict[float, dict]:
    out = {}
    for rate in rates:
        rows = [r.metrics for r in records if r.ber == rate]
        detected = sum(m["detected"] for m in rows)
        sdc = sum(not m["detected"] and m["accuracy"] < clean - 0.005 for m in rows)
        n = len(rows)
        out[rate] = {"accuracy": float(np.mean([m["accuracy"] for m in rows])), "n": n,
                     **{k: (v / n, *wilson_interval(v, n)) for k, v in
                        (("detected", detected), ("sdc", sdc),
                         ("masked", n - detected - sdc))},
                     "words_due": float(np.mean([m["words_due"] for m in rows])),
                     "words_silent": float(np.mean([m["words_silent"] for m in rows])),
                     "raw_bit_errors": float(np.mean([m["raw_bit_errors"] for m in rows]))}
    return out


def within(res: dict[float, dict], clean: float, rates: tuple[float, ...]) -> float | None:
    """The highest rate whose mean accuracy, and that of every lower rate, is within 0.5
    points of fault-free (None: not even the lowest)."""
    kept = None
    for rate in sorted(rates):
        if res[rate]["accuracy"] < clean - 0.005:
            break
        kept = rate
    return kept


def plot(results: dict, out: Path) -> None:
    """Accuracy vs rate for every protection scheme, one figure per model and format
    (solid: independent bits, dashed: multi-bit upsets)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for model, fmt in dict.fromkeys((k[0], k[1]) for k in results):
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        schemes = list(dict.fromkeys(k[2] for k in results if k[:2] == (model, fmt)))
        for key, r in results.items():
            if key[:2] != (model, fmt):
                continue
            rates = sorted(r["rates"], key=float)
            ax.plot([float(p) for p in rates], [100 * r["rates"][p]["accuracy"] for p in rates],
                    "-" if key[3] == "independent" else "--",
                    marker="os^vDPX*"[schemes.index(key[2]) % 8], markersize=3.5,
                    color=plt.cm.tab10(schemes.index(key[2])), label=f"{key[2]} ({key[3]})")
        clean = results[next(k for k in results if k[:2] == (model, fmt))]["clean"]
        ax.axhline(100 * clean, color="grey", linestyle=":", linewidth=1, label="no faults")
        ax.set_xscale("log")
        ax.set_xlabel("rate (raw bit error rate; multi-bit upsets: events per word)")
        ax.set_ylabel("accuracy, mean over chips (%)")
        ax.set_title(f"{model}, {fmt} weights in 64-bit words", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        fig.savefig(out / f"protection_{model}_{fmt}.png", dpi=110, bbox_inches="tight")
        plt.close(fig)


def output_paths(out: Path, models: list[str]) -> list[Path]:
    """Every file a run writes into ``out``."""
    return [out / "study_protection.md", out / "study_protection.json",
            *(out / f"protection_{m}_{f}.png" for m in models for f in FORMATS)]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated of {', '.join(CASES)} (none always runs)")
    parser.add_argument("--formats", default="int8,mxfp4")
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--cnn-epochs", type=int, default=5)
    parser.add_argument("--cnn-train", type=int, default=10000)
    parser.add_argument("--cnn-test", type=int, default=2000)
    parser.add_argument("--chips", type=int, default=10)
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="study_protection")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the files of an earlier run in --out")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if not models or any(m not in SETTINGS for m in models):
        raise ArgumentError("--models", args.models, f"comma-separated of {tuple(SETTINGS)}")
    cases = [c.strip() for c in args.cases.split(",")]
    if any(c not in CASES for c in cases):
        raise ArgumentError("--cases", args.cases, f"comma-separated of {tuple(CASES)}")
    for option, allowed in (("formats", FORMATS), ("patterns", PATTERNS)):
        chosen = getattr(args, option).split(",")
        if any(c not in allowed for c in chosen):
            raise ArgumentError(f"--{option}", getattr(args, option),
                                f"comma-separated of {tuple(allowed)}")
        setattr(args, option, tuple(c for c in allowed if c in chosen))
    args.models, args.cases = models, tuple(c for c in CASES if c == "none" or c in cases)
    taken = [str(p) for p in output_paths(Path(args.out), models) if p.exists()]
    if taken and not args.overwrite:
        raise ArgumentError("--out", args.out, "a folder without an earlier run's files",
                            requirement=f"{taken} exist; pass --overwrite to replace them")
    return args


def main() -> int:
    args = parse()
    torch.set_num_threads(args.threads)
    rates = tuple(float(r) for r in args.rates.split(","))
    out, stores = Path(args.out), Path(tempfile.mkdtemp(prefix="study_protection_"))
    out.mkdir(parents=True, exist_ok=True)
    results, lines, costs, overheads = {}, [], {}, {}
    for model_name in args.models:
        setting = SETTINGS[model_name]
        xtr, ytr, xte, yte = data(model_name, args)
        for fmt_name in args.formats:
            fmt = FORMATS[fmt_name](setting["axis"])
            model = setting["build"]()
            fit(model, xtr, ytr, Recipe.normal(fmt),
                epochs=args.epochs if model_name == "mlp" else args.cnn_epochs,
                batch_size=100, lr=setting["lr"], seed=0)
            evaluator = TorchEvaluator(model, xte, yte)
            trials = rate_sweep(rates, args.chips, base_seed=1000)
            for (scheme, pattern), memory in memories(fmt_name, fmt, args.cases,
                                                      args.patterns).items():
                key = (model_name, fmt_name, scheme, pattern)
                overheads[key[:3]] = overhead(memory, evaluator.tensor_shapes())
                store = stores / f"{model_name}-{fmt_name}-{scheme}-{pattern}.db".replace(" ", "_")
                start = time.perf_counter()
                result = run(evaluator, trials, memory, store)
                costs[key] = time.perf_counter() - start
                clean = result.clean["accuracy"]
                res = outcomes(result.records, clean, rates)
                results[key] = {"clean": clean, "rates": res, "storage": memory.storage.to_dict(),
                                "overhead": overheads[key[:3]], "seconds": costs[key]}
                kept = within(res, clean, rates)
                cells = " | ".join(
                    f"{100 * res[r]['accuracy']:.1f} ({100 * res[r]['sdc'][0]:.0f}/"
                    f"{100 * res[r]['detected'][0]:.0f})" for r in rates)
                lines.append(f"| {model_name} | {fmt_name} | {scheme} | {pattern} | "
                             f"{100 * clean:.1f} | {cells} | {kept if kept else '-'} |")
                print(lines[-1], file=sys.stderr)
    head = ("| model | format | protection | pattern | clean | "
            + " | ".join(f"p={r:g}" for r in rates) + " | within 0.5 pt up to |")
    table = "\n".join([head, "|---|---|---|---|---:|" + "---:|" * (len(rates) + 1), *lines])
    ratio = {f"{m}/{f}/{s}/{p}": costs[(m, f, s, p)] / costs[(m, f, "none", p)]
             for (m, f, s, p) in costs if s != "none"}
    text = (table + "\n\ncells: mean accuracy % (SDC % / detected % of trials)\n\n"
            "check bits per data bit: "
            + ", ".join(f"{'/'.join(k)} {100 * v:.1f}%" for k, v in overheads.items())
            + "\n\ncampaign time, protected / unprotected (same pattern): "
            + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    print(text)
    (out / "study_protection.md").write_text(text + "\n")
    (out / "study_protection.json").write_text(json.dumps(
        {"/".join(k): v for k, v in results.items()}, indent=1, default=str))
    plot(results, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
