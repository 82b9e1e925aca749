"""A snapshot's DuckDB catalog, and the fact-history and entity lookups `tkg serve` and the
MCP server answer from it: parameterized SQL, scoped to the caller's groups."""

from __future__ import annotations

import threading
from datetime import date, datetime
from pathlib import Path
from typing import Any

from tkg.pipeline import storage, store
from tkg.pipeline.storage import Location

ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"  # edge and entity ids (hashes, prefixed)
# `episodes`: the caller's ids of the provenance episodes (their `id` field), in time order,
# as search returns them, not the internal episode ids
HISTORY_SQL = """
    SELECT f.edge_id, f.version, f.group_id, f.relation, f.fact, s.name AS source,
           t.name AS target, f.valid_at, f.invalid_at, f.created_at, f.expired_at,
           f.invalidated_by,
           coalesce((SELECT list(e.source_id ORDER BY e.valid_at, e.source_id)
                     FROM episodes e WHERE e.group_id = f.group_id
                       AND list_contains(f.episode_ids, e.episode_id)), []) AS episodes
    FROM facts f
    LEFT JOIN entities s ON s.entity_id = f.source_entity_id AND s.group_id = f.group_id
    LEFT JOIN entities t ON t.entity_id = f.target_entity_id AND t.group_id = f.group_id
    WHERE f.edge_id = ? AND list_contains(?, f.group_id)
    ORDER BY f.version"""
ENTITY_SQL = """
    SELECT entity_id, group_id, name, labels, summary, attributes, first_seen, last_seen,
           mention_count
    FROM entities WHERE entity_id = ? AND list_contains(?, group_id)"""
ALIASES_SQL = """
    SELECT DISTINCT alias, evidence FROM entity_aliases
    WHERE entity_id = ? AND list_contains(?, group_id) ORDER BY alias"""


# The entity a name's own id (what the name was on its own, or an entity it was before a
# merge) now belongs to: entity_aliases keeps it, so an id stored by a client still resolves.
MERGED_SQL = """
    SELECT min(entity_id) AS entity_id FROM entity_aliases
    WHERE merged_entity_id = ? AND list_contains(?, group_id)"""


class Catalog:
    """A snapshot's DuckDB catalog (fact history, entities), opened read-only on first use;
    each query has its own cursor, so threads share one connection."""

    def __init__(self, snapshot: Location) -> None:
        self.snapshot = snapshot
        self._con: Any = None
        self._lock = threading.Lock()

    def _available(self) -> bool:
        """A local snapshot has its catalog file; one in object storage gets a catalog
        built at open time from its manifest's file lists."""
        if storage.is_url(self.snapshot):
            return storage.is_file(storage.join(self.snapshot, store.MANIFEST))
        return (Path(self.snapshot) / store.CATALOG).is_file()

    def rows(self, sql: str, params: list[Any]) -> list[dict[str, Any]] | None:
        """The result as JSON-ready dicts (times as ISO strings); None without a catalog."""
        with self._lock:
            if self._con is None:
                if not self._available():
                    return None
                self._con = store.open_catalog(self.snapshot)
        cursor = self._con.cursor()
        try:
            return json_rows(cursor.execute(sql, params))
        finally:
            cursor.close()


def json_rows(cursor: Any) -> list[dict[str, Any]]:
    """A DuckDB result as dicts of JSON values (times as ISO strings)."""
    columns = [d[0] for d in cursor.description]
    return [{c: _json_value(v) for c, v in zip(columns, row, strict=True)}
            for row in cursor.fetchall()]


def _json_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime | date) else value


class NoCatalog(LookupError):
    """The snapshot has no DuckDB catalog."""


def _query(catalog: Catalog, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    found = catalog.rows(sql, params)
    if found is None:
        raise NoCatalog("this snapshot has no catalog")
    return found


def history(catalog: Catalog, edge_id: str, groups: list[str]) -> list[dict[str, Any]]:
    """Every version of a fact within `groups`, oldest first."""
    return _query(catalog, HISTORY_SQL, [edge_id, groups])


def entity(catalog: Catalog, entity_id: str, groups: list[str]) -> dict[str, Any] | None:
    """One entity within `groups` with its aliases, or None. An id the entity had before a
    merge gives the entity it became (its own `entity_id` says which)."""
    rows = _query(catalog, ENTITY_SQL, [entity_id, groups])
    if not rows:
        merged = _query(catalog, MERGED_SQL, [entity_id, groups])[0]["entity_id"]
        if merged is None or merged == entity_id:
            return None
        rows = _query(catalog, ENTITY_SQL, [merged, groups])
        if not rows:
            return None
    found = rows[0]
    found["aliases"] = _query(catalog, ALIASES_SQL, [entity_id, [found["group_id"]]])
    return found
