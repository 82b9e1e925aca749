"""What a reader sees: the group and both timelines, defined once and rendered three ways.

A row is visible to a reader of some groups at valid time `as_of` and transaction time
`known_at` when its group is one of theirs and every bound of its kind holds:

    transaction time  created_at <= known_at  and  expired_at > known_at
    valid time        valid_at   <= as_of     and  invalid_at > as_of     (facts only)

A null bound is open (a fact with no `invalid_at` still holds). `as_of` narrows facts only:
an episode told later may well be the source of a fact that held earlier.

The same table of bounds is rendered to DuckDB SQL (the catalog macros, the build's counts),
to LanceDB filters (search prefilters) and to numpy masks (in-memory search, the community
input). Renderings only ever contain column names, integers we format, parameter names and
group ids that match GROUP_ID_PATTERN: no caller's text becomes SQL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from tkg.pipeline.config import GROUP_ID_PATTERN
from tkg.pipeline.index import FUTURE, PAST, micros

# "Now and forever after" on either timeline: later than every stored time, below the
# open-bound sentinel, so integer renderings need no special case (a `>` bound then keeps
# only open rows, a `<=` bound keeps every row).
LATEST = FUTURE - 1
Moment = int | str | None  # micros, a SQL parameter name (DuckDB only), or None: unbounded
_PARAMETER = re.compile(r"\$?[a-z_]{1,32}")


@dataclass(frozen=True)
class Bound:
    column: str  # timestamp column
    op: str  # "<=": the row starts at or before the moment; ">": it ends after it
    timeline: str  # "known_at" (transaction time) or "as_of" (valid time)

    @property
    def open(self) -> int:
        """The integer a null stands for in the `<column>_us` copies (index.micros)."""
        return PAST if self.op == "<=" else FUTURE


CREATED = Bound("created_at", "<=", "known_at")
EXPIRED = Bound("expired_at", ">", "known_at")
VALID = Bound("valid_at", "<=", "as_of")
INVALID = Bound("invalid_at", ">", "as_of")
RULES: dict[str, tuple[Bound, ...]] = {
    "facts": (CREATED, EXPIRED, VALID, INVALID),
    "entities": (CREATED,),
    "communities": (CREATED,),
    "episodes": (CREATED,),
}


def _bounds(kind: str, as_of: Moment, known_at: Moment) -> list[tuple[Bound, Moment]]:
    moments = {"as_of": as_of, "known_at": known_at}
    return [(b, moments[b.timeline]) for b in RULES[kind] if moments[b.timeline] is not None]


def checked_groups(groups: Sequence[str]) -> tuple[str, ...]:
    """Group ids safe to quote in a filter; anything else is refused, never escaped."""
    for group in groups:
        if not isinstance(group, str) or not GROUP_ID_PATTERN.fullmatch(group):
            raise ValueError(f"invalid group id {group!r}")
    return tuple(groups)


# --- DuckDB ---------------------------------------------------------------------------------


def _parameter(name: str) -> str:
    if not isinstance(name, str) or not _PARAMETER.fullmatch(name):
        raise ValueError(f"{name!r} is not a parameter name")
    return name


def duckdb_where(kind: str, *, as_of: Moment = None, known_at: Moment = None,
                 groups: str | None = None) -> str:
    """A DuckDB condition over the published columns. Moments are parameter names (a macro's
    argument, `$name`) or LATEST; `groups` names a list parameter."""
    parts = [f"list_contains({_parameter(groups)}, group_id)"] if groups else []
    for bound, moment in _bounds(kind, as_of, known_at):
        if moment == LATEST:
            if bound.op == ">":
                parts.append(f"{bound.column} IS NULL")
            continue
        parts.append(f"({bound.column} IS NULL OR {bound.column} {bound.op} "
                     f"{_parameter(moment)})")
    return " AND ".join(parts) or "TRUE"


# --- LanceDB --------------------------------------------------------------------------------


def lance_where(kind: str, groups: Sequence[str], *, as_of: int | None, known_at: int | None,
                bounds: Mapping[str, tuple[int, int]] | None = None) -> str:
    """A LanceDB prefilter over the `<column>_us` copies. With the table's (min, max) per
    column (`bounds`), a condition every row meets is left out: it selects the same rows and
    costs a column scan per query."""
    quoted = ", ".join(f"'{g}'" for g in checked_groups(groups))
    parts = [f"group_id IN ({quoted})"]
    for bound, moment in _bounds(kind, as_of, known_at):
        column, value = f"{bound.column}_us", int(moment)
        low, high = (bounds or {}).get(column, (None, None))
        if high is not None and (value >= high if bound.op == "<=" else value < low):
            continue
        parts.append(f"{column} {bound.op} {value}")
    return " AND ".join(parts)


# --- numpy ----------------------------------------------------------------------------------


def group_table(allowed: np.ndarray, n_groups: int) -> np.ndarray:
    """A bool per group code, and a last one for code -1 (no group), never allowed: whether
    a row of that code may be seen by a caller of the `allowed` codes (`table[codes]` masks
    rows: faster than isin's sort)."""
    table = np.zeros(n_groups + 1, dtype=bool)
    table[np.asarray(allowed, dtype=np.int64)] = True
    return table


def numpy_mask(kind: str, times: Mapping[str, np.ndarray], *, as_of: int | None,
               known_at: int | None, rows: np.ndarray | None = None) -> np.ndarray:
    """The timelines over `<column>_us` arrays (nulls as their open sentinels), for `rows`
    of them or all; the caller ANDs the group mask."""
    ok: np.ndarray | bool = True
    for bound, moment in _bounds(kind, as_of, known_at):
        values = times[f"{bound.column}_us"]
        values = values if rows is None else values[rows]
        ok = ok & (values <= moment if bound.op == "<=" else values > moment)
    size = len(rows) if rows is not None else len(next(iter(times.values()), ()))
    return np.broadcast_to(ok, (size,)).copy()


def arrow_times(table: pa.Table, kind: str) -> dict[str, np.ndarray]:
    """The `<column>_us` arrays of an Arrow table's bound columns (a missing column is open
    everywhere, as a null would be)."""
    return {f"{b.column}_us": (np.asarray(micros(table[b.column], b.open))
                               if b.column in table.column_names
                               else np.full(table.num_rows, b.open, dtype=np.int64))
            for b in RULES[kind]}


def current(table: pa.Table, kind: str = "facts") -> pa.Table:
    """The rows the store believes now (transaction time LATEST, any valid time)."""
    if not table.num_rows:
        return table
    mask = numpy_mask(kind, arrow_times(table, kind), as_of=None, known_at=LATEST)
    return table.filter(pa.array(mask))
