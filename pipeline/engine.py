"""The execution engine: every Ray Data step of a stage, and where it runs.

Stage bodies say what to compute (`map`, `union`, `shuffle`, `join`, `partition`, `gather`);
this module decides where, by one rule (`SizePolicy`): a dataset that is already computed and
fits `ray.driver_mb` is worked on in the driver, block by block, anything bigger on Ray Data.
A Ray Data map, shuffle or join starts an executor and its operators for any size (about
0.25 s where the arithmetic of a night's rows takes milliseconds; a 10,000 + 200 incremental
run made about a hundred of them), so small work stays here; big work never comes here, and
memory per worker is bounded by the largest key's block, never by the dataset.

A `gather` (a few columns of a dataset as one table in the driver) is bounded too: past
`ray.gather_mb` it stops the run with an error naming what it gathered, instead of growing
the driver with the store. Model work ("run a model over rows") is `tkg.pipeline.runner`,
which takes its driver-or-actors decision from the same policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from ray.data import Dataset
from ray.data.dataset import MaterializedDataset
from tkg.pipeline import schema
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.context import RunContext
from tkg.pipeline.datasets import (
    DriverDataset,
    empty_dataset,
    from_block_refs,
    from_tables,
)

MB = 2**20
Block = Callable[..., pa.Table]


class DriverLimitError(RuntimeError):
    """A gather would bring more into the driver than `ray.gather_mb` allows."""


@dataclass(frozen=True)
class SizePolicy:
    """The one rule of where work runs.

    - `driver_bytes` (`ray.driver_mb`): a computed dataset up to this size is mapped,
      united, shuffled and joined in the driver, stage outputs up to it are read and
      published here, as is an input one read task would take alone.
    - `gather_bytes` (`ray.gather_mb`): the most one gather brings into the driver.
    - `model_rows` (`ray.driver_rows`): a model that can run in the driver (a CPU model,
      loaded once per process) takes up to this many rows itself, not an actor pool."""

    driver_bytes: int
    gather_bytes: int
    model_rows: int

    @classmethod
    def of(cls, config: TkgConfig) -> SizePolicy:
        return cls(driver_bytes=int(config.ray.driver_mb * MB),
                   gather_bytes=int(config.ray.gather_mb * MB),
                   model_rows=config.ray.driver_rows)

    def on_driver(self, ds: Dataset) -> bool:
        """Whether work on `ds` runs in the driver: its blocks are computed and fit."""
        if not isinstance(ds, MaterializedDataset):
            return False
        size = ds.size_bytes()
        return size is not None and size <= self.driver_bytes

    def model_on_driver(self, rows: int) -> bool:
        return rows <= self.model_rows

    def writes_on_driver(self, size: int, threads: int) -> bool:
        """Whether the driver publishes files of `size` bytes itself, `threads` at a time,
        not Ray tasks. A publish streams (`store.write_parts` holds a batch and a row group
        per group, not the files), so what bounds it is time, not memory: up to
        `driver_bytes` per thread; beyond, the cluster's cores share it, a task per batch."""
        return size <= self.driver_bytes * threads

    def reads_on_driver(self, tasks: int, size: int) -> bool:
        """Whether the driver reads an input itself: one task would read it alone (a big
        file is read in spans, a task each) and its `size` bytes fit. A fresh worker took
        0.3-0.5 s to take its first task, most of a night's read of 200 episodes."""
        return tasks == 1 and size <= self.driver_bytes


def policy(ctx: RunContext) -> SizePolicy:
    return SizePolicy.of(ctx.config)


# --- blocks ---------------------------------------------------------------------------------


@ray.remote
def _slice(block: pa.Table, start: int, end: int) -> pa.Table:
    return block.slice(start, end - start)


def _block_refs_with_rows(ds: Dataset) -> list[ray.ObjectRef]:
    """The blocks of `ds` (executed) that hold rows, in order."""
    refs = []
    for bundle in ds.materialize().iter_internal_ref_bundles():
        for entry, part in zip(bundle.blocks, bundle.slices, strict=True):
            if part is None:
                if entry.metadata.num_rows:
                    refs.append(entry.ref)
            elif part.end_offset > part.start_offset:
                refs.append(_slice.remote(entry.ref, part.start_offset, part.end_offset))
    return refs


def nonempty(ds: Dataset) -> MaterializedDataset | None:
    """`ds` executed with its empty blocks dropped, or None when it has no rows at all.

    Ray Data passes an empty block through `map_batches` without calling the function, so
    the block keeps the schema it had before the map (or none, after a shuffle partition
    that received no rows). A hash shuffle or join sends the first block of each input to
    every partition to spread the schema; when that block is such an empty one, the
    partitions later fail to concatenate it with real rows or look up a key column it
    lacks. This is the one guard: every shuffle and join goes through it."""
    if isinstance(ds, DriverDataset):
        tables = [table for table in ds.tables if table.num_rows]
        return (ds if len(tables) == len(ds.tables) else DriverDataset(tables)) if tables else None
    executed = ds.materialize()
    sizes = [entry.metadata.num_rows if part is None else part.end_offset - part.start_offset
             for bundle in executed.iter_internal_ref_bundles()
             for entry, part in zip(bundle.blocks, bundle.slices, strict=True)]
    if sizes and all(sizes):
        return executed  # nothing to drop: no new dataset (a metadata task per block)
    refs = _block_refs_with_rows(executed)
    return ray.data.from_arrow_refs(refs) if refs else None


def stream(ds: Dataset) -> Iterator[pa.Table]:
    """The Arrow blocks of `ds` one at a time, in order (the driver holds one block; the
    tables of a `DriverDataset` are here already)."""
    if isinstance(ds, DriverDataset):
        yield from ds.tables
        return
    for ref in ds.to_arrow_refs():
        yield ray.get(ref)


def columns(ds: Dataset) -> list[str]:
    """The column names of `ds` (of its first block; none without blocks)."""
    if isinstance(ds, DriverDataset):
        return ds.tables[0].column_names if ds.tables else []
    found = ds.schema()
    return list(found.names) if found is not None else []


def _blocks(ds: Dataset) -> list[pa.Table]:
    """The Arrow blocks of `ds` that hold rows, in this process (only for what the policy
    placed on the driver)."""
    return [block for block in stream(ds) if block.num_rows]


def _gathered(tables: list[pa.Table]) -> Dataset:
    """Tables made in the driver as one dataset: one block when they share a schema (fewer
    objects to put and get back), else a block each, as Ray Data would hold them."""
    if not tables:
        return empty_dataset()
    if len(tables) > 1 and all(t.schema.equals(tables[0].schema) for t in tables[1:]):
        tables = [pa.concat_tables(tables)]
    return from_tables(tables)


def as_dataset(table: pa.Table) -> Dataset:
    """A table made in the driver as a dataset (no rows: the empty dataset)."""
    return from_tables([table]) if table.num_rows else empty_dataset()


def _small(ds: MaterializedDataset, ctx: RunContext) -> pa.Table | None:
    """All rows of `ds` as one table on the driver when the policy places it there, else
    None. A night's rows, and a small store's, are shuffled and joined faster here than by
    Ray Data's hash shuffle (the 5,000 + 200 bench's incremental facts stage, about 20
    shuffles and joins of a few thousand rows, took 29 s on the loaded machine where its
    arithmetic takes under 1 s)."""
    if not policy(ctx).on_driver(ds):
        return None
    tables = _blocks(ds)
    return concat(tables) if tables else None


def concat(tables: Sequence[pa.Table]) -> pa.Table:
    """Blocks as one table in the driver. Blocks of one schema are concatenated as they
    are; blocks whose types differ are conformed first to the schema Ray's union gives them
    (`_union_on_ray`: string and large_string become large_string). Ray Data's joins hand
    back large_string where the driver's blocks hold string, so a night whose store went to
    Ray Data and whose own rows stayed here failed in embed ("Unable to merge: Field
    embed_text has incompatible types", `ray.driver_mb: 16` into a 10,000-episode store)."""
    try:
        return pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        target = pa.unify_schemas([t.schema for t in tables], promote_options="permissive")
        return pa.concat_tables([schema.conform(t, target) for t in tables],
                                promote_options="default")


def map_on_driver(ds: Dataset, fn: Callable[[pa.Table], pa.Table]) -> Dataset:
    """`fn` over each Arrow block of `ds` that holds rows, in this process; an empty block
    is skipped, as Ray Data passes it by without a call."""
    return _gathered([fn(block) for block in _blocks(ds)])


# --- the interface ----------------------------------------------------------------------------


def map(ctx: RunContext, ds: Dataset, fn: Block, *fn_args: object,
        **ray_options: Any) -> Dataset:
    """`fn(block, *fn_args)` over the Arrow blocks of `ds`: in the driver, block by block,
    when the policy places `ds` there; otherwise a Ray Data `map_batches` with
    `ray_options`. Every `fn` is row-local or takes whole blocks (batch_size=None), so both
    agree."""
    if policy(ctx).on_driver(ds):
        return map_on_driver(ds, lambda block: fn(block, *fn_args))
    return ds.map_batches(fn, batch_format="pyarrow", fn_args=fn_args, **ray_options)


def map_on_workers(ds: Dataset, fn: Callable[[pa.Table], pa.Table]) -> Dataset:
    """`fn` over the blocks of `ds` in Ray workers whatever the size (fault injection: a
    worker that dies must not be the driver)."""
    return ds.map_batches(fn, batch_format="pyarrow")


def union(ctx: RunContext, first: Dataset, *others: Dataset) -> Dataset:
    """The rows of every dataset, one after the other, gathered in the driver when the
    policy places each there."""
    parts = (first, *others)
    if not others:
        return first  # Ray plans a union of one dataset as an error (needs two children)
    if not all(policy(ctx).on_driver(ds) for ds in parts):
        return _union_on_ray(parts)
    return _gathered([block for ds in parts for block in _blocks(ds)])


def _union_on_ray(parts: Sequence[Dataset]) -> Dataset:
    """Ray Data's union of `parts`, its blocks in one schema: the blocks without rows are
    dropped (Ray passes an empty block through a map unchanged, so it keeps the schema it had
    before the map), and each remaining block is conformed to the union of every block's
    schema, as the driver's `pa.concat_tables(promote_options="default")` does: a column a
    block lacks is null there (types are widened where the driver's would fail; blocks that
    no one schema holds pass as they are). Ray's union takes its parts' blocks as they are;
    the shuffle after it then failed on blocks of two schemas (the 1,000,000-episode build's
    facts stage, record statements with and without `tonight`)."""
    present = [rows for ds in parts if (rows := nonempty(ds)) is not None]
    if not present:
        return empty_dataset()
    schemas = [_block_schemas(ds) for ds in present]
    try:
        target = pa.unify_schemas([s for each in schemas for s in each],
                                  promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # no one schema: the blocks as they are
        target = None
    conformed = [ds if target is None or all(s.equals(target) for s in each)
                 else ds.map_batches(_promoted, batch_format="pyarrow", fn_args=(target,))
                 for ds, each in zip(present, schemas, strict=True)]
    return conformed[0] if len(conformed) == 1 else conformed[0].union(*conformed[1:])


@ray.remote
def _schema_of(block: pa.Table) -> pa.Schema:
    return block.schema


def _block_schemas(ds: MaterializedDataset) -> list[pa.Schema]:
    """The distinct schemas of the blocks of `ds`: a bundle of one block carries its
    block's; a bundle of several carries one of theirs, so each is asked (a task that
    returns the schema, not the block)."""
    found: list[pa.Schema] = []
    for bundle in ds.iter_internal_ref_bundles():
        if len(bundle.blocks) == 1 and isinstance(bundle.schema, pa.Schema):
            schemas = [bundle.schema]
        else:
            schemas = ray.get([_schema_of.remote(ref) for ref in bundle.block_refs])
        found += [s for s in schemas if not any(s.equals(f) for f in found)]
    return found


def _promoted(block: pa.Table, target: pa.Schema) -> pa.Table:
    """`block` in `target`'s columns and types, a column it lacks null."""
    return schema.conform(block, target)


def partition(ctx: RunContext, ds: Dataset, keys: list[str]) -> Dataset:
    """Hash-shuffled by `keys` and materialized: every key's rows share one block."""
    rows = nonempty(ds)
    if rows is None:
        return empty_dataset()
    if (local := _small(rows, ctx)) is not None:
        return as_dataset(local)  # one block holds every key
    return nonempty(rows.repartition(ctx.partitions, keys=keys)) or empty_dataset()


def shuffle(ctx: RunContext, ds: Dataset, keys: list[str], fn: Block, *fn_args: object,
            partitions: int | None = None) -> Dataset:
    """Hash-shuffle by `keys` (every key's rows land in one block, bounded by the largest
    key, not the dataset), then run `fn` once per block: what Ray's map_groups does, without
    a Python call and a table per group. No rows in gives an empty dataset out, without
    calling fn."""
    rows = nonempty(ds)
    if rows is None:
        return empty_dataset()
    if (local := _small(rows, ctx)) is not None:
        return as_dataset(fn(local, *fn_args))  # one block: every key whole
    out = rows.repartition(partitions or ctx.partitions, keys=keys).map_batches(
        fn, batch_size=None, batch_format="pyarrow", fn_args=fn_args)
    return nonempty(out) or empty_dataset()


def join(ctx: RunContext, left: Dataset, right: Dataset, join_type: str,
         on: tuple[str, ...]) -> Dataset:
    """`left` joined with `right` on `on`, holding when either side has no rows (a Ray join
    of an empty side fails on its missing key columns): an empty left gives nothing, an
    empty right gives nothing (inner) or the left rows unchanged (left_outer, left_anti;
    the right's columns are filled in by whoever reads them). Both sides small: in the
    driver. Only the right small: each block of the left joined with the whole right in a
    map (a broadcast join; every join here keeps the left's rows, so a block needs no
    other). Ray Data's hash join shuffled both sides: a night into the 160,000-episode
    synthetic store joined the stored facts (their vectors included) with a few edge ids
    that way four times in `versions`."""
    left_rows = nonempty(left)
    if left_rows is None:
        return empty_dataset()
    right_rows = nonempty(right)
    if right_rows is None:
        return empty_dataset() if join_type == "inner" else left_rows
    if (small_right := _small(right_rows, ctx)) is None:
        return left_rows.join(right_rows, join_type=join_type, num_partitions=ctx.partitions,
                              on=on)
    if (small_left := _small(left_rows, ctx)) is not None:
        return as_dataset(_join_tables(small_left, small_right, join_type, list(on)))
    return left_rows.map_batches(_join_tables, batch_size=None, batch_format="pyarrow",
                                 fn_args=(small_right, join_type, list(on)))


def _join_tables(left: pa.Table, right: pa.Table, join_type: str, on: list[str]
                 ) -> pa.Table:
    """`join` of two tables on the driver: the keys matched by polars, the rows taken by
    Arrow (Arrow's own join refuses list columns, which facts and entities carry); left
    columns, then the right's others, as Ray's join gives them. The bigger side is first
    cut to the rows whose every key the other side holds (`_matchable`), which only they
    can match: taking a few rows of a many-chunked table (the stored facts' vectors, read
    file by file) concatenated every chunk first (0.68 s of the 160,000-episode night's
    embed, for 4,839 rows), and the keys of every stored mention became a polars frame to
    meet a few hundred names (0.24 s of that night's resolve)."""
    if right.num_rows > left.num_rows:
        right = right.filter(_matchable(right, left, on))
    elif join_type != "left_outer" and left.num_rows > right.num_rows:
        maybe = _matchable(left, right, on)
        if join_type == "inner":
            return _matched(left.filter(maybe), right, join_type, on)
        # left_anti: a row that no key of the right can match is kept, in its place
        candidates = pc.indices_nonzero(maybe)
        found = _matched(left.take(candidates).append_column("_at", candidates), right,
                         "inner", on)["_at"].to_numpy()
        keep = np.ones(left.num_rows, dtype=bool)
        keep[found] = False
        return left.filter(pa.array(keep))
    return _matched(left, right, join_type, on)


def _matched(left: pa.Table, right: pa.Table, join_type: str, on: list[str]) -> pa.Table:
    """`_join_tables` without its cuts."""
    import polars as pl

    keys_left = pl.from_arrow(left.select(on)).with_row_index("_left")
    keys_right = pl.from_arrow(right.select(on)).with_row_index("_right")
    if join_type == "left_anti":
        kept = keys_left.join(keys_right, on=on, how="anti")["_left"]
        return left.take(kept.to_arrow())
    how = {"inner": "inner", "left_outer": "left"}[join_type]
    pairs = keys_left.join(keys_right, on=on, how=how).sort("_left", maintain_order=True)
    out = left.take(pairs["_left"].to_arrow())
    others = right.drop_columns(on).take(pairs["_right"].to_arrow())
    for name, column in zip(others.column_names, others.columns, strict=True):
        out = out.append_column(name, column)
    return out


def _matchable(rows: pa.Table, other: pa.Table, on: list[str]) -> pa.Array:
    """Which of `rows` have every key in `other`'s values of that key (a null key matches
    nothing, as in the join); every row where two key types do not compare."""
    mask = pa.array(np.ones(rows.num_rows, dtype=bool))  # (and_ of every key's test)
    for key in on:
        try:
            values = pc.unique(other[key]).cast(rows.schema.field(key).type)
            found = pc.fill_null(pc.is_in(rows[key], value_set=values), False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            continue
        mask = pc.and_(mask, found)
    return mask


def gather(ctx: RunContext, ds: Dataset | None, columns: Sequence[str] | None = None, *,
           table_schema: pa.Schema | None = None, what: str = "rows") -> pa.Table:
    """`columns` (all: None) of every row of `ds` as one table in the driver, block by block;
    with `table_schema`, each block conformed to it. No rows: an empty table (of
    `table_schema`, or of string `columns`). Past `ray.gather_mb` it raises
    `DriverLimitError` naming `what`: the driver never holds more than the policy allows."""
    rows = None if ds is None else nonempty(ds)
    limit = policy(ctx).gather_bytes
    tables, held = [], 0
    for block in stream(rows) if rows is not None else ():
        if columns is not None:
            block = block.select(list(columns))
        if table_schema is not None:
            block = schema.conform(block, table_schema)
        held += block.nbytes
        if held > limit:
            raise DriverLimitError(
                f"gathering {what} ({', '.join(block.column_names)}) into the driver passed "
                f"ray.gather_mb = {limit / MB:g} MB: raise it, or give the driver more memory")
        tables.append(block)
    if tables:
        return concat(tables)
    if table_schema is not None:
        return table_schema.empty_table()
    return pa.table({c: pa.array([], pa.string()) for c in columns or []})


def total(ds: Dataset, fn: Callable[[pa.Table], int]) -> int:
    """The sum of `fn(block)` over the blocks of `ds`, streamed (the driver holds one)."""
    rows = nonempty(ds)
    return sum(fn(block) for block in stream(rows)) if rows is not None else 0


def run_tasks(task: Any, calls: Iterable[tuple]) -> list:
    """One Ray task of the remote function `task` per argument tuple; their results."""
    return ray.get([task.remote(*args) for args in calls])


def task_blocks(ctx: RunContext, task: Any, calls: Sequence[tuple], blocks: int, *,
                local: Callable[..., tuple] | None = None, size: int = 0
                ) -> tuple[list[Dataset], list[Any]]:
    """One Ray task of the remote function `task` per argument tuple, returning (with
    `num_returns` = `blocks` + 1) `blocks` tables and then (a small value, the tables'
    `datasets.block_metadata`, computed in the task where the tables are): a dataset per
    position, each task's table one of its blocks, and the small values. The tables stay in
    the object store, so the driver holds none of them (a read of every input file used to
    bring the whole input here and put it back). `local`: the task's function in this
    process (the tables, then the small value alone), which the driver runs itself where
    the policy says (`SizePolicy.reads_on_driver`, of the `size` bytes the calls read)."""
    if not calls:
        return [empty_dataset() for _ in range(blocks)], []
    if local is not None and policy(ctx).reads_on_driver(len(calls), size):
        done = [local(*args) for args in calls]
        return ([from_tables([tables[position] for tables in done])
                 for position in range(blocks)], [tables[blocks] for tables in done])
    returned = [task.remote(*args) for args in calls]
    smalls = ray.get([refs[-1] for refs in returned])
    datasets = [from_block_refs([refs[position] for refs in returned],
                                [metadata[position] for _, metadata in smalls])
                for position in range(blocks)]
    return datasets, [small for small, _ in smalls]


def shuffle_together(ctx: RunContext, parts: dict[str, Dataset], keys: list[str],
                     tag: Callable[[pa.Table, str], pa.Table], fn: Block,
                     *fn_args: object, partitions: int | None = None) -> Dataset:
    """The rows of several datasets in one `shuffle` by `keys` (into `partitions`):
    `tag(block, name)` puts each part's blocks in one schema, marked with the part's name,
    and `fn` sees every part's rows of a key in one block (a join of many sides, bounded by
    the largest key's block). In the driver, in one step, when the policy places every part
    there; a part without rows is left out, so `fn` finds none of its name."""
    present = {name: rows for name, ds in parts.items() if (rows := nonempty(ds)) is not None}
    local = {name: _small(rows, ctx) for name, rows in present.items()}
    if not present:
        return empty_dataset()
    if all(table is not None for table in local.values()):
        return as_dataset(fn(pa.concat_tables([tag(table, name) for name, table in local.items()]),
                             *fn_args))
    marked = [map(ctx, rows, tag, name) for name, rows in present.items()]
    return shuffle(ctx, union(ctx, *marked), keys, fn, *fn_args, partitions=partitions)
