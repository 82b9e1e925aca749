"""Forget: a run that removes. `forget(X)` after `build(all)` publishes what `build(all - X)`
publishes (the same rows and ids; run ids and transaction times aside).

Every derived table is a function of a group's episodes (resolution, facts and communities
never cross a group), so a forget re-derives the groups it touches and carries every other
group's files by reference:

- **select**: the erased episodes (by id, source, group, date, or the episodes that mention
  an entity) and the names of erased entities, read from the current snapshot's catalog
  with parameters (no user text becomes SQL). A group that loses every episode is dropped
  whole: nothing of it is derived again.
- **stages**: the touched groups' stored extractions less the erased episodes (and less the
  erased entities' names) go through the build's own stages, computing in full (`names`,
  `resolve`, `facts`, `communities`) as a build of those episodes would; names and facts
  keep their stored vectors (a vector is a function of its text), so no model runs but
  for new community names.
- **versions**: each re-derived edge meets its stored versions (`reconcile_versions`):
  versions that an erased episode supported or that it ended are gone, the history that
  remains is kept, and the edge as it now stands is its open version (the earlier one
  reopened when it says the same).
- **publish**: `store.publish` with the touched groups' new files and, of every table,
  the previous files that held nothing erased (episodes files that held an erased episode
  are rewritten without it).
- **purge** (`--purge`): earlier snapshots that list a file that held erased data are
  retired (their files removed unless a kept snapshot lists them), and every work dir goes.

Cost: what the touched groups hold (their extractions, names and edges), not the store; the
retrieval indexes are built again at publish, as after every run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import posixpath
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import engine, faults, lock, outputs, reliability, schema, storage, store
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.context import RunContext, Stage
from tkg.pipeline.datasets import empty_dataset, read_parquet_files
from tkg.pipeline.resolve import normalize_name
from tkg.pipeline.stages import INTERNAL_EXTRACTIONS, INTERNAL_PAIRS, REGISTRY
from tkg.pipeline.stages.common import (
    INTERNAL_ENTITIES,
    INTERNAL_NAMES,
    embed_changed,
    previous_table,
)
from tkg.pipeline.stages.facts import INTERNAL_STATEMENTS
from tkg.pipeline.stages.names import INTERNAL_MENTIONS, INTERNAL_NODES
from tkg.pipeline.storage import Location

log = logging.getLogger("tkg.forget")
ERASURES_DIR = "erasures"  # STORE/erasures/<request_id>.parquet: the erasure log
GROUP_DIR = re.compile(r"(?:^|/)group_id=([^/]+)/")

# What the forget's stages publish: work output -> table (the build's names). A touched
# group's files of every other table are dropped (`_plan`): each table a later run reads
# must be here.
PUBLISHED = {"extractions": INTERNAL_EXTRACTIONS, "resolution_pairs": INTERNAL_PAIRS,
             "entity_aliases": "entity_aliases", "mentions": "mentions",
             "entities_embedded": "entities", "facts_versioned": "facts",
             "communities": "communities", "community_members": "community_members",
             # without it, the next night takes every entity of a touched group as changed
             "name_map": INTERNAL_NAMES,
             # what the next night keeps of names and resolution where it changes nothing
             "entity_mentions": INTERNAL_MENTIONS, "name_nodes": INTERNAL_NODES,
             "resolved_entities": INTERNAL_ENTITIES,
             # without it, the next night lost the earlier versions of a touched group's
             # records (a version tonight ended none of their fields)
             "record_statements": INTERNAL_STATEMENTS}


class ForgetError(ValueError):
    """A selector that cannot be used; the message says what to give instead."""


# --- what to forget ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """What goes; each part adds to it. `episodes`: (group, caller's id or episode id);
    `entities`: (group, name, alias or entity id), with `with_episodes` also every episode
    that mentions them; `before`: episodes whose time (valid_at) is earlier."""

    episodes: tuple[tuple[str, str], ...] = ()
    sources: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    before: datetime | None = None
    entities: tuple[tuple[str, str], ...] = ()
    with_episodes: bool = False

    def __post_init__(self) -> None:
        if not (self.episodes or self.sources or self.groups or self.before or self.entities):
            raise ForgetError("nothing selected: give --episode GROUP:ID, --source, --group, "
                              "--before DATE or --entity GROUP:NAME")
        if self.before is not None and self.before.tzinfo is None:
            object.__setattr__(self, "before", self.before.replace(tzinfo=UTC))

    def key(self) -> str:
        """A stable text of the selector (what the run id of a resumable forget hashes)."""
        return json.dumps({"episodes": sorted(self.episodes), "sources": sorted(self.sources),
                           "groups": sorted(self.groups), "entities": sorted(self.entities),
                           "before": self.before.isoformat() if self.before else None,
                           "with_episodes": self.with_episodes}, sort_keys=True)

    def hashed(self, salt: str) -> dict[str, Any]:
        """The selector for the erasure log: its kinds, each value as a salted hash (an
        erased id never appears in clear); the date cut is no person's data and stays."""
        def digest(*parts: str) -> str:
            return salted(salt, *parts)

        return {"episodes": [digest(g, i) for g, i in sorted(self.episodes)],
                "sources": [digest(s) for s in sorted(self.sources)],
                "groups": [digest(g) for g in sorted(self.groups)],
                "entities": [digest(g, n) for g, n in sorted(self.entities)],
                "before": self.before.isoformat() if self.before else None,
                "with_episodes": self.with_episodes}


def salted(salt: str, *parts: str) -> str:
    return hashlib.sha256((salt + "\x1f".join(parts)).encode()).hexdigest()


def parse_pair(text: str, what: str) -> tuple[str, str]:
    """`GROUP:VALUE` (the value may hold colons)."""
    group, sep, value = text.partition(":")
    if not sep or not group or not value:
        raise ForgetError(f"{what} {text!r}: expected GROUP:{what.upper()}, e.g. acme:m-17")
    return group, value


def parse_date(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            moment = datetime.combine(date.fromisoformat(text), datetime.min.time())
        except ValueError:
            raise ForgetError(f"--before {text!r}: expected a date or time in ISO-8601, "
                              "e.g. 2023-01-01") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass
class Selection:
    """What a selector finds in a snapshot."""

    erased: pa.Table  # episode_id, group_id, source_id
    entity_ids: dict[str, set[str]]  # group -> erased entities (by --entity)
    masked: dict[str, set[str]]  # group -> normalized names of erased entities
    touched: set[str]  # groups derived again
    dropped: set[str]  # groups that lose everything
    counts: dict[str, int] = field(default_factory=dict)  # what a dry run prints

    @property
    def empty(self) -> bool:
        return self.erased.num_rows == 0 and not any(self.entity_ids.values())

    def erased_ids(self) -> set[str]:
        return set(self.erased["episode_id"].to_pylist())


ERASED = pa.schema([("episode_id", pa.string()), ("group_id", pa.string()),
                    ("source_id", pa.string())])


def _table(rows: Iterable[Sequence[Any]], names: Sequence[str]) -> pa.Table:
    rows = list(rows)
    return pa.table({n: pa.array([r[i] for r in rows], pa.string())
                     for i, n in enumerate(names)})


def select(snapshot: Location, selector: Selector) -> Selection:
    """The erased episodes and entities of `selector` in `snapshot`, and the counts of what
    would go (episodes, mentions, facts deleted or kept with fewer sources, entities,
    communities touched, groups dropped)."""
    with store.open_catalog(snapshot) as con:
        con.register("sel_pairs", _table(selector.episodes, ["group_id", "value"]))
        con.register("sel_sources", _table([(s,) for s in selector.sources], ["source"]))
        con.register("sel_groups", _table([(g,) for g in selector.groups], ["group_id"]))
        entity_ids = _entities(con, selector.entities)
        con.register("sel_entities", _table(
            [(g, e) for g, ids in entity_ids.items() for e in ids], ["group_id", "entity_id"]))
        where = [
            "group_id IN (SELECT group_id FROM sel_groups)",
            "source IN (SELECT source FROM sel_sources)",
            "EXISTS (SELECT 1 FROM sel_pairs p WHERE p.group_id = e.group_id AND "
            "(p.value = e.source_id OR p.value = e.episode_id))",
        ]
        params: list[Any] = []
        if selector.before is not None:
            where.append("valid_at < ?")
            params.append(selector.before)
        if selector.with_episodes:
            where.append("episode_id IN (SELECT m.episode_id FROM mentions m "
                         "JOIN sel_entities s USING (group_id, entity_id))")
        erased = con.sql(
            "SELECT episode_id, group_id, source_id FROM episodes e WHERE "
            + " OR ".join(f"({w})" for w in where) + " ORDER BY group_id, episode_id",
            params=params).to_arrow_table()
        erased = schema.conform(erased, ERASED)
        con.register("erased", erased)
        masked = _masked_names(con, entity_ids)
        left = dict(con.execute(
            "SELECT group_id, count(*) FROM episodes WHERE group_id IN "
            "(SELECT DISTINCT group_id FROM erased) AND episode_id NOT IN "
            "(SELECT episode_id FROM erased) GROUP BY group_id").fetchall())
        groups = set(erased["group_id"].to_pylist())
        dropped = {g for g in groups if not left.get(g)}
        touched = (groups - dropped) | {g for g, ids in entity_ids.items() if ids} - dropped
        counts = _counts(con, dropped)
    return Selection(erased=erased, entity_ids=entity_ids, masked=masked, touched=touched,
                     dropped=dropped, counts=counts)


def _entities(con: Any, wanted: Sequence[tuple[str, str]]) -> dict[str, set[str]]:
    """Entity ids of each (group, name, alias or id) asked for; an unknown one is an error
    (a typo must not pass for an erasure)."""
    found: dict[str, set[str]] = {}
    for group, value in wanted:
        ids = {row[0] for row in con.execute(
            "SELECT entity_id FROM entities WHERE group_id = ? AND (entity_id = ? OR "
            "lower(name) = lower(?)) UNION SELECT entity_id FROM entity_aliases WHERE "
            "group_id = ? AND (entity_id = ? OR merged_entity_id = ? OR lower(alias) = "
            "lower(?) OR normalized = ?)",
            [group, value, value, group, value, value, value, normalize_name(value)]
        ).fetchall()}
        if not ids:
            raise ForgetError(f"no entity {value!r} in group {group!r}: give a name, an "
                              "alias or an entity id as `tkg search` shows it")
        found.setdefault(group, set()).update(ids)
    return found


def _masked_names(con: Any, entity_ids: dict[str, set[str]]) -> dict[str, set[str]]:
    """The normalized names (every alias) of the erased entities, per group."""
    masked: dict[str, set[str]] = {}
    for group in entity_ids:
        rows = con.execute(
            "SELECT normalized FROM entity_aliases WHERE group_id = ? AND entity_id IN "
            "(SELECT entity_id FROM sel_entities WHERE group_id = ?) UNION "
            "SELECT name FROM entities WHERE group_id = ? AND entity_id IN "
            "(SELECT entity_id FROM sel_entities WHERE group_id = ?)",
            [group, group, group, group]).fetchall()
        masked[group] = {normalize_name(r[0] or "") for r in rows} - {""}
    return masked


def _counts(con: Any, dropped: set[str]) -> dict[str, int]:
    """What a forget of the registered `erased` episodes and `sel_entities` would remove
    (the stages derive the exact figures; these read the snapshot as it is)."""
    def one(sql: str) -> int:
        return int(con.execute(sql).fetchone()[0] or 0)

    gone = ("(SELECT entity_id FROM mentions WHERE episode_id IN (SELECT episode_id FROM "
            "erased) EXCEPT SELECT entity_id FROM mentions WHERE episode_id NOT IN "
            "(SELECT episode_id FROM erased)) UNION SELECT entity_id FROM sel_entities")
    sources = ("SELECT edge_id, count(*) AS n, count(*) FILTER (ep IN (SELECT episode_id "
               "FROM erased)) AS x, bool_or(source_entity_id IN (SELECT entity_id FROM "
               "sel_entities) OR target_entity_id IN (SELECT entity_id FROM sel_entities)) "
               "AS named FROM (SELECT edge_id, source_entity_id, target_entity_id, "
               "unnest(episode_ids) AS ep FROM facts_current) GROUP BY edge_id")
    return {
        "episodes": one("SELECT count(*) FROM erased"),
        "mentions": one("SELECT count(*) FROM mentions WHERE episode_id IN (SELECT "
                        "episode_id FROM erased) OR entity_id IN (SELECT entity_id FROM "
                        "sel_entities)"),
        "facts_deleted": one(f"SELECT count(*) FROM ({sources}) WHERE x = n OR named"),
        "facts_fewer_sources": one(f"SELECT count(*) FROM ({sources}) WHERE x > 0 AND "
                                   "x < n AND NOT named"),
        "entities": one(f"SELECT count(*) FROM ({gone})"),
        "communities_touched": one(
            "SELECT count(DISTINCT community_id) FROM community_members WHERE entity_id IN "
            "(SELECT entity_id FROM mentions WHERE episode_id IN (SELECT episode_id FROM "
            "erased) UNION SELECT entity_id FROM sel_entities)"),
        "groups_dropped": len(dropped),
    }


# --- the run's stages -------------------------------------------------------------------------


def _remaining(erased: set[str], masked: dict[str, set[str]]
               ) -> Callable[[pa.Table], pa.Table]:
    """Extraction rows less the erased episodes, and less the erased entities' names (their
    mentions and every fact they are an endpoint of)."""
    gone = pa.array(sorted(erased), pa.string())

    def keep(batch: pa.Table) -> pa.Table:
        batch = schema.conform(batch, schema.EXTRACTIONS)
        batch = batch.filter(pc.invert(pc.fill_null(pc.is_in(batch["episode_id"], gone),
                                                    False)))
        if not any(masked.values()):
            return batch
        rows = batch.to_pylist()
        for row in rows:
            names = masked.get(row["group_id"]) or set()
            if names:
                row["entities"] = [e for e in row["entities"] or []
                                   if normalize_name(e["name"] or "") not in names]
                row["facts"] = [f for f in row["facts"] or []
                                if normalize_name(f["source"] or "") not in names
                                and normalize_name(f["target"] or "") not in names]
        return schema.from_rows(rows, schema.EXTRACTIONS)

    return keep


def in_groups(files: Sequence[Location], groups: set[str]) -> list[Location]:
    """The files of a table (as listed) that lie in one of `groups`' partitions."""
    return [f for f in files if (m := GROUP_DIR.search(str(f))) and m.group(1) in groups]


def _extractions_stage(selection: Selection) -> Stage:
    """The touched groups' stored extractions, less what goes: the input of the build's
    stages from `names` on."""

    def run(ctx: RunContext, _inputs: dict[str, Dataset]) -> dict[str, Dataset]:
        files = in_groups(store.table_files(ctx.previous, INTERNAL_EXTRACTIONS),
                          selection.touched)
        if not files:
            return {"extractions": empty_dataset()}
        stored = read_parquet_files([str(f) for f in files], None,
                                    engine.policy(ctx).driver_bytes)
        ctx.count("previous_rows_read", stored.count())
        return {"extractions": engine.map(ctx, stored, _remaining(selection.erased_ids(),
                                                                  selection.masked))}

    return Stage("forget_select", (), ("extractions",), run)


def _from_scratch(stage: Stage) -> Stage:
    """A build stage computing in full over the touched groups' inputs alone, as a build of
    them would: it reads nothing of the previous snapshot (whose rows it replaces)."""
    full = stage.in_full()
    return replace(full, name=stage.name,
                   run=lambda ctx, inputs: full.run(replace(ctx, previous=None), inputs))


def _embed_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Vectors of the re-derived entities and facts, each its stored one when the snapshot
    holds the same text (so a forget runs no embedding model for them); entities keep the
    transaction time they were first stored at."""
    entities = embed_changed(ctx, inputs["entities_summarized"], "entities", "entity_id",
                             "name", "name_embedding")
    stored = previous_table(ctx, "entities", ["entity_id", "created_at"])
    if stored is not None:
        entities = engine.map(ctx, engine.join(ctx, entities, engine.map(
            ctx, stored, _renamed, "created_at", "stored_created_at"), "left_outer",
            ("entity_id",)), _first_created)
    return {"entities_embedded": entities,
            "facts_embedded": embed_changed(ctx, inputs["merged_facts"], "facts", "edge_id",
                                            "fact", "fact_embedding")}


def _renamed(batch: pa.Table, old: str, new: str) -> pa.Table:
    return batch.rename_columns([new if c == old else c for c in batch.column_names])


def _first_created(batch: pa.Table) -> pa.Table:
    if "stored_created_at" not in batch.column_names:
        return batch
    created = pc.coalesce(batch["stored_created_at"], batch["created_at"])
    rest = batch.drop_columns(["stored_created_at"])
    return rest.set_column(rest.schema.get_field_index("created_at"), "created_at", created)


SIDE = "_side"


def _versions_stage(selection: Selection) -> Stage:
    """Each re-derived edge of the touched groups against its stored versions, shuffled by
    edge (`reconcile_versions`)."""

    def run(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
        files = in_groups(store.table_files(ctx.previous, "facts"), selection.touched)
        new = engine.map(ctx, inputs["facts_embedded"], _side, "new", ctx.dim)
        if not files:
            return {"facts_versioned": engine.map(ctx, new, reconcile_versions, set(),
                                                  ctx.created_at)}
        stored = read_parquet_files([str(f) for f in files], None,
                                    engine.policy(ctx).driver_bytes)
        ctx.count("previous_rows_read", stored.count())
        both = engine.union(ctx, new, engine.map(ctx, stored, _side, "old", ctx.dim))
        return {"facts_versioned": engine.shuffle(
            ctx, both, ["edge_id"], reconcile_versions, selection.erased_ids(),
            ctx.created_at)}

    return Stage("forget_versions", ("facts_embedded",), ("facts_versioned",), run)


def _side(batch: pa.Table, side: str, dim: int) -> pa.Table:
    rows = schema.conform(batch, schema.facts(dim))
    return rows.append_column(SIDE, pa.array([side] * rows.num_rows, pa.string()))


SAME = ("source_entity_id", "target_entity_id", "relation", "fact", "valid_at", "invalid_at",
        "invalidated_by")


def _says_the_same(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return (all(old[k] == new[k] for k in SAME)
            and sorted(old["episode_ids"] or []) == sorted(new["episode_ids"] or []))


def reconcile_versions(block: pa.Table, erased: set[str], now: datetime) -> pa.Table:
    """The versions of the edges in `block` (stored ones tagged "old", the re-derived edge
    "new") as if the erased episodes had never arrived: a stored version goes when an erased
    episode supported it, and so does the open one (the edge is what it now says). The rest
    of the history stays, numbered again from 1; the re-derived edge follows as the open
    version, or reopens the last kept one when it says the same. A re-derived edge keeps
    the transaction time the store first held the edge at (what a build of the remaining
    episodes would have said then), and an unchanged edge stays as it is."""
    if block.num_rows == 0:
        return block.drop_columns([SIDE]) if SIDE in block.column_names else block
    out_schema = block.schema.remove(block.schema.get_field_index(SIDE))
    by_edge: dict[str, tuple[list[dict], dict | None]] = {}
    for row in block.to_pylist():
        old, new = by_edge.setdefault(row["edge_id"], ([], None))
        side = row.pop(SIDE)
        if side == "old":
            old.append(row)
        else:
            by_edge[row["edge_id"]] = (old, row)
    rows: list[dict] = []
    for edge_id in sorted(by_edge):
        old, new = by_edge[edge_id]
        rows += _edge_history(sorted(old, key=lambda r: r["version"]), new, erased, now)
    return pa.Table.from_pylist(rows, schema=out_schema)


def _edge_history(old: list[dict], new: dict | None, erased: set[str], now: datetime
                  ) -> list[dict]:
    supported = any(erased.intersection(v["episode_ids"] or []) for v in old)
    if (new is not None and old and not supported and old[-1]["expired_at"] is None
            and _says_the_same(old[-1], new)):
        return old  # untouched by the erasure: every version as it was
    kept = [dict(v) for v in old if v["expired_at"] is not None
            and not erased.intersection(v["episode_ids"] or [])]
    for number, version in enumerate(kept, start=1):
        version["version"] = number
    if new is None:
        return kept
    if kept and _says_the_same(kept[-1], new):
        kept[-1]["expired_at"] = None
        return kept
    first = min((v["created_at"] for v in old if v["created_at"] is not None), default=now)
    opened = kept[-1]["expired_at"] if kept else first
    return [*kept, {**new, "version": len(kept) + 1, "created_at": opened, "expired_at": None}]


def forget_stages(selection: Selection) -> tuple[Stage, ...]:
    """The build's stages from `names` on, over the touched groups' remaining extractions."""
    return (_extractions_stage(selection), _from_scratch(REGISTRY["names"]),
            REGISTRY["embed_names"], _from_scratch(REGISTRY["resolve"]),
            _from_scratch(REGISTRY["facts"]),
            Stage("forget_embed", ("entities_summarized", "merged_facts"),
                  ("entities_embedded", "facts_embedded"), _embed_stage),
            _versions_stage(selection), _from_scratch(REGISTRY["communities"]))


# --- publish ----------------------------------------------------------------------------------


@dataclass
class Plan:
    """Of each table, the previous files carried as they are, and the rows written anew."""

    carry: dict[str, list[str]]
    rewritten: dict[str, pa.Table]  # table -> rows of rewritten files (episodes)
    held: set[str]  # storage keys of previous files that held erased data
    rejects: pa.Table


def _plan(previous: Location, selection: Selection, dim: int) -> Plan:
    """Which previous files stay: every file of a group neither touched nor dropped; of a
    touched group, the episodes files that held no erased episode. The episodes files that
    held one are written again without it; rejects lose the erased episodes' rows."""
    listed = store.relative_files(previous)
    erased = pa.array(sorted(selection.erased_ids()), pa.string())
    gone_groups = selection.touched | selection.dropped
    carry: dict[str, list[str]] = {}
    held: set[str] = set()
    rewritten: list[pa.Table] = []
    for table, files in listed.items():
        if table in ("runs", "rejects"):  # written whole: runs by publish, rejects here
            carry[table] = []
            continue
        if table == "episodes":
            carry[table], kept, held_here = _episode_files(previous, files, selection, erased)
            rewritten += kept
            held |= held_here
            continue
        out = in_groups(files, gone_groups)
        carry[table] = [f for f in files if f not in out]
        if table == INTERNAL_EXTRACTIONS:
            # a snapshot listing one of these holds the erased rows or what came of them
            held |= {_key(storage.join(previous, f)) for f in in_groups(
                files, selection.dropped | {g for g, n in selection.masked.items() if n})}
    rejects = store.read_table(previous, "rejects", schema.REJECTS)
    keep = pc.invert(pc.or_(
        pc.fill_null(pc.is_in(rejects["episode_id"], erased), False),
        pc.fill_null(pc.is_in(rejects["group_id"], pa.array(sorted(selection.dropped),
                                                           pa.string())), False)))
    episodes = (pa.concat_tables(rewritten) if rewritten
                else schema.episodes(dim).empty_table())
    return Plan(carry=carry, rewritten={"episodes": episodes}, held=held,
                rejects=rejects.filter(keep))


def _episode_files(previous: Location, files: list[str], selection: Selection,
                   erased: pa.Array) -> tuple[list[str], list[pa.Table], set[str]]:
    """Episodes files: carried (no erased episode), or read and kept less the erased rows."""
    dropped = set(in_groups(files, selection.dropped))
    candidates = [f for f in in_groups(files, set(selection.erased["group_id"].to_pylist()))
                  if f not in dropped]
    ids = storage.each(lambda f: storage.read_parquet(storage.join(previous, f),
                                                      ["episode_id"]), candidates)
    holding = {f for f, t in zip(candidates, ids, strict=True)
               if pc.any(pc.is_in(t["episode_id"], erased)).as_py()}
    kept = [t.filter(pc.invert(pc.is_in(t["episode_id"], erased))) for t in storage.each(
        lambda f: storage.read_parquet(storage.join(previous, f)), sorted(holding))]
    held = {_key(storage.join(previous, f)) for f in holding | dropped}
    return [f for f in files if f not in holding and f not in dropped], kept, held


def _writers(ctx: RunContext, plan: Plan, ran: bool) -> dict[str, store.TableWriter]:
    from tkg.pipeline.build import stage_writers, table_writer

    tables = (stage_writers(ctx, PUBLISHED) if ran else {
        table: table_writer(schema.WORK_TABLES[work](ctx.dim).empty_table(),
                            schema.WORK_TABLES[work](ctx.dim))
        for work, table in PUBLISHED.items()})
    tables["episodes"] = table_writer(plan.rewritten["episodes"], schema.episodes(ctx.dim))
    tables["rejects"] = table_writer(plan.rejects, schema.REJECTS)
    return tables  # a table of another kind: the files of groups not touched are carried


def _key(location: Location) -> str:
    """A file's storage key with `..` resolved: a later snapshot lists an earlier one's file
    as `../<run>/...`, the earlier one as its own."""
    return posixpath.normpath(storage.key(location))


def retired_snapshots(store_dir: Location, held: set[str], current: str) -> list[str]:
    """Published snapshots (other than `current`) that list a file that held erased data:
    they hold the erased rows, or rows derived from them."""
    found = []
    for snapshot in storage.list_dirs(storage.join(store_dir, "snapshots")):
        name = storage.name(snapshot)
        if name == current or not storage.is_file(storage.join(snapshot, store.MANIFEST)):
            continue
        files = store.snapshot_files(snapshot)
        if any(_key(f) in held for listed in files.values() for f in listed):
            found.append(name)
    return sorted(found)


# --- the forget -------------------------------------------------------------------------------


@dataclass
class ForgetResult:
    request_id: str
    dry_run: bool
    counts: dict[str, int]  # dry run: what would go; else rows removed per table
    snapshot: str | None = None
    retired: list[str] = field(default_factory=list)
    work_dirs_removed: int = 0
    seconds: float = 0.0
    nothing: bool = False

    def summary(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "dry_run": self.dry_run, "counts": self.counts,
                "snapshot": self.snapshot, "snapshots_retired": self.retired,
                "work_dirs_removed": self.work_dirs_removed, "seconds": round(self.seconds, 2),
                "nothing_selected": self.nothing}


def forget(config: TkgConfig, store_dir: str | Location, selector: Selector, *,
           by: str = "", dry_run: bool = False, purge: bool = False) -> ForgetResult:
    """Remove what `selector` finds from the store's current snapshot (a new snapshot, as
    if it had never arrived), log the erasure, and with `purge` from its history. A forget
    killed at any step leaves the previous snapshot published; the same call again resumes
    it (the run id is the selector's and the snapshot's) and completes the purge."""
    started = time.perf_counter()
    storage.configure(config.storage)
    store_dir = storage.location(store_dir)
    snapshot = store.current_snapshot(store_dir)
    digest = hashlib.sha256((selector.key() + storage.name(snapshot)).encode()).hexdigest()
    request = f"forget-{digest[:12]}"  # the same request on the same snapshot resumes
    selection = select(snapshot, selector)
    if dry_run or selection.empty:
        result = ForgetResult(request, dry_run, selection.counts, nothing=selection.empty)
        if purge and not dry_run:  # what an interrupted forget left to purge
            with lock.held(store_dir, "forget", request):
                result.retired, result.work_dirs_removed = purge_history(store_dir)
        result.seconds = time.perf_counter() - started
        return result
    with lock.held(store_dir, "forget", request):
        if store.current_snapshot(store_dir) != snapshot:
            raise store.StoreError(f"{store_dir} changed while the forget was selecting; run "
                                   "it again")
        result = _run(config, store_dir, request, selection)
        _log(store_dir, result, selector, by, selection)
        faults.hit("forget", "published")
        if purge:
            result.retired, result.work_dirs_removed = purge_history(store_dir)
    result.seconds = time.perf_counter() - started
    return result


def _run(config: TkgConfig, store_dir: Location, request: str, selection: Selection
         ) -> ForgetResult:
    from tkg.pipeline.build import publish_run, run_context, run_figures, run_stages

    started_at = store.now()
    ctx = run_context(config, store_dir, request, [], started_at,
                      dim=int(store.read_manifest(store.current_snapshot(store_dir))
                              ["embedding"]["dim"]))
    previous = ctx.previous
    before = store.read_manifest(previous)
    ran = bool(selection.touched)
    seconds = run_stages(ctx, forget_stages(selection)) if ran else {}
    plan = _plan(previous, selection, ctx.dim)
    retired = retired_snapshots(store_dir, plan.held, request)  # the previous one too
    erasures = [*(before.get("erasures") or []),
                {"request_id": request, "at": ctx.created_at.isoformat(), "retire": retired}]

    def summarize(done: store.Published) -> dict[str, Any]:
        removed = {t: int(before.get("tables", {}).get(t, 0)) - n for t, n in done.rows.items()
                   if t in before.get("tables", {})}
        return {"run_id": request, "kind": "forget", "store": str(store_dir),
                "snapshot": str(done.snapshot), "previous_snapshot": storage.name(previous),
                "removed": removed, **{t: n for t, n in done.rows.items()
                                       if t in schema.PUBLISHED},
                **run_figures(ctx, done, seconds)}

    manifest = publish_run(
        ctx, store_dir, _writers(ctx, plan, ran), started_at, summarize,
        {"embedding": before["embedding"], "inputs": [], "schema_version": 1,
         "forget": {"request_id": request, "groups_touched": len(selection.touched),
                    "groups_dropped": len(selection.dropped)},
         "erasures": erasures},
        grown=tuple(plan.carry), carry=plan.carry,
        # retrieval tables built whole: an extended table would keep the erased rows in the
        # files of its earlier versions, in a folder this snapshot lists (the purge keeps it)
        extend=False)
    return ForgetResult(request, False, manifest["summary"]["removed"],
                        snapshot=manifest["run_id"], retired=retired)


def purge_history(store_dir: Location) -> tuple[list[str], int]:
    """Retire the snapshots that erasures recorded as holding erased data (their files go
    unless a kept snapshot lists them), and remove every work dir (stage outputs of earlier
    runs hold episodes and extractions). Call it with the store lock held; done again it
    finds nothing more to do."""
    current = store.current_run(store_dir)
    if current is None:
        return [], 0
    manifest = store.read_manifest(store.snapshot_dir(store_dir, current))
    wanted = {r for e in manifest.get("erasures") or [] for r in e.get("retire") or []}
    published = {storage.name(s): s for s in storage.list_dirs(
        storage.join(store_dir, "snapshots"))}
    retire = sorted(r for r in wanted if r in published and r != current)
    kept = [s for name, s in published.items() if name not in retire
            and storage.is_file(storage.join(s, store.MANIFEST))]
    files, folders = reliability.referenced_files(kept)
    for name in retire:
        snapshot = published[name]
        # the manifest first: a crash after it leaves a folder no reader opens
        with contextlib.suppress(FileNotFoundError):
            storage.delete_file(storage.join(snapshot, store.MANIFEST))
        faults.hit("forget", "retired")
        unused = [f for f, _ in storage.file_sizes(snapshot)
                  if storage.key(f) not in files and not storage.key(f).startswith(folders)]
        storage.delete_files(unused)
        lance = storage.join(snapshot, "lance")  # its emptied folders, unless still listed
        if not any(storage.key(lance).startswith(f.rstrip("/")) for f in folders):
            storage.delete_dir(lance)
        if not any(True for _ in storage.file_sizes(snapshot)):
            storage.delete_dir(snapshot)
    works = storage.list_dirs(storage.join(store_dir, "work"))
    for work in works:
        storage.delete_dir(work)
    return retire, len(works)


# --- the erasure log --------------------------------------------------------------------------


def _log(store_dir: Location, result: ForgetResult, selector: Selector, by: str,
         selection: Selection) -> None:
    """One row in STORE/erasures/: no erased content, no id in clear."""
    salt = secrets.token_hex(16)
    hashes = sorted(salted(salt, g, s) for g, s in zip(
        selection.erased["group_id"].to_pylist(), selection.erased["source_id"].to_pylist(),
        strict=True))
    row = {"request_id": result.request_id, "requested_at": store.now(), "requested_by": by,
           "selector": json.dumps(selector.hashed(salt), sort_keys=True),
           "dry_run": result.dry_run, "counts": list(result.counts.items()),
           "snapshot": result.snapshot, "snapshots_retired": result.retired, "salt": salt,
           "erased_hashes": hashes}
    name = f"{result.request_id}-{'dry-' if result.dry_run else ''}{salt[:8]}.parquet"
    storage.write_parquet(schema.from_rows([row], schema.ERASURES),
                          storage.join(store_dir, ERASURES_DIR, name))


def erasure_log(store_dir: str | Location, last: int | None = None) -> pa.Table:
    """The erasure log, newest first (`last`: only so many)."""
    folder = storage.join(storage.location(store_dir), ERASURES_DIR)
    with contextlib.suppress(FileNotFoundError):
        files = storage.list_files(folder, suffixes={".parquet"})
        if files:
            table = pa.concat_tables([schema.conform(storage.read_parquet(f), schema.ERASURES)
                                      for f in files])
            table = table.sort_by([("requested_at", "descending")])
            return table if last is None else table.slice(0, last)
    return schema.ERASURES.empty_table()


def was_erased(store_dir: str | Location, group_id: str, source_id: str) -> bool:
    """Whether the log records this episode (the caller's id) as erased: an auditor's
    check, against each request's salt."""
    log_rows = erasure_log(store_dir).filter(pc.invert(pc.field("dry_run")))
    for salt, hashes in zip(log_rows["salt"].to_pylist(),
                            log_rows["erased_hashes"].to_pylist(), strict=True):
        if salted(salt, group_id, source_id) in (hashes or []):
            return True
    return False


# --- retention --------------------------------------------------------------------------------


def apply_retention(config: TkgConfig, store_dir: str | Location,
                    now: datetime | None = None) -> ForgetResult | None:
    """The `retention` section, applied after a build: episodes older than
    `retention.max_age_days` are forgotten (none when it is unset)."""
    days = config.retention.max_age_days
    if days is None:
        return None
    cut = (now or store.now()) - timedelta(days=days)
    return forget(config, store_dir, Selector(before=cut), by=config.retention.by,
                  purge=config.retention.purge)


def read_selection_file(path: str) -> list[tuple[str, str]]:
    """`GROUP:ID` per line (blank lines and # comments skipped)."""
    lines = storage.read_text(path).splitlines()
    return [parse_pair(line.strip(), "episode") for line in lines
            if line.strip() and not line.lstrip().startswith("#")]


def stage_seconds(store_dir: Location, request: str) -> dict[str, float]:
    """Seconds per stage of a forget, from its markers (for the benchmark)."""
    work = store.work_dir(store_dir, request)
    out = {}
    for folder in storage.list_dirs(work):
        record = outputs.finished(folder)
        if record is not None:
            out[storage.name(folder)] = record["seconds"]
    return out
