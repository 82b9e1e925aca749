"""Stage outputs under a run's work dir: written once as Parquet in their declared schema,
marked finished with `_SUCCESS.json`, read back as Ray datasets. The runner (whole stages,
`tkg.pipeline.build`) and resume (chunks of one stage, `tkg.pipeline.resume`) both use these,
so a finished output looks the same whoever wrote it. The work dir lies with the store (a
local folder or an object-store prefix), so any node that sees the store can resume a run;
an output counts only once its marker is written, which is why writing needs no rename.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from ray.data import Dataset
from tkg.pipeline import engine, schema, storage
from tkg.pipeline.datasets import from_tables, read_parquet_files
from tkg.pipeline.storage import Location

SUCCESS = "_SUCCESS.json"
EMPTY_PART = "part-empty.parquet"


def part_files(folder: Location) -> list[str]:
    """The Parquet parts of one output folder, in write order."""
    return storage.list_files(folder, suffixes={".parquet"})


def read(folders: Iterable[Location], driver_bytes: int = 0,
         columns: Sequence[str] | None = None) -> Dataset:
    """Finished outputs as one dataset, loaded before the next stage starts: actor pools then
    never wait for CPU slots held by read tasks (a deadlock on small machines). Outputs that
    fit `driver_bytes` are read by this process (`read_parquet_files`). `columns`: only
    these."""
    return read_parquet_files([f for folder in folders for f in part_files(folder)],
                              columns, driver_bytes)


def write(dataset: Dataset, target: Location, table_schema: pa.Schema,
          held: list[pa.Table] | None = None) -> int:
    """An output as Parquet in its declared schema (at least one file); returns rows.
    Whatever an earlier attempt left there is removed first; the caller's marker, written
    after, is what makes it finished (a crash in between leaves an unmarked output, which
    the next attempt rewrites). `held`: gets the blocks as written (`handed`)."""
    storage.delete_dir(target)
    rows, pending = 0, deque()
    with ThreadPoolExecutor(storage.IO_THREADS) as pool:  # uploads overlap (object stores)
        for index, block in enumerate(engine.stream(dataset)):
            table = schema.conform(block, table_schema)
            if held is not None and (table.num_rows or not held):
                held.append(table)  # (one empty block kept, for its schema, as `read`)
            if table.num_rows:
                pending.append(pool.submit(storage.write_parquet, table,
                                           storage.join(target, f"part-{index:05d}.parquet")))
                rows += table.num_rows
            while len(pending) > storage.IO_THREADS:  # bounded: blocks are not all held
                pending.popleft().result()
        for future in pending:
            future.result()
    if held is not None and not held:
        held.append(table_schema.empty_table())
    if rows == 0:
        storage.write_parquet(table_schema.empty_table(), storage.join(target, EMPTY_PART))
    return rows


def handed(held: list[pa.Table], columns: Sequence[str] | None = None) -> Dataset:
    """The blocks `write` held of an output, as `read` would give them back (`columns`:
    only these): a block per file it wrote, or one empty block of the output's schema. A
    stage's output made in the driver goes to the next stages this way, not read back
    from its files (0.86 s of a 160,000-episode night, timed per input: the store-sized
    outputs, every name node's vector or every mention, read back after being written)."""
    tables = [t for t in held if t.num_rows] or held[:1]
    return from_tables([t.select(list(columns)) if columns is not None else t
                        for t in tables])


def finished(folder: Location) -> dict[str, Any] | None:
    """What a finished step recorded (rows, counters, seconds), or None if it never finished."""
    try:
        return json.loads(storage.read_text(storage.join(folder, SUCCESS)))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def mark_finished(folder: Location, record: dict[str, Any]) -> None:
    storage.write_text(storage.join(folder, SUCCESS), json.dumps(record))
