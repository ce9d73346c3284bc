"""No import cycles among gguflm's modules: the graph of every ``import`` and ``from ... import``
statement in gguflm/ (those inside functions and under ``if TYPE_CHECKING:`` included) has no
cycle, so each module can be read, and imported, after the modules it names."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gguflm"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the gguflm modules it imports (a name imported from a package counts as its
    submodule when there is one of that name, else as the package)."""
    mods = modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {owner(a.name) for a in node.names if a.name.split(".")[0] == "gguflm"}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                if base.split(".")[0] != "gguflm":
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in mods else owner(base))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "gguflm.models" in graph["gguflm.loader"]            # from gguflm.models import ...
    assert "gguflm.grammar.sampler" in graph["gguflm.samplers"]  # inside a function
    assert "gguflm.model" in graph["gguflm.graph"]              # under TYPE_CHECKING
    assert "gguflm._ext" in graph["gguflm.graph"]               # from gguflm._ext import ops
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(
        " <-> ".join(f"{m} (imports {', '.join(sorted(graph[m] & set(c)))})" for m in c) for c in found)
