"""The `tkg` parser imports a jobs module only when one of its commands runs; the table of
stand-ins (names and help lines) must match what the modules register."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from tkg.jobs.bench import BENCHES


def test_lazy_table_names_what_each_module_registers():
    from tkg.jobs import bench, cli

    root = argparse.ArgumentParser()
    commands = root.add_subparsers()
    benches = commands.add_parser("bench").add_subparsers()
    for module in sorted({m for m, _ in cli.COMMANDS.values()}):
        cli._register(module, commands)
    for module in sorted({m for m, _ in bench.BENCHES.values()}):
        bench.register(module, benches)
    assert set(commands.choices) - {"bench"} == set(cli.COMMANDS)
    assert set(benches.choices) == set(bench.BENCHES)


@pytest.mark.parametrize("argv,module,function,parsed", [
    (["search", "--store", "s", "--group", "g", "--query", "q", "--limit", "3"],
     "query_commands", "cmd_search", {"store": "s", "group": ["g"], "limit": 3}),
    (["bench", "query", "--facts", "2000", "--reuse"], "bench.query", "run_command",
     {"facts": 2000, "queries": 1_000, "reuse": True}),
    (["communities", "refresh", "--store", "s", "--json"], "refresh_communities",
     "cmd_refresh", {"store": "s", "json": True}),
    (["serve", "--store", "s", "--processes", "2"], "ops", "cmd_serve",
     {"store": "s", "processes": 2, "port": 8080}),
])
def test_the_running_command_gets_its_real_arguments(argv, module, function, parsed):
    """The command being run parses its own flags (types and defaults included) and runs its
    module's function, where a stand-in would refuse the flags."""
    from importlib import import_module

    from tkg.jobs import cli

    args = cli.parser(argv).parse_args(argv)
    assert args.fn is getattr(import_module(f"tkg.jobs.{module}"), function)
    assert {key: getattr(args, key) for key in parsed} == parsed


def test_help_imports_no_jobs_module():
    script = ("import sys\nfrom tkg.jobs import cli\ncli.parser(['--help'])\n"
              "print(sorted(m for m in sys.modules if m.startswith(('tkg.jobs.', 'ray', "
              "'igraph', 'duckdb', 'torch'))))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "['tkg.jobs.cli']"


def test_no_command_module_imports_a_benchmark():
    """Benchmarks live in tkg.jobs.bench and register their own `tkg bench` subcommands: a
    command module that imported one would load it (and its data generators) for nothing."""
    import ast
    from pathlib import Path

    from tkg import jobs

    offenders = []
    for path in sorted(Path(jobs.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name} imports {name}" for name in names
                          if name.startswith("tkg.jobs.bench.")]
    assert offenders == []


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_subparsers(sub))
    return found


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]]
                         + [["bench", name, "--help"] for name in sorted(BENCHES)])
def test_every_help_text_formats(argv: list[str]):
    """argparse formats help with %: one bare percent sign made `tkg bench --help` raise
    TypeError (the forget bench's "0.5 %")."""
    from tkg.jobs import cli

    for parser in _subparsers(cli.parser(argv)):
        assert parser.format_help()


def test_benches_read_shared_data_beside_the_checkout():
    """`tkg bench locomo` looked in the checkout's own shared/data (not ../shared/data, as
    the README says), so its default --data was never found."""
    from pathlib import Path

    from tkg.jobs.bench import figures, graph, locomo

    checkout = Path(__file__).resolve().parents[1]
    assert checkout.parent / "shared" / "data" == figures.SHARED_DATA
    assert locomo.DEFAULT_DATA.parent == figures.SHARED_DATA
    assert graph.bench_graph.__defaults__[1] == figures.SHARED_DATA
