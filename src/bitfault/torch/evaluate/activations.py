"""``TorchEvaluator``'s clean activations, kept per data batch within ``max_bytes``.

One traced clean run per format and fault model gives each batch's node values. A batch
keeps them while they fit in the evaluator's byte budget (``budget.ByteBudget``, shared
with its other caches): every node's value ("complete": what single faults read), or
where that does not fit, only the values layer trials read (the clean inputs of the
nodes that depend on a target tensor), or nothing. A trial on a batch that kept
nothing (or too little) recomputes it from the replica's stored tensors: a layer trial
runs the whole graph on the batch, dropping each value after its last use; single
faults take, in one pass over the data per ``predict``, its complete values or chunks of
examples whose values from the earliest faulted node on fit in ``max_bytes`` (measured
on one example). The same operations on the same values: the same results.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import predicted_labels
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory
from bitfault.torch.evaluate.budget import ByteBudget, held_bytes, storages
from bitfault.torch.evaluate.graph import TracedGraph


@dataclass
class BatchEnv:
    """The clean values one data batch keeps (node -> value), whether they are every
    node's (``complete``), and the bytes they hold (counted in the budget)."""

    values: dict[Any, Any]
    complete: bool
    nbytes: int


class CleanActivations:
    """The graph and its clean values (a mixin of ``TorchEvaluator``)."""

    model: Any
    x: Any
    max_bytes: int
    _budget: ByteBudget
    _graph: Any
    _envs: dict[Any, list[BatchEnv | None]]
    _per_example: dict[Any, dict[int, int]]
    _aliases: dict[str, list[str]]
    _clean: dict[str, Any]
    _key: Any
    _batches: Any
    stored: Any
    golden: Any
    _write_faulty: Any
    _predict_full: Any
    _replica_tensors: Any
    batch_roles: Any

    def graph(self) -> TracedGraph | None:
        """The model's fx graph, or None when it cannot be traced (then every trial runs
        the whole model)."""
        if self._graph is None:
            self._graph = TracedGraph.trace(self.model) or False
        return self._graph or None

    def cached_bytes(self) -> int:
        """Bytes the evaluator's caches hold now (within ``max_bytes``)."""
        return self._budget.used

    def _excluded(self) -> set[tuple[str, int]]:
        """Storages a cache entry may reference without holding them: the replica's
        tensors and the data."""
        return set(storages([*self._replica_tensors().values(), self.x]))

    def _layer_nodes(self) -> set[Any]:
        """Every node whose clean value some layer trial reads (over all targets)."""
        g = self.graph()
        out: set[Any] = set()
        for path in self._clean:
            seeds = g.seeds(path, *self._aliases.get(path, ()))
            if seeds:
                out |= g.frontier(seeds)
        return out

    def _clean_env(self, memory: Memory) -> list[BatchEnv | None] | None:
        """Per data batch, what it keeps of its clean values (None: nothing); None if the
        model has no graph or its graph does not give the model's predictions."""
        g = self.graph()
        if g is None:
            return None
        key = self._key(memory)
        if key not in self._envs:
            self.stored(memory)
            exclude = self._excluded()
            layer = self._layer_nodes()
            envs, preds = [], []
            try:
                for b in self._batches():
                    env, out = self._build(g, b, layer, exclude)
                    envs.append(env)
                    preds.append(out)
            except Exception:  # the trace does not run on the data: whole-model runs
                preds.append(None)
            if any(p is None for p in preds) or not np.array_equal(
                    np.concatenate(preds), self.golden(memory)):
                for env in envs:  # the trace does not reproduce the model: no reuse
                    if env is not None:
                        self._budget.give(env.nbytes)
                self._graph = False
                return None
            self._envs[key] = envs
        return self._envs[key]

    def _build(self, g: TracedGraph, b: slice, layer: set[Any], exclude: set[Any]
               ) -> tuple[BatchEnv | None, np.ndarray | None]:
        """Run the clean graph on batch ``b``, keeping every value while they fit in the
        budget, else only ``layer``'s, else none; returns them and the predictions (None
        when the graph's output is not a tensor)."""
        import torch

        from bitfault.torch.evaluate.graph import run_nodes

        env: dict[Any, Any] = {}
        mode = "complete"  # -> "layer" -> "none" as the budget runs out
        kept: dict[Any, int] = {}  # the storages kept so far -> bytes

        def keeps(n: Any) -> bool:
            return mode == "complete" or (mode == "layer" and n in layer)

        with torch.no_grad():
            for pos, node in enumerate(g.nodes):
                run_nodes(self.model, [node], env, {}, self.x[b])
                if keeps(node):
                    kept.update((k, v) for k, v in storages([env[node]]).items()
                                if k not in exclude)
                    while mode != "none" and not self._budget.fits(sum(kept.values())):
                        mode = "layer" if mode == "complete" else "none"
                        kept = {k: v for k, v in storages(
                            [v for n, v in env.items() if keeps(n)]).items()
                            if k not in exclude}
                        g.drop_dead(env, pos, layer if mode == "layer" else ())
                if mode != "complete":
                    g.drop_dead(env, pos, layer if mode == "layer" else (),
                                [*node.all_input_nodes, node])
        out = env[g.output]
        if not isinstance(out, torch.Tensor):
            return None, None
        preds = predicted_labels(out.float().cpu().numpy())
        if mode == "none":
            return None, preds
        values = env if mode == "complete" else {n: v for n, v in env.items() if n in layer}
        nbytes = held_bytes(values.values(), exclude)
        if not self._budget.take(nbytes):  # not reached: counted while it was built
            return None, preds
        return BatchEnv(values, mode == "complete", nbytes), preds

    def _env_chunks(self, memory: Memory, start: int = 0
                    ) -> Iterator[tuple[slice, dict[Any, Any]]]:
        """(examples, clean values on them) covering the data: the batches that keep
        complete values, and the others recomputed in chunks of examples, keeping only
        the values of the nodes from position ``start`` on and what those read
        (``TracedGraph.needed_from``), chunks whose kept values fit in ``max_bytes`` (one
        example at least)."""
        import torch

        g = self.graph()
        envs = self._clean_env(memory)
        self.stored(memory)
        keep = self._keep_from(start)
        for b, kept in zip(self._batches(), envs, strict=True):
            if kept is not None and kept.complete:
                yield b, kept.values
                continue
            size = max(1, self.max_bytes // max(1, self._example_bytes(memory, start)))
            for a in range(b.start, b.stop, size):
                chunk = slice(a, min(a + size, b.stop))
                env: dict[Any, Any] = {}
                with torch.no_grad():
                    g.run(self.model, env, self.x[chunk], keep=keep)
                yield chunk, env

    def _keep_from(self, start: int) -> frozenset[Any]:
        """The clean values single faults from position ``start`` on read: the nodes from
        there and their inputs, and what computing a size read from the batch again needs
        (``BatchRoles.sources``)."""
        g = self.graph()
        keep = g.needed_from(start)
        roles = self.batch_roles()
        return keep if roles is None else keep | roles.sources(keep)

    def _example_bytes(self, memory: Memory, start: int = 0) -> int:
        """Bytes of the clean values ``_env_chunks(memory, start)`` keeps for one example
        (measured once per memory and start)."""
        import torch

        key = self._key(memory)
        per_start = self._per_example.setdefault(key, {})
        if start not in per_start:
            self.stored(memory)
            g = self.graph()
            env: dict[Any, Any] = {}
            with torch.no_grad():
                g.run(self.model, env, self.x[0:1], keep=self._keep_from(start))
            per_start[start] = held_bytes(env.values(), self._excluded())
        return per_start[start]

    def _predict_layer(self, name: str, fmap: FaultMap, memory: Memory) -> np.ndarray:
        """Faults in one tensor: recompute only the nodes that depend on it (the whole
        graph on batches that keep no clean values)."""
        import torch

        envs = self._clean_env(memory)
        g = self.graph()
        seeds = g.seeds(name, *self._aliases.get(name, ())) if envs is not None else []
        if not seeds:
            return self._predict_full({name: fmap}, memory)
        dirty = g.dependents(seeds)
        if g.output not in dirty:
            return self.golden(memory)
        start = g.position[seeds[0]]
        self.stored(memory)
        self._write_faulty(name, fmap, memory)
        preds = []
        with torch.no_grad():
            for b, kept in zip(self._batches(), envs, strict=True):
                if kept is not None:
                    env = dict(kept.values)
                    g.run(self.model, env, self.x[b], start, only=dirty, keep=())
                else:
                    env = {}
                    g.run(self.model, env, self.x[b], keep=())
                preds.append(predicted_labels(env[g.output].float().cpu().numpy()))
        return np.concatenate(preds)


__all__ = ["BatchEnv", "CleanActivations"]
