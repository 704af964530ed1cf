"""The model's ``torch.fx`` graph, for ``TorchEvaluator``'s clean-activation reuse.

A traced clean run gives the value of every node (checked by the evaluator to give
``model(x)``'s predictions); a trial whose faults sit in one tensor then recomputes only
the nodes that depend on that tensor, from the module that owns it: the same operations
on the same values, so the same bits. ``run`` evaluates nodes dropping each value after
its last use (what a forward pass holds), keeping the nodes asked for.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# model -> (module path -> module): ``run_nodes``'s lookups, made once per model (the
# models run here are the evaluator's own copies, whose modules do not change)
_MODULES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def submodule(model: Any, path: str) -> Any:
    """``model.get_submodule(path)``, looked up once per model and path."""
    found = _MODULES.setdefault(model, {})
    if path not in found:
        found[path] = model.get_submodule(path)
    return found[path]


class TracedGraph:
    """A traced model: its nodes in order, where each is read last, and its output."""

    def __init__(self, gm: Any) -> None:
        self.nodes = [n for n in gm.graph.nodes]
        self.position = {n: i for i, n in enumerate(self.nodes)}
        self.output = next(n for n in self.nodes if n.op == "output")
        # node -> the position of the last node reading it (its own if none does)
        self.last_use = {n: max([self.position[u] for u in n.users] + [self.position[n]])
                         for n in self.nodes}
        self._needed: dict[int, frozenset[Any]] = {}  # start -> needed_from(start)
        self._seeds: dict[tuple[str, ...], list[Any]] = {}  # names -> seeds(*names)

    @classmethod
    def trace(cls, model: Any) -> TracedGraph | None:
        """``model``'s fx graph, or None when it cannot be traced. When the plain trace
        fails, convolution modules (``nn.Conv1d/2d/3d`` and their subclasses, e.g.
        same-padding convolutions that compute their padding from the input's size) are
        traced as leaves, called as the model calls them."""
        import torch.fx
        from torch import nn

        class ConvLeaves(torch.fx.Tracer):
            def is_leaf_module(self, m: Any, qualname: str) -> bool:
                return isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) or \
                    super().is_leaf_module(m, qualname)

        try:
            return cls(torch.fx.symbolic_trace(model))
        except Exception:  # data-dependent control flow etc.: no reuse, still correct
            pass
        try:
            return cls(torch.fx.GraphModule(model, ConvLeaves().trace(model)))
        except Exception:
            return None

    def seeds(self, *names: str) -> list[Any]:
        """The nodes that read tensor ``names`` (the paths of one tensor, tied or not), in
        graph order: calls of the (leaf) module holding it, or reads of it (found once)."""
        def reads(n: Any, name: str) -> bool:
            module = name.rpartition(".")[0]
            if n.op == "call_module":
                return n.target == module or module.startswith(n.target + ".")
            return n.op == "get_attr" and n.target == name
        if names not in self._seeds:
            self._seeds[names] = [n for n in self.nodes if any(reads(n, m) for m in names)]
        return list(self._seeds[names])

    def dependents(self, seeds: Sequence[Any]) -> set[Any]:
        """``seeds`` (in graph order) and every node after the first that depends on them."""
        dirty = set(seeds)
        for node in self.nodes[self.position[seeds[0]]:]:
            if any(a in dirty for a in node.all_input_nodes):
                dirty.add(node)
        return dirty

    def frontier(self, seeds: Sequence[Any]) -> set[Any]:
        """The clean values a trial faulting ``seeds`` reads: the inputs of the nodes that
        depend on them which do not depend on them themselves."""
        dirty = self.dependents(seeds)
        return {i for n in dirty for i in n.all_input_nodes if i not in dirty}

    def needed_from(self, start: int) -> frozenset[Any]:
        """The nodes a recomputation from position ``start`` on makes or reads: those from
        ``start`` and their inputs (all nodes for 0)."""
        if start not in self._needed:
            later = self.nodes[start:]
            self._needed[start] = frozenset(later).union(
                *(n.all_input_nodes for n in later))
        return self._needed[start]

    def run(self, model: Any, env: dict[Any, Any], x: Any, start: int = 0,
            only: set[Any] | None = None, keep: Any = None) -> None:
        """``run_nodes`` from position ``start`` with the model's own tensors, dropping from
        ``env`` each value after its last use unless ``keep`` (a set, or None: all) holds
        it; the output's value stays."""
        for pos, node in enumerate(self.nodes[start:], start):
            if only is not None and node not in only:
                continue
            run_nodes(model, [node], env, {}, x)
            if keep is not None:
                self.drop_dead(env, pos, keep, [*node.all_input_nodes, node])

    def drop_dead(self, env: dict[Any, Any], pos: int, keep: Any,
                  nodes: Iterable[Any] | None = None) -> None:
        """Drop from ``env`` the values of ``nodes`` (default: all) that no node after
        position ``pos`` reads, unless ``keep`` holds them; the output's value stays."""
        for n in list(env) if nodes is None else nodes:
            if n in env and self.last_use[n] <= pos and n not in keep and n is not self.output:
                del env[n]


def run_nodes(model: Any, nodes: Iterable[Any], env: dict[Any, Any],
              params: Mapping[str, Any], x: Any, only: set[Any] | None = None) -> None:
    """Evaluate ``nodes`` of ``model``'s graph in order into ``env`` (the same calls the
    model's forward makes), with ``params`` (tensor name -> value) in place of the
    modules' own tensors; ``x`` is the placeholder's value, ``only`` limits the nodes."""
    from torch.func import functional_call
    from torch.fx.node import map_arg

    for node in nodes:
        if only is not None and node not in only:
            continue
        op = node.op
        if op == "placeholder":
            env[node] = x
        elif op == "get_attr":
            env[node] = params.get(node.target, None)
            if env[node] is None:
                env[node] = functools.reduce(getattr, node.target.split("."), model)
        elif op == "output":
            env[node] = map_arg(node.args[0], lambda n: env[n])
        else:
            args = map_arg(node.args, lambda n: env[n])
            kwargs = map_arg(node.kwargs, lambda n: env[n])
            if op == "call_function":
                env[node] = node.target(*args, **kwargs)
            elif op == "call_method":
                env[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
            else:  # call_module
                prefix = node.target + "."
                own = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
                mod = submodule(model, node.target)
                env[node] = functional_call(mod, own, args, kwargs) if own else mod(*args,
                                                                                   **kwargs)


__all__ = ["TracedGraph", "run_nodes", "submodule"]
