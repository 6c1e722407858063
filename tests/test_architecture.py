"""The code's layout as docs/architecture.md draws it, checked on the source (``ast``, nothing
is imported): no import cycle between modules, no import upwards, no class too large to read,
and a Checkpointer that uses no private attribute of another object.

Imports are read from every ``.py`` file of ``src/shardwise``; a relative import is resolved
against the file's package, and ``from package import name`` counts as an import of the
submodule ``package.name`` where there is one.

- The cycle check counts module-level imports only (those that run when the module is
  imported; ``if TYPE_CHECKING:`` blocks excluded): an import inside a function runs later,
  when every module is loaded, so it cannot take part in an import-time cycle.
- The direction check counts every import, module-level or inside a function, type-only
  included: an import inside a function still makes the lower layer depend on the upper one.
- Inside the packages of :data:`NO_DEFERRED_CYCLES` (``checkpoint``), imports inside
  functions count for cycles too: a function-level import that closes a cycle there only hides
  two modules that need each other (move what both need to the lower one).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "shardwise"

#: The layers of docs/architecture.md, top to bottom: a module may import from its own layer
#: (without a cycle) and from the layers below it, never from a layer above.
LAYERS: list[set[str]] = [
    {"cli"},
    {"integrations"},  # mmengine's FlexibleRunner over strategies, Ray Train over the runner
    {"runner"},
    {"strategies"},
    {"optim", "checkpoint", "visualization"},
    {"registry", "config", "dist", "launch_env", "env", "logging", "dtypes", "tree"}
    # mmengine's registry tree behind the registries, and what the runner does with the objects
    # it builds: imports nothing of shardwise, so registry and runner can use it; the Runner's
    # compatibility policy over it (imports only it), which runner and optim consult
    | {"integrations.openmmlab", "integrations.openmmlab_compat"},
]

#: The only modules that import mmengine (each only when a config or a user asks for it).
MMENGINE_IMPORTERS = {"shardwise.integrations.mmengine", "shardwise.integrations.openmmlab"}

#: The packages in which no import, not even one inside a function, closes a cycle.
NO_DEFERRED_CYCLES = ("checkpoint",)

#: ``shardwise/__init__.py`` holds ``__version__`` (imported from anywhere) and the lazy
#: top-level accessor ``shardwise.build_strategy``: it is at the top for what it imports and
#: at the bottom for what imports it.
ROOT = "shardwise"

#: Classes allowed over MAX_CLASS_LINES until they are split (remove an entry when its class
#: is split: the test fails while an entry is stale).
MAX_CLASS_LINES = 450
LARGE_CLASSES_ALLOWED: set[str] = set()  # was {"shardwise.runner.runner.Runner"} until its split


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported shardwise module
    line: int
    module_level: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _deepest_module(name: str, modules: Iterable[str]) -> str | None:
    """``name`` or the longest prefix of it that is a shardwise module."""
    known = set(modules)
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def _runtime_nodes(tree: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    """Every node with whether it runs at import time (not inside a function or lambda, nor
    under ``if TYPE_CHECKING:``)."""

    def walk(node: ast.AST, module_level: bool) -> Iterator[tuple[ast.AST, bool]]:
        for child in ast.iter_child_nodes(node):
            level = module_level
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                level = False
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from walk(ast.Module(body=child.body, type_ignores=[]), False)
                yield from walk(ast.Module(body=child.orelse, type_ignores=[]), module_level)
                continue
            yield child, level
            yield from walk(child, level)

    yield from walk(tree, True)


def imports_of(module: str, path: Path, modules: Iterable[str]) -> list[Import]:
    """The shardwise modules that ``module`` (the file ``path``) imports."""
    modules = set(modules)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node, module_level in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            names = [f"{origin}.{alias.name}" for alias in node.names]
            names = [n if _deepest_module(n, modules) == n else origin for n in names]
        for name in names:
            target = _deepest_module(name, modules) if name.split(".")[0] == ROOT else None
            if target is not None and target != module:
                found.append(Import(module, target, node.lineno, module_level))
    return found


def _all_imports() -> list[Import]:
    modules = _modules()
    return [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]


def _layer(module: str) -> int:
    """0 for the top layer; the root package counts as the bottom (see ROOT)."""
    parts = module.split(".")
    if module == ROOT:
        return len(LAYERS)
    for name in (".".join(parts[1:3]), parts[1]):  # a module placed on its own, then its package
        for index, layer in enumerate(LAYERS):
            if name in layer:
                return index
    raise AssertionError(
        f"{module} is in no layer: place shardwise.{parts[1]} in docs/architecture.md's "
        f"layout and in LAYERS in {Path(__file__).name}"
    )


def find_cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The import cycles among ``edges`` (one per strongly connected component of more than
    one module, or a module importing itself), each as a closed path."""
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_closed_path(sorted(c), graph) for c in components]


def _closed_path(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle through the first module of ``component`` (breadth first, so the shortest)."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for succ in sorted(graph[node] & members):
            if succ == start:
                return [*paths[node], start]
            if succ not in paths:
                paths[succ] = [*paths[node], succ]
                queue.append(succ)
    return component


def test_no_import_cycle_between_modules():
    edges = [(i.source, i.target) for i in _all_imports() if i.module_level]
    cycles = find_cycles(edges)
    assert not cycles, "import cycles (module-level imports):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def _cycles_inside(package: str, imports: Iterable[Import]) -> list[list[str]]:
    """The cycles among the modules of ``shardwise.<package>``, every import counted (those
    inside functions too; the package's ``__init__`` left out: its lazy accessors import the
    modules below it on first use)."""
    prefix = f"{ROOT}.{package}."
    return find_cycles(
        (i.source, i.target)
        for i in imports
        if i.source.startswith(prefix) and i.target.startswith(prefix)
    )


@pytest.mark.parametrize("package", NO_DEFERRED_CYCLES)
def test_no_import_cycle_inside_the_package_even_through_function_level_imports(package):
    cycles = _cycles_inside(package, _all_imports())
    assert not cycles, f"import cycles inside shardwise.{package} (any import):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_no_module_imports_from_a_layer_above_it():
    upward = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in _all_imports()
        if i.source != ROOT and _layer(i.target) < _layer(i.source)
    ]
    assert not upward, (
        "imports against the layer order of docs/architecture.md ("
        + " > ".join("/".join(sorted(layer)) for layer in LAYERS)
        + "):\n"
        + "\n".join(upward)
    )


def test_the_checks_see_cycles_and_upward_imports():
    """The checks themselves, on made-up edges and on a real module's imports."""
    assert find_cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c", "a"]]
    assert find_cycles([("a", "b"), ("b", "c")]) == []
    deferred = [
        Import("shardwise.checkpoint.a", "shardwise.checkpoint.b", 1, module_level=True),
        Import("shardwise.checkpoint.b", "shardwise.checkpoint.a", 9, module_level=False),
    ]
    assert _cycles_inside("checkpoint", deferred) == [
        ["shardwise.checkpoint.a", "shardwise.checkpoint.b", "shardwise.checkpoint.a"]
    ]
    modules = _modules()
    targets = {i.target for i in imports_of("shardwise.dist", modules["shardwise.dist"], modules)}
    assert "shardwise.launch_env" in targets
    assert _layer("shardwise.runner.runner") < _layer("shardwise.strategies.base")
    assert _layer("shardwise.cli") < _layer("shardwise.tree")


def mmengine_importers() -> set[str]:
    """The shardwise modules with an ``import mmengine...`` or ``from mmengine... import``
    anywhere (inside functions too)."""
    found = set()
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(name.split(".")[0] == "mmengine" for name in names):
                found.add(module)
    return found


def test_only_the_integrations_import_mmengine():
    assert mmengine_importers() <= MMENGINE_IMPORTERS, (
        "mmengine is a test dependency, imported only by "
        + ", ".join(sorted(MMENGINE_IMPORTERS))
        + f"; also imported by {sorted(mmengine_importers() - MMENGINE_IMPORTERS)}"
    )


def class_sizes() -> dict[str, int]:
    """Every class of src/shardwise (``module.Class``, nested ``module.Outer.Inner``) and its
    number of lines, decorators included."""
    sizes = {}
    for module, path in _modules().items():

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    sizes[f"{prefix}.{child.name}"] = child.end_lineno - first + 1
                    visit(child, f"{prefix}.{child.name}")
                elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    visit(child, f"{prefix}.{child.name}")

        visit(ast.parse(path.read_text(), str(path)), module)
    return sizes


def test_every_class_is_under_450_lines():
    sizes = class_sizes()
    too_large = {
        name: lines
        for name, lines in sizes.items()
        if lines >= MAX_CLASS_LINES and name not in LARGE_CLASSES_ALLOWED
    }
    assert not too_large, f"classes of {MAX_CLASS_LINES} lines or more: {too_large}"
    stale = {name: sizes.get(name) for name in LARGE_CLASSES_ALLOWED}
    stale = {name: lines for name, lines in stale.items() if (lines or 0) < MAX_CLASS_LINES}
    assert not stale, f"remove these from LARGE_CLASSES_ALLOWED, they are small now: {stale}"


def private_attributes_of_others(path: Path, class_name: str) -> list[str]:
    """Where class ``class_name`` of ``path`` reads or writes an attribute ``x._name`` of an
    object ``x`` other than itself (``self``, ``cls``, ``super()``): ``'line: expression'``.
    Dunder names (``__class__``) are public protocol and not counted."""
    tree = ast.parse(path.read_text(), str(path))
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name]
    if not classes:
        raise LookupError(f"{path} has no class {class_name}")
    uses = []
    for node in ast.walk(classes[0]):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
            continue
        uses.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(uses), key=lambda use: (int(use.split(":")[0]), use))


def test_the_private_attribute_check_finds_a_use(tmp_path):
    (tmp_path / "c.py").write_text(
        "class C:\n"
        "    def f(self, other):\n"
        "        self._mine = super()._base\n"
        "        return other._theirs, self._x._y, type(self).__name__\n"
    )
    assert private_attributes_of_others(tmp_path / "c.py", "C") == [
        "4: other._theirs",
        "4: self._x._y",
    ]


CHECKPOINTER = PACKAGE / "checkpoint" / "checkpointer.py"


@pytest.mark.skipif(
    not CHECKPOINTER.exists(), reason="shardwise/checkpoint/checkpointer.py does not exist yet"
)
def test_the_checkpointer_uses_no_private_attribute_of_another_object():
    uses = private_attributes_of_others(CHECKPOINTER, "Checkpointer")
    assert not uses, "shardwise.checkpoint.checkpointer.Checkpointer uses private names:\n" + (
        "\n".join(uses)
    )
