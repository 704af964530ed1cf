"""The package's layout rules (DESIGN.md), checked on the source with ``ast``.

- no module imports an underscored name, or an underscored module, from another bitfault
  package (the core's top-level modules are one package, each subpackage another), nor
  reaches one through an imported name (``maps._hits``);
- no module imports ``keras.src`` or uses ``torch._C``;
- no module is over 400 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "bitfault"
MAX_LINES = 400


def _modules() -> list[tuple[str, Path]]:
    """(dotted name, path) of every module of bitfault."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append((".".join(parts), path))
    return found


def _package(dotted: str) -> str:
    """The package a bitfault name belongs to: its subpackage (``bitfault.torch``), or
    ``bitfault`` for the core's top-level modules."""
    parts = dotted.split(".")
    if len(parts) >= 2 and (ROOT / parts[1]).is_dir():
        return ".".join(parts[:2])
    return "bitfault"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _absolute(module: str | None, level: int, dotted: str, is_package: bool) -> str:
    """The absolute module of ``from <level dots><module> import ...`` in module ``dotted``."""
    if not level:
        return module or ""
    base = dotted.split(".") if is_package else dotted.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _chain(node: ast.Attribute) -> tuple[ast.expr, list[str]]:
    """``a.b.c`` -> (the node of ``a``, ["b", "c"])."""
    attrs = [node.attr]
    value = node.value
    while isinstance(value, ast.Attribute):
        attrs.insert(0, value.attr)
        value = value.value
    return value, attrs


def violations(source: str, dotted: str, is_package: bool = False) -> list[str]:
    """The layout rules that ``source``, module ``dotted``, breaks: one line each."""
    tree = ast.parse(source)
    own = _package(dotted)
    found: list[str] = []
    torch_names: set[str] = set()
    bound: dict[str, str] = {}  # local name -> the bitfault name it was imported as

    def check(target: str, names: list[str], line: int) -> None:
        parts = target.split(".")
        if parts[0] == "keras" and (parts[1:2] == ["src"] or (len(parts) == 1 and "src" in names)):
            found.append(f"{dotted}:{line}: imports keras.src")
        if parts[0] == "torch" and (parts[1:2] == ["_C"] or (len(parts) == 1 and "_C" in names)):
            found.append(f"{dotted}:{line}: uses torch._C")
        if parts[0] != "bitfault" or _package(target) == own:
            return
        private = [p for p in parts[1:] if _private(p)] + [n for n in names if _private(n)]
        if private:
            found.append(f"{dotted}:{line}: imports {', '.join(private)} from {target} "
                         f"(another package: {_package(target)})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check(alias.name, [], node.lineno)
                if alias.name.split(".")[0] == "torch":
                    torch_names.add(alias.asname or "torch")
                if alias.name.split(".")[0] == "bitfault":
                    local = alias.asname or "bitfault"
                    bound[local] = alias.name if alias.asname else "bitfault"
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node.module, node.level, dotted, is_package)
            check(target, [alias.name for alias in node.names], node.lineno)
            for alias in node.names:
                if target == "torch":
                    continue
                if target.split(".")[0] == "bitfault":
                    bound[alias.asname or alias.name] = f"{target}.{alias.name}"

    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue  # only whole chains: a.b.c, not a.b again
        root, attrs = _chain(node)
        if not isinstance(root, ast.Name):
            continue
        if root.id in torch_names and attrs[0] == "_C":
            found.append(f"{dotted}:{node.lineno}: uses torch._C")
        if root.id not in bound:
            continue
        name = bound[root.id]
        for attr in attrs:
            if _private(attr) and _package(name) != own:
                found.append(f"{dotted}:{node.lineno}: uses {attr} of {name} "
                             f"(another package: {_package(name)})")
                break
            name = f"{name}.{attr}"
    return found


def test_the_checker_finds_what_it_should():
    bad = """
import keras.src.ops
from keras import src
from torch._C import _nn
import torch as T
T._C._get_tracing_state()
from bitfault.torch._kernels import fault_words
from bitfault.maps import _popcount
from bitfault import maps as m
m.sampling._hits(1)
import bitfault.torch
bitfault.torch._fused.run()
"""
    found = violations(bad, "bitfault.campaign.runner")
    assert len([f for f in found if "keras.src" in f]) == 2, found
    assert len([f for f in found if "torch._C" in f]) == 2, found
    assert any("_kernels from bitfault.torch._kernels" in f for f in found), found
    assert any("_popcount from bitfault.maps" in f for f in found), found
    assert any("_hits of bitfault.maps.sampling" in f for f in found), found
    assert any("_fused of bitfault.torch" in f for f in found), found
    assert len(found) == 8, found
    same_package = """
from bitfault.torch._kernels import fault_words
from . import _inject
from ._fused import x
from bitfault.faults import __all__
import torch
torch.nn.functional.relu(x)
x._private
"""
    assert violations(same_package, "bitfault.torch.seam") == []
    assert violations("from bitfault.errors import _check\n", "bitfault.spec") == []
    assert violations("from bitfault.faults import _FaultBase\n", "bitfault.spec")
    assert violations("from bitfault.faults import _FaultBase\n", "bitfault.maps.faultmap")
    assert violations("from ..faults import _FaultBase\n", "bitfault.maps.faultmap")
    assert violations("from .sampling import _hits\n", "bitfault.maps", is_package=True) == []


def test_no_private_names_across_packages_no_keras_src_no_torch_c():
    found = []
    for dotted, path in _modules():
        found += violations(path.read_text(encoding="utf-8"), dotted,
                            is_package=path.name == "__init__.py")
    assert not found, "layout rules broken:\n" + "\n".join(found)


def test_modules_stay_small():
    found = [f"{dotted}: {n} lines" for dotted, path in _modules()
             if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not found, f"modules over {MAX_LINES} lines:\n" + "\n".join(found)


# ---- the package's shape (DESIGN.md's layout) ----------------------------------------------

MAX_LOOSE_MODULES = 6  # top-level modules besides __init__ and __main__
FORMAT_CLASSES = frozenset({"FixedPoint", "IntQuant", "Float", "BlockFormat", "MX", "NVFP4",
                            "GGUF", "GroupwiseInt", "IntCodes"})
MAX_FORMAT_ISINSTANCE = 5  # in the adapters: the rest dispatches through registries
FRAMEWORK_NAMES = frozenset({"torch", "keras", "tensorflow", "gguf", "jax"})


def _imports(dotted: str, path: Path) -> set[str]:
    """The bitfault modules ``dotted`` imports anywhere (inside functions and under
    TYPE_CHECKING too), as modules of the tree (a name imported from a package counts as
    its submodule when it is one, else as the package)."""
    known = {d for d, _ in _modules()}
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def add(name: str) -> None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != dotted:
            found.add(name)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "bitfault":
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node.module, node.level, dotted, is_package)
            if target.split(".")[0] != "bitfault":
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                add(full if full in known else target)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_cycles():
    assert import_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycles():
    graph = {dotted: _imports(dotted, path) for dotted, path in _modules()}
    assert import_cycles(graph) == []


def test_few_loose_top_level_modules():
    loose = sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(loose) <= MAX_LOOSE_MODULES, loose


def test_adapters_dispatch_on_formats_through_registries():
    found = []
    for dotted, path in _modules():
        if _package(dotted) not in ("bitfault.torch", "bitfault.keras"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "isinstance" and len(node.args) == 2):
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                names = {getattr(k, "id", None) or getattr(k, "attr", None) for k in kinds}
                if names & FORMAT_CLASSES:
                    found.append(f"{dotted}:{node.lineno}")
    assert len(found) <= MAX_FORMAT_ISINSTANCE, found


def test_no_branches_on_a_framework_name_outside_adapters_and_config():
    found = []
    for dotted, path in _modules():
        if _package(dotted) in ("bitfault.torch", "bitfault.keras", "bitfault.config"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            constants = [o.value for o in operands if isinstance(o, ast.Constant)]
            for o in operands:
                if isinstance(o, ast.Tuple | ast.List | ast.Set):
                    constants += [e.value for e in o.elts if isinstance(e, ast.Constant)]
            if any(c in FRAMEWORK_NAMES for c in constants if isinstance(c, str)):
                found.append(f"{dotted}:{node.lineno}")
    assert found == [], found


def test_tests_mirror_the_package():
    """Each folder of tests/ is named after a package of bitfault, and no test file repeats
    its folder's name (tests/torch/test_inject.py, not test_torch_inject.py)."""
    tests = Path(__file__).resolve().parent
    folders = sorted(p.name for p in tests.iterdir()
                     if p.is_dir() and not p.name.startswith((".", "__")))
    assert [f for f in folders if not (ROOT / f / "__init__.py").is_file()] == []
    repeating = sorted(str(p.relative_to(tests)) for f in folders
                       for p in (tests / f).glob(f"test_{f}_*.py"))
    assert repeating == []
