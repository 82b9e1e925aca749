"""The layers import one way only: jobs -> query -> pipeline, with no import circles.

Walks the source with `ast` (every import, including those inside functions and under
TYPE_CHECKING: a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"pipeline": 0, "query": 1, "jobs": 2}  # a layer may import only lower or equal ones
BARE = {"pipeline", "query", "jobs"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["tkg", *parts])


def _imports(path: Path, modules: set[str] | None = None) -> set[str]:
    """Imported module names; `from package import module` counts the module alone."""
    modules = modules or set()
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            submodules = [name for name in names if name in modules]
            found.update(submodules)
            if len(submodules) < len(names):
                found.add(node.module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {target for target in _imports(path, set(modules))
                       if target in modules and target != name}
    return graph


def test_no_bare_layer_imports():
    """Nothing imports `pipeline`, `query` or `jobs` outside the tkg namespace."""
    offenders = []
    for path in [*ROOT.glob("*/**/*.py"), *ROOT.glob("*.py")]:
        if ".venv" in path.parts or "build" in path.parts:
            continue
        for target in _imports(path):
            if target.split(".")[0] in BARE:
                offenders.append(f"{path.relative_to(ROOT)} imports {target}")
    assert offenders == []


def test_layers_point_one_way():
    backwards = []
    for source, targets in _graph().items():
        for target in targets:
            if LAYERS[target.split(".")[1]] > LAYERS[source.split(".")[1]]:
                backwards.append(f"{source} -> {target}")
    assert backwards == []


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*stack[stack.index(target):], target]))
            elif target not in state:
                visit(target, [*stack, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []
