"""Block-boundary reuse of clean activations in a sequential stack of transformer blocks.

``torch.fx`` cannot trace a Hugging Face model, but its blocks sit in one
``nn.ModuleList`` that the model's forward calls in order, each block's output the next
one's input (Llama's ``model.layers``, GPT-2's ``transformer.h``, BERT's
``encoder.layer``). A clean run, watched by forward hooks, keeps each block's output per
data batch. A trial whose faulty tensors all lie in blocks ``>= k`` (or after the stack)
then runs the model's own forward with blocks ``< k`` patched, for that call, to return
the clean output of block ``k - 1``: only blocks ``k..`` and the tail recompute, from the
same values by the same code, so the same bits. Nothing of the model's code is rewritten.

The kept outputs are bounded by ``max_bytes``: a batch keeps the boundaries that fit,
spread evenly over the stack, and a trial starts from the nearest kept boundary at or
below its first faulty block (or runs whole). The first clean run also records which
modules run before the stack (a fault there allows no reuse) and which only after it; a
patched run is checked once to reproduce the clean outputs bit for bit, and any
difference, or blocks that do not run once each in order, turns reuse off for the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import check_max_bytes
from bitfault.errors import ArgumentError, ArgumentTypeError

_ABSENT = object()


def find_stack(model: Any, path: str | None = None) -> tuple[str, list[Any]] | None:
    """``(path, blocks)`` of ``model``'s stack of repeated blocks: the module at ``path``
    (an ``nn.ModuleList`` or ``nn.Sequential``), or by default the ``nn.ModuleList`` of
    two or more children of one class holding the most parameters (None if there is none)."""
    from torch import nn

    if path is not None:
        allowed = "the dotted path of a non-empty nn.ModuleList or nn.Sequential of the model"
        if not isinstance(path, str):
            raise ArgumentTypeError("stack", path, allowed)
        try:
            found = model.get_submodule(path)
        except AttributeError:
            found = None
        if not isinstance(found, (nn.ModuleList, nn.Sequential)) or len(found) == 0:
            raise ArgumentError("stack", path, allowed, requirement=(
                f"stack must be {allowed}; {path!r} is "
                f"{'no module' if found is None else type(found).__name__} of "
                f"{type(model).__name__}"))
        return path, list(found)
    best: tuple[int, str, list[Any]] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2 or \
                len({type(child) for child in module}) != 1:
            continue
        size = sum(p.numel() for p in module.parameters())
        if size and (best is None or size > best[0]):
            best = (size, name, list(module))
    return None if best is None else (best[1], best[2])


def output_nbytes(out: Any) -> int | None:
    """Bytes of a block's output (a tensor, None, or tuples/lists of them); None for
    anything else (such outputs are not kept)."""
    import torch

    if out is None:
        return 0
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    if type(out) in (tuple, list):
        sizes = [output_nbytes(v) for v in out]
        return None if any(s is None for s in sizes) else sum(sizes)
    return None


def copy_output(out: Any) -> Any:
    """A copy of a block's output (what ``output_nbytes`` measures), detached."""
    if out is None:
        return None
    if type(out) in (tuple, list):
        return type(out)(copy_output(v) for v in out)
    return out.detach().clone()


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two output arrays are identical bit for bit (NaN payloads included)."""
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def spread(n: int, m: int) -> set[int]:
    """``m`` of the boundaries ``0..n-1`` spread evenly (all of them when ``m >= n``)."""
    m = max(0, min(n, m))
    return {(i + 1) * (n + 1) // (m + 1) - 1 for i in range(m)}


class StackReuse:
    """Clean block outputs of ``model``'s stack (``find_stack(model, stack)``), kept per
    (memory key, batch) within ``max_bytes``, and the patched runs that reuse them.

    ``start(paths)``: the block a trial faulting those tensors can start from;
    ``capture(key, batch, n_batches)``: around a clean run, keeps its block outputs;
    ``verify(...)``: once, a patched run against the clean outputs;
    ``reusing(key, batch, k)``: around a faulty run, patches the blocks before the nearest
    kept boundary (yields the block the run starts from, 0 for a whole run).
    """

    def __init__(self, model: Any, stack: str | None = None, max_bytes: int = 256 << 20
                 ) -> None:
        found = find_stack(model, stack)
        self.path, self.blocks = found if found is not None else ("", [])
        self.max_bytes = check_max_bytes(max_bytes)
        self.enabled = bool(self.blocks)
        self.reason = "" if self.blocks else "the model has no stack of repeated blocks"
        self._model = model
        self._prefix = f"{self.path}." if self.path else ""
        groups: dict[int, list[str]] = {}
        for name, t in [*model.named_parameters(remove_duplicate=False),
                        *model.named_buffers(remove_duplicate=False)]:
            groups.setdefault(id(t), []).append(name)
        self._aliases = {n: names for names in groups.values() for n in names}
        self._index = {id(b): i for i, b in enumerate(self.blocks)}
        self._tail: set[str] | None = None  # modules that run only after the stack
        self._cache: dict[Hashable, dict[int, Any]] = {}
        self._verified = False
        self.last_start = 0  # the block the last ``reusing`` run started from

    # ---- which trials may reuse ----------------------------------------------------------

    def block_of(self, path: str) -> int | None:
        """The block a tensor path lies in (None: outside the stack)."""
        if not path.startswith(self._prefix):
            return None
        head = path[len(self._prefix):].partition(".")[0]
        return int(head) if head.isdigit() and int(head) < len(self.blocks) else None

    def start(self, paths: Iterable[str], unread: Iterable[str] = ()) -> int:
        """The first block a trial whose faulty tensors are ``paths`` (model paths; a tied
        tensor counts under each of its names) must recompute: its lowest faulty block,
        ``len(blocks)`` if all lie after the stack, 0 if any lies before it or anywhere
        not known to run only after the stack (then the whole model runs). A path in
        ``unread`` (an embedding whose faulty rows the data never reads, proven by
        ``unread_rows.RowsBeforeStack``) counts only under its other names."""
        if not self.enabled or self._tail is None:
            return 0
        k, skip = len(self.blocks), set(unread)
        for path in paths:
            for name in self._aliases.get(path, [path]):
                if name in skip:
                    continue
                j = self.block_of(name)
                if j is None and name.rpartition(".")[0] not in self._tail:
                    return 0
                if j is not None:
                    k = min(k, j)
        return k

    def aliases(self, path: str) -> list[str]:
        """Every name of the tensor at ``path`` (more than one: a tied tensor)."""
        return list(self._aliases.get(path, [path]))

    @property
    def learnt(self) -> bool:
        """Whether reuse is on and a clean run has shown what runs after the stack."""
        return self.enabled and self._tail is not None

    def after_stack(self, module: str) -> bool:
        """Whether module ``module`` is known to run only after the stack (learnt by the
        first ``capture``)."""
        return self._tail is not None and module in self._tail

    # ---- the clean run: keeping block outputs ---------------------------------------------

    def used_bytes(self) -> int:
        """Bytes held by the kept block outputs (never above ``max_bytes``)."""
        return sum(output_nbytes(v) or 0 for kept in self._cache.values() for v in kept.values())

    def kept(self, key: Hashable, batch: int) -> list[int]:
        """The blocks whose clean outputs are kept for ``(key, batch)``."""
        return sorted(self._cache.get((key, batch), {}))

    @contextlib.contextmanager
    def capture(self, key: Hashable, batch: int, n_batches: int = 1) -> Iterator[None]:
        """Around a clean run of batch ``batch``: keep its block outputs, at most
        ``max_bytes / n_batches`` of them (and ``max_bytes`` in all). The first capture
        also learns which modules run only after the stack."""
        if not self.enabled or (key, batch) in self._cache:
            yield
            return
        allowance = min(self.max_bytes // max(1, n_batches), self.max_bytes - self.used_bytes())
        clock: list[Any] = []  # events in order: ("start" | "end", block) or module name
        kept: dict[int, Any] = {}
        plan: list[set[int]] = []

        def before(block: Any, args: Any) -> None:
            clock.append(("start", self._index[id(block)]))

        def after(block: Any, args: Any, out: Any) -> None:
            i = self._index[id(block)]
            clock.append(("end", i))
            size = output_nbytes(out)
            if not plan:
                plan.append(spread(len(self.blocks), allowance // size) if size else set())
            have = sum(output_nbytes(v) or 0 for v in kept.values())
            if size is not None and i in plan[0] and have + size <= allowance:
                kept[i] = copy_output(out)

        handles = [h for b in self.blocks for h in (
            b.register_forward_pre_hook(before, prepend=True),
            b.register_forward_hook(after, prepend=True))]  # the block's own output
        if self._tail is None:
            inside = {id(m) for b in self.blocks for m in b.modules()}
            for name, m in self._model.named_modules():
                owns = next(m.parameters(recurse=False), None) is not None or \
                    next(m.buffers(recurse=False), None) is not None
                if owns and id(m) not in inside:
                    handles.append(m.register_forward_pre_hook(
                        lambda mod, args, name=name: clock.append(name)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()
        blocks = [e for e in clock if isinstance(e, tuple)]
        expect = [(s, i) for i in range(len(self.blocks)) for s in ("start", "end")]
        if blocks != expect:
            self.disable("its blocks did not run once each, in order, in a clean run")
            return
        if self._tail is None:
            end = clock.index(("end", len(self.blocks) - 1))
            early = {e for e in clock[:end] if isinstance(e, str)}
            self._tail = {e for e in clock[end:] if isinstance(e, str)} - early
        self._cache[(key, batch)] = kept

    def verify(self, key: Hashable, batch: int, run: Callable[[], np.ndarray],
               clean: np.ndarray) -> bool:
        """Once per model, right after a capture (the model still clean): ``run()`` patched
        at the lowest and the highest kept boundary must give ``clean`` bit for bit, else
        reuse is turned off. Returns whether reuse is on."""
        kept = self.kept(key, batch)
        if self._verified or not self.enabled or not kept:
            return self.enabled
        for j in sorted({kept[0], kept[-1]}):
            with self._patched(key, batch, j + 1):
                got = run()
            if not same_bits(got, clean):
                self.disable(f"a run reusing block {j}'s clean output differed from the "
                             "whole model's")
                return False
        self._verified = True
        return True

    def disable(self, reason: str) -> None:
        """Turn reuse off for this model (every trial then runs whole)."""
        self.enabled, self.reason = False, reason
        self._cache.clear()

    # ---- the faulty run ------------------------------------------------------------------

    def reusing(self, key: Hashable, batch: int, k: int) -> contextlib.AbstractContextManager:
        """Around a run of batch ``batch`` whose faults lie in blocks ``>= k``: blocks
        ``< j`` return the kept clean output of block ``j - 1`` (``j <= k``, the nearest
        kept boundary), so the run starts at block ``j``; yields ``j`` (0: a whole run,
        as before ``verify`` has passed)."""
        return self._patched(key, batch, k if self._verified else 0)

    @contextlib.contextmanager
    def _patched(self, key: Hashable, batch: int, k: int) -> Iterator[int]:
        kept = self._cache.get((key, batch)) if self.enabled and k > 0 else None
        j = max((i for i in kept if i < k), default=-1) + 1 if kept else 0
        self.last_start = j
        if not j:
            yield 0
            return
        out = kept[j - 1]
        saved = [b.__dict__.get("forward", _ABSENT) for b in self.blocks[:j]]
        for b in self.blocks[:j]:
            b.forward = lambda *args, **kwargs: copy_output(out)
        try:
            yield j
        finally:
            for b, old in zip(self.blocks[:j], saved, strict=True):
                if old is _ABSENT:
                    del b.forward
                else:
                    b.forward = old

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_cache={}, _verified=False)
        return state


__all__ = ["StackReuse", "copy_output", "find_stack", "output_nbytes", "same_bits", "spread"]
