"""LanceDB tables and indexes of a snapshot, built at publish.

One LanceDB database per snapshot, under `SNAPSHOT/lance/`, with one table per searchable
kind: facts (every version: `known_at` needs the expired ones), entities, communities and
episodes. Each table holds

- `row`: the row's position (int64), so a hit maps to its in-memory metadata in O(1);
- `group_id` with a BITMAP index: every search prefilters on it;
- `text` with a native full-text (BM25) index: fact / name + summary / content;
- `vector`: the embedding (fixed-size float32 list), with no index below
  `query.ann_min_rows` rows (exact search) and an IVF index from there on;
- `<time>_us` int64 copies of the time columns, nulls replaced by far-past / far-future
  sentinels, so bi-temporal filters are integer comparisons built from integers we format;
- `_hash`: a digest of the row's other columns, what a later publish compares;
- the table's other columns, unchanged (what results are hydrated from).

A first publish writes each table whole into `SNAPSHOT/lance/`, `row` numbering the rows in
sort order. A later publish extends the table it builds on instead (`extend`): the rows
whose digest changed are deleted and the new ones added under new `row` keys, and LanceDB
adds them to the existing indexes, as a new version of that table; each snapshot's manifest
names the version it reads, so an earlier snapshot reads what it always read. `row` is then
a key, not a position: the rows in sort order, with their keys, are `table_arrays`' meta.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tkg.pipeline import schema, storage, table_arrays
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.postings import STOP_WORDS  # (the tokenizer's: one list for both BM25s)
from tkg.pipeline.storage import Location

os.environ.setdefault("LANCE_LOG", "error")  # lance logs deprecation notes per query

LANCE_DIR = "lance"
PAST = -(2**62)  # sentinel for "since forever" (null valid_at / created_at)
FUTURE = 2**62  # sentinel for "still open" (null invalid_at / expired_at)
# Rows of a published table the driver holds at once while building its LanceDB table. A
# table of more rows is sorted out of core (`_sorted_chunks`): read into the driver whole,
# the 1,000,000-episode bench's published tables (1,000,000 episode vectors, 696,550 fact
# vectors) took the machine's available memory down to 6.1 GB before publish ended.
# 65,536 rows of the widest table (episodes: content and a 384-float vector) are ~150 MB.
CHUNK_ROWS = 65_536
RANK = "_rank"  # a row's position in the table's sort order, while it is sorted
HASH = table_arrays.HASH  # a row's digest: polars' hash_rows of its other columns but `row`
log = logging.getLogger("tkg.pipeline.index")


@dataclass(frozen=True)
class TableSpec:
    """How one published table becomes a searchable LanceDB table."""

    name: str
    key: str
    vector: str
    text: tuple[str, ...]  # columns joined with a space into `text`
    order: tuple[str, ...]  # sort keys, so `row` is deterministic
    times: tuple[tuple[str, int], ...]  # (timestamp column, sentinel for null)


SPECS: dict[str, TableSpec] = {
    "facts": TableSpec("facts", "edge_id", "fact_embedding", ("fact",),
                       ("group_id", "edge_id", "version"),
                       (("valid_at", PAST), ("invalid_at", FUTURE), ("created_at", PAST),
                        ("expired_at", FUTURE))),
    "entities": TableSpec("entities", "entity_id", "name_embedding", ("name", "summary"),
                          ("group_id", "entity_id"),
                          (("created_at", PAST), ("first_seen", PAST))),
    "communities": TableSpec("communities", "community_id", "name_embedding",
                             ("name", "summary"), ("group_id", "community_id"),
                             (("created_at", PAST),)),
    "episodes": TableSpec("episodes", "episode_id", "content_embedding", ("content",),
                          ("group_id", "valid_at", "episode_id"),
                          (("valid_at", PAST), ("created_at", PAST))),
}


def micros(column: pa.ChunkedArray | pa.Array, sentinel: int) -> pa.Array:
    """Timestamps as int64 microseconds since the epoch, nulls as the sentinel."""
    values = pc.cast(column, pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return pc.fill_null(values, sentinel)


def searchable(table: pa.Table, spec: TableSpec, dim: int) -> pa.Table:
    """The LanceDB form of a published table (see the module docstring)."""
    table = table.sort_by([(c, "ascending") for c in spec.order]) if table.num_rows else table
    return _searchable_rows(table, spec, dim, 0)


def _searchable_rows(table: pa.Table, spec: TableSpec, dim: int, first_row: int) -> pa.Table:
    """The LanceDB form of rows already in sort order, the first of them at `first_row`."""
    texts = [pc.fill_null(table[c], "") for c in spec.text]
    text = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, " ")
    columns = {
        "row": pa.array(np.arange(first_row, first_row + table.num_rows, dtype=np.int64)),
        "text": text,
        "vector": table[spec.vector].cast(schema.vector(dim)),
        **{f"{c}_us": micros(table[c], s) for c, s in spec.times},
    }
    for field in table.schema:
        if field.name != spec.vector:
            columns[field.name] = table[field.name]
    rows = pa.table(columns)
    return rows.append_column(HASH, digests(rows))


def digests(rows: pa.Table) -> pa.Array:
    """One 64-bit digest per row of every column but `row` (and an earlier digest): equal
    rows, equal digests, within one version of polars (a new version may change them all,
    which makes the next publish build its tables whole: `MAX_CHANGED_SHARE`)."""
    content = rows.drop_columns([c for c in ("row", HASH) if c in rows.column_names])
    if not content.num_rows:
        return pa.array([], pa.uint64())
    return pl.from_arrow(content).hash_rows(seed=0).to_arrow()


# k-means iterations of an IVF_PQ index's training (its partitions and its PQ codebooks).
# The PQ codebooks' k-means is the cost of publishing a table of 10^5 rows or more: 157,937
# synthetic fact vectors took 26-35 s at 20 iterations, 13-14 s at 5 (both cores; ~1 s an
# iteration over ~7.5 s of the rest), and a night into a 160,000-episode store indexes two
# such tables. Recall@10 against an exact scan, real MiniLM vectors (15,012 of a LoCoMo
# store, 200 held-out queries, refine 4 as searched): 4 partitions, all probed: 0.989 /
# 0.993 at 20, 0.987 / 0.988 at 5; 60 partitions, 6 probed (a tenth, as 24 of 1,000,000
# rows' 245): 0.954 / 0.952 / 0.961 at 20, 0.957 / 0.950 / 0.953 at 5. Training samples
# at random, so two builds at 20 differ by as much.
PQ_ITERATIONS = 5


def _vector_index(rows: int, dim: int, config: QueryConfig) -> Any:
    from lancedb.index import HnswSq, IvfPq, IvfSq

    partitions = max(1, math.ceil(rows / config.ann_rows_per_partition))
    if config.ann_index == "IVF_PQ":
        sub_vectors = next(s for s in (dim // 8, dim // 4, dim // 2, dim, 1) if s and dim % s == 0)
        return IvfPq(distance_type="cosine", num_partitions=partitions,
                     num_sub_vectors=sub_vectors, max_iterations=PQ_ITERATIONS)
    if config.ann_index == "IVF_SQ":
        return IvfSq(distance_type="cosine", num_partitions=partitions, max_iterations=20)
    return HnswSq(distance_type="cosine", num_partitions=partitions, max_iterations=20)


def index_table(db: Any, spec: TableSpec, data: pa.Table, dim: int,
                config: QueryConfig) -> dict[str, Any]:
    """Write one LanceDB table of an in-memory table and its indexes; returns what was
    built (for the manifest)."""
    return _write_indexed(db, spec, searchable(data, spec, dim), data.num_rows, dim, config)


def _write_indexed(db: Any, spec: TableSpec, data: pa.Table | pa.RecordBatchReader,
                   rows: int, dim: int, config: QueryConfig) -> dict[str, Any]:
    """Write one LanceDB table (a reader is written as it streams) and build its indexes.
    LanceDB reads the written table for each index, and trains IVF_PQ on a sample of it
    (`sample_rate` x partitions rows), so no index needs the table in the driver."""
    from lancedb.index import FTS, Bitmap, BTree

    started = time.perf_counter()
    # "create" where the table is new (a publish writes into a fresh snapshot): LanceDB logs
    # a WARN line per table on stderr for "overwrite" of a table that does not exist yet,
    # whatever LANCE_LOG says; "overwrite" where a resumed publish left one
    mode = "overwrite" if spec.name in db.list_tables().tables else "create"
    table = db.create_table(spec.name, data, mode=mode)
    built: dict[str, Any] = {"rows": rows, "vector_index": "exact"}
    if rows:
        table.create_index("group_id", config=Bitmap())
        table.create_index("row", config=BTree())
        table.create_index("text", config=FTS(with_position=False,
                                              custom_stop_words=list(STOP_WORDS)))
        if rows >= config.ann_min_rows:
            table.create_index("vector", config=_vector_index(rows, dim, config))
            built["vector_index"] = config.ann_index
    built.update(seconds=round(time.perf_counter() - started, 3), version=table.version,
                 appends=0, unindexed=0)
    return built


# A later publish extends a table rather than build it whole while both hold: at most this
# many extensions since it was last built whole (each adds a delta to every index, which a
# search reads besides the others), and at most this share of its rows changed (the
# indexes' partitions were trained on the rows of then). `tkg bench incremental --episodes
# 160000 --new 200 --embed synthetic --extract synthetic`: building the episodes and facts
# tables whole took 16.8 s each (IVF_PQ 13.2 s of it); extending them 0.4-0.5 s (episodes:
# this run's 200 rows alone) and 2.5-2.8 s (facts: 1,434 rows added and 661 deleted, most
# of it reading the published rows to compare their digests). Delete, add and index: about
# 0.1 s for 200 rows into 160,000.
MAX_APPENDS = 16
MAX_CHANGED_SHARE = 0.25
# An extension leaves the rows it adds outside the indexes (LanceDB searches them exactly,
# beside the indexed ones) until they pass this share of the table; then `optimize` adds
# them to every index, each index merged whole: 1.1-1.3 s of a 200-episode night on the
# 160,000-episode store (facts and episodes), against 0.1 s on the 10,000-episode one. On
# that store, 60 fact texts searched (`tkg.query.open(...).search`) gave the same top five
# facts either way, at a p50 of 22.8 ms unindexed against 23.9 ms indexed.
MAX_UNINDEXED_SHARE = 0.1
KEEP_VERSIONS = timedelta(days=36_500)  # LanceDB's clean-up never removes a pinned version
DELETE_BATCH = 4_096  # row keys per delete statement


@dataclass(frozen=True)
class Extendable:
    """The previous snapshot's LanceDB table of a kind, which a publish may extend: its
    folder, the version that snapshot reads, and its extensions since it was built whole."""

    folder: Location
    version: int
    appends: int
    arrays: Location | None = None  # the `table_arrays` of that version (their LANCE dir)
    unindexed: int = 0  # rows added since the indexes last took rows in (`optimize`)


def _layout(table_schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    return [(f.name, f.type) for f in table_schema]


def _stored_digests(table: Any, key: str) -> pl.DataFrame:
    """(key, digest, row) of every row of a LanceDB table, as checked out."""
    rows = table.count_rows()
    found = table.search().select([key, HASH, "row"]).limit(max(rows, 1)).to_arrow()
    return pl.from_arrow(found).unique(subset=[key, HASH], keep="first")


def _extend(base: Extendable, spec: TableSpec, data: pa.Table | pa.RecordBatchReader,
            rows: int, dim: int, config: QueryConfig, grown: bool = False,
            replaced: bool = False) -> dict[str, Any] | None:
    """Extend the table of `base` to hold `data` (its rows in any order; those it adds go
    in sort order): a new version
    without the rows whose digest no longer occurs and with the new ones, its indexes
    extended; None where the rules above ask for a whole build (nothing written then).
    `grown`: `data` is only the rows to add (a table that grows: its stored rows stay as
    they are, so none is read to be compared). `replaced`: `data` is every row of some
    keys, and the stored rows of every other key stay as they are: only the stored rows
    of those keys are compared (the 160,000-episode night read and digested every
    published fact, 1.5 s, to find 5,000 that changed)."""
    started = time.perf_counter()
    table = connect(base.folder).open_table(spec.name)
    table.checkout(base.version)
    if base.appends >= MAX_APPENDS or HASH not in table.schema.names:
        return None
    every = _stored_digests(table, spec.key)
    stored = every
    if replaced:
        data = data if isinstance(data, pa.Table) else data.read_all()
        stored = every.filter(pl.col(spec.key).is_in(pl.from_arrow(data[spec.key])))
    size = rows + every.height if grown else every.height if replaced else rows
    changes = _changes(stored, data, spec, table.schema, grown, MAX_CHANGED_SHARE * size)
    if not size or changes is None:
        return None
    added, gone = changes
    rows = every.height - len(gone) + added.num_rows if replaced else size
    table.restore()  # the version the previous snapshot reads becomes the latest
    for start in range(0, len(gone), DELETE_BATCH):
        table.delete("row IN (" + ", ".join(str(int(k)) for k in
                                             gone[start:start + DELETE_BATCH]) + ")")
    if added.num_rows:
        first = int(every["row"].max()) + 1 if every.height else 0
        keys = pa.array(np.arange(first, first + added.num_rows, dtype=np.int64))
        table.add(added.set_column(added.schema.get_field_index("row"), "row", keys))
    indexed = {tuple(i.columns) for i in table.list_indices()}
    if rows >= config.ann_min_rows and ("vector",) not in indexed:
        table.create_index("vector", config=_vector_index(rows, dim, config))
        indexed.add(("vector",))
    unindexed = base.unindexed + added.num_rows
    if unindexed > MAX_UNINDEXED_SHARE * rows:
        table.optimize(cleanup_older_than=KEEP_VERSIONS)
        unindexed = 0
    return {"rows": rows, "vector_index": config.ann_index if ("vector",) in indexed
            else "exact", "added": added.num_rows, "deleted": len(gone),
            "seconds": round(time.perf_counter() - started, 3), "version": table.version,
            "appends": base.appends + 1, "unindexed": unindexed}


def _changes(stored: pl.DataFrame, data: pa.Table | pa.RecordBatchReader, spec: TableSpec,
             table_schema: pa.Schema, grown: bool, budget: float
             ) -> tuple[pa.Table, np.ndarray] | None:
    """The rows of `data` to add (their digest is not stored) and the stored `row` keys to
    delete (their digest no longer occurs); None past `budget` changed rows, or where
    `data` has another layout than the stored table (a newer tkg): built whole then."""
    layout = _layout(table_schema)
    added: list[pa.Table] = []
    matched: list[np.ndarray] = []
    changed = 0
    for batch in (data.to_batches() if isinstance(data, pa.Table) else data):
        chunk = pa.Table.from_batches([batch])
        if _layout(chunk.schema) != layout:
            return None
        if grown:
            added.append(chunk)
        else:
            found = pl.from_arrow(chunk.select([spec.key, HASH])).join(
                stored, on=[spec.key, HASH], how="left", maintain_order="left")["row"]
            matched.append(found.drop_nulls().to_numpy())
            added.append(chunk.filter(found.is_null().to_arrow()))
        changed += added[-1].num_rows
        if changed > budget:
            return None
    old = stored["row"].to_numpy()
    gone = old[:0] if grown else old[~np.isin(old, np.concatenate(matched) if matched
                                              else old[:0])]
    if changed + len(gone) > budget:
        return None
    rows = pa.concat_tables(added) if added else table_schema.empty_table()
    if rows.num_rows and not grown:  # (Arrow's sort is stable: ties keep the files' order,
        # as in the sort of the whole table)
        rows = rows.take(pc.sort_indices(rows, sort_keys=[(c, "ascending")
                                                          for c in spec.order]))
    return rows, gone


def _file_batches(location: Location, table_schema: pa.Schema,
                  chunk_rows: int) -> Iterator[pa.Table]:
    """One published Parquet file in batches of at most `chunk_rows`, in `table_schema`
    (a file an older snapshot wrote may lack a newer nullable column: `schema.conform`)."""
    fs, path = storage.resolve(location)
    with fs.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        present = set(parquet.schema_arrow.names)
        columns = [f.name for f in table_schema if f.name in present]
        for batch in parquet.iter_batches(batch_size=chunk_rows, columns=columns):
            yield schema.conform(pa.Table.from_batches([batch]), table_schema)


def _ranks(files: Sequence[Location], spec: TableSpec, table_schema: pa.Schema,
           chunk_rows: int) -> np.ndarray:
    """Each row's position in the table's sort order (rows numbered file by file), from
    its sort keys alone (a few columns: 1,000,000 fact keys are ~100 MB)."""
    keys_schema = pa.schema([table_schema.field(c) for c in spec.order])
    keys = pa.concat_tables([batch for f in files
                             for batch in _file_batches(f, keys_schema, chunk_rows)])
    order = pc.sort_indices(keys, sort_keys=[(c, "ascending") for c in spec.order])
    ranks = np.empty(keys.num_rows, dtype=np.int64)
    ranks[order.to_numpy()] = np.arange(keys.num_rows, dtype=np.int64)
    return ranks


def _sorted_chunks(files: Sequence[Location], spec: TableSpec, table_schema: pa.Schema,
                   rows: int, chunk_rows: int) -> Iterator[pa.Table]:
    """The table's rows in sort order, `chunk_rows` at a time, never all in the driver: one
    pass writes each row to the local Arrow file of its chunk of ranks, then each chunk
    is read back and sorted (the same order as `searchable`'s sort of the whole table:
    Arrow's sort is stable and rows are numbered in the same file order)."""
    ranks = _ranks(files, spec, table_schema, chunk_rows)
    spilled = table_schema.append(pa.field(RANK, pa.int64()))
    with tempfile.TemporaryDirectory(prefix=f"tkg-index-{spec.name}-") as folder:
        paths = [Path(folder) / f"{n:05d}.arrow" for n in range(math.ceil(rows / chunk_rows))]
        writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
        offset = 0
        try:
            for f in files:
                for batch in _file_batches(f, table_schema, chunk_rows):
                    batch_ranks = ranks[offset:offset + batch.num_rows]
                    offset += batch.num_rows
                    batch = batch.append_column(RANK, pa.array(batch_ranks))
                    chunks = batch_ranks // chunk_rows
                    for n in np.unique(chunks):
                        if n not in writers:
                            writers[n] = pa.ipc.new_file(paths[n], spilled)
                        writers[n].write_table(batch.filter(pa.array(chunks == n)))
        finally:
            for writer in writers.values():
                writer.close()
        for path in paths:
            with pa.memory_map(str(path)) as source:
                chunk = pa.ipc.open_file(source).read_all().sort_by(RANK)
            yield chunk.drop_columns([RANK])


def _unsorted(snapshot: Location, spec: TableSpec, dim: int,
              files: Mapping[str, Sequence[Location]] | None, chunk_rows: int
              ) -> tuple[pa.RecordBatchReader, int]:
    """A published table's rows in LanceDB form, file by file as stored, and how many there
    are: what an extension compares (`_changes` puts the rows it adds in sort order). The
    sort of every row cost the 160,000-episode night's facts 1.7 s of its publish."""
    listed = (files or {}).get(spec.name)
    listed = published_files(snapshot, spec.name) if listed is None else listed
    table_schema = schema.PUBLISHED[spec.name](dim)
    target = _searchable_rows(table_schema.empty_table(), spec, dim, 0).schema

    def batches() -> Iterator[pa.RecordBatch]:
        for f in listed:
            for chunk in _file_batches(f, table_schema, chunk_rows):
                yield from _searchable_rows(chunk, spec, dim, 0).cast(target).to_batches()

    rows = sum(storage.each(storage.parquet_rows, list(listed)))
    return pa.RecordBatchReader.from_batches(target, batches()), rows


def _published_reader(files: Sequence[Location], spec: TableSpec, table_schema: pa.Schema,
                      dim: int, chunk_rows: int) -> tuple[pa.Table | pa.RecordBatchReader, int]:
    """The LanceDB form of a published table's files and its rows: in memory when it
    fits `chunk_rows`, else a reader of its sorted chunks."""
    rows = sum(storage.each(storage.parquet_rows, list(files)))
    if rows <= chunk_rows:
        return searchable(read_published_files(files, table_schema), spec, dim), rows
    target = _searchable_rows(table_schema.empty_table(), spec, dim, 0).schema

    def batches() -> Iterator[pa.RecordBatch]:
        first = 0
        for chunk in _sorted_chunks(files, spec, table_schema, rows, chunk_rows):
            yield from _searchable_rows(chunk, spec, dim, first).cast(target).to_batches()
            first += chunk.num_rows

    return pa.RecordBatchReader.from_batches(target, batches()), rows


def connect(location: Location) -> Any:
    """A LanceDB database at a local folder or an object-store URL (LanceDB's own
    `storage_options`, from the same settings as the rest of tkg)."""
    import lancedb

    return lancedb.connect(str(location), storage_options=storage.lance_options(location))


async def connect_async(location: Location) -> Any:
    import lancedb

    return await lancedb.connect_async(str(location),
                                       storage_options=storage.lance_options(location))


def read_published(snapshot: Location, name: str, dim: int,
                   files: Sequence[Location] | None = None) -> pa.Table:
    """A published table in its declared schema (all groups): of the `files` given (the
    manifest's), else of the Parquet under the snapshot's folder for it."""
    table_schema = schema.PUBLISHED[name](dim)
    if files is None:
        files = published_files(snapshot, name)
    return read_published_files(files, table_schema)


def published_files(snapshot: Location, name: str) -> list[Location]:
    return storage.list_files(storage.join(snapshot, name), suffixes={".parquet"})


def read_published_files(files: Sequence[Location], table_schema: pa.Schema) -> pa.Table:
    if not files:
        return table_schema.empty_table()
    return pa.concat_tables([schema.conform(t, table_schema)
                             for t in storage.each(storage.read_parquet, list(files))])


def build_indexes(snapshot: Location, dim: int, config: QueryConfig,
                  tables: dict[str, pa.Table] | None = None,
                  reused: Collection[str] = (),
                  files: Mapping[str, Sequence[Location]] | None = None,
                  chunk_rows: int = CHUNK_ROWS,
                  bases: Mapping[str, Extendable] | None = None,
                  added: Mapping[str, Sequence[Location]] | None = None,
                  replaced: Mapping[str, Sequence[Location]] | None = None
                  ) -> dict[str, Any]:
    """Build `SNAPSHOT/lance/` from the snapshot's Parquet (its `files` per table, or
    `tables` given in memory, as the query benchmark does), except the `reused` tables
    kept from an earlier snapshot; a table with a base in `bases` is extended there instead
    where it can be (`_extend`: its figures say `"extended": true`); of a table that grows,
    `added` names the files of the rows this snapshot adds (only those are read then); of
    a table whose rows of some keys this snapshot replaced (`Publish.replaces`),
    `replaced` names the files of those keys' rows (only those are read and compared).
    Called by publish
    before the manifest is written, so a published snapshot always has its indexes. A
    table's Parquet streams through the driver `chunk_rows` rows at a time
    (`_sorted_chunks`). Every table's `table_arrays` go to this snapshot's folder. Returns
    per-table figures for the manifest."""
    started = time.perf_counter()
    folder = storage.join(snapshot, LANCE_DIR)
    db = connect(folder)
    figures: dict[str, Any] = {}
    for name, spec in SPECS.items():
        if name in reused:
            continue
        base = (bases or {}).get(name)
        built = None
        if base is not None:
            grown, keyed = name in (added or {}), name in (replaced or {})
            part = added if grown else replaced if keyed else files
            built = _extend(base, spec, *(
                _source(snapshot, spec, dim, tables, part, chunk_rows)
                if grown or keyed or tables is not None else _unsorted(
                    snapshot, spec, dim, files, chunk_rows)), dim, config, grown, keyed)
        if built is None:
            built = _write_indexed(db, spec, *_source(snapshot, spec, dim, tables, files,
                                                      chunk_rows), dim, config)
        figures[name] = {**built, "extended": base is not None and "added" in built}
        table = connect(base.folder if figures[name]["extended"] else folder).open_table(name)
        table.checkout(built["version"])
        # what an open derives, for it to map (`table_arrays`); an extended table's kept
        # rows have the unit vectors of the version it extends
        earlier = (table_arrays.load(base.arrays, name) if figures[name]["extended"]
                   and base is not None and base.arrays is not None else None)
        figures[name]["arrays_s"] = round(table_arrays.write(folder, table, name, config,
                                                             spec.order, earlier), 3)
    figures["seconds"] = round(time.perf_counter() - started, 3)
    log.info("retrieval indexes built in %.1f s", figures["seconds"])
    return figures


def _source(snapshot: Location, spec: TableSpec, dim: int, tables: dict[str, pa.Table] | None,
            files: Mapping[str, Sequence[Location]] | None, chunk_rows: int
            ) -> tuple[pa.Table | pa.RecordBatchReader, int]:
    """A table's rows in LanceDB form (a reader for big ones) and how many there are."""
    data = (tables or {}).get(spec.name)
    if data is not None:
        return searchable(data, spec, dim), data.num_rows
    listed = (files or {}).get(spec.name)
    listed = published_files(snapshot, spec.name) if listed is None else listed
    return _published_reader(listed, spec, schema.PUBLISHED[spec.name](dim), dim, chunk_rows)
