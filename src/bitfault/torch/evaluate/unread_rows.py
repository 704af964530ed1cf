"""Embedding rows the data never reads: a fault there cannot change the outputs, proven.

An ``nn.Embedding`` (its own, stock ``forward``) reads only the rows its indices name. A
fault confined to other rows of its weight cannot change what the model computes on that
data, provided nothing else reads the weight: a tied tensor (an LM head sharing the
embedding) is never a candidate, and anything else reading it is caught by a proof, done
once per (model, data, memory) on the evaluator's copy of the model holding the stored
values: forward hooks record the rows each candidate reads on each batch, then each
batch is run again with every row it does not read set to NaN; only if every output is
bit-identical to the clean run's (and the same rows are read) are the unread rows
trusted. A trial whose faults all lie in trusted rows no batch reads (faults in the
codes plane only: a scale fault may change other rows) is then a masked trial, without
any forward; a batch that does not read the faulty rows keeps its clean outputs while the
batches that do are run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory
from bitfault.torch.evaluate.replica import confined
from bitfault.torch.evaluate.stack_reuse import same_bits


def embedding_candidates(model: Any, paths: list[str], tied: Mapping[str, Any]
                         ) -> dict[str, Any]:
    """Model path -> module, for each ``paths`` entry that is the ``weight`` of an
    ``nn.Embedding`` with the stock ``forward`` and not tied (no other path in ``tied``)."""
    from torch import nn

    out = {}
    for path in paths:
        owner, _, attr = path.rpartition(".")
        if attr != "weight" or path in tied:
            continue
        try:
            module = model.get_submodule(owner)
        except AttributeError:
            continue
        if isinstance(module, nn.Embedding) and type(module).forward is nn.Embedding.forward \
                and "forward" not in module.__dict__ and module.weight.dim() == 2:
            out[path] = module
    return out


class UnreadRows:
    """The unread embedding rows of one evaluator's model (``candidates``: path -> module),
    proven per memory key (``prove``) and used by ``covers``. ``skipped``: trials it
    answered without a forward."""

    def __init__(self, candidates: Mapping[str, Any]) -> None:
        self.candidates = dict(candidates)
        self._read: dict[Hashable, dict[str, np.ndarray] | None] = {}  # by any batch
        self._by_batch: dict[Hashable, dict[str, np.ndarray]] = {}  # (batches, rows)
        self.skipped = 0
        self.skipped_batches = 0  # batches of other trials answered without a forward
        self.reason: dict[Hashable, str] = {}

    def eligible(self, active: Mapping[str, FaultMap], memory: Memory) -> bool:
        """Whether every faulty tensor is a candidate and every map changes only its own
        elements (so the proof may decide)."""
        return bool(active) and all(p in self.candidates and confined(m, memory)
                                    for p, m in active.items())

    def proven(self, key: Hashable) -> bool:
        """Whether the proof has run for ``key`` (``trusted``: and held)."""
        return key in self._read

    def trusted(self, key: Hashable) -> bool:
        return self._read.get(key) is not None

    def covers(self, key: Hashable, active: Mapping[str, FaultMap], memory: Memory,
               batch: int | None = None) -> bool:
        """Whether the trial's faults all lie in rows proven unread for ``key``: by every
        batch, or by batch ``batch`` (whose outputs then equal the clean ones)."""
        read = self._read.get(key) if batch is None else self._by_batch.get(key)
        if read is None or not self.eligible(active, memory):
            return False
        for path, fmap in active.items():
            width = self.candidates[path].weight.shape[1]
            rows = np.asarray(fmap.indices, np.int64) // width
            if (read[path] if batch is None else read[path][batch])[rows].any():
                return False
        return True

    def prove(self, key: Hashable, runs: Sequence[Callable[[], np.ndarray]],
              clean: list[np.ndarray]) -> bool:
        """Once per ``key``: ``runs`` (one per batch, through the model holding the stored
        clean values) with hooks recording the rows each batch reads, then each batch again
        with every row it does not read NaN; trusted only if both give ``clean`` bit for
        bit with the same rows read (rows unread by batch ``i`` then cannot change batch
        ``i``'s outputs; rows unread by every batch, no output). The weights are put back
        as they were. Returns whether it is trusted."""
        if key in self._read:
            return self._read[key] is not None
        first = self._watch(runs)
        if first is None:
            return self._refuse(key, "an embedding was called with indices it cannot hold")
        by_batch, outs = first
        if not all(same_bits(a, b) for a, b in zip(outs, clean, strict=True)):
            return self._refuse(key, "a clean run did not reproduce the clean outputs")
        for i, run in enumerate(runs):
            with self._nan_rows({p: ~r[i] for p, r in by_batch.items()}):
                second = self._watch([run])
            if second is None or any(not np.array_equal(second[0][p][0], by_batch[p][i])
                                     for p in by_batch):
                return self._refuse(key, "the rows read changed when unread rows were NaN")
            if not same_bits(second[1][0], clean[i]):
                return self._refuse(key, "NaN in rows the embeddings do not read reached "
                                         "the outputs: something else reads the weights")
        self._by_batch[key] = by_batch
        self._read[key] = {p: r.any(axis=0) for p, r in by_batch.items()}
        return True

    @contextlib.contextmanager
    def _nan_rows(self, rows: Mapping[str, np.ndarray]) -> Iterator[None]:
        """Each candidate's ``rows`` (a mask) NaN inside, their values put back after."""
        import torch

        saved = {}
        try:
            with torch.no_grad():
                for path, module in self.candidates.items():
                    at = torch.from_numpy(np.flatnonzero(rows[path])).to(module.weight.device)
                    saved[path] = (at, module.weight[at].clone())
                    module.weight[at] = float("nan")
            yield
        finally:
            with torch.no_grad():
                for path, (at, values) in saved.items():
                    self.candidates[path].weight[at] = values

    def _refuse(self, key: Hashable, reason: str) -> bool:
        self._read[key], self.reason[key] = None, reason
        return False

    def _watch(self, runs: Sequence[Callable[[], Any]]
               ) -> tuple[dict[str, np.ndarray], list[Any]] | None:
        """Each of ``runs`` with the rows each candidate reads recorded: path -> a
        (runs, rows) mask, and the runs' results (None: bad indices)."""
        read = {p: np.zeros((len(runs), m.weight.shape[0]), bool)
                for p, m in self.candidates.items()}
        bad: list[str] = []
        now = [0]

        def hook(path: str) -> Any:
            def record(module: Any, args: Any) -> None:
                idx = args[0].detach().reshape(-1).cpu().numpy() if args else None
                outside = idx is not None and idx.size > 0 and (
                    idx.min() < 0 or idx.max() >= read[path].shape[1])
                if idx is None or outside:
                    bad.append(path)
                    return
                read[path][now[0], np.unique(idx)] = True
            return record

        handles = [m.register_forward_pre_hook(hook(p)) for p, m in self.candidates.items()]
        outs = []
        try:
            for i, run in enumerate(runs):
                now[0] = i
                outs.append(run())
        finally:
            for h in handles:
                h.remove()
        return None if bad else (read, outs)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_read={}, _by_batch={}, reason={})  # keyed by the evaluator's memory keys
        return state


def tied_candidates(model: Any, stack: Any) -> dict[str, Any]:
    """Model path -> module, for each stock ``nn.Embedding`` weight tied to modules that
    run only after ``stack`` (a ``StackReuse`` that has captured a clean run), as a
    language model's input embedding shared with its LM head."""
    from torch import nn

    out = {}
    for path, module in embedding_candidates(model, [
            n for n, _ in model.named_parameters(remove_duplicate=False)], {}).items():
        others = [a for a in stack.aliases(path) if a != path]
        if others and all(stack.after_stack(a.rpartition(".")[0]) for a in others) and \
                isinstance(module, nn.Embedding):
            out[path] = module
    return out


class RowsBeforeStack(UnreadRows):
    """The rows of tied embeddings (``tied_candidates``) the data never reads as input: a
    fault confined to them changes nothing before the stack's end (the LM head sharing
    the weight reads every row after it), so the trial may start after the stack.

    Trusted once per key by a proof on the model holding the stored values: every batch
    run with the rows read recorded and the stack's last block outputs kept, then again
    with every unread row NaN; the last block's outputs must be bit-identical and the
    same rows read (the logits differ, as they should: the LM head reads the NaN)."""

    def __init__(self, candidates: Mapping[str, Any], last_block: Any) -> None:
        super().__init__(candidates)
        self.last_block = last_block

    @classmethod
    def after_capture(cls, model: Any, stack: Any) -> RowsBeforeStack | None:
        """The candidates of ``model`` around ``stack`` (a ``StackReuse``), once the stack
        has captured a clean run (its blocks known); None before."""
        if not stack.learnt:
            return None
        return cls(tied_candidates(model, stack), stack.blocks[-1])

    def prove(self, key: Hashable, runs: Sequence[Callable[[], Any]],
              clean: Any = None) -> bool:
        """Once per ``key``: the proof above (``runs``: one per batch, through the model);
        the weights are put back as they were. Returns whether the rows are trusted."""
        if key in self._read:
            return self._read[key] is not None
        watched = [lambda run=run: self._last_outputs(run) for run in runs]
        first = self._watch(watched)
        if first is None:
            return self._refuse(key, "an embedding was called with indices it cannot hold")
        by_batch, outs = first
        read = {p: r.any(axis=0) for p, r in by_batch.items()}
        with self._nan_rows({p: ~r for p, r in read.items()}):
            second = self._watch(watched)
        if second is None or any(not np.array_equal(second[0][p], by_batch[p]) for p in read):
            return self._refuse(key, "the rows read changed when unread rows were NaN")
        mine = [a for batch in outs for a in batch]
        again = [a for batch in second[1] for a in batch]
        if len(again) != len(mine) or not all(
                same_bits(a, b) for a, b in zip(again, mine, strict=True)):
            return self._refuse(key, "NaN in rows the embeddings do not read reached the "
                                     "stack's output: something else reads the weights")
        self._read[key] = read
        return True

    def unread(self, key: Hashable, rows: Mapping[str, np.ndarray]) -> bool:
        """Whether ``rows`` (path -> row indices of a candidate) are all proven unread."""
        read = self._read.get(key)
        return read is not None and bool(rows) and all(
            p in read and not read[p][np.asarray(r, np.int64)].any() for p, r in rows.items())

    def _last_outputs(self, run: Callable[[], Any]) -> list[np.ndarray]:
        """``run()`` with the last block's outputs (their first tensor) kept as arrays."""
        outs: list[np.ndarray] = []

        def keep(module: Any, args: Any, out: Any) -> None:
            first = out[0] if isinstance(out, (tuple, list)) else out
            outs.append(first.detach().float().cpu().numpy().copy())

        handle = self.last_block.register_forward_hook(keep)
        try:
            run()
        finally:
            handle.remove()
        return outs


__all__ = ["RowsBeforeStack", "UnreadRows", "embedding_candidates", "tied_candidates"]
