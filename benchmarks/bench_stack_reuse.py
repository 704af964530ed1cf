"""Block-boundary reuse on SmolLM2-135M-Instruct (Q4_1 GGUF): the cost of a trial whose
faults lie in block k only, as a ratio to a trial run through the whole model.

One ``GGUFEvaluator`` on ~512 tokens of gensim's Lee corpus (4 windows of 128, one
batch); its clean run keeps the output of every block (``bitfault.torch.evaluate.stack_reuse``).
Per k, maps faulting the seven ``blk.k.*`` matrices (codes, scales, minimums at
``--ber``) are written into the model and its forward is timed, interleaved, with the
blocks before k reusing the kept clean output (as the evaluator's trials run it) and
through the whole model; the logits must be identical bit for bit (NaNs included). The
ratio is of the minimum over ``--reps`` (the machine is shared: the minimum is the least
disturbed), next to the share of blocks from k on, (n - k) / n. Faults in the final norm
only (no block recomputed) give the part every forward pays whatever k is (embedding,
final norm, the 49,152-row LM head).
Whole trials (``GGUFEvaluator.predict``: the faulty tensors written in, the forward, the
language-model metric on the logits) with reuse on and off on block ``--trial``'s maps
(minimum of ``--trial-reps``, records checked identical) give the trial's own ratio and
the part of a trial outside the forward, hence the trial ratio each k then has. Offline,
one CPU thread by default, about five minutes on a free core:

    python benchmarks/bench_stack_reuse.py [--blocks 0 10 20 29] [--reps 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from smollm2_gguf import smollm2_path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[0, 10, 20, 29])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--ber", type=float, default=1e-4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trial", type=int, default=10, help="block of the timed trials")
    parser.add_argument("--trial-reps", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from bitfault.data.text import lee_corpus, token_windows
    from bitfault.torch.gguf import load_gguf_model
    from bitfault.torch.gguf.evaluate import CLEAN, GGUFEvaluator
    from bitfault.torch.hf import next_token_labels

    torch.set_num_threads(args.threads)
    path = smollm2_path()
    gm = load_gguf_model(path)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    windows = token_windows(lee_corpus(), tok, args.context,
                            n_windows=max(1, args.tokens // args.context))
    ev = GGUFEvaluator(gm, windows, next_token_labels(windows), metric="language_model")
    n = len(ev.stack_cache.blocks)
    t0 = time.perf_counter()
    ev.predict([{}], ev.memory)  # the clean run, its block outputs kept and checked once
    print(f"{windows.size} tokens, {n} blocks ({ev.stack_cache.path}); clean run with capture "
          f"and check {time.perf_counter() - t0:.2f} s; kept "
          f"{ev.stack_cache.used_bytes() / 2**20:.1f} MiB, reuse "
          f"{'on' if ev.stack_cache.enabled else 'off: ' + ev.stack_cache.reason}", flush=True)

    forward: list[float] = []  # seconds inside the model's forward, this trial
    gm.model.register_forward_pre_hook(lambda m, a: forward.append(-time.perf_counter()),
                                       prepend=True)
    gm.model.register_forward_hook(lambda m, a, o: forward.append(time.perf_counter()))

    def chip(c, seed):
        names = (["output_norm.weight"] if c == "norm" else
                 [t for t in ev.shapes if t.startswith(f"blk.{c}.") and "norm" not in t])
        return gm.memory.random_maps(ber=args.ber, seed=seed, targets=names)

    def trial(maps, reuse):
        """(trial seconds, forward seconds, records) of one ``predict``."""
        ev.stack_reuse = reuse
        forward.clear()
        t0 = time.perf_counter()
        records = ev.predict([maps], ev.memory)[0]
        return time.perf_counter() - t0, sum(forward), records

    runs = {True: [], False: []}
    for rep in range(args.trial_reps):  # fresh maps per rep, each run with reuse on and off
        maps = chip(args.trial, 7 + rep)
        for reuse in (True, False):
            runs[reuse].append(trial(maps, reuse))
        if runs[True][-1][2].tobytes() != runs[False][-1][2].tobytes():
            sys.exit(f"block {args.trial}: a trial's records with reuse differ from the "
                     "whole run's")
    (on_t, _, _), (off_t, off_f, _) = (min(runs[r], key=lambda t: t[0]) for r in (True, False))
    fixed = off_t - off_f  # writing the tensors in and scoring the logits
    print(f"a trial faulting block {args.trial}: {on_t:.2f} s with reuse, {off_t:.2f} s "
          f"whole (ratio {on_t / off_t:.3f}); outside the forward {fixed:.2f} s "
          f"(the faulty tensors written in, the metric on the logits)", flush=True)

    x = ev.x
    print(f"{'faults in':>10} {'starts':>6} {'share (n-k)/n':>14} {'forward ratio':>14} "
          f"{'trial ratio':>12} {'reuse s':>8} {'whole s':>8}")
    for c in ["norm", *args.blocks]:
        maps = chip(c, 11)
        gm.inject_(maps)
        k = ev.stack_cache.start({gm.targets[n] for n in maps})
        best = {True: float("inf"), False: float("inf")}
        with torch.no_grad():
            for _ in range(args.reps):
                for reuse in (True, False):
                    t0 = time.perf_counter()
                    with ev.stack_cache.reusing(CLEAN, 0, k if reuse else 0):
                        logits = gm.model(x).logits
                    best[reuse] = min(best[reuse], time.perf_counter() - t0)
                    if reuse:
                        start, reused = ev.stack_cache.last_start, logits
                    elif not torch.equal(reused.view(torch.int32), logits.view(torch.int32)):
                        sys.exit(f"{c}: logits with reuse differ from the whole model's")
        share = 0.0 if c == "norm" else (n - c) / n
        ratio = best[True] / best[False]
        est = (fixed + off_f * ratio) / (fixed + off_f)
        print(f"{'final norm' if c == 'norm' else f'block {c}':>10} {start:>6} {share:>14.3f} "
              f"{ratio:>14.3f} {est:>12.3f} {best[True]:>8.2f} {best[False]:>8.2f}",
              flush=True)
    gm.restore_()
    print("trial ratio: (outside-forward time + whole forward x forward ratio) / whole trial")


if __name__ == "__main__":
    main()
