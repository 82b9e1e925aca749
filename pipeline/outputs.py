"""Stage outputs under a run's work dir: written once as Parquet in their declared schema,
marked finished with `_SUCCESS.json`, read back as Ray datasets. The runner (whole stages,
`tkg.pipeline.build`) and resume (chunks of one stage, `tkg.pipeline.resume`) both use these,
so a finished output looks the same whoever wrote it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.data import Dataset
from tkg.pipeline import schema
from tkg.pipeline.datasets import read_parquet_files

SUCCESS = "_SUCCESS.json"
EMPTY_PART = "part-empty.parquet"


def part_files(folder: Path) -> list[str]:
    """The Parquet parts of one output folder, in write order."""
    return sorted(str(p) for p in Path(folder).glob("*.parquet"))


def read(folders: Iterable[Path]) -> Dataset:
    """Finished outputs as one dataset, loaded before the next stage starts: actor pools then
    never wait for CPU slots held by read tasks (a deadlock on small machines)."""
    return read_parquet_files([f for folder in folders for f in part_files(folder)])


def write(dataset: Dataset, target: Path, table_schema: pa.Schema) -> int:
    """An output as Parquet in its declared schema (at least one file), written to a temp
    folder and renamed into place, so a crash never leaves half an output; returns rows."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rows = 0
    for index, ref in enumerate(dataset.to_arrow_refs()):
        table = schema.conform(ray.get(ref), table_schema)
        if table.num_rows:
            pq.write_table(table, tmp / f"part-{index:05d}.parquet")
            rows += table.num_rows
    if rows == 0:
        pq.write_table(table_schema.empty_table(), tmp / EMPTY_PART)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return rows


def finished(folder: Path) -> dict[str, Any] | None:
    """What a finished step recorded (rows, counters, seconds), or None if it never finished."""
    marker = Path(folder) / SUCCESS
    return json.loads(marker.read_text()) if marker.is_file() else None


def mark_finished(folder: Path, record: dict[str, Any]) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / SUCCESS).write_text(json.dumps(record))
