"""One published snapshot, opened once for querying: LanceDB tables, row metadata and the
entity graph in memory (integer arrays), so a query costs index lookups, not loads."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import storage, store, table_arrays
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.index import SPECS, connect, connect_async, read_published
from tkg.pipeline.storage import Location
from tkg.query import link
from tkg.query.catalog import Catalog
from tkg.query.lexical import TermIndex

log = logging.getLogger("tkg.snapshot")


class QueryError(ValueError):
    """A query that cannot run as asked; the message says what to change."""


class Published(Protocol):
    run_id: str


S = TypeVar("S", bound=Published)


class SnapshotHolder(Generic[S]):
    """The snapshot STORE/CURRENT names, opened once by `open_run(snapshot_path)` and
    reopened when CURRENT moves.

    Without a watcher, `get` checks CURRENT itself (one stat; the file is read only when its
    mtime, size or inode moved) and opens a newly published snapshot on the caller's thread.
    After `watch`, a background thread does that and `get` returns what is open, so no caller
    waits for a load; a snapshot that cannot be opened is logged and the old one kept.
    With `follow=False`, `get` returns what is open and only `refresh` moves it: a retrieval
    process of `tkg serve`, which its server tells when to switch (`query.serve.pool`).
    A switch is one reference swap: a caller keeps the snapshot `get` gave it to the end."""

    def __init__(self, store_dir: str | Path, open_run: Callable[[Location], S],
                 follow: bool = True) -> None:
        self.store = storage.location(store_dir)
        self.switches = 0
        self._open_run = open_run
        self._follow = follow
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._current: S | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.refresh()

    def get(self) -> S:
        if self._watcher is None and self._follow:
            self.refresh()
        assert self._current is not None
        return self._current

    def refresh(self) -> bool:
        """Open and switch to the published snapshot if CURRENT moved (True when it did)."""
        stamp = self._pointer_stamp()
        if stamp is not None and stamp == self._stamp and self._current is not None:
            return False
        with self._lock:
            if self._current is not None and store.current_run(self.store) is None:
                return False  # CURRENT gone (a store being removed): keep what is open
            path = store.current_snapshot(self.store)
            if self._current is not None and storage.name(path) == self._current.run_id:
                self._stamp = stamp
                return False
            opened = self._open_run(path)
            before = self._current.run_id if self._current is not None else None
            if before is not None:
                self.switches += 1
            self._current, self._stamp = opened, stamp
        if before is None:
            log.info("serving snapshot %s of %s", opened.run_id, self.store)
        else:
            log.info("switched to snapshot %s (was %s) of %s", opened.run_id, before,
                     self.store)
        return True

    def _pointer_stamp(self) -> tuple[int, ...] | None:
        """CURRENT's identity: a stat locally (the inode catches a same-size, same-second
        rename), one HEAD request on an object store."""
        if storage.is_url(self.store):
            return storage.stamp(storage.join(self.store, "CURRENT"))
        try:
            info = os.stat(Path(self.store) / "CURRENT")
        except FileNotFoundError:
            return None
        return info.st_mtime_ns, info.st_size, info.st_ino

    def watch(self, every: float) -> None:
        """Check CURRENT every `every` seconds on a background thread, until `stop`."""
        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    self.refresh()
                except Exception:
                    log.exception("the published snapshot could not be opened; still "
                                  "serving %s", self.get().run_id)

        self._watcher = threading.Thread(target=loop, name="tkg-snapshot-watch", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()


def log_switches(server: str) -> None:
    """The snapshot a server serves, and each switch, as a line on stderr (`tkg serve:
    2026-11-25 10:00:00 switched to snapshot B (was A) of STORE`): without it a server said
    nothing when it moved to a new build. Its only INFO lines; the libraries' stay quiet."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{server}: %(asctime)s %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


@dataclass
class Kind:
    """One searchable table: its LanceDB handle and its rows without the vectors."""

    name: str
    table: Any  # lancedb Table (None when the snapshot has no rows of this kind)
    atable: Any  # the same table, async (what searches use)
    meta: pa.Table
    ann: bool  # has a vector index (else exact search)
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)  # (min, max) per *_us
    times: dict[str, np.ndarray] = field(default_factory=dict)  # *_us columns as numpy
    # Unit vectors of every row, when the table is small enough to scan in memory (see
    # `query.exact_scan_rows`); rows of one group are contiguous (tables sort by group).
    vectors: np.ndarray | None = None
    group_start: np.ndarray | None = None  # rows of group code g: [start[g], start[g + 1])
    terms: TermIndex | None = None  # BM25 postings of `text` (`query.memory_text_rows`)
    # LanceDB's `row` of each row (`keys`) and the row of each such key (`rows_of_keys`, -1
    # where none): None where they are the rows themselves (a table built whole), else an
    # extended table's (`tkg.pipeline.index`), whose keys are not positions
    keys: np.ndarray | None = None
    rows_of_keys: np.ndarray | None = None

    def __post_init__(self) -> None:
        for column in self.meta.column_names:
            if column.endswith("_us") and self.meta.num_rows:
                values = self.meta[column].to_numpy()
                self.times[column] = values
                self.bounds[column] = (int(values.min()), int(values.max()))
        keys = self.meta["row"].to_numpy() if self.meta.num_rows else None
        if keys is not None and not np.array_equal(keys, np.arange(len(keys))):
            self.keys = keys
            self.rows_of_keys = table_arrays.rows_of_keys(keys)

    def rows_of(self, keys: Sequence[int]) -> list[int]:
        """The rows of LanceDB `row` values (what a LanceDB search returns)."""
        if self.rows_of_keys is None:
            return [int(k) for k in keys]
        return self.rows_of_keys[np.asarray(keys, dtype=np.int64)].tolist()

    def keys_of(self, rows: Sequence[int]) -> list[int]:
        """The LanceDB `row` values of rows (what a LanceDB filter names)."""
        if self.keys is None:
            return [int(r) for r in rows]
        return self.keys[np.asarray(rows, dtype=np.int64)].tolist()

    @property
    def rows(self) -> int:
        return self.meta.num_rows


@dataclass
class Csr:
    """Compressed adjacency: items of node i are `items[start[i]:start[i + 1]]`."""

    start: np.ndarray
    items: np.ndarray

    @classmethod
    def build(cls, nodes: np.ndarray, items: np.ndarray, size: int) -> Csr:
        order = np.argsort(nodes, kind="stable")
        start = np.searchsorted(nodes[order], np.arange(size + 1))
        return cls(start.astype(np.int64), items[order].astype(np.int64))

    def of(self, node: int) -> np.ndarray:
        return self.items[self.start[node]:self.start[node + 1]]

    def of_many(self, nodes: np.ndarray) -> np.ndarray:
        """The items of each node in turn (one gather, not a slice a node)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if len(nodes) == 0:
            return np.zeros(0, dtype=np.int64)
        first, sizes = self.start[nodes], self.start[nodes + 1] - self.start[nodes]
        # each item's position: its node's first, plus its place among that node's items
        offsets = np.repeat(first - np.cumsum(sizes) + sizes, sizes)
        return self.items[offsets + np.arange(int(sizes.sum()))]


@dataclass
class Snapshot:
    run_id: str
    path: Location
    manifest: dict[str, Any]
    kinds: dict[str, Kind]
    groups: dict[str, int]  # group_id -> code
    group_codes: dict[str, np.ndarray]  # kind -> group code per row
    fact_src: np.ndarray  # entity row of each fact row's source (-1: none)
    fact_tgt: np.ndarray
    fact_support: np.ndarray  # provenance episodes per fact row
    entity_facts: Csr  # entity row -> fact rows touching it
    entity_episodes: Csr  # entity row -> episode rows mentioning it (newest first)
    episode_entities: Csr  # episode row -> entity rows it mentions
    # episode row -> whether the row before it is of the same conversation (rows sort by
    # group and time): a turn's neighbours without a per-query read of conversation ids
    follows_turn: np.ndarray
    entity_rows: dict[str, int] = field(repr=False)
    episode_rows: dict[str, int] = field(repr=False)
    catalog: Catalog = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.catalog = Catalog(self.path)

    @property
    def dim(self) -> int:
        return int(self.manifest["embedding"]["dim"])


def _meta(table: Any, rows: int) -> pa.Table:
    try:
        return table_arrays.read_meta(table, rows)
    except ValueError as exc:  # (rows not 0 to rows - 1)
        raise store.StoreError(str(exc)) from exc


def _rows_of(values: pa.ChunkedArray | pa.Array, keys: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Position of each value in `keys`, -1 where absent (vectorised, no Python loop)."""
    return table_arrays.positions(values, pa.chunked_array(keys).combine_chunks()
                                  if isinstance(keys, pa.ChunkedArray) else keys)


def _vectors(kind: Kind, saved: table_arrays.Saved | None) -> np.ndarray:
    """The table's unit vectors: the file publish wrote, else computed from LanceDB."""
    found = saved.vectors() if saved else None
    return found if found is not None else table_arrays.unit_vectors(kind.table, kind.rows)


def _terms(kind: Kind, codes: np.ndarray, saved: table_arrays.Saved | None) -> TermIndex:
    """The table's BM25 postings: the files publish wrote, else built from its texts."""
    found = saved.postings() if saved else None
    return TermIndex(**found) if found else TermIndex.build(kind.meta["text"], codes)


def snapshot_query_config(manifest: dict[str, Any]) -> QueryConfig:
    """The query section the snapshot was built with (defaults where it has none)."""
    try:
        return QueryConfig.model_validate((manifest.get("config") or {}).get("query") or {})
    except ValueError:
        return QueryConfig()


def open_snapshot(snapshot: Location, config: QueryConfig | None = None) -> Snapshot:
    """Open a published snapshot's retrieval tables (they are built at publish, and may lie
    in an earlier snapshot that this one kept them from); tables whose groups are small
    enough for an exact in-memory scan keep their vectors, and tables small enough keep
    BM25 postings (`tkg.query.lexical`). Rows, vectors and postings are the files publish
    wrote beside each table (`tkg.pipeline.table_arrays`: 100,000 facts opened in 0.12-0.23 s
    instead of 1.22-1.28), computed from the table where it wrote none."""
    from lancedb.background_loop import LOOP

    manifest = store.read_manifest(snapshot)
    config = config or snapshot_query_config(manifest)
    where = store.lance_dirs(snapshot, manifest)
    arrays, versions = store.arrays_dirs(snapshot, manifest), store.lance_versions(manifest)
    missing = sorted({str(d) for d in where.values() if not storage.exists(d)})
    if missing:
        raise store.StoreError(
            f"snapshot {storage.name(snapshot)} has no retrieval indexes ({missing[0]} is "
            "missing); it was published before query indexes existed: rebuild it with "
            "`tkg build`")
    dbs = {str(d): (connect(d), LOOP.run(connect_async(d))) for d in where.values()}
    kinds: dict[str, Kind] = {}
    saved: dict[str, table_arrays.Saved | None] = {}
    for name in SPECS:
        db, adb = dbs[str(where[name])]
        table, atable = db.open_table(name), LOOP.run(adb.open_table(name))
        if versions[name] is not None:  # (the version this snapshot reads: later ones extend it)
            table.checkout(versions[name])
            LOOP.run(atable.checkout(versions[name]))
        rows = table.count_rows()
        indexed = {tuple(i.columns) for i in table.list_indices()} if rows else set()
        saved[name] = table_arrays.load(arrays[name], name, rows) if rows else None
        meta = saved[name].meta() if saved[name] else _meta(table, rows)
        kinds[name] = Kind(name, table if rows else None, atable if rows else None,
                           meta, ("vector",) in indexed)
    all_groups = sorted({g for k in kinds.values()
                         for g in pc.unique(k.meta["group_id"]).to_pylist() if g})
    groups = {g: i for i, g in enumerate(all_groups)}
    group_keys = pa.array(all_groups, pa.string())
    codes = {n: _rows_of(k.meta["group_id"], group_keys) for n, k in kinds.items()}
    for name, kind in kinds.items():
        if kind.table is None or np.any(np.diff(codes[name]) < 0):
            continue  # (rows sort by group_id, so codes never decrease)
        kind.group_start = np.searchsorted(codes[name], np.arange(len(groups) + 1))
        smallest = int(np.diff(kind.group_start).min()) if groups else 0
        if table_arrays.keeps_vectors(kind.rows, smallest, config):
            kind.vectors = _vectors(kind, saved[name])
        if table_arrays.keeps_postings(kind.rows, config):
            kind.terms = _terms(kind, codes[name], saved[name])

    entities, facts, episodes = kinds["entities"].meta, kinds["facts"].meta, kinds["episodes"].meta
    n_entities = entities.num_rows
    src = _rows_of(facts["source_entity_id"], entities["entity_id"])
    tgt = _rows_of(facts["target_entity_id"], entities["entity_id"])
    fact_rows = np.arange(facts.num_rows, dtype=np.int64)
    ends = np.concatenate([src, tgt])
    touching = np.concatenate([fact_rows, fact_rows])
    keep = ends >= 0
    entity_facts = Csr.build(ends[keep], touching[keep], n_entities)

    mentions = read_published(snapshot, "mentions", int(manifest["embedding"]["dim"]),
                              store.snapshot_files(snapshot, manifest).get("mentions"))
    m_episode = _rows_of(mentions["episode_id"], episodes["episode_id"])
    m_entity = _rows_of(mentions["entity_id"], entities["entity_id"])
    keep = (m_episode >= 0) & (m_entity >= 0)
    m_episode, m_entity = m_episode[keep], m_entity[keep]
    newest = np.argsort(-episodes["valid_at_us"].to_numpy()[m_episode], kind="stable")
    entity_episodes = Csr.build(m_entity[newest], m_episode[newest], n_entities)
    episode_entities = Csr.build(m_episode, m_entity, episodes.num_rows)

    support = pc.fill_null(pc.list_value_length(facts["episode_ids"]), 0)
    conversation = episodes["conversation_id"]
    follows_turn = np.zeros(episodes.num_rows, dtype=bool)
    if episodes.num_rows > 1:  # (a null conversation has no neighbours)
        same = pc.equal(conversation.slice(1), conversation.slice(0, episodes.num_rows - 1))
        follows_turn[1:] = pc.fill_null(same, False).to_numpy(zero_copy_only=False)
    opened = Snapshot(
        run_id=manifest["run_id"], path=snapshot, manifest=manifest, kinds=kinds,
        groups=groups, group_codes=codes, fact_src=src, fact_tgt=tgt,
        fact_support=support.to_numpy(zero_copy_only=False).astype(np.int64),
        entity_facts=entity_facts, entity_episodes=entity_episodes,
        episode_entities=episode_entities, follows_turn=follows_turn,
        entity_rows=dict(zip(entities["entity_id"].to_pylist(), range(n_entities), strict=True)),
        episode_rows=dict(zip(episodes["episode_id"].to_pylist(), range(episodes.num_rows),
                              strict=True)),
    )
    # The names index too, here rather than in the first query on this snapshot (0.15 s at
    # 100,000 facts that the first query paid on top of its own; a server opens snapshots
    # on its watcher thread).
    link.name_index(opened)
    return opened
