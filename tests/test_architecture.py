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


# Ray Data calls and gathers live in the execution engine and the model runner alone: a stage
# body says what to compute, `tkg.pipeline.engine` where (driver or Ray Data, by one size
# policy) and `tkg.pipeline.runner` where a model runs. Each exception below says why.
ENGINE = {"pipeline/engine.py"}
RUNNER = {"pipeline/runner.py"}
RAY_DATA_CALLS = {"map_batches", "repartition", "union", "join", "to_arrow_refs"}
GATHERS = {"take_all", "take_batch", "to_arrow_refs", "iter_internal_ref_bundles"}
# `join` and `union` are also str.join, path joins, polars' join and set.union: a call
# counts as Ray Data's join when it passes Ray's own keywords (polars' take `how`), a union
# unless it is a set's; calls through the engine and the runner (`engine.union`) are theirs.
RAY_JOIN_KEYWORDS = {"join_type", "num_partitions"}
OWN_MODULES = {"engine", "runner"}
EXCEPTIONS = {
    # ray.data.llm's vLLM processor is itself a Ray Data pipeline: the backend that
    # runner.over_dataset runs, and the only one that runs on GPU nodes alone.
    "pipeline/llm/vllm.py": "vLLM through ray.data.llm",
    # Checks that Ray schedules a GPU task on a cluster: it tests Ray, not a stage.
    "jobs/gpu_smoke.py": "a Ray smoke test",
    # Prepares a resolution benchmark's inputs as Ray datasets, outside any build.
    "jobs/bench/resolution.py": "benchmark set-up",
}


def _ray_data_calls(path: Path) -> list[str]:
    """`name (line)` of every Ray Data call and gather in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and (
                func.value.id == "ray" and func.attr == "get"):
            found.append(f"ray.get ({node.lineno})")
        elif isinstance(func, ast.Attribute) and func.attr in RAY_DATA_CALLS | GATHERS:
            if _not_ray_data(func, node):
                continue
            found.append(f"{func.attr} ({node.lineno})")
    return found


def _not_ray_data(func: ast.Attribute, call: ast.Call) -> bool:
    receiver = func.value
    if isinstance(receiver, ast.Name) and receiver.id in OWN_MODULES:
        return True
    if func.attr == "join":
        return not {k.arg for k in call.keywords} & RAY_JOIN_KEYWORDS
    return func.attr == "union" and (
        isinstance(receiver, ast.Set | ast.SetComp)
        or (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name)
            and receiver.func.id in {"set", "frozenset"}))


def _sources() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def test_ray_data_calls_only_in_the_engine_and_the_model_runner():
    allowed = ENGINE | RUNNER | set(EXCEPTIONS)
    offenders = [f"{path.relative_to(ROOT)}: {call}" for path in _sources()
                 if str(path.relative_to(ROOT)) not in allowed
                 for call in _ray_data_calls(path)]
    assert offenders == []


def test_gathers_only_in_the_engine():
    """A gather brings a dataset's rows into the driver: only the engine's bounded gather
    (`engine.gather`, `engine.stream`) may, so none grows the driver past the policy."""
    gathers = {f"{name} " for name in GATHERS} | {"ray.get "}
    offenders = [f"{path.relative_to(ROOT)}: {call}" for path in _sources()
                 if str(path.relative_to(ROOT)) not in ENGINE | set(EXCEPTIONS)
                 for call in _ray_data_calls(path)
                 if any(call.startswith(g) for g in gathers)]
    assert offenders == []


def test_the_check_sees_what_it_forbids(tmp_path):
    """The walk finds each forbidden form and passes over string and path joins."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "ds.map_batches(f)\nds.repartition(4)\na.union(b)\nleft.join(right, join_type='inner')\n"
        "ray.get(ref)\nds.to_arrow_refs()\nds.take_all()\n"
        "','.join(names)\nstorage.join(root, 'x')\ndf.join(other, on='k', how='inner')\n"
        "set().union(a)\nengine.union(ctx, a, b)\n")
    assert [c.split()[0] for c in _ray_data_calls(sample)] == [
        "map_batches", "repartition", "union", "join", "ray.get", "to_arrow_refs", "take_all"]


def test_ray_internal_plan_types_are_pinned():
    """`datasets.from_tables` builds a dataset from Ray Data's internal plan types (a dataset
    of driver tables without a metadata task per block: 11 s of a 40 s incremental run).
    Internal types change without notice: they were checked against Ray 2.60, which
    pyproject pins; a new Ray must be checked again before this pin moves."""
    import ray

    assert ray.__version__.startswith("2.60."), ray.__version__


def test_stage_state_is_published_and_declared():
    """What a stage reads of the previous snapshot is a table some stage publishes, and each
    stage module's `previous_table(ctx, "<table>")` names a table its stage declares as state
    (build wires the state tables from these declarations)."""
    from tkg.pipeline import stages

    published = {p.table for p in stages.PUBLISHES}
    undeclared = []
    for stage in stages.STAGES:
        assert set(stage.state) <= published, stage.name
        path = ROOT / "pipeline" / "stages" / f"{stage.name}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "previous_table" and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value not in stage.state):
                undeclared.append(f"{stage.name}: {node.args[1].value}")
    assert undeclared == []
