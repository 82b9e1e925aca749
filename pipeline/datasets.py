"""Datasets from Parquet part files and from tables in this process (the engine's empty
blocks guard is `tkg.pipeline.engine.nonempty`)."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import ray
import ray.data
from ray.data.dataset import MaterializedDataset
from tkg.pipeline import storage
from tkg.pipeline.config import StorageConfig
from tkg.pipeline.storage import rows_in

EMPTY_PART = "part-empty.parquet"  # what every writer of tkg names a file of no rows


Keys = tuple[str, pa.Array]  # (a key column, the values of it to keep)


@ray.remote
def _read_file(path: str, config: StorageConfig | None,
               columns: Sequence[str] | None = None, key: str | None = None,
               values: pa.Array | None = None) -> pa.Table:
    storage.configure(config)  # a worker reads the store the driver was told about
    return _read(path, columns, None if key is None else (key, values))


def _read(path: str, columns: Sequence[str] | None, keys: Keys | None) -> pa.Table:
    """A file's `columns`; with `keys`, its rows of those keys alone, read a batch at a time
    (`storage.read_parquet_rows`)."""
    if keys is None:
        return storage.read_parquet(path, columns)
    key, values = keys
    return storage.read_parquet_rows(path, lambda rows: rows_in(rows, rows[key], values),
                                     columns)


def read_parquet_files(files: Sequence[str], columns: Sequence[str] | None = None,
                       driver_bytes: int = 0, keys: Keys | None = None
                       ) -> MaterializedDataset:
    """One Ray task per file, each file one block, already materialized. Ray Data's
    read_parquet plans a listing and a read operator per call, about a second of fixed cost
    that a build paid some thirty times; the files here are our own part files, each
    written from one block, so a task per file reads them as well. Placeholder files of
    empty tables are left out by name (no footer read per file: on an object store each is
    a request), one kept when there is nothing else, for its schema. `columns`: only
    these (a table's vectors are most of its bytes). Files that fit `driver_bytes` once
    decoded are read by this process instead (a Ray task per file cost each read about
    0.4 s on the loaded machine; a night's outputs are a few MB). `keys`: only the rows
    whose key column holds one of the values given, selected where each file is read (a
    night's few stored versions of the 160,000-episode store's facts: 315 MB read, not
    put in the object store to be joined)."""
    with_rows = [f for f in files if posixpath.basename(str(f)) != EMPTY_PART]
    chosen = with_rows or list(files[:1])
    sizes = storage.each(lambda f: storage.parquet_bytes(f, columns), chosen) if (
        driver_bytes) else []
    if sizes and (sum(sizes) if keys is None else max(sizes)) <= driver_bytes:
        # a keyed read holds a file's matched rows and a batch of it (`_read`; the stored
        # facts' 1.9 s on Ray tasks became 0.6 s here)
        return from_tables(storage.each(lambda f: _read(f, columns, keys), chosen))
    config = storage.configured()
    key, values = (None, None) if keys is None else (keys[0], ray.put(keys[1]))
    return ray.data.from_arrow_refs([_read_file.remote(str(f), config, columns, key, values)
                                     for f in chosen])


def from_tables(tables: Sequence[pa.Table]) -> MaterializedDataset:
    """Tables in this process as a dataset, each one block (`DriverDataset`: put in the
    object store only when Ray Data works on them)."""
    return DriverDataset(tables)


def block_metadata(table: pa.Table) -> Any:
    """What Ray Data keeps of a block (rows, bytes, schema), computed where the block is, so
    that `from_block_refs` needs neither the block nor a task to read it back."""
    from ray.data._internal.util import get_table_block_metadata_schema

    return get_table_block_metadata_schema(table)


def from_block_refs(refs: Sequence[ray.ObjectRef], metadata: Sequence[Any]
                    ) -> MaterializedDataset:
    """A dataset of blocks already in the object store, with their `block_metadata`. Uses
    Ray Data's own plan types, the plan that 2.60's `from_arrow_refs` builds;
    tests/test_architecture.py pins the Ray version they were checked against."""
    from ray.data._internal.logical.interfaces import LogicalPlan
    from ray.data._internal.logical.operators import FromArrow
    from ray.data._internal.stats import DatasetStats
    from ray.data.context import DataContext

    context = DataContext.get_current().copy()
    return HeldDataset(LogicalPlan(FromArrow(list(refs), list(metadata)), context), context,
                       DatasetStats(metadata={"FromArrow": list(metadata)}, parent=None))


class HeldDataset(MaterializedDataset):
    """A dataset of blocks this process put in the object store (`from_tables`): its blocks
    are known, so asking for them runs nothing. Ray Data's `materialize`, `to_arrow_refs`
    and `iter_internal_ref_bundles` each start an execution even here, with two GCS calls
    for cluster-wide spill figures: 14 ms per `materialize` and 51 ms per bundle iteration
    on the idle machine, about half of a tiny build's 2.5 s on the driver path (227 such
    executions per build, profiled on tests/test_records_versions.py's input)."""

    def _held(self) -> list:
        return list(self._logical_plan.dag.output_data())

    def materialize(self) -> HeldDataset:
        return self

    def iter_internal_ref_bundles(self):
        return iter(self._held())

    def to_arrow_refs(self) -> list:
        return [entry.ref for bundle in self._held() for entry in bundle.blocks]


def empty_dataset() -> MaterializedDataset:
    """A dataset with no rows and no columns: what a shuffle of nothing yields. Maps skip
    it, `nonempty` sees it as empty, and writers conform it to their table's schema."""
    return from_tables([pa.table({})])


class DriverDataset(HeldDataset):
    """Tables in this process as a dataset. The engine maps, unites, shuffles, joins and
    writes them where they are (`tables`); they go to the object store, and this becomes a
    `HeldDataset` of them, only when Ray Data itself is asked for them (the first time a
    method of Ray's reads the dataset's own state: `__getattr__`). Putting every table the
    driver made was 10.6 s of a night into the 160,000-episode synthetic store (py-spy:
    `ray.put` in `from_tables`), though most went on to the next step in this process."""

    def __init__(self, tables: Sequence[pa.Table]) -> None:  # (no Ray Data state yet)
        self.__dict__["tables"] = list(tables)

    def __getattr__(self, name: str) -> Any:
        """Ray Data's state of the dataset, made on first use: the tables put, the plan of a
        `HeldDataset` of them. Only called for attributes not set yet."""
        if name.startswith("__") or "_held_state" in self.__dict__:
            raise AttributeError(name)
        tables = self.__dict__["tables"]
        held = from_block_refs([ray.put(table) for table in tables],
                               [block_metadata(table) for table in tables])
        self.__dict__.update(held.__dict__, _held_state=True)
        return object.__getattribute__(self, name)

    def __del__(self) -> None:
        """Ray's `__del__` stops the dataset's executor, which reads its state: one never
        made has none to stop (and reading it here would put the tables on their way out)."""
        if "_held_state" in self.__dict__:
            super().__del__()

    def materialize(self) -> DriverDataset:
        return self

    def count(self) -> int:
        return sum(table.num_rows for table in self.tables)

    def size_bytes(self) -> int:
        """What Ray Data's metadata would say (`block_metadata`: an Arrow block's bytes are
        its `nbytes`), so that the size policy places these tables as it would place their
        blocks; once, the tables never change (asked of Ray's metadata at every placement,
        0.25 s of the 160,000-episode night)."""
        if "_size_bytes" not in self.__dict__:
            self.__dict__["_size_bytes"] = sum(table.nbytes for table in self.tables)
        return self.__dict__["_size_bytes"]
