"""Benchmark figures as a two-column table: one printer for every `tkg bench ...`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
