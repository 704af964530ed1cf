"""Run a campaign: evaluate every trial of a grid, stream results to a store, resume.

The engine is framework-free: it talks to an *evaluator* that knows the model,
the data and the tensors that can be faulted, and returns predictions for a list
of fault-map sets (as many per call as it can vectorise): the ``Evaluator``
protocol of ``bitfault.campaign.evaluator``. A campaign's faults live in one
``Memory`` (format + fault model); each trial brings its own rate and seed, so the
campaign's identity (digest, store provenance) is the memory, the trials, the model
and the data. Trials run here (``executor="local"``) or as Ray tasks
(``executor="ray"``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

import bitfault
from bitfault.campaign.evaluator import Evaluator, Maps
from bitfault.campaign.grid import Trial
from bitfault.campaign.metrics import (
    Metric,
    accuracy_metrics,
    call_metric,
)
from bitfault.campaign.result import CampaignResult, memory_outcomes
from bitfault.campaign.stopping import StopWhenPrecise
from bitfault.campaign.store import CampaignStore
from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults.models import resolve_plane_bits
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory
from bitfault.memory.plane_maps import TensorWords


def _check_target(trial: Trial, shapes: Mapping[str, tuple[int, ...]]) -> None:
    if trial.target is not None and trial.target not in shapes:
        raise ValueError(f"trial {trial.key}: unknown tensor {trial.target!r}; known: "
                         f"{sorted(shapes)}")


def _check_trial(trial: Trial, shapes: Mapping[str, tuple[int, ...]], memory: Memory) -> None:
    """A trial's tensor, bit (position or field of the format) and element exist."""
    _check_target(trial, shapes)
    if trial.kind == "bit":
        resolve_plane_bits((trial.bit,), memory.format, argument=f"trial {trial.key}: bit")
    elif trial.kind == "single":
        if memory.storage is not None:
            raise ArgumentError("memory.storage", memory.storage.to_dict(),
                                "None for single-fault trials",
                                requirement=f"trial {trial.key}: a single fault flips one "
                                            "element bit; a stored memory places its faults "
                                            "by its pattern in physical words (run a rate "
                                            "or layer sweep through it)")
        if trial.target is None:
            raise ValueError(f"trial {trial.key}: a single fault needs a target tensor")
        size = math.prod(shapes[trial.target])
        if not (isinstance(trial.bit, int) and 0 <= trial.bit < memory.format.bits):
            raise ValueError(f"trial {trial.key}: bit must be in 0..{memory.format.bits - 1} "
                             f"for {memory.format}")
        if not (isinstance(trial.element, int) and 0 <= trial.element < size):
            raise ValueError(f"trial {trial.key}: element must be in 0..{size - 1} for tensor "
                             f"{trial.target!r} of shape {tuple(shapes[trial.target])}")


@functools.lru_cache(maxsize=4096)
def _empty_map(shape: tuple[int, ...], name: str) -> FaultMap:
    """``FaultMap.empty``, built once per tensor: maps are immutable, trials share it."""
    return FaultMap.empty(shape, name)


def trial_maps(trial: Trial, memory: Memory, shapes: Mapping[str, tuple[int, ...]],
               words: TensorWords | None = None) -> Maps:
    """The fault maps of one trial for every tensor (empty where the trial puts no fault),
    drawn in ``memory``'s format for its fault model at the trial's rate and seed; a
    ``data_dependent`` memory's with each tensor's clean stored ``words`` (name -> them).

    Every tensor is stored in the format in every trial, faulty or not, as in a real
    memory; layer and single-fault trials confine the faults, not the format.
    """
    _check_target(trial, shapes)
    maps = {n: _empty_map(tuple(s), n) for n, s in shapes.items()}
    if trial.kind == "single":
        maps[trial.target] = FaultMap(shapes[trial.target], np.array([trial.element]),
                                      np.array([1 << trial.bit], np.uint32), trial.target,
                                      {"source": "single", "format": memory.format.to_dict()})
        return maps
    names = [trial.target] if trial.kind == "layer" else list(shapes)
    bits = (trial.bit,) if trial.kind == "bit" else memory.fault.bits
    for n in names:
        maps[n] = memory.random_map(shapes[n], ber=memory.plane_ber(trial.ber),
                                    seed=trial.seed, name=n, bits=bits,
                                    words=None if words is None else words(n))
    return maps


def _maps_digest(maps: Maps) -> str:
    h = hashlib.sha256()
    for name in sorted(maps):
        h.update(name.encode())
        h.update(maps[name].digest().encode())
    return h.hexdigest()


def versions() -> dict[str, str]:
    """Library, Python and framework versions recorded with every trial."""
    found = {"bitfault": bitfault.__version__, "python": platform.python_version(),
             "numpy": np.__version__}
    for mod in ("torch", "tensorflow", "keras"):
        if mod in sys.modules:
            found[mod] = getattr(sys.modules[mod], "__version__", "?")
    return found


def campaign_digest(memory: Memory, trials: Sequence[Trial], model_digest: str,
                    data_digest: str) -> str:
    """Identity of a campaign: the memory (format + fault model), the set of trials (their
    keys carry rates and seeds), model and data."""
    body = {"memory": memory.to_dict(), "trials": sorted(t.key for t in trials),
            "model": model_digest, "data": data_digest}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def evaluate_trials(evaluator: Evaluator, trials: Sequence[Trial], memory: Memory,
                    shapes: Mapping[str, tuple[int, ...]], words: TensorWords | None = None,
                    ) -> list[tuple[str, np.ndarray, dict[str, int]]]:
    """Map digests, predictions and memory outcomes of ``trials`` (one evaluator call: many
    maps per pass); a data-dependent memory's maps drawn with ``words`` (default: the
    evaluator's clean tensors, encoded here)."""
    if words is None and memory.data_dependent:
        words = TensorWords(evaluator, memory.format)
    maps = [trial_maps(t, memory, shapes, words) for t in trials]
    predictions = evaluator.predict(maps, memory)
    return [(_maps_digest(m), np.asarray(p), memory_outcomes(m))
            for m, p in zip(maps, predictions, strict=True)]


def _run_local(evaluator: Evaluator, chunks: list[list[Trial]], memory: Memory,
               shapes: Mapping[str, tuple[int, ...]], words: TensorWords | None,
               ) -> Iterator[tuple[list[Trial], list]]:
    for chunk in chunks:
        yield chunk, evaluate_trials(evaluator, chunk, memory, shapes, words)


def _run_ray(evaluator: Evaluator, chunks: list[list[Trial]], memory: Memory,
             shapes: Mapping[str, tuple[int, ...]], ray_address: str | None,
             workers: int | None) -> Iterator[tuple[list[Trial], list]]:
    """Shard chunks into Ray tasks; yield each chunk's results as its task finishes.

    A task whose worker dies is retried by Ray (``max_retries``); results reach the
    store only through this driver, so a dead worker never loses a stored trial.
    """
    try:
        import ray
    except ImportError:
        raise ImportError("executor='ray' needs Ray: pip install 'bitfault[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        if ray_address is not None:
            ray.init(address=ray_address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(max_retries=3, retry_exceptions=False)(evaluate_trials)
        ev_ref, memory_ref = ray.put(evaluator), ray.put(memory)
        pending = {remote.remote(ev_ref, chunk, memory_ref, dict(shapes)): chunk
                   for chunk in chunks}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                yield pending.pop(ref), ray.get(ref)
    finally:
        for ref in pending:  # the campaign stopped early: what is left is not wanted
            ray.cancel(ref)
        if started_here:
            ray.shutdown()


def run(
    evaluator: Evaluator,
    trials: Sequence[Trial],
    memory: Memory,
    store: str | os.PathLike[str],
    *,
    metric: Metric = accuracy_metrics,
    batch: int = 8,
    append: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    workers: int | None = None,
    progress: bool | Callable[[int, int], None] | None = None,
    stop: StopWhenPrecise | None = None,
) -> CampaignResult:
    """Evaluate every trial not yet in ``store``; commit each as soon as it is known.

    ``memory`` gives the format and fault model (``bf.Memory(format, fault)``, or a
    FaultSpec's ``spec.memory``); each trial brings its rate and seed. ``batch`` trials
    are handed to the evaluator per call, so it can run several fault maps per forward
    pass. ``executor="ray"`` shards batches into Ray
    tasks (``ray_address`` for an existing cluster, else a local one with
    ``workers`` CPUs). Re-running with the same store resumes. ``progress``: True
    for a tqdm bar on stderr (trials done, rate, ETA), or ``fn(done, total)``;
    None/False is quiet. ``stop``: end early once the failure share is precise
    enough (``StopWhenPrecise``; trials in random order, e.g. ``sampled_single_faults``).
    ``fn(done, total)`` counts every trial of ``trials``: a first call before any runs says
    how many earlier runs stored; a campaign stopped early ends below ``total``.
    """
    if not isinstance(memory, Memory):
        raise ArgumentTypeError("memory", memory, "a bitfault.Memory (bf.Memory(format, "
                                "fault), or a FaultSpec's spec.memory)",
                                tail=f", got {type(memory).__name__}")
    if not trials:
        raise ValueError("trials must not be empty (build them with rate_sweep, layer_sweep, "
                         "bit_sweep or single_faults)")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
    if stop is not None and not isinstance(stop, StopWhenPrecise):
        raise TypeError(f"stop must be None or a StopWhenPrecise, got {stop!r}")
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"progress must be True, False, None or fn(done, total), got "
                        f"{progress!r}")
    keys = [t.key for t in trials]
    if len(set(keys)) != len(keys):
        raise ValueError("trials contain duplicates (the same key twice)")
    shapes = evaluator.tensor_shapes()
    for t in trials:  # unknown tensors, bits and elements fail here, before anything runs
        _check_trial(t, shapes, memory)
    # a data-dependent memory: each tensor's clean stored words, encoded once per campaign
    words = TensorWords(evaluator, memory.format) if memory.data_dependent else None
    model_digest, data_digest = evaluator.model_digest(), evaluator.data_digest()
    digest = campaign_digest(memory, trials, model_digest, data_digest)
    description = {"memory": memory.to_dict(), "n_trials": len(trials), "model": model_digest,
                   "data": data_digest}
    naming = getattr(evaluator, "naming", None)
    if naming:  # how tensors were named (a root module, a stripped prefix): the chips' seeds
        description["naming"] = naming
    labels = np.asarray(evaluator.labels)
    # The golden run: every tensor stored in the format, no faults (ber = 0).
    golden = {n: FaultMap.empty(shape, n) for n, shape in shapes.items()}
    clean = evaluator.predict([golden], memory)[0]
    clean_metrics = call_metric(metric, labels, clean, clean, "clean run")
    if stop is not None:
        stop.check(clean_metrics)
    memory_json = memory.to_json()
    version_json = json.dumps(versions(), sort_keys=True)
    worker = f"{platform.node()}:{os.getpid()}"
    wanted = set(keys)
    with CampaignStore(store, digest, description, append=append) as db:
        done = db.done_keys()
        failures = tried = 0
        if stop is not None:  # what earlier runs of this campaign found counts too
            for r in db.records():
                if r.trial_key in wanted:
                    tried += 1
                    failures += stop.failed(r.metrics, clean_metrics)
        estimate = stop.estimate(failures, tried) if stop is not None else None
        todo = [] if estimate and estimate["reached"] else [t for t in trials
                                                             if t.key not in done]
        chunks = [todo[i:i + batch] for i in range(0, len(todo), batch)]
        if executor == "ray" and chunks:
            results = _run_ray(evaluator, chunks, memory, shapes, ray_address, workers)
        else:
            results = _run_local(evaluator, chunks, memory, shapes, words)
        already = len(wanted & done)
        bar, report = _progress(progress, len(trials), already)
        if report is not None:  # where it starts: what earlier runs stored
            report(already, len(trials))
        finished = 0
        began = time.time()
        try:
            for chunk, outputs in results:
                # the trials of one evaluator call finish together (one forward pass): score
                # them, then commit them in one transaction, so a crash keeps all or none
                done_at, rows = time.time(), []
                for trial, (map_digest, pred, outcomes) in zip(chunk, outputs, strict=True):
                    values = {**call_metric(metric, labels, clean, pred, trial.key), **outcomes}
                    rows.append({"trial_key": trial.key, "kind": trial.kind, "ber": trial.ber,
                                 "chip": trial.chip, "seed": trial.seed, "target": trial.target,
                                 "bit": trial.bit, "element": trial.element,
                                 "map_digest": map_digest, "model_digest": model_digest,
                                 "data_digest": data_digest, "memory": memory_json,
                                 "versions": version_json, "metrics": values, "started": began,
                                 "finished": done_at, "worker": worker})
                db.add_many(rows)
                finished += len(rows)
                if report is not None:
                    report(already + finished, len(trials))
                if stop is not None:
                    failures += sum(stop.failed(r["metrics"], clean_metrics) for r in rows)
                    estimate = stop.estimate(failures, tried + finished)
                    if estimate["reached"]:
                        break
                began = time.time()
        finally:
            results.close()  # a Ray executor cancels the tasks left
            if bar is not None:
                if estimate and estimate["reached"] and already + finished < len(trials):
                    before = f"{already} done before, " if already else ""
                    bar.set_postfix_str(before + stop.describe(estimate))
                bar.close()
        # an evaluator whose fast path failed for a tensor took its exact path (it warned):
        # the store keeps which tensors and why, beside the trials
        db.add_fallbacks(getattr(evaluator, "fallbacks", None) or {})
        records = [r for r in db.records() if r.trial_key in wanted]
        fallbacks = db.fallbacks()
    return CampaignResult(records, ran=finished, skipped=already, clean=clean_metrics,
                          stopping=estimate, fallbacks=fallbacks)


def _progress(progress: bool | Callable[[int, int], None] | None, total: int,
              already: int) -> tuple[Any, Callable[[int, int], None] | None]:
    """(a tqdm bar to close, or None; the callback ``run`` reports to, or None)."""
    if progress is None or progress is False:
        return None, None
    if progress is not True:
        return None, progress
    try:
        from tqdm import tqdm
    except ImportError:
        raise ImportError("progress=True needs tqdm: pip install tqdm (or 'bitfault[cli]')") \
            from None
    bar = tqdm(total=total, initial=already, desc="campaign", unit="trial")
    if already:
        bar.set_postfix_str(f"{already} done before", refresh=False)
    return bar, lambda done, _: bar.update(done - bar.n)


__all__ = ["CampaignResult", "campaign_digest", "evaluate_trials", "memory_outcomes", "run",
           "trial_maps", "versions"]
