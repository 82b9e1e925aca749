"""Snapshots: Parquet tables partitioned by group, a DuckDB catalog, a manifest, `CURRENT`.

Layout of a store (a local folder or an object-store prefix, the same layout in both):

    STORE/CURRENT                         the run id of the snapshot readers use
    STORE/snapshots/<run_id>/manifest.json    tables, their files, row counts, embedding model
    STORE/snapshots/<run_id>/<table>/group_id=<g>/part-*.parquet   files this run wrote
    STORE/snapshots/<run_id>/lance/           retrieval indexes this run built
    STORE/snapshots/<run_id>/catalog.duckdb   views over the manifest's files (local stores)
    STORE/work/<run_id>/<stage>/...           stage outputs of a build (resumable)

The manifest lists every file of every table, relative to its snapshot: a table carried
from an earlier run (episodes that grow, tables a community refresh keeps) is listed as
`../<earlier run>/...`, referenced rather than copied, so a snapshot needs no hard links and
publishing costs what the run wrote. Readers only follow `CURRENT`, one small object written
last (a rename on a local disk, a whole-object PUT on S3), then read the manifest it names:
nobody sees a half-built snapshot and a failed build leaves the last good one. `tkg gc`
removes only files that no kept manifest lists. `publish` is the one writer of snapshots
(builds and community refreshes), and every file operation of publishing is a function of
this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
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
import ray
from tkg.pipeline import faults, schema, storage, visibility
from tkg.pipeline.config import QueryConfig, StorageConfig
from tkg.pipeline.index import LANCE_DIR, Extendable, build_indexes
from tkg.pipeline.storage import Location

MANIFEST = "manifest.json"
CATALOG = "catalog.duckdb"
EMPTY_PART = "part-empty.parquet"
NO_GROUP = "_none"  # partition of rows without a group (rejects of unreadable records)


class StoreError(RuntimeError):
    """The store is missing, empty or unreadable; the message says what to do."""


def snapshot_dir(store: Location, run_id: str) -> Location:
    """A snapshot's folder: a Path in a local store, a URL in object storage (a Path would
    fold `s3://` into `s3:/`)."""
    return storage.join(store, "snapshots", run_id)


def work_dir(store: Location, run_id: str) -> Location:
    return storage.join(store, "work", run_id)


def new_run_id(now: datetime, files: Sequence[Location]) -> str:
    """A run's id: its start and a digest of its inputs (`tkg build` prints it before Ray
    starts, so it lives here, not in the runner, whose imports take seconds)."""
    digest = hashlib.sha256("\n".join(map(str, files)).encode()).hexdigest()[:6]
    return f"{now:%Y%m%dT%H%M%SZ}-{digest}"


def current_run(store: Location) -> str | None:
    try:
        return storage.read_text(storage.join(store, "CURRENT")).strip() or None
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def current_snapshot(store: Location) -> Location:
    run_id = current_run(store)
    if run_id is None:
        raise StoreError(
            f"{store} has no published snapshot; build one with "
            f"`tkg build --config configs/local.yaml --input PATH --store {store}`"
        )
    return snapshot_dir(store, run_id)


def write_group_parts(table: pa.Table, table_dir: Location, table_schema: pa.Schema) -> pa.Table:
    """Write one table as Parquet parts under `group_id=<g>/` (`_GroupFiles`); returns rows
    per group. group_id is validated at ingestion ([A-Za-z0-9_-]), so it is safe as a path
    component; null groups go under `_none`."""
    with _GroupFiles(table_dir, table_schema) as out:
        out.add(schema.conform(table, table_schema))
    return pa.table({"group_id": list(out.counts),
                     "rows": pa.array(list(out.counts.values()), pa.int64())})


# A streamed write's row group: up to this many bytes of a group's rows (decoded), not a
# row group per batch read (the 160,000-episode store's 735,391 mentions would be 180).
ROW_GROUP_BYTES = 16 << 20
STREAM_ROWS = 4_096  # rows per batch read: about 7 MB of facts with their vectors


def write_parts(paths: Sequence[str], target: Location, table_schema: pa.Schema,
                config: StorageConfig | None, key: str | None = None,
                keys: pa.Array | None = None) -> int:
    """Write the rows of part files `paths` under `target`, a file per group (with a
    `key`: but those whose key is one of `keys`), streamed: each file read a batch at a
    time and each group's rows written a row group at a time, so the writer holds a batch
    and a row group per group, not the files. The 160,000-episode night's stored facts
    (267 MB, 12 files) were read whole, filtered and written by Ray tasks in 2.7 s (fresh
    workers); streamed by two threads of the driver, 0.8 s, with 30-60 MB more of it. In
    the driver, or as a Ray task of publish (`write_parts_task`), which is here, not
    beside the build that calls it: a worker imports the module of the function it runs,
    and the build's imports every stage (igraph among them), 1.5 s of a fresh worker."""
    storage.configure(config)  # a worker writes to the store the driver was told about
    with _GroupFiles(target, table_schema) as out:
        for path in paths:
            for batch in storage.parquet_batches(path, batch_rows=STREAM_ROWS):
                rows = schema.conform(pa.Table.from_batches([batch]), table_schema)
                out.add(rows if key is None else storage.rows_in(rows, rows[key], keys,
                                                                 keep=False))
    return out.rows


class _GroupFiles:
    """A Parquet file per group under `table_dir` (`group_id=<g>/part-<uuid>.parquet`),
    opened at its group's first row; each group's rows written once they fill a row group
    (`ROW_GROUP_BYTES`) and at the end, where the groups' files are finished a thread each
    (on an object store closing a file uploads it: a store of many groups would wait for
    each in turn)."""

    def __init__(self, table_dir: Location, table_schema: pa.Schema) -> None:
        self.table_dir, self.schema = table_dir, table_schema
        self.files: dict[str | None, tuple[Any, pq.ParquetWriter]] = {}  # (its context)
        self.waiting: dict[str | None, list[pa.Table]] = {}
        self.counts: dict[str | None, int] = {}  # rows per group, in the order first seen

    def __enter__(self) -> _GroupFiles:
        return self

    def __exit__(self, failed: type[BaseException] | None, *_: object) -> None:
        try:
            if failed is None:
                storage.each(self._finish, sorted(self.counts, key=lambda g: g or ""))
        finally:  # (on an error, every file still open is closed too)
            for context, _ in list(self.files.values()):
                context.__exit__(None, None, None)

    @property
    def rows(self) -> int:
        return sum(self.counts.values())

    def add(self, rows: pa.Table) -> None:
        groups = rows["group_id"]
        values = sorted(pc.unique(groups).to_pylist(), key=lambda g: g or "")
        for group in values:
            part = rows if len(values) == 1 else rows.filter(
                pc.is_null(groups) if group is None else pc.equal(groups, group))
            self.waiting.setdefault(group, []).append(part)
            self.counts[group] = self.counts.get(group, 0) + part.num_rows
            if sum(t.nbytes for t in self.waiting[group]) >= ROW_GROUP_BYTES:
                self._flush(group)

    def _flush(self, group: str | None) -> None:
        parts = self.waiting.pop(group, [])  # (each part holds rows)
        if not parts:
            return
        rows = pa.concat_tables(parts)
        if group not in self.files:
            target = storage.join(self.table_dir, f"group_id={group or NO_GROUP}",
                                  f"part-{uuid.uuid4().hex}.parquet")
            context = storage.parquet_writer(target, self.schema, compression="zstd")
            self.files[group] = (context, context.__enter__())
        self.files[group][1].write_table(rows)

    def _finish(self, group: str | None) -> None:
        """The group's last rows written and its file closed."""
        self._flush(group)
        context, _ = self.files.pop(group, (None, None))
        if context is not None:
            context.__exit__(None, None, None)


write_parts_task = ray.remote(write_parts)


def write_empty(table_dir: Location, table_schema: pa.Schema) -> None:
    """Every table has at least one file, so its view exists with its columns when empty."""
    storage.write_parquet(table_schema.empty_table(), storage.join(table_dir, EMPTY_PART))


def _catalog_config(snapshot: Path) -> dict[str, str]:
    """The snapshot's folder as DuckDB's `file_search_path` (for every cursor of the
    connection): views name their files relative to it, so a copied or moved store reads
    its own files, and a catalog opened without it finds none (an error) rather than another
    store's."""
    folder = str(Path(snapshot).resolve())
    if "," in folder:  # DuckDB splits the setting on commas
        raise StoreError(f"{folder}: a store path must not contain a comma")
    return {"file_search_path": folder}


def _sql_list(files: Sequence[Location]) -> str:
    return "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"


def _create_views(con: duckdb.DuckDBPyConnection, files: Mapping[str, Sequence[Location]]
                  ) -> None:
    """The catalog's views (one per published table, over the files given: relative to the
    snapshot in a catalog file, URLs in a catalog built at open time) and macros."""
    for table in schema.PUBLISHED:
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM "
                    f"read_parquet({_sql_list(files[table])}, hive_partitioning = false)")
    for statement in CATALOG_MACROS:
        con.execute(statement)


def build_catalog(snapshot: Location, relative: Mapping[str, Sequence[str]] | None = None
                  ) -> None:
    """A DuckDB file of views over the manifest's files (paths relative to the snapshot;
    without them, the files under the snapshot's folders). A snapshot in object storage
    gets none: `open_catalog` builds one in memory."""
    if storage.is_url(snapshot):
        return
    relative = relative_files(snapshot, {}) if relative is None else relative
    path = Path(snapshot) / CATALOG
    path.unlink(missing_ok=True)
    with duckdb.connect(str(path), config=_catalog_config(snapshot)) as con:
        _create_views(con, relative)


def memory_catalog(snapshot: Location, files: Mapping[str, Sequence[Location]]
                   ) -> duckdb.DuckDBPyConnection:
    """An in-memory catalog over files given as locations (object storage through the
    filesystem registered with DuckDB; the httpfs extension is not needed)."""
    con = duckdb.connect()
    storage.register_duckdb(con, snapshot)
    _create_views(con, files)
    return con


def open_catalog(snapshot: Location) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection on a snapshot's catalog, reading that snapshot's files
    wherever the store now lies (use this, not `duckdb.connect(CATALOG)`). A snapshot in
    object storage gets an in-memory catalog built now from its manifest's file lists."""
    if storage.is_url(snapshot):
        return memory_catalog(snapshot, snapshot_files(snapshot))
    return duckdb.connect(str(Path(snapshot) / CATALOG), read_only=True,
                          config=_catalog_config(snapshot))


def _entity_history(in_group: str) -> str:
    """The body of `entity_history`: facts of the entities an alias names, where `in_group`
    (in parentheses: else an overload's parameters would continue its ORDER BY)."""
    return f"""(
       WITH target AS (SELECT DISTINCT entity_id, group_id FROM entity_aliases
                       WHERE lower(entity_aliases.alias) = lower(alias) AND {in_group})
       SELECT f.group_id, s.name AS subject, f.relation, o.name AS object, f.fact,
              f.valid_at, f.invalid_at, f.created_at, f.expired_at, f.version, f.edge_id,
              f.invalidated_by
       FROM facts f
       JOIN target ON f.group_id = target.group_id
                  AND target.entity_id IN (f.source_entity_id, f.target_entity_id)
       JOIN entities s ON s.entity_id = f.source_entity_id
       JOIN entities o ON o.entity_id = f.target_entity_id
       ORDER BY f.valid_at NULLS FIRST, f.edge_id, f.version)"""


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
    # Every version of every fact touching an entity known under `alias`, on both timelines:
    # in every group (an operator's view), or in one: entity_history('Berlin', 'acme').
    "CREATE MACRO entity_history(alias) AS TABLE " + _entity_history("TRUE")
    + ", (alias, only_group) AS TABLE "
    + _entity_history("entity_aliases.group_id = only_group"),
)


def _listed(snapshot: Location, name: str) -> list[Location]:
    """The Parquet files under a table's own folder (what a run wrote; also how snapshots
    made without file lists, and work outputs, are read)."""
    return [storage.join(snapshot, storage.relative(f, snapshot))
            for f in storage.list_files(storage.join(snapshot, name), suffixes={".parquet"})]


def _manifest_or_none(snapshot: Location) -> dict[str, Any] | None:
    try:
        return read_manifest(snapshot)
    except StoreError:
        return None


def relative_files(snapshot: Location, manifest: Mapping[str, Any] | None = None
                   ) -> dict[str, list[str]]:
    """Every table's files relative to the snapshot, as its manifest lists them (a
    snapshot written without lists, e.g. by a benchmark, is listed from its folders)."""
    manifest = _manifest_or_none(snapshot) if manifest is None else manifest
    listed = (manifest or {}).get("files")
    if listed is not None:
        return {name: list(files) for name, files in listed.items()}
    names = {*schema.PUBLISHED, *(storage.name(d) for d in storage.list_dirs(snapshot))}
    names.discard(LANCE_DIR)
    return {name: [storage.relative(f, snapshot) for f in _listed(snapshot, name)]
            for name in sorted(names)}


def snapshot_files(snapshot: Location, manifest: Mapping[str, Any] | None = None
                   ) -> dict[str, list[Location]]:
    """Every table's files as locations (some may lie in an earlier snapshot)."""
    return {name: [storage.join(snapshot, f) for f in files]
            for name, files in relative_files(snapshot, manifest).items()}


def table_files(snapshot: Location, name: str) -> list[Location]:
    """The Parquet files of one published table (all groups), in a stable order; of a work
    output folder's table when `snapshot` is a stage folder (no manifest)."""
    manifest = _manifest_or_none(snapshot)
    if manifest is None or "files" not in manifest:
        return _listed(snapshot, name)
    return [storage.join(snapshot, f) for f in manifest["files"].get(name, [])]


def table_rows(snapshot: Location | None, name: str) -> int:
    """Rows of a published table, from the Parquet footers (0 without a snapshot)."""
    if snapshot is None:
        return 0
    return sum(storage.each(storage.parquet_rows, table_files(snapshot, name)))


def read_table(snapshot: Location, name: str, table_schema: pa.Schema,
               columns: Sequence[str] | None = None) -> pa.Table:
    """A published table (all groups) in `table_schema`, or just `columns` of it."""
    if columns is not None:
        table_schema = pa.schema([table_schema.field(c) for c in columns])
    files = table_files(snapshot, name)
    if not files:
        return table_schema.empty_table()
    return pa.concat_tables([
        schema.conform(t, table_schema)
        for t in storage.each(lambda f: storage.read_parquet(f, columns), files)])


def write_table(table: pa.Table, target: Location, table_schema: pa.Schema) -> int:
    """A table written from the driver (rejects, runs, communities of a refresh): by group
    where it has one; returns rows."""
    if table.num_rows and "group_id" in table_schema.names:
        write_group_parts(table, target, table_schema)
    elif table.num_rows:
        storage.write_parquet(schema.conform(table, table_schema),
                              storage.join(target, "part-00000.parquet"))
    write_empty(target, table_schema)
    return table.num_rows


def table_names(snapshot: Location) -> list[str]:
    """The data tables of a snapshot (what a new snapshot may keep from it)."""
    return sorted(set(relative_files(snapshot)) - {"runs", LANCE_DIR})


def _carried(previous: Location, files: Sequence[str]) -> list[str]:
    """An earlier snapshot's files (relative to it) as seen from a new sibling snapshot;
    placeholders of empty tables are carried only where the table has no other file."""
    with_rows = [f for f in files if not f.endswith(EMPTY_PART)] or list(files[:1])
    return [_rebase(storage.name(previous), f) for f in with_rows]


def _rebase(run: str, relative: str) -> str:
    """`relative` (to snapshot `run`) relative to a sibling snapshot: `../run/...`."""
    return posixpath.normpath(posixpath.join("..", run, relative))


def _previous_rows(previous: Location, name: str) -> int:
    """Rows of a previous snapshot's table: its manifest's count, else the footers."""
    counted = (_manifest_or_none(previous) or {}).get("tables", {}).get(name)
    return int(counted) if counted is not None else table_rows(previous, name)


TableWriter = Callable[[Location], int]  # writes one table under the folder given; returns rows


@dataclass
class Published:
    """What `publish` has written when it asks its caller to describe the snapshot."""

    snapshot: Location
    rows: dict[str, int]  # per table: written, grown and kept
    retrieval: dict[str, Any]  # index figures per searchable table
    seconds: float  # spent publishing so far
    files: dict[str, list[str]]  # per table, relative to the snapshot (what the manifest lists)

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory catalog over what is written so far (the manifest is not yet)."""
        files = {name: [storage.join(self.snapshot, f) for f in listed]
                 for name, listed in self.files.items()}
        return memory_catalog(self.snapshot, files)


Describe = Callable[[Published], tuple[dict[str, Any], pa.Table]]  # -> manifest, runs row


def publish(store_dir: Location, run_id: str, tables: Mapping[str, TableWriter], *,
            previous: Location | None, dim: int, query: QueryConfig, describe: Describe,
            grown: Sequence[str] = (), kept: Sequence[str] = (),
            carry: Mapping[str, Sequence[str]] | None = None,
            extend: bool = True,
            replaced: Mapping[str, Sequence[Location]] | None = None) -> dict[str, Any]:
    """Write snapshot `run_id` and switch CURRENT to it, last: the new `tables`; the
    previous snapshot's files of `grown` tables listed beside the new ones and of `kept`
    tables whole (referenced, their retrieval indexes too); the retrieval indexes of the
    rest (with `extend`, the previous snapshot's extended: `index.build_indexes`); the runs
    table with the row `describe` returns; the catalog; its manifest with
    every table's files. `carry`: of each grown table only these previous files (relative
    to the previous snapshot; a forget leaves out those that held erased rows). Returns
    the manifest. `replaced`: of each table a writer wrote as the previous snapshot's rows
    with some keys' rows replaced (`Publish.replaces`), the files of the rows of those keys
    (an extension compares these alone). A crash at any step leaves CURRENT where it was
    (faults: `publish:<step>`)."""
    started = time.perf_counter()
    snapshot = prepare_snapshot(store_dir, run_id)
    rows = {name: write(storage.join(snapshot, name)) for name, write in tables.items()}
    files = {name: [storage.relative(f, snapshot) for f in _listed(snapshot, name)]
             for name in tables}
    before = relative_files(previous) if previous is not None and (grown or kept) else {}
    for name in (*grown, *kept):
        listed = before.get(name) if carry is None or name in kept else carry.get(name)
        if previous is not None and listed:
            files[name] = _carried(previous, listed) + files.get(name, [])
            rows[name] = rows.get(name, 0) + (
                _previous_rows(previous, name) if listed is before.get(name) else
                sum(storage.each(storage.parquet_rows,
                                 [storage.join(previous, f) for f in listed])))
    faults.hit("publish", "tables")
    added = {name: [f for f in files.get(name, []) if not f.startswith("../")]
             for name in grown}  # (what this run wrote of a table that grows)
    retrieval, lance, arrays = _indexes(snapshot, previous, kept, dim, query, files,
                                        extend, added, replaced or {})
    faults.hit("publish", "indexes")
    runs_dir = storage.join(snapshot, "runs")
    write_empty(runs_dir, schema.RUNS)  # the catalog describe may open needs every view
    files["runs"] = [storage.relative(f, snapshot) for f in _listed(snapshot, "runs")]
    manifest, run = describe(Published(snapshot, rows, retrieval,
                                       time.perf_counter() - started, files))
    write_table(pa.concat_tables([previous_runs(store_dir), run]), runs_dir, schema.RUNS)
    files["runs"] = [storage.relative(f, snapshot) for f in _listed(snapshot, "runs")]
    build_catalog(snapshot, files)
    faults.hit("publish", "catalog")
    manifest = {**manifest, "files": files, "lance": lance, "arrays": arrays,
                "erasures": _erasures(previous, manifest)}
    write_manifest(snapshot, manifest)
    faults.hit("before_switch")
    switch_current(store_dir, run_id)
    return manifest


def _erasures(previous: Location | None, manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """When erasures removed data from the store (request id and time, never what), carried
    from snapshot to snapshot: a query at a `known_at` before one says so
    (`tkg.pipeline.forget`)."""
    if "erasures" in manifest:
        return list(manifest["erasures"])
    return list(((_manifest_or_none(previous) or {}) if previous is not None else {})
                .get("erasures") or [])


def _indexes(snapshot: Location, previous: Location | None, kept: Sequence[str], dim: int,
             query: QueryConfig, files: Mapping[str, Sequence[str]], extend: bool,
             added: Mapping[str, Sequence[str]], replaced: Mapping[str, Sequence[Location]]
             ) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """Retrieval indexes of the snapshot, where each table lies (its LanceDB folder) and
    where its `table_arrays` lie, relative to the snapshot: a kept table's are the previous
    snapshot's, referenced; with `extend`, a table the previous snapshot reads at a known
    version is extended there (`index.build_indexes`; of a table that grows, with the rows
    of this run's files, `added`), its arrays written here."""
    old = read_manifest(previous) if previous is not None and (kept or extend) else {}
    before, where = old.get("retrieval") or {}, lance_dirs(previous, old) if old else {}
    arrays_before = arrays_dirs(previous, old) if old else {}
    reused = {name: before[name] for name in kept if name in before and name in where}
    lance = {name: _sibling(previous, where[name]) for name in reused}
    arrays = {name: _sibling(previous, arrays_before[name]) for name in reused}
    bases = {name: Extendable(where[name], int(figures["version"]), int(figures["appends"]),
                              arrays_before.get(name), int(figures.get("unindexed", 0)))
             for name, figures in before.items()
             if extend and name in where and name not in reused
             and isinstance(figures, dict) and "version" in figures and "appends" in figures}
    sources = {name: [storage.join(snapshot, f) for f in listed]
               for name, listed in files.items()}
    built = build_indexes(snapshot, dim, query, reused=set(reused), files=sources, bases=bases,
                          added={name: [storage.join(snapshot, f) for f in listed]
                                 for name, listed in added.items() if name in bases},
                          replaced={name: files for name, files in replaced.items()
                                    if name in bases})
    for name, figures in built.items():
        if name == "seconds":
            continue
        lance[name] = _sibling(previous, where[name]) if figures["extended"] else LANCE_DIR
        arrays[name] = LANCE_DIR
    return {**built, **reused}, lance, arrays


def _sibling(previous: Location, folder: Location) -> str:
    """A folder the previous snapshot lists, relative to a new sibling snapshot."""
    return _rebase(storage.name(previous), storage.relative(folder, previous))


def lance_dirs(snapshot: Location, manifest: Mapping[str, Any] | None = None
               ) -> dict[str, Location]:
    """The LanceDB folder holding each searchable table of a snapshot."""
    from tkg.pipeline.index import SPECS

    manifest = read_manifest(snapshot) if manifest is None else manifest
    listed = manifest.get("lance") or {}
    return {name: storage.join(snapshot, listed.get(name, LANCE_DIR)) for name in SPECS}


def arrays_dirs(snapshot: Location, manifest: Mapping[str, Any] | None = None
                ) -> dict[str, Location]:
    """The folder holding each searchable table's `table_arrays` (beside its LanceDB table
    where the manifest names none: snapshots published before tables were extended)."""
    manifest = read_manifest(snapshot) if manifest is None else manifest
    listed = manifest.get("arrays") or {}
    return {name: storage.join(snapshot, listed[name]) if name in listed else folder
            for name, folder in lance_dirs(snapshot, manifest).items()}


def lance_versions(manifest: Mapping[str, Any]) -> dict[str, int | None]:
    """The version of each LanceDB table a snapshot reads (None: the latest, for snapshots
    published before tables were extended, whose tables no later publish changes)."""
    from tkg.pipeline.index import SPECS

    figures = manifest.get("retrieval") or {}
    return {name: (int(figures[name]["version"]) if isinstance(figures.get(name), dict)
                   and "version" in figures[name] else None) for name in SPECS}


def write_manifest(snapshot: Location, manifest: dict[str, Any]) -> None:
    """Written whole (a local temp file renamed; one PUT on an object store)."""
    text = json.dumps(manifest, indent=2, default=str, sort_keys=True)
    if storage.is_url(snapshot):
        storage.write_text(storage.join(snapshot, MANIFEST), text)
        return
    tmp = Path(snapshot) / f".{MANIFEST}.tmp"
    tmp.write_text(text)
    os.replace(tmp, Path(snapshot) / MANIFEST)


def switch_current(store: Location, run_id: str) -> None:
    """Point readers at a snapshot: write-then-rename on a local disk, one whole-object PUT
    on an object store (readers see the old object or the new one)."""
    if not storage.is_file(storage.join(snapshot_dir(store, run_id), MANIFEST)):
        raise StoreError(f"snapshot {run_id} has no manifest; refusing to publish it")
    if storage.is_url(store):
        storage.write_text(storage.join(store, "CURRENT"), run_id + "\n")
        return
    tmp = Path(store) / f".CURRENT.{uuid.uuid4().hex}"
    tmp.write_text(run_id + "\n")
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, Path(store) / "CURRENT")


def read_manifest(snapshot: Location) -> dict[str, Any]:
    try:
        return json.loads(storage.read_text(storage.join(snapshot, MANIFEST)))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        raise StoreError(f"{snapshot} has no {MANIFEST}: it was never completely "
                         "published") from exc


def prepare_snapshot(store: Location, run_id: str) -> Location:
    """An empty folder for a new snapshot; leftovers of a crashed publish are removed."""
    target = snapshot_dir(store, run_id)
    if current_run(store) == run_id and storage.is_file(storage.join(target, MANIFEST)):
        raise StoreError(f"snapshot {run_id} is already published in {store}; use a new run id")
    storage.delete_dir(target)
    if not storage.is_url(target):
        Path(target).mkdir(parents=True)
    return target


def previous_runs(store: Location) -> pa.Table:
    """The runs table of the current snapshot, carried into the next one."""
    run_id = current_run(store)
    if run_id is None:
        return schema.RUNS.empty_table()
    return read_table(snapshot_dir(store, run_id), "runs", schema.RUNS)


def connect(store: Location) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection on the current snapshot's catalog."""
    return open_catalog(current_snapshot(store))


def now() -> datetime:
    return datetime.now(UTC)
