"""``OutputEvaluator``: any PyTorch model, batches of inputs, and a metric on its outputs.

The campaign engine asks it for each trial's records (``bitfault.campaign.metrics``): per
example, the metric's values comparing the faulty outputs with the clean run's (and the
labels where the metric has them), whether the outputs are bit-identical to the clean
ones and whether they are finite. ``run(evaluator, trials, memory, store,
metric=evaluator.metric)`` then stores each trial's scores and its outcome (masked,
benign, sdc, non-finite). What a trial computes is ``TorchEvaluator``'s: every targeted
tensor stored in the memory's format, the trial's maps faulting theirs, the model's own
forward in eval mode under ``torch.no_grad()``; a tied tensor is one memory. One copy of
the model is kept and written in place; clean outputs are cached in the evaluator's one
budget of ``max_bytes``, with its other caches, and so is the metric's clean side
(``CleanRows``: a trial then computes only the faulty side; beyond the budget both are
recomputed per batch). A trial whose faults lie in blocks ``>= k`` of the model's stack
of transformer blocks starts from the clean output of block ``k - 1``
(``bitfault.torch.evaluate.stack_reuse``; those outputs bounded by ``max_bytes`` too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import Maps, check_max_bytes, digest_arrays
from bitfault.campaign.metrics import CleanRows, OutputMetric, make_records
from bitfault.errors import ArgumentTypeError
from bitfault.formats import plane_formats
from bitfault.memory.memory import Memory
from bitfault.torch.evaluate.evaluator import TorchEvaluator, faulty_in
from bitfault.torch.evaluate.replica import confined
from bitfault.torch.evaluate.stack_reuse import StackReuse, find_stack
from bitfault.torch.evaluate.unread_rows import RowsBeforeStack, UnreadRows, embedding_candidates


def model_output(out: Any, batch: Any = None) -> Any:
    """The tensor to score in a model's output: itself, ``.logits``, ``.last_hidden_state``
    (Hugging Face outputs), or the first element of a tuple."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    for attr in ("logits", "last_hidden_state"):
        value = getattr(out, attr, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the model returned {type(out).__name__}; pass output_fn= to pick the "
                    "tensor to score")


class OutputEvaluator(TorchEvaluator):
    """A model on inputs, scored by ``metric`` (an ``OutputMetric`` or its kind name).

    ``inputs``: a tensor (N, ...) or a dict of tensors with N rows (``model(**batch)``);
    ``labels``: what the metric compares with, if it uses labels ((N,) classes, (N, T)
    next tokens: ``bitfault.torch.hf.next_token_labels``); ``output_fn(model_output,
    batch_inputs)``: the tensor to score (default ``model_output``; ``hf.mean_pooled``
    for sentence embeddings). ``targets``, ``filter_fn``, ``root``,
    ``name_prefix`` choose and name tensors as ``inject_`` does. A metric that does not
    fit the outputs is refused here, before any trial runs. ``stack_reuse``: reuse the
    clean outputs of the blocks before a trial's first faulty block (``stack``: the
    dotted path of the ``nn.ModuleList`` of blocks; default: found, ``find_stack``);
    ``stack_reuse=False`` runs every trial through the whole model (``stack_cache``: the
    ``StackReuse`` holding the kept outputs; ``stack_cache.reason`` says why reuse is off).
    ``unread_rows``: a trial whose faults all lie in rows of (untied) ``nn.Embedding``
    weights that the data never reads, proven once per memory by a run with those rows
    NaN (``bitfault.torch.evaluate.unread_rows``; ``unread``: its record), is masked without a
    forward; False: such trials run too.
    """

    def __init__(self, model: Any, inputs: Any, metric: OutputMetric | str = "accuracy", *,
                 labels: Any = None, targets: Any = "weights", filter_fn: Any = None,
                 batch_size: int | None = None, device: str = "cpu",
                 output_fn: Callable[[Any, Any], Any] | None = None, max_bytes: int = 256 << 20,
                 root: Any = None, name_prefix: str | None = None, stack_reuse: bool = True,
                 stack: str | None = None, unread_rows: bool = True) -> None:
        import torch
        from torch import nn

        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        for arg, value in (("stack_reuse", stack_reuse), ("unread_rows", unread_rows)):
            if not isinstance(value, bool):
                raise ArgumentTypeError(arg, value, "True or False")
        if stack is not None:
            find_stack(model, stack)  # a bad path is refused before anything is copied
        self.metric = metric if isinstance(metric, OutputMetric) else OutputMetric(metric)
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
                batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.max_bytes = check_max_bytes(max_bytes)
        self.device = torch.device(device)
        self.x = _inputs(inputs, self.device)
        n = len(next(iter(self.x.values())) if isinstance(self.x, dict) else self.x)
        if n == 0:
            raise ValueError("inputs must hold at least one example")
        self._labels = None if labels is None else np.asarray(
            labels.cpu().numpy() if isinstance(labels, torch.Tensor) else labels)
        self.labels = self._labels if self._labels is not None else np.zeros(n, np.int64)
        self.batch_size, self.fast_paths = batch_size, False
        self.output_fn = output_fn or model_output
        self._n = n
        self._setup(model, targets, filter_fn, root, name_prefix, copy_model=True)
        self.stack_reuse = stack_reuse
        self.stack_cache = StackReuse(self.model, stack, self.max_bytes)
        self.unread_rows = unread_rows
        self.unread = UnreadRows(embedding_candidates(self.model, list(self._clean),
                                                      self._aliases))
        self.before_stack: RowsBeforeStack | None = None  # built after the first capture
        with torch.no_grad():  # the metric must fit the outputs: checked on the first batch
            first = self._outputs(self.model, self._batches()[0])
        self.metric.check(first.shape, None if self._labels is None
                          else self._labels[:len(first)])
        if self._labels is not None and len(self._labels) != n:
            raise ValueError(f"labels must have one row per example: {len(self._labels)} "
                             f"labels for {n} examples")
        self._digest = super().model_digest()  # the clean model (trials write into it)
        self._clean_outs: dict[Any, np.ndarray] = {}
        self._clean_rows: dict[Any, CleanRows] = {}  # the metric's clean side, per batch
        self._applied: Any = None  # the maps the replica holds (None: unknown)

    def _batches(self) -> list[slice]:
        size = self.batch_size or self._n
        return [slice(i, min(i + size, self._n)) for i in range(0, self._n, size)]

    def _outputs(self, model: Any, b: slice) -> np.ndarray:
        xb = {k: v[b] for k, v in self.x.items()} if isinstance(self.x, dict) else self.x[b]
        out = model(**xb) if isinstance(xb, dict) else model(xb)
        t = self.output_fn(out, xb).detach()
        return (t.float() if t.dtype.is_floating_point and t.itemsize < 4 else t).cpu().numpy()

    def model_digest(self) -> str:
        return self._digest

    def data_digest(self) -> str:
        arrays = ({f"x.{k}": v.cpu().numpy() for k, v in self.x.items()}
                  if isinstance(self.x, dict) else {"x": self.x.cpu().numpy()})
        return digest_arrays({**arrays, "y": self.labels})

    def _clean_output(self, i: int, b: slice, memory: Memory) -> np.ndarray:
        import torch

        key = (self._key(memory), i)
        hit = self._clean_outs.get(key)
        if hit is None:
            self._load(self.stored(memory))
            self._applied = None
            reuse = self.stack_cache if self.stack_reuse else None
            with torch.no_grad():
                with reuse.capture(key[0], i, len(self._batches())) if reuse else nullcontext():
                    hit = self._outputs(self.model, b)
                if reuse:
                    reuse.verify(key[0], i, lambda: self._outputs(self.model, b), hit)
            if self._budget.take(hit.nbytes):  # the evaluator's one budget
                self._clean_outs[key] = hit
        if key in self._clean_outs and key not in self._clean_rows and self._budget.fits(
                self.metric.clean_rows_nbytes(hit)):
            rows = self.metric.clean_rows(hit, torch.get_num_threads())
            if rows is not None and self._budget.take(rows.nbytes):
                self._clean_rows[key] = rows
        return hit

    def _forget_other(self, key: Any) -> None:
        """Also the clean outputs of other memories go (their bytes back to the budget)."""
        super()._forget_other(key)
        for cache in (self._clean_outs, self._clean_rows):
            for k in [k for k in cache if k[0] != key]:
                self._budget.give(cache.pop(k).nbytes)

    def predict(self, batch_of_maps: Sequence[Maps], memory: Memory) -> list[np.ndarray]:
        """Per-example records (``bitfault.campaign.metrics.make_records``, scored on torch's
        threads) for each map set."""
        import torch

        planes = plane_formats(memory.format)
        eligible = {p: memory.fault.eligible_mask(memory.format, p) for p in planes}
        out = []
        for maps in batch_of_maps:
            maps = self._by_path(maps)
            active = {n: m for n, m in maps.items() if any(faulty_in(m, p, eligible[p])
                                                          for p in planes)}
            unread = bool(active) and self._unread(active, memory)
            if unread and self.unread.covers(self._key(memory), active, memory):
                active = {}  # faults only in embedding rows the data never reads: masked
                self.unread.skipped += 1
            parts = []
            for i, b in enumerate(self._batches()):
                clean = self._clean_output(i, b, memory)
                faulty = clean
                if unread and active and self.unread.covers(self._key(memory), active,
                                                            memory, batch=i):
                    self.unread.skipped_batches += 1  # rows this batch never reads
                elif active:
                    k = self._start(active, memory) if self.stack_reuse else 0  # may prove
                    if self._applied is not active:
                        self._apply(active, memory)
                    with torch.no_grad(), self.stack_cache.reusing(self._key(memory), i, k):
                        faulty = self._outputs(self.model, b)
                labels = None if self._labels is None else self._labels[b]
                parts.append(make_records(self.metric, faulty, clean, labels,
                                          self._clean_rows.get((self._key(memory), i)),
                                          torch.get_num_threads()))
            out.append(np.concatenate(parts))
        return out

    def _unread(self, active: Maps, memory: Memory) -> bool:
        """Whether the trial may use proven-unread embedding rows (``unread_rows``): its
        faults all lie in candidates and the proof holds (run here, once per memory)."""
        if not self.unread_rows or not self.unread.eligible(active, memory):
            return False
        key = self._key(memory)
        if not self.unread.proven(key):
            import torch

            clean = [self._clean_output(i, b, memory) for i, b in enumerate(self._batches())]
            self._load(self.stored(memory))
            self._applied = None
            with torch.no_grad():
                self.unread.prove(key, [lambda b=b: self._outputs(self.model, b)
                                        for b in self._batches()], clean)
        return self.unread.trusted(key)

    def _start(self, active: Maps, memory: Memory) -> int:
        """The block a trial starts from (``StackReuse.start``); a tied embedding whose
        faulty rows the data never reads (``unread_rows.RowsBeforeStack``) counts only
        under its names after the stack (an LM head). May run that proof, once per key."""
        if self.before_stack is None:
            self.before_stack = RowsBeforeStack.after_capture(self.model, self.stack_cache)
        rb, unread = self.before_stack, []
        for name, fmap in active.items():
            path = next((a for a in self.stack_cache.aliases(name)
                         if rb is not None and a in rb.candidates), None)
            if path is None or not confined(fmap, memory):
                continue
            key = self._key(memory)
            if not rb.proven(key):
                import torch

                self._load(self.stored(memory))
                self._applied = None
                with torch.no_grad():
                    rb.prove(key, [lambda b=b: self._outputs(self.model, b)
                                   for b in self._batches()])
            width = rb.candidates[path].weight.shape[1]
            if rb.unread(key, {path: np.asarray(fmap.indices, np.int64) // width}):
                unread.append(path)
        return self.stack_cache.start(active, unread)

    def _apply(self, active: Maps, memory: Memory) -> None:
        """Write the trial's faulty tensors into the model, every other one stored."""
        params = dict(self.stored(memory))
        self._applied = None
        for name, fmap in active.items():
            if self._write_faulty(name, fmap, memory):
                del params[name]
            else:
                params[name] = self.faulty(name, fmap, memory)
        self._load(params)
        self._applied = active

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_clean_outs={}, _clean_rows={}, _applied=None, _replica=None)
        return state


def _inputs(inputs: Any, device: Any) -> Any:
    import torch

    if isinstance(inputs, Mapping):
        if not inputs or not all(isinstance(v, torch.Tensor) for v in inputs.values()):
            raise ArgumentTypeError("inputs", type(inputs).__name__,
                                    "a tensor or a non-empty dict of tensors")
        sizes = {len(v) for v in inputs.values()}
        if len(sizes) != 1:
            raise ValueError(f"inputs: every tensor needs the same number of rows, got {sizes}")
        return {k: v.detach().to(device) for k, v in inputs.items()}
    t = inputs if isinstance(inputs, torch.Tensor) else torch.as_tensor(np.asarray(inputs))
    if t.ndim == 0:
        raise ValueError("inputs must have a batch dimension")
    return t.detach().to(device)


__all__ = ["OutputEvaluator", "model_output"]
