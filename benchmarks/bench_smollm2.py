"""SmolLM2-135M-Instruct in its Q4_1 GGUF storage: perplexity and next-token agreement with
the clean model vs bit error rate, faults in each plane separately and in every bit.

Each chip is one seed: ``GGUFMemory.random_maps`` over the stored tensors (Q4_1 / Q8_0
codes, fp16 scales, fp16 minimums, F32 norm words, or all), dequantised into the model
loaded once (``bitfault.torch.gguf``). Per (plane, rate): the median and the range of
perplexity over the chips, the mean next-token agreement with the clean model (top-1 of
the faulty logits equal to the clean top-1, over every position), and the share of
chips whose perplexity is not finite. Text: gensim's Lee corpus. Offline:

    python benchmarks/bench_smollm2.py --chips 10 --rates 1e-6 1e-5 1e-4 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from smollm2_gguf import smollm2_path

PLANES = ("codes", "scale", "min", "f32", "all")


def evaluate(model, windows):
    """(perplexity, top-1 ids per position) of ``model`` on the windows."""
    import torch

    total, count, tops = 0.0, 0, []
    with torch.no_grad():
        for row in torch.from_numpy(windows):
            logits = model(row[None]).logits[0, :-1].double()
            total += float(torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum"))
            count += row.numel() - 1
            tops.append(logits.argmax(-1))
    mean = total / count
    ppl = math.exp(mean) if mean < 700 else (math.nan if math.isnan(mean) else math.inf)
    return ppl, torch.cat(tops)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chips", type=int, default=10)
    parser.add_argument("--rates", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4])
    parser.add_argument("--planes", nargs="+", default=list(PLANES), choices=PLANES)
    parser.add_argument("--tokens", type=int, default=384)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--json", default=None, help="write the rows here (a new file)")
    args = parser.parse_args(argv)
    if args.json and os.path.exists(args.json):
        sys.exit(f"--json {args.json}: exists; choose a new file")

    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from bitfault.data.text import lee_corpus, token_windows
    from bitfault.torch.gguf import load_gguf_model

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    path = smollm2_path()
    gm = load_gguf_model(path)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    windows = token_windows(lee_corpus(), tok, args.context,
                            n_windows=max(1, args.tokens // args.context))
    clean_ppl, clean_top = evaluate(gm.model, windows)
    print(f"clean perplexity {clean_ppl:.3f} on {windows.size} tokens; {args.chips} chips "
          "per row")
    quantised = [n for n, t in gm.memory.tensors.items() if t.type.startswith("Q")]
    floats = [n for n in gm.memory.names if n not in quantised]
    rows = []
    print(f"{'plane':>6} {'ber':>8} {'bits':>8} {'ppl median':>11} {'ppl min':>10} "
          f"{'ppl max':>10} {'agree':>7} {'non-finite':>10}")
    for plane in args.planes:
        for rate in args.rates:
            ber = {"codes": {"codes": rate}, "scale": {"scale": rate}, "min": {"min": rate},
                   "f32": rate, "all": rate}[plane]
            names = {"f32": floats, "all": gm.memory.names}.get(plane, quantised)
            ppls, agrees, bits = [], [], []
            for seed in range(args.chips):
                maps = gm.memory.random_maps(ber=ber, seed=seed,
                                             targets={"kinds": ["weights"], "include": names})
                stats = gm.inject_(maps)
                ppl, top = evaluate(gm.model, windows)
                ppls.append(ppl)
                agrees.append(float((top == clean_top).double().mean()))
                bits.append(sum(s["faults"] for s in stats.values()))
            gm.restore_()
            finite = [p for p in ppls if math.isfinite(p)]
            row = {"plane": plane, "ber": rate, "chips": args.chips,
                   "faulty_bits_mean": float(np.mean(bits)),
                   "perplexity_median": float(np.median(ppls)),
                   "perplexity_min": min(ppls), "perplexity_max": max(ppls),
                   "agreement_mean": float(np.mean(agrees)),
                   "non_finite_share": 1 - len(finite) / len(ppls), "clean": clean_ppl}
            rows.append(row)
            print(f"{plane:>6} {rate:>8.0e} {row['faulty_bits_mean']:>8.0f} "
                  f"{row['perplexity_median']:>11.4g} {row['perplexity_min']:>10.4g} "
                  f"{row['perplexity_max']:>10.4g} {row['agreement_mean']:>7.3f} "
                  f"{row['non_finite_share']:>10.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
