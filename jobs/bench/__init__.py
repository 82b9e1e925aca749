"""`tkg bench ...`: benchmarks that print figures and never gate, registered from here.

Each module of this package times one part of tkg on synthetic or published data and adds
its own `tkg bench NAME` subcommand (`add_command`). No command module imports a benchmark:
`jobs/cli.py` hands the `bench` subparsers to `add_benches`, which imports only the module of
the benchmark being run and gives every other one a stand-in with its help line.
"""

from __future__ import annotations

from typing import Any

# name -> (module of this package, one-line help for `tkg bench --help`); in this order there.
# argparse formats help text with %: a literal percent sign is written %%.
BENCHES = {
    "build": ("build", "synthetic episodes, embedded default"),
    "resolution": ("resolution", "synthetic mentions with known duplicates"),
    "locomo": ("locomo", "LoCoMo (../shared/data): evidence recall@k and hit@k"),
    "query": ("query", "query latency on a synthetic store"),
    "communities": ("communities", "label propagation, planted partition"),
    "serve": ("serve", "HTTP load on a synthetic store, publish mid-run"),
    "incremental": ("incremental", "a full build, then a small newer run into it"),
    "scale": ("scale", "synthetic episodes on both paths: stages, rows, memory, spill"),
    "forget": ("forget", "a full build, then erasing 0.5 %% of it: seconds, rows, files"),
    "graph": ("graph", "graph quality (../shared/data): LoCoMo observations, chinook "
              "records, generic nouns, person duplicates"),
}


def register(module: str, benches: Any) -> None:
    """Let one benchmark module add its subcommand to the `tkg bench` subparsers."""
    from importlib import import_module

    import_module(f"{__name__}.{module}").add_command(benches)


def add_benches(benches: Any, name: str | None) -> None:
    """The benchmark `name` registers for real (None: none does); every other one gets a
    stand-in with its help line, enough for `tkg bench --help`."""
    for bench, (module, text) in BENCHES.items():
        if bench == name:
            register(module, benches)
        else:
            benches.add_parser(bench, help=text)
