"""Reading finished Parquet outputs back into Ray, for the runner, the stages and resume."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import ray
import ray.data
from ray.data.dataset import MaterializedDataset


@ray.remote
def _read_file(path: str) -> pa.Table:
    return pq.read_table(path, partitioning=None)


def read_parquet_files(files: Sequence[str]) -> MaterializedDataset:
    """One Ray task per file, each file one block, already materialized. Ray Data's
    read_parquet plans a listing and a read operator per call, about a second of fixed cost
    that a build paid some thirty times; the files here are our own part files, each
    written from one block, so a task per file reads them as well."""
    return ray.data.from_arrow_refs([_read_file.remote(str(f)) for f in files])
