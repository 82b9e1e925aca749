"""Benchmark figures as a two-column table: one printer for every `tkg bench ...`."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Public data written by others, beside the checkout (../shared/data: see its README).
SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def report(figures: dict[str, Any], as_json: bool,
           print_table: Callable[[dict[str, Any]], None]) -> int:
    """A bench's result on stdout: one JSON line (`--json`) or its table; the exit code."""
    if as_json:
        print(json.dumps(figures, default=str))
    else:
        print_table(figures)
    return 0


def report_ray_bench(run: Callable[[], dict[str, Any]], as_json: bool,
                     print_table: Callable[[dict[str, Any]], None]) -> int:
    """`report` for a bench that starts Ray: under `--json`, whatever Ray's processes write
    to fd 1 (a raylet warning once came before the object) goes to stderr, so stdout holds
    the one JSON object."""
    from tkg.jobs.build_output import terminal

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    with terminal(None, as_json) as (out, _):
        figures = run()
        if as_json:
            print(json.dumps(figures, default=str), file=out)
    if not as_json:
        print_table(figures)
    return 0


def print_figures(title: str, figures: Mapping[str, Any]) -> None:
    """Each figure a row; integers with thousands separators, nested mappings flattened
    to `key subkey` rows."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        if isinstance(value, Mapping):
            for sub, inner in value.items():
                table.add_row(f"{key} {sub}", _cell(inner))
        else:
            table.add_row(key, _cell(value))
    Console().print(table)


def _cell(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
