"""``worst_case``: a small set of stored-bit flips that drives a model's metric to a target.

Progressive bit search, widened: at each step the adapter gives the attack loss's
gradient with respect to every searched tensor's values as stored (with the flips so
far); every candidate bit of every plane (codes, scales, minimums, exponents, block
scales) is scored by gradient times the value change its flip makes (a block scale: the
sum over its block); the best ``candidates`` (every candidate when there are at most
``exhaustive_below``) are evaluated exactly on the attack data, the flip raising the
attack loss most is kept, and the held-out metric is measured after it, so every step
reported is a measured value. Framework-free: the model is any ``SearchModel``
(``bitfault.torch.search.TorchSearchModel``).
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from bitfault.campaign.search.state import Flip, SearchedTensor
from bitfault.errors import ArgumentError, check_int
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory

DIRECTIONS = (None, "0->1", "1->0")


class SearchModel(Protocol):
    """What the search asks of a model: its clean tensors, the attack loss with its
    gradient, the attack loss of candidate tensors, and the held-out metric; every
    ``values`` maps tensor names to NumPy arrays of the tensors' own shapes."""

    metric_name: str
    lower_is_worse: bool

    def tensor_values(self) -> dict[str, np.ndarray]: ...

    def loss_and_gradients(self, values: Mapping[str, np.ndarray]
                           ) -> tuple[float, dict[str, np.ndarray]]: ...

    def attack_losses(self, values: Mapping[str, np.ndarray],
                      changes: Sequence[tuple[str, np.ndarray]]) -> np.ndarray: ...

    def metric(self, values: Mapping[str, np.ndarray]) -> float: ...


@dataclass
class SearchResult:
    """The flips in the order found; ``metric[k]`` and ``attack_loss[k]`` after ``k``
    flips (``k = 0``: the model stored in the format, no flip); ``seconds[k]``: time
    from the start to step ``k``; ``reached``: whether the metric met ``target``."""

    metric_name: str
    target: float | None
    flips: list[Flip] = field(default_factory=list)
    metric: list[float] = field(default_factory=list)
    attack_loss: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    reached: bool = False
    maps: dict[str, FaultMap] = field(default_factory=dict)

    def fault_maps(self) -> dict[str, FaultMap]:
        """The flips as one fault map per flipped tensor (replay with ``bitfault.inject``)."""
        return dict(self.maps)

    def to_dict(self) -> dict[str, Any]:
        return {"flips": [f.to_dict() for f in self.flips], self.metric_name: self.metric,
                "metric": self.metric_name, "attack_loss": self.attack_loss,
                "seconds": self.seconds, "target": self.target, "reached": self.reached}


def _reached(value: float, target: float | None, lower_is_worse: bool) -> bool:
    if target is None:
        return False
    if np.isnan(value):
        return True
    return value <= target if lower_is_worse else value >= target


def _selected(names: Sequence[str], patterns: Sequence[str] | None) -> list[str]:
    if patterns is None:
        return list(names)
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not chosen:
        raise ArgumentError("tensors", list(patterns), f"patterns matching some of {names}")
    return chosen


def _scores(t: SearchedTensor, grad: np.ndarray, now: np.ndarray, eligible: dict[str, int],
            direction: str | None) -> list[tuple[str, int, np.ndarray]]:
    """(plane, bit, score of each word of the plane) for every eligible bit of ``t``."""
    g = grad.reshape(-1).astype(np.float64)
    out = []
    for plane, mask in eligible.items():
        words = t.current_bits(plane)
        owner = t.word_of_element(plane)
        n_words = words.size
        for bit in range(64):
            if not mask >> bit & 1:
                continue
            delta = t.bit_deltas(plane, bit, now)
            with np.errstate(all="ignore"):
                gain = np.where(np.isfinite(delta), g * delta, np.inf)
            gain = np.where(delta == 0, 0.0, gain)
            changes = delta != 0
            if owner is not None:
                gain = np.bincount(owner, weights=np.nan_to_num(gain, posinf=1e300),
                                   minlength=n_words)
                changes = np.bincount(owner, weights=changes, minlength=n_words) > 0
            score = np.where(changes, gain, -np.inf)
            flipped = np.zeros(n_words, bool)  # a bit flipped already is not flipped back
            for word, mask_now in t.flips[plane].items():
                flipped[word] = bool(mask_now >> bit & 1)
            score = np.where(flipped, -np.inf, score)
            if direction is not None:
                set_now = (words >> bit & 1).astype(bool)
                score = np.where(set_now == (direction == "0->1"), -np.inf, score)
            out.append((plane, bit, score))
    return out


def _candidates(searched: Mapping[str, SearchedTensor], grads: Mapping[str, np.ndarray],
                values: Mapping[str, np.ndarray], eligible: dict[str, int],
                direction: str | None, candidates: int, exhaustive_below: int,
                per_tensor: bool) -> list[Flip]:
    """The flips to evaluate exactly, best score first: all of them when there are at most
    ``exhaustive_below``, else the ``candidates`` best and (``per_tensor``) each tensor's
    best."""
    scored = [(n, plane, bit, score) for n, t in searched.items()
              for plane, bit, score in _scores(t, grads[n], values[n], eligible, direction)]
    total = sum(int(np.count_nonzero(s > -np.inf)) for *_, s in scored)
    k = total if total <= exhaustive_below else candidates
    pool: list[tuple[float, Flip]] = []
    for n, plane, bit, score in scored:
        ok = np.flatnonzero(score > -np.inf)
        if ok.size > k:
            ok = ok[np.argpartition(-score[ok], k - 1)[:k]]
        pool.extend((float(score[w]), Flip(n, plane, int(w), bit)) for w in ok)
    pool.sort(key=lambda c: (-c[0], c[1]))
    chosen = [flip for _, flip in pool[:k]]
    if per_tensor and k < total:  # and each tensor's best, as a layer-wise search takes
        for n in searched:
            best = next((f for _, f in pool if f.tensor == n), None)
            if best is not None and best not in chosen:
                chosen.append(best)
    return chosen


def worst_case(model: SearchModel, memory: Memory, *, max_flips: int = 20,
               stop_at: float | None = None, candidates: int = 16,
               exhaustive_below: int = 4096, tensors: Sequence[str] | None = None,
               planes: Sequence[str] | None = None, bits: Sequence[int] | None = None,
               direction: str | None = None, per_tensor: bool = True,
               progress: Any = None) -> SearchResult:
    """Search the fewest flips (greedily, see the module docstring) of ``memory``'s stored
    bits that bring ``model``'s metric to ``stop_at`` (None: run ``max_flips`` flips).

    ``tensors``: name patterns to search (default all of the model's); ``planes``: plane
    names (default all); ``bits``: bit positions (default those ``memory.fault`` may
    touch); ``direction``: only ``"0->1"`` or only ``"1->0"`` flips; ``per_tensor``:
    also evaluate each tensor's best-scored flip (as a layer-wise progressive bit search
    does), not only the ``candidates`` best overall. A memory with a
    protection code is not searched here yet (refused).
    """
    max_flips = check_int(max_flips, "max_flips", minimum=1)
    candidates = check_int(candidates, "candidates", minimum=1)
    if direction not in DIRECTIONS:
        raise ArgumentError("direction", direction, f"one of {DIRECTIONS}")
    if memory.storage is not None:
        raise ArgumentError("memory.storage", memory.storage, "None",
                            requirement="the worst-case search counts flips in unprotected "
                                        "stored words only so far")
    clean = model.tensor_values()
    names = _selected(sorted(clean), tensors)
    searched = {n: SearchedTensor(n, np.asarray(clean[n]), memory.format) for n in names}
    eligible = {}
    for plane in next(iter(searched.values())).planes:
        if planes is not None and plane not in planes:
            continue
        mask = memory.fault.eligible_mask(memory.format, plane)
        if bits is not None:
            mask &= sum(1 << int(b) for b in bits)
        if mask:
            eligible[plane] = mask
    if not eligible:
        raise ArgumentError("planes/bits", (planes, bits), "a selection leaving some "
                            "candidate bit", requirement="no plane and bit is left to search")
    start = time.perf_counter()
    values = dict(clean)
    values.update({n: t.values() for n, t in searched.items()})
    result = SearchResult(model.metric_name, stop_at)
    loss, grads = model.loss_and_gradients(values)
    result.metric.append(float(model.metric(values)))
    result.attack_loss.append(float(loss))
    result.seconds.append(0.0)
    result.reached = _reached(result.metric[0], stop_at, model.lower_is_worse)
    while not result.reached and len(result.flips) < max_flips:
        chosen = _candidates(searched, grads, values, eligible, direction, candidates,
                             exhaustive_below, per_tensor)
        if not chosen:
            break
        changes = []
        for flip in chosen:
            t = searched[flip.tensor]
            t.add(flip)
            changes.append((flip.tensor, t.values()))
            t.add(flip)  # undone: a flip twice is none
        losses = np.asarray(model.attack_losses(values, changes), np.float64)
        losses = np.where(np.isnan(losses), np.inf, losses)
        best = int(np.argmax(losses))  # ties: the higher score (the pool's order)
        flip = chosen[best]
        searched[flip.tensor].add(flip)
        values[flip.tensor] = changes[best][1]
        loss, grads = model.loss_and_gradients(values)
        result.flips.append(flip)
        result.metric.append(float(model.metric(values)))
        result.attack_loss.append(float(loss))
        result.seconds.append(time.perf_counter() - start)
        result.reached = _reached(result.metric[-1], stop_at, model.lower_is_worse)
        if progress is not None:
            progress(len(result.flips), result.metric[-1])
    touched = {f.tensor for f in result.flips}
    result.maps = {n: searched[n].fault_map() for n in sorted(touched)}
    return result


__all__ = ["DIRECTIONS", "SearchModel", "SearchResult", "worst_case"]
