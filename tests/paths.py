"""Both execution paths, one answer: the config that runs a whole build on Ray Data and actor
pools, and the comparison of two builds' published tables.

The driver path (`ray.driver_mb`, `ray.driver_rows`) serves small inputs, Ray Data big
ones; every store the suite builds is small, so without `on_ray_data` no test would run a
shuffle, join, extraction or embedding on Ray Data at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

# Stamped with the run's clock (created_at, expired_at of replaced versions, the run's own
# row) or measured (seconds), so two builds of the same input differ in them by design.
CLOCK_COLUMNS = {"created_at", "expired_at", "started_at", "finished_at", "seconds"}
# Vectors are compared with a tolerance: a text's vector varies with its batch's padding.
VECTOR_TOLERANCE = 1e-3


def on_ray_data(config: Any) -> Any:
    """`config` with the driver path off: every map, shuffle and join on Ray Data
    (`driver_mb` 0), every model on an actor pool (`driver_rows` 0)."""
    return config.model_copy(update={"ray": config.ray.model_copy(
        update={"driver_mb": 0, "driver_rows": 0})})


def published(snapshot: Path, table: str) -> pa.Table:
    """A published table's rows, in one canonical order, without its clock columns."""
    rows = pads.dataset(Path(snapshot) / table, format="parquet", partitioning=None).to_table()
    rows = rows.drop_columns([c for c in rows.column_names if c in CLOCK_COLUMNS])
    keys = [c for c in rows.column_names if _sortable(rows.schema.field(c).type)]
    return rows.sort_by([(c, "ascending") for c in keys]) if keys else rows


def _sortable(kind: pa.DataType) -> bool:
    return not (pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind)
                or pa.types.is_large_list(kind) or pa.types.is_struct(kind)
                or pa.types.is_map(kind))


def differences(first: Path, second: Path, tables: tuple[str, ...] | None = None
                ) -> dict[str, str]:
    """Published tables that differ between two snapshots (table -> what differs): rows,
    ids, versions, names, summaries, memberships; vectors within `VECTOR_TOLERANCE`. Empty
    when both paths gave one answer."""
    import numpy as np
    from tkg.pipeline import schema

    found: dict[str, str] = {}
    for table in tables or tuple(t for t in schema.PUBLISHED if t != "runs"):
        a, b = published(first, table), published(second, table)
        if a.num_rows != b.num_rows:
            found[table] = f"{a.num_rows} rows against {b.num_rows}"
            continue
        for column in a.column_names:
            left, right = a[column], b[column]
            if pa.types.is_fixed_size_list(left.type):
                if not np.allclose(_matrix(left), _matrix(right), atol=VECTOR_TOLERANCE):
                    found[table] = f"{column}: vectors differ"
                    break
            elif not left.equals(right):
                diff = next(i for i, (x, y) in enumerate(zip(
                    left.to_pylist(), right.to_pylist(), strict=True)) if x != y)
                found[table] = (f"{column} row {diff}: {left[diff].as_py()!r} against "
                                f"{right[diff].as_py()!r}")
                break
    return found


def _matrix(column: pa.ChunkedArray) -> Any:
    import numpy as np

    flat = column.combine_chunks()
    width = flat.type.list_size
    values = flat.flatten().to_numpy(zero_copy_only=False)
    return np.nan_to_num(values.reshape(-1, width)) if len(values) else np.zeros((0, width))
