"""Benchmark figures as a two-column table: one printer for every `tkg bench ...`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any


def report(figures: dict[str, Any], as_json: bool,
           print_table: Callable[[dict[str, Any]], None]) -> int:
    """A bench's result on stdout: one JSON line (`--json`) or its table; the exit code."""
    if as_json:
        print(json.dumps(figures, default=str))
    else:
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
