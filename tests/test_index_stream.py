"""The retrieval indexes of a published table too big for one chunk are built from its
Parquet streamed through the driver in sorted chunks (`index._sorted_chunks`): the LanceDB
tables are the ones the whole table in memory gives, row for row and in the same order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tkg.pipeline import index, schema
from tkg.pipeline.config import QueryConfig

DIM = 4
ROWS = 300


def _episodes(rng: np.random.Generator) -> pa.Table:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    days = rng.integers(0, 20, ROWS)  # many rows share a (group, valid_at)
    valid = [None if d == 0 else start + timedelta(days=int(d)) for d in days]
    return pa.table({
        "episode_id": [f"e{i:04d}" for i in rng.permutation(ROWS)],
        "group_id": [f"g{g}" for g in rng.integers(0, 3, ROWS)],
        "content": [None if i % 17 == 0 else f"episode {i} about topic {i % 11}"
                    for i in range(ROWS)],
        "valid_at": pa.array(valid, pa.timestamp("us", tz="UTC")),
        "created_at": pa.array([start] * ROWS, pa.timestamp("us", tz="UTC")),
        "content_embedding": pa.array(list(rng.random((ROWS, DIM), dtype=np.float32)),
                                      schema.vector(DIM)),
    })


def _facts(rng: np.random.Generator) -> pa.Table:
    edges = rng.integers(0, ROWS // 3, ROWS)
    return pa.table({
        "edge_id": [f"edge{e:04d}" for e in edges],
        "version": pa.array(np.arange(ROWS) % 5, pa.int32()),
        "group_id": [f"g{e % 3}" for e in edges],
        "fact": [f"fact {i} of edge {e}" for i, e in enumerate(edges)],
        "fact_embedding": pa.array(list(rng.random((ROWS, DIM), dtype=np.float32)),
                                   schema.vector(DIM)),
    })


def _publish(snapshot: Path, name: str, table: pa.Table) -> pa.Table:
    """Written as several unsorted parts, as Ray Data writes them; returns the table in
    its published schema."""
    table = schema.conform(table, schema.PUBLISHED[name](DIM))
    folder = snapshot / name
    folder.mkdir(parents=True)
    for part, first in enumerate(range(0, ROWS, 70)):
        pq.write_table(table.slice(first, 70), folder / f"part-{part:05d}.parquet",
                       row_group_size=25)
    return table


def test_streamed_indexes_equal_the_in_memory_ones(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    snapshot = tmp_path / "snapshot"
    tables = {"episodes": _publish(snapshot, "episodes", _episodes(rng)),
              "facts": _publish(snapshot, "facts", _facts(rng))}
    for name in ("entities", "communities"):
        (snapshot / name).mkdir()
    streamed = index.build_indexes(snapshot, DIM, QueryConfig(), chunk_rows=32)
    memory = tmp_path / "memory"
    index.build_indexes(memory, DIM, QueryConfig(), tables=tables)
    assert streamed["episodes"]["rows"] == streamed["facts"]["rows"] == ROWS
    assert streamed["entities"]["rows"] == 0
    db_streamed = index.connect(snapshot / index.LANCE_DIR)
    db_memory = index.connect(memory / index.LANCE_DIR)
    for name, spec in index.SPECS.items():
        if name not in tables:
            continue
        got = db_streamed.open_table(name).to_arrow()
        want = db_memory.open_table(name).to_arrow()
        assert got.schema == want.schema
        assert got.equals(want), name  # the same rows, in `row` order on disk
        assert got["row"].to_pylist() == list(range(ROWS))
        keys = want.select(list(spec.order)).to_pylist()
        assert keys == tables[name].sort_by([(c, "ascending") for c in spec.order]) \
            .select(list(spec.order)).to_pylist()
