"""Snapshots: Parquet tables partitioned by group, a DuckDB catalog, a manifest, `CURRENT`.

Layout of a store:

    STORE/CURRENT                         the run id of the snapshot readers use
    STORE/snapshots/<run_id>/<table>/group_id=<g>/part-*.parquet
    STORE/snapshots/<run_id>/catalog.duckdb   one view per table, plus facts_current
    STORE/snapshots/<run_id>/manifest.json    tables, row counts, embedding model, summary
    STORE/work/<run_id>/<stage>/...           stage outputs of a build (resumable)

Readers only follow `CURRENT`, which is switched with an atomic rename after everything else
is written, so nobody sees a half-built snapshot and a failed build leaves the last good one.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tkg.pipeline import schema

MANIFEST = "manifest.json"
CATALOG = "catalog.duckdb"
EMPTY_PART = "part-empty.parquet"
NO_GROUP = "_none"  # partition of rows without a group (rejects of unreadable records)


class StoreError(RuntimeError):
    """The store is missing, empty or unreadable; the message says what to do."""


def snapshot_dir(store: Path, run_id: str) -> Path:
    return Path(store) / "snapshots" / run_id


def work_dir(store: Path, run_id: str) -> Path:
    return Path(store) / "work" / run_id


def current_run(store: Path) -> str | None:
    pointer = Path(store) / "CURRENT"
    if not pointer.is_file():
        return None
    return pointer.read_text().strip() or None


def current_snapshot(store: Path) -> Path:
    run_id = current_run(store)
    if run_id is None:
        raise StoreError(
            f"{store} has no published snapshot; build one with "
            f"`tkg build --config configs/local.yaml --input PATH --store {store}`"
        )
    return snapshot_dir(store, run_id)


def write_group_parts(table: pa.Table, table_dir: Path, table_schema: pa.Schema) -> pa.Table:
    """Write one batch as Parquet parts under `group_id=<g>/`; returns rows per group.

    Runs inside Ray tasks for big tables. group_id is validated at ingestion
    ([A-Za-z0-9_-]), so it is safe as a path component; null groups go under `_none`.
    """
    table = schema.conform(table, table_schema)
    counts = {}
    groups = table["group_id"]
    for group in sorted(set(groups.to_pylist()), key=lambda g: g or ""):
        mask = pc.is_null(groups) if group is None else pc.equal(groups, group)
        part = table.filter(mask)
        target = table_dir / f"group_id={group or NO_GROUP}"
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, target / f"part-{uuid.uuid4().hex}.parquet", compression="zstd")
        counts[group] = part.num_rows
    return pa.table({"group_id": list(counts), "rows": pa.array(list(counts.values()), pa.int64())})


def write_empty(table_dir: Path, table_schema: pa.Schema) -> None:
    """Every table has at least one file, so its view exists with its columns when empty."""
    table_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(table_schema.empty_table(), table_dir / EMPTY_PART)


def build_catalog(snapshot: Path, tables: list[str]) -> None:
    """A DuckDB file of views over the snapshot's Parquet (absolute paths)."""
    path = snapshot / CATALOG
    path.unlink(missing_ok=True)
    with duckdb.connect(str(path)) as con:
        for table in tables:
            glob = (snapshot / table).resolve() / "**" / "*.parquet"
            con.execute(
                f"CREATE VIEW {table} AS SELECT * FROM "
                f"read_parquet('{glob.as_posix()}', hive_partitioning = false)"
            )
        for statement in CATALOG_MACROS:
            con.execute(statement)


CATALOG_MACROS = (
    # What the store believes now: the open version of every fact.
    "CREATE VIEW facts_current AS SELECT * FROM facts WHERE expired_at IS NULL",
    # Valid time: the facts that held in the world at t (as currently believed).
    """CREATE MACRO facts_as_of(t) AS TABLE
       SELECT * FROM facts_current
       WHERE (valid_at IS NULL OR valid_at <= t) AND (invalid_at IS NULL OR invalid_at > t)""",
    # Transaction time: every fact version the store held at t'.
    """CREATE MACRO facts_known_at(t) AS TABLE
       SELECT * FROM facts
       WHERE created_at <= t AND (expired_at IS NULL OR expired_at > t)""",
    # Every version of every fact touching an entity known under `alias`, on both timelines.
    """CREATE MACRO entity_history(alias) AS TABLE
       WITH target AS (SELECT DISTINCT entity_id, group_id FROM entity_aliases
                       WHERE lower(entity_aliases.alias) = lower(alias))
       SELECT f.group_id, s.name AS subject, f.relation, o.name AS object, f.fact,
              f.valid_at, f.invalid_at, f.created_at, f.expired_at, f.version, f.edge_id,
              f.invalidated_by
       FROM facts f
       JOIN target ON f.group_id = target.group_id
                  AND target.entity_id IN (f.source_entity_id, f.target_entity_id)
       JOIN entities s ON s.entity_id = f.source_entity_id
       JOIN entities o ON o.entity_id = f.target_entity_id
       ORDER BY f.valid_at NULLS FIRST, f.edge_id, f.version""",
)


def write_manifest(snapshot: Path, manifest: dict[str, Any]) -> None:
    tmp = snapshot / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, default=str, sort_keys=True))
    os.replace(tmp, snapshot / MANIFEST)


def switch_current(store: Path, run_id: str) -> None:
    """Point readers at a snapshot: write-then-rename is atomic on POSIX filesystems."""
    if not (snapshot_dir(store, run_id) / MANIFEST).is_file():
        raise StoreError(f"snapshot {run_id} has no manifest; refusing to publish it")
    tmp = Path(store) / f".CURRENT.{uuid.uuid4().hex}"
    tmp.write_text(run_id + "\n")
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, Path(store) / "CURRENT")


def read_manifest(snapshot: Path) -> dict[str, Any]:
    path = snapshot / MANIFEST
    if not path.is_file():
        raise StoreError(f"{snapshot} has no {MANIFEST}: it was never completely published")
    return json.loads(path.read_text())


def prepare_snapshot(store: Path, run_id: str) -> Path:
    """An empty folder for a new snapshot; leftovers of a crashed publish are removed."""
    target = snapshot_dir(store, run_id)
    if (target / MANIFEST).is_file() and current_run(store) == run_id:
        raise StoreError(f"snapshot {run_id} is already published in {store}; use a new run id")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    return target


def previous_runs(store: Path) -> pa.Table:
    """The runs table of the current snapshot, carried into the next one."""
    run_id = current_run(store)
    if run_id is None:
        return schema.RUNS.empty_table()
    runs = snapshot_dir(store, run_id) / "runs"
    if not runs.exists():
        return schema.RUNS.empty_table()
    return pq.read_table(runs, schema=schema.RUNS, partitioning=None)


def connect(store: Path) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection on the current snapshot's catalog."""
    return duckdb.connect(str(current_snapshot(store) / CATALOG), read_only=True)


def now() -> datetime:
    return datetime.now(UTC)
