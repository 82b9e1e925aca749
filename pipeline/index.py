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
- the table's other columns, unchanged (what results are hydrated from).

Snapshots are immutable, so these tables are written once and never updated.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import schema, storage
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.storage import Location

os.environ.setdefault("LANCE_LOG", "error")  # lance logs deprecation notes per query

LANCE_DIR = "lance"
PAST = -(2**62)  # sentinel for "since forever" (null valid_at / created_at)
FUTURE = 2**62  # sentinel for "still open" (null invalid_at / expired_at)
log = logging.getLogger("tkg.pipeline.index")

# The English stop words LanceDB 0.40 drops by default (NLTK's list, as tokens: "don't" is
# "don" + "t"), passed to the index at publish so both agree whatever the default becomes.
_STOP_TEXT = """
a about above after again against ain all am an and any are aren as at be because been
before being below between both but by can couldn d did didn do does doesn doing don down
during each few for from further had hadn has hasn have haven having he her here hers
herself him himself his how i if in into is isn it its itself just ll m ma me mightn more
most mustn my myself needn no nor not now o of off on once only or other our ours
ourselves out over own re s same shan she should shouldn so some such t than that the
their theirs them themselves then there these they this those through to too under until
up ve very was wasn we were weren what when where which while who whom why will with won
wouldn y you your yours yourself yourselves
"""
STOP_WORDS: tuple[str, ...] = tuple(_STOP_TEXT.split())


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
    texts = [pc.fill_null(table[c], "") for c in spec.text]
    text = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, " ")
    columns = {
        "row": pa.array(np.arange(table.num_rows, dtype=np.int64)),
        "text": text,
        "vector": table[spec.vector].cast(schema.vector(dim)),
        **{f"{c}_us": micros(table[c], s) for c, s in spec.times},
    }
    for field in table.schema:
        if field.name != spec.vector:
            columns[field.name] = table[field.name]
    return pa.table(columns)


def _vector_index(rows: int, dim: int, config: QueryConfig) -> Any:
    from lancedb.index import HnswSq, IvfPq, IvfSq

    partitions = max(1, math.ceil(rows / config.ann_rows_per_partition))
    if config.ann_index == "IVF_PQ":
        sub_vectors = next(s for s in (dim // 8, dim // 4, dim // 2, dim, 1) if s and dim % s == 0)
        return IvfPq(distance_type="cosine", num_partitions=partitions,
                     num_sub_vectors=sub_vectors, max_iterations=20)
    if config.ann_index == "IVF_SQ":
        return IvfSq(distance_type="cosine", num_partitions=partitions, max_iterations=20)
    return HnswSq(distance_type="cosine", num_partitions=partitions, max_iterations=20)


def index_table(db: Any, spec: TableSpec, data: pa.Table, dim: int,
                config: QueryConfig) -> dict[str, Any]:
    """Write one LanceDB table and its indexes; returns what was built (for the manifest)."""
    from lancedb.index import FTS, Bitmap, BTree

    started = time.perf_counter()
    table = db.create_table(spec.name, searchable(data, spec, dim), mode="overwrite")
    built: dict[str, Any] = {"rows": data.num_rows, "vector_index": "exact"}
    if data.num_rows:
        table.create_index("group_id", config=Bitmap())
        table.create_index("row", config=BTree())
        table.create_index("text", config=FTS(with_position=False,
                                              custom_stop_words=list(STOP_WORDS)))
        if data.num_rows >= config.ann_min_rows:
            table.create_index("vector", config=_vector_index(data.num_rows, dim, config))
            built["vector_index"] = config.ann_index
    built["seconds"] = round(time.perf_counter() - started, 3)
    return built


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
        files = storage.list_files(storage.join(snapshot, name), suffixes={".parquet"})
    if not files:
        return table_schema.empty_table()
    return pa.concat_tables([schema.conform(t, table_schema)
                             for t in storage.each(storage.read_parquet, list(files))])


def build_indexes(snapshot: Location, dim: int, config: QueryConfig,
                  tables: dict[str, pa.Table] | None = None,
                  reused: Collection[str] = (),
                  files: Mapping[str, Sequence[Location]] | None = None) -> dict[str, Any]:
    """Build `SNAPSHOT/lance/` from the snapshot's Parquet (its `files` per table, or
    `tables` given in memory, as the query benchmark does), except the `reused` tables
    kept from an earlier snapshot. Called by publish before the manifest is written, so a
    published snapshot always has its indexes. Returns per-table figures for the manifest."""
    started = time.perf_counter()
    db = connect(storage.join(snapshot, LANCE_DIR))
    figures: dict[str, Any] = {}
    for name, spec in SPECS.items():
        if name in reused:
            continue
        data = (tables or {}).get(name)
        if data is None:
            data = read_published(snapshot, name, dim, (files or {}).get(name))
        figures[name] = index_table(db, spec, data, dim, config)
    figures["seconds"] = round(time.perf_counter() - started, 3)
    log.info("retrieval indexes built in %.1f s", figures["seconds"])
    return figures
