"""Speed on the real models of issue 17: SmolLM2-135M-Instruct (Q4_1 GGUF) and
all-MiniLM-L6-v2, as ratios measured in this one process.

(a) A rate-sweep trial through the evaluator (its maps drawn with ``trial_maps``, then
``predict``: the faulty tensors written in, the forward, the metric) against one clean
inference of the same data (the model's forward alone). SmolLM2: ``--tokens`` tokens of
gensim's Lee corpus in windows of ``--context``, every plane (codes, scales, minimums) at
``--ber``, metric language_model, ``max_bytes`` large enough to keep the clean logits;
MiniLM: the 50 Lee documents in batches of ``--minilm-batch`` (bitfault, the hand loop
and the clean inference alike; mean pooling, Spearman with the human ratings: metric
similarity), every weight matrix stored as IntQuant(8) per channel and as bfloat16. Clean
inference and trial alternate (ABAB...), ``--reps`` of each; medians. Where a trial's time
goes: drawing the maps, writing them in, the forward, the metric (``make_records``), the
rest.

(b) A sampled single-bit-fault campaign (``--faults`` faults, ``sampled_single_faults``)
through ``bitfault.campaign.run`` against the loop a user writes by hand (flip the bit in
the weight, run the whole model, score the outputs with the same metric, restore), in
ABBA order over two halves of the faults; the metric values of every fault must be
identical (exit 1 otherwise); faults per second of each and their ratio.

Offline, one CPU thread by default:

    python benchmarks/bench_pretrained_speed.py [--models smollm2 minilm] [--reps 3]
        [--faults 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

PARTS = ("draw", "inject", "forward", "metric")  # of a trial; "other": the rest


class Clock:
    """Seconds spent in named parts of the current trial."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        self.hooked: set[int] = set()

    def wrap(self, part: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[part] += time.perf_counter() - t0
        return timed

    def hook_forward(self, model: Any) -> None:
        if id(model) in self.hooked:  # once per model: the time is not counted twice
            return
        self.hooked.add(id(model))
        start: list[float] = []
        model.register_forward_pre_hook(lambda m, a: start.append(time.perf_counter()),
                                        prepend=True)

        def done(m: Any, a: Any, o: Any) -> None:
            self.parts["forward"] += time.perf_counter() - start.pop()
        model.register_forward_hook(done)


def same_values(a: dict, b: dict) -> bool:
    """Metric dicts equal value for value (NaN equal to NaN)."""
    if set(a) != set(b):
        return False
    return all(a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k])
                                and math.isnan(b[k])) for k in a)


def rate_trials(name: str, clean_run: Any, trial_run: Any, clock: Clock, reps: int) -> dict:
    """(a): clean inference and a rate-sweep trial alternating, ``reps`` of each, after one
    untimed trial (what a campaign builds once: stored arrays, the clean outputs)."""
    t0 = time.perf_counter()
    trial_run(reps)
    first_trial = time.perf_counter() - t0
    clean_s, trial_s, parts = [], [], defaultdict(list)
    for rep in range(reps):
        for first in ((True, False) if rep % 2 == 0 else (False, True)):
            clock.parts.clear()
            t0 = time.perf_counter()
            if first:
                clean_run()
                clean_s.append(time.perf_counter() - t0)
            else:
                trial_run(rep)
                trial_s.append(time.perf_counter() - t0)
                for p in PARTS:
                    parts[p].append(clock.parts[p])
                parts["other"].append(trial_s[-1] - sum(clock.parts[p] for p in PARTS))
    clean, trial = statistics.median(clean_s), statistics.median(trial_s)
    row = {"model": name, "clean_s": clean, "trial_s": trial, "ratio": trial / clean,
           "first_trial_s": first_trial,
           "parts_s": {p: statistics.median(v) for p, v in parts.items()}}
    split = ", ".join(f"{p} {v:.3f}" for p, v in row["parts_s"].items())
    print(f"(a) {name}: trial {trial:.3f} s / clean inference {clean:.3f} s = "
          f"{row['ratio']:.3f}x (medians of {reps}); trial parts (s): {split}; the first "
          f"(untimed) trial {first_trial:.3f} s", flush=True)
    return row


def single_campaign(name: str, ev: Any, memory: Any, trials: list, hand: Any,
                    clock: Clock) -> dict:
    """(b): ``run`` vs the hand loop in ABBA order over two halves; identical values. Also
    the bound of exact recomputation: the hand loop's seconds over the seconds bitfault
    spent in model forwards (what the ratio would be were every other cost zero)."""
    from bitfault.campaign import run

    halves = [trials[:len(trials) // 2], trials[len(trials) // 2:]]
    ours: dict[tuple, dict] = {}
    theirs: dict[tuple, dict] = {}
    seconds = {"bitfault": 0.0, "hand": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        for step, (who, half) in enumerate([("bitfault", 0), ("hand", 0), ("hand", 1),
                                            ("bitfault", 1)]):
            t0 = time.perf_counter()
            clock.parts.clear()
            if who == "bitfault":
                result = run(ev, halves[half], memory, Path(tmp) / f"s{step}.sqlite",
                             metric=ev.metric)
                for r in result.records:
                    ours[(r.target, r.element, r.bit)] = dict(r.metrics)
            else:
                for t in halves[half]:
                    theirs[(t.target, t.element, t.bit)] = hand(t)
            seconds[who] += time.perf_counter() - t0
            if who == "bitfault":
                seconds["bitfault_forward"] = seconds.get("bitfault_forward", 0.0) + \
                    clock.parts["forward"]
    bad = [k for k in theirs if k not in ours or not same_values(ours[k], theirs[k])]
    if bad:
        k = bad[0]
        sys.exit(f"{name}: {len(bad)} faults differ from the hand loop, e.g. {k}: "
                 f"{ours.get(k)} vs {theirs[k]}")
    n = len(trials)
    row = {"model": name, "faults": n, "bitfault_s": seconds["bitfault"],
           "hand_s": seconds["hand"], "bitfault_fps": n / seconds["bitfault"],
           "hand_fps": n / seconds["hand"], "ratio": seconds["hand"] / seconds["bitfault"],
           "bound": seconds["hand"] / max(seconds["bitfault_forward"], 1e-9),
           "changed": sum(1 for v in ours.values() if not v.get("masked", 0)),
           "without_forward": getattr(getattr(ev, "unread", None), "skipped", 0)}
    print(f"(b) {name}: {n} single faults, bitfault {row['bitfault_fps']:.3f} faults/s, hand "
          f"loop {row['hand_fps']:.3f} faults/s: {row['ratio']:.2f}x (exact recomputation's "
          f"bound, the hand loop over bitfault's forwards alone: {row['bound']:.2f}x); "
          f"values identical for "
          f"every fault ({row['changed']} not masked; {row['without_forward']} answered without "
          f"a forward: embedding rows the data never reads)", flush=True)
    return row


def smollm2(args: argparse.Namespace) -> list[dict]:
    import numpy as np
    import torch
    from smollm2_gguf import smollm2_path
    from transformers import AutoTokenizer

    from bitfault.campaign import rate_sweep, sampled_single_faults, trial_maps
    from bitfault.campaign.metrics import make_records
    from bitfault.data.text import lee_corpus, token_windows
    from bitfault.faults import BitFlip
    from bitfault.maps import FaultMap
    from bitfault.torch.gguf import evaluate as gguf_eval
    from bitfault.torch.gguf import load_gguf_model
    from bitfault.torch.hf import next_token_labels

    path = smollm2_path()
    gm = load_gguf_model(path)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    windows = token_windows(lee_corpus(), tok, args.context,
                            n_windows=max(1, args.tokens // args.context))
    labels = next_token_labels(windows)
    ev = gguf_eval.GGUFEvaluator(gm, windows, labels, metric="language_model",
                                 max_bytes=args.max_mib << 20)
    memory = ev.with_memory(BitFlip(), None)
    shapes = ev.tensor_shapes()
    clock = Clock()
    clock.hook_forward(gm.model)
    gm.inject_ = clock.wrap("inject", gm.inject_)
    gguf_eval.make_records = clock.wrap("metric", make_records)
    ev.predict([{}], memory)  # the clean logits (and block outputs) kept
    x = ev.x
    print(f"SmolLM2 Q4_1: {windows.size} tokens ({len(windows)} x {args.context}), "
          f"{sum(math.prod(s) for s in shapes.values()):,} stored elements in {len(shapes)} "
          f"tensors", flush=True)

    def clean_run() -> None:
        with torch.no_grad():
            gm.model(x)

    sweep = rate_sweep([args.ber], args.reps + 1, base_seed=100)

    def trial_run(rep: int) -> None:
        maps = clock.wrap("draw", trial_maps)(sweep[rep], memory, shapes)
        ev.predict([maps], memory)

    gm.restore_()
    rows = [rate_trials("smollm2", clean_run, trial_run, clock, args.reps)]
    gm.restore_()

    with torch.no_grad():
        clean_logits = gm.model(x).logits.float().numpy()

    clean_records = make_records(ev.metric, clean_logits, clean_logits, ev.labels)

    def hand(t: Any) -> dict:
        fmap = FaultMap(shapes[t.target], np.array([t.element]),
                        np.array([1 << t.bit], np.uint32), t.target)
        gm.inject_({t.target: fmap})  # the bit flipped in the stored blocks
        with torch.no_grad():
            logits = gm.model(x).logits.float().numpy()
        gm.restore_()
        records = make_records(ev.metric, logits, clean_logits, ev.labels)
        return ev.metric(ev.labels, clean_records, records)

    trials = sampled_single_faults(shapes, memory.format, size=args.faults, seed=args.seed)
    rows.append(single_campaign("smollm2", ev, memory, trials, hand, clock))
    return rows


def minilm(args: argparse.Namespace) -> list[dict]:
    import copy

    import numpy as np
    import torch
    from study_minilm import minilm_path
    from transformers import AutoModel, AutoTokenizer

    import bitfault as bf
    from bitfault.campaign import rate_sweep, sampled_single_faults, trial_maps
    from bitfault.campaign.metrics import make_records
    from bitfault.campaign.similarity import SimilarityMetric
    from bitfault.data.text import text_pairs
    from bitfault.maps import FaultMap
    from bitfault.torch import OutputEvaluator
    from bitfault.torch.evaluate import outputs
    from bitfault.torch.hf import mean_pooled
    from bitfault.torch.seam import inject_tensor

    path = minilm_path()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    lee = text_pairs("lee")
    x = dict(tok(list(lee.texts), padding=True, truncation=True, max_length=args.minilm_context,
                 return_tensors="pt"))
    print(f"MiniLM: {len(lee.texts)} documents, {tuple(x['input_ids'].shape)} tokens",
          flush=True)
    clock = Clock()
    outputs.make_records = clock.wrap("metric", make_records)
    n, size = len(lee.texts), args.minilm_batch
    batches = [{k: v[i:i + size] for k, v in x.items()} for i in range(0, n, size)]

    def embed(m: Any) -> Any:
        """The embeddings in the evaluator's batches (the hand loop and the clean
        inference batch as bitfault does)."""
        with torch.no_grad():
            return np.concatenate([mean_pooled(m(**b), b).float().numpy() for b in batches])

    rows = []
    for label, fmt, ber in (("int8_channel", bf.IntQuant(8, per_channel=True), args.int8_ber),
                            ("bfloat16", bf.Float("bfloat16"), args.bf16_ber)):
        memory = bf.Memory(fmt, bf.BitFlip())
        ev = OutputEvaluator(model, x, SimilarityMetric.of(lee), output_fn=mean_pooled,
                             max_bytes=args.max_mib << 20, batch_size=args.minilm_batch)
        clock.hook_forward(ev.model)
        ev._apply = clock.wrap("inject", ev._apply)
        shapes = ev.tensor_shapes()
        ev.predict([{}], memory)
        sweep = rate_sweep([ber], args.reps + 1, base_seed=100)

        def clean_run() -> None:
            embed(model)

        def trial_run(rep: int, sweep=sweep, memory=memory, shapes=shapes, ev=ev) -> None:
            maps = clock.wrap("draw", trial_maps)(sweep[rep], memory, shapes)
            ev.predict([maps], memory)

        rows.append(rate_trials(f"minilm {label} ber {ber:g}", clean_run, trial_run, clock,
                                args.reps))

        # the hand loop: a copy of the model with every weight stored in the format
        mine = copy.deepcopy(model)
        params = dict(mine.named_parameters())
        clean = {n: dict(model.named_parameters())[n].detach() for n in shapes}
        with torch.no_grad():
            for n in shapes:
                params[n].copy_(inject_tensor(clean[n], fmt, memory.fault,
                                              FaultMap.empty(shapes[n])))
            clean_emb = embed(mine)
        clean_records = make_records(ev.metric, clean_emb, clean_emb, None)

        def hand(t: Any, memory=memory, params=params, clean=clean, mine=mine,
                 clean_emb=clean_emb, ev=ev, shapes=shapes, fmt=fmt,
                 clean_records=clean_records) -> dict:
            fmap = FaultMap(shapes[t.target], np.array([t.element]),
                            np.array([1 << t.bit], np.uint32), t.target)
            flat = params[t.target].view(-1)
            with torch.no_grad():
                kept = flat[t.element].clone()
                flat[t.element] = inject_tensor(clean[t.target], fmt, memory.fault,
                                                fmap).view(-1)[t.element]
                emb = embed(mine)
                flat[t.element] = kept
            records = make_records(ev.metric, emb, clean_emb, None)
            return ev.metric(ev.labels, clean_records, records)

        trials = sampled_single_faults(shapes, fmt, size=args.faults, seed=args.seed)
        rows.append(single_campaign(f"minilm {label}", ev, memory, trials, hand, clock))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "minilm"],
                        choices=["smollm2", "minilm"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--faults", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--minilm-context", type=int, default=128)
    parser.add_argument("--minilm-batch", type=int, default=10,
                        help="documents per batch, for bitfault, the hand loop and the "
                             "clean inference alike")
    parser.add_argument("--ber", type=float, default=1e-5, help="SmolLM2, every plane")
    parser.add_argument("--int8-ber", type=float, default=1e-3)
    parser.add_argument("--bf16-ber", type=float, default=1e-6)
    parser.add_argument("--max-mib", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="a new file for the rows")
    args = parser.parse_args(argv)
    if args.json is not None and Path(args.json).exists():
        parser.error(f"--json {args.json}: exists; name a new file")
    for key in ("reps", "faults", "tokens", "context", "minilm_context", "minilm_batch",
                "threads"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be a positive integer")
    if args.faults < 2:
        parser.error("--faults must be at least 2 (two halves, ABBA order)")

    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for m in args.models:
        rows += {"smollm2": smollm2, "minilm": minilm}[m](args)
    if args.json is not None:
        with open(args.json, "x") as fh:
            json.dump({"args": vars(args), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
