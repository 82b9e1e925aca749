"""Snapshots: Parquet tables partitioned by group, a DuckDB catalog, a manifest, `CURRENT`.

Layout of a store:

    STORE/CURRENT                         the run id of the snapshot readers use
    STORE/snapshots/<run_id>/<table>/group_id=<g>/part-*.parquet
    STORE/snapshots/<run_id>/catalog.duckdb   one view per table, plus facts_current
    STORE/snapshots/<run_id>/manifest.json    tables, row counts, embedding model, summary
    STORE/work/<run_id>/<stage>/...           stage outputs of a build (resumable)

Readers only follow `CURRENT`, which is switched with an atomic rename after everything else
is written, so nobody sees a half-built snapshot and a failed build leaves the last good one.
`publish` is the one writer of snapshots (builds and community refreshes), and every file
operation of publishing is a function of this module.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tkg.pipeline import faults, schema, storage, visibility
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.index import LANCE_DIR, build_indexes

MANIFEST = "manifest.json"
CATALOG = "catalog.duckdb"
EMPTY_PART = "part-empty.parquet"
NO_GROUP = "_none"  # partition of rows without a group (rejects of unreadable records)


class StoreError(RuntimeError):
    """The store is missing, empty or unreadable; the message says what to do."""


def snapshot_dir(store: Path | str, run_id: str) -> Path:
    """A snapshot's folder; an object-store URL for a store in object storage (typed Path | str
    where callers may pass one: `Path("s3://b/x")` would fold the `//`)."""
    if storage.is_url(store):
        return storage.join(store, "snapshots", run_id)
    return Path(store) / "snapshots" / run_id


def work_dir(store: Path, run_id: str) -> Path:
    return Path(store) / "work" / run_id


def current_run(store: Path | str) -> str | None:
    if storage.is_url(store):  # one small object, written last (a whole-object PUT)
        try:
            return storage.read_text(storage.join(store, "CURRENT")).strip() or None
        except FileNotFoundError:
            return None
    pointer = Path(store) / "CURRENT"
    if not pointer.is_file():
        return None
    return pointer.read_text().strip() or None


def current_snapshot(store: Path | str) -> Path | str:
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


def _catalog_config(snapshot: Path) -> dict[str, str]:
    """The snapshot's folder as DuckDB's `file_search_path` (for every cursor of the
    connection): views name their files relative to it, so a copied or moved snapshot reads
    its own files, and a catalog opened without it finds none (an error) rather than another
    snapshot's."""
    folder = str(Path(snapshot).resolve())
    if "," in folder:  # DuckDB splits the setting on commas
        raise StoreError(f"{folder}: a store path must not contain a comma")
    return {"file_search_path": folder}


def _create_views(con: duckdb.DuckDBPyConnection, tables: list[str], root: str = "") -> None:
    """The catalog's views and macros; `root` prefixes the table folders (none: relative)."""
    for table in tables:
        glob = f"{root}/{table}/**/*.parquet" if root else f"{table}/**/*.parquet"
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM "
                    f"read_parquet('{glob}', hive_partitioning = false)")
    for statement in CATALOG_MACROS:
        con.execute(statement)


def build_catalog(snapshot: Path, tables: list[str]) -> None:
    """A DuckDB file of views over the snapshot's Parquet (paths relative to the snapshot)."""
    path = snapshot / CATALOG
    path.unlink(missing_ok=True)
    with duckdb.connect(str(path), config=_catalog_config(snapshot)) as con:
        _create_views(con, tables)


def open_catalog(snapshot: Path | str) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection on a snapshot's catalog, reading that snapshot's files
    wherever the snapshot now lies (use this, not `duckdb.connect(CATALOG)`). A snapshot in
    object storage gets an in-memory catalog built now, over its objects through the
    filesystem registered with DuckDB (the httpfs extension is not needed)."""
    if storage.is_url(snapshot):
        con = duckdb.connect()
        storage.register_duckdb(con, snapshot)
        read_manifest(snapshot)  # a snapshot without one was never completely published
        _create_views(con, list(schema.PUBLISHED), root=str(snapshot))
        return con
    return duckdb.connect(str(Path(snapshot) / CATALOG), read_only=True,
                          config=_catalog_config(snapshot))


CATALOG_MACROS = (
    # What the store believes now: the open version of every fact.
    "CREATE VIEW facts_current AS SELECT * FROM facts WHERE "
    + visibility.duckdb_where("facts", known_at=visibility.LATEST),
    # Valid time: the facts that held in the world at t (as currently believed).
    "CREATE MACRO facts_as_of(t) AS TABLE SELECT * FROM facts WHERE "
    + visibility.duckdb_where("facts", known_at=visibility.LATEST, as_of="t"),
    # Transaction time: every fact version the store held at t.
    "CREATE MACRO facts_known_at(t) AS TABLE SELECT * FROM facts WHERE "
    + visibility.duckdb_where("facts", known_at="t"),
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


def table_files(snapshot: Path, name: str) -> list[str]:
    """The Parquet files of one published table (all groups), in a stable order."""
    folder = Path(snapshot) / name
    return sorted(str(p) for p in folder.rglob("*.parquet")) if folder.is_dir() else []


def table_rows(snapshot: Path | None, name: str) -> int:
    """Rows of a published table, from the Parquet footers (0 without a snapshot)."""
    if snapshot is None:
        return 0
    return sum(pq.ParquetFile(f).metadata.num_rows for f in table_files(snapshot, name))


def read_table(snapshot: Path, name: str, table_schema: pa.Schema,
               columns: Sequence[str] | None = None) -> pa.Table:
    """A published table (all groups) in `table_schema`, or just `columns` of it."""
    if columns is not None:
        table_schema = pa.schema([table_schema.field(c) for c in columns])
    files = table_files(snapshot, name)
    if not files:
        return table_schema.empty_table()
    return pa.concat_tables([schema.conform(pq.read_table(f, columns=columns,
                                                          partitioning=None), table_schema)
                             for f in files])


def write_table(table: pa.Table, target: Path, table_schema: pa.Schema) -> int:
    """A table written from the driver (rejects, runs, communities of a refresh): by group
    where it has one; returns rows."""
    if table.num_rows and "group_id" in table_schema.names:
        write_group_parts(table, target, table_schema)
    elif table.num_rows:
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(schema.conform(table, table_schema), target / "part-00000.parquet")
    write_empty(target, table_schema)
    return table.num_rows


def table_names(snapshot: Path) -> list[str]:
    """The data tables of a snapshot (what a new snapshot may keep from it)."""
    rebuilt = {"runs", LANCE_DIR}
    return sorted(p.name for p in Path(snapshot).iterdir() if p.is_dir() and p.name not in rebuilt)


def _link(source: Path, target: Path) -> None:
    """Hard-link a file of an immutable snapshot (copy where links are refused)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def link_table(previous: Path | None, snapshot: Path, name: str) -> int:
    """A table's files of the previous snapshot, linked into the new one beside what it
    already holds (a file of the same name is kept); returns the Parquet rows linked."""
    if previous is None or not (previous / name).is_dir():
        return 0
    rows = 0
    for source in sorted((previous / name).rglob("*")):
        target = snapshot / name / source.relative_to(previous / name)
        if source.is_dir() or target.exists():
            continue
        _link(source, target)
        if source.suffix == ".parquet":
            rows += pq.ParquetFile(target).metadata.num_rows
    return rows


TableWriter = Callable[[Path], int]  # writes one table under the folder given; returns rows


@dataclass
class Published:
    """What `publish` has written when it asks its caller to describe the snapshot."""

    snapshot: Path
    rows: dict[str, int]  # per table: written, grown and kept
    retrieval: dict[str, Any]  # index figures per searchable table
    seconds: float  # spent publishing so far


Describe = Callable[[Published], tuple[dict[str, Any], pa.Table]]  # -> manifest, runs row


def publish(store_dir: Path, run_id: str, tables: Mapping[str, TableWriter], *,
            previous: Path | None, dim: int, query: QueryConfig, describe: Describe,
            grown: Sequence[str] = (), kept: Sequence[str] = ()) -> dict[str, Any]:
    """Write snapshot `run_id` and switch CURRENT to it, last: the new `tables`; the
    previous snapshot's rows of `grown` tables beside the new ones and its `kept` tables
    whole (linked, their retrieval indexes too); the catalog; the retrieval indexes of the
    rest; the runs table with the row `describe` returns; its manifest. Returns the
    manifest. A crash at any step leaves CURRENT where it was (faults: `publish:<step>`)."""
    started = time.perf_counter()
    snapshot = prepare_snapshot(store_dir, run_id)
    rows = {name: write(snapshot / name) for name, write in tables.items()}
    for name in (*grown, *kept):
        rows[name] = rows.get(name, 0) + link_table(previous, snapshot, name)
    write_empty(snapshot / "runs", schema.RUNS)  # every view of the catalog needs a file
    faults.hit("publish", "tables")
    build_catalog(snapshot, list(schema.PUBLISHED))
    faults.hit("publish", "catalog")
    retrieval = _indexes(snapshot, previous, kept, dim, query)
    faults.hit("publish", "indexes")
    manifest, run = describe(Published(snapshot, rows, retrieval, time.perf_counter() - started))
    write_table(pa.concat_tables([previous_runs(store_dir), run]), snapshot / "runs",
                schema.RUNS)
    write_manifest(snapshot, manifest)
    faults.hit("before_switch")
    switch_current(store_dir, run_id)
    return manifest


def _indexes(snapshot: Path, previous: Path | None, kept: Sequence[str], dim: int,
             query: QueryConfig) -> dict[str, Any]:
    """Retrieval indexes of the snapshot; a kept table's are linked from the previous one."""
    before = (read_manifest(previous).get("retrieval") or {}) if previous and kept else {}
    reused = {}
    for name in kept:
        folder = f"{LANCE_DIR}/{name}.lance"
        if name in before and (previous / folder).is_dir():
            link_table(previous, snapshot, folder)
            reused[name] = before[name]
    return {**build_indexes(snapshot, dim, query, reused=set(reused)), **reused}


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


def read_manifest(snapshot: Path | str) -> dict[str, Any]:
    if storage.is_url(snapshot):
        try:
            return json.loads(storage.read_text(storage.join(snapshot, MANIFEST)))
        except FileNotFoundError as exc:
            raise StoreError(f"{snapshot} has no {MANIFEST}: it was never completely "
                             "published") from exc
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


def connect(store: Path | str) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection on the current snapshot's catalog."""
    return open_catalog(current_snapshot(store))


def now() -> datetime:
    return datetime.now(UTC)
