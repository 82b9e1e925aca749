"""What a search returns: the hits of each kind (`SearchResult`, the JSON object of
`tkg search --json`), filled from the ranked rows of a snapshot, and the provenance
episodes a fact or entity cites that the caller may see."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from tkg.pipeline.index import SPECS
from tkg.query.derived import derived
from tkg.query.search import Hits, Scope
from tkg.query.snapshot import Snapshot

KINDS = ("facts", "entities", "communities", "episodes")


@dataclass
class FactHit:
    edge_id: str
    fact: str
    relation: str
    source: str | None
    target: str | None
    valid_at: str | None
    invalid_at: str | None
    score: float
    episodes: list[str]  # source_ids of the provenance episodes, in time order


@dataclass
class EntityHit:
    entity_id: str
    name: str
    summary: str | None
    score: float


@dataclass
class CommunityHit:
    community_id: str
    name: str | None
    summary: str | None
    score: float


@dataclass
class EpisodeHit:
    episode_id: str
    source_id: str
    speaker: str | None  # who said it (messages); None for other kinds
    content: str
    valid_at: str | None
    score: float


@dataclass
class SearchResult:
    facts: list[FactHit] = field(default_factory=list)
    entities: list[EntityHit] = field(default_factory=list)
    communities: list[CommunityHit] = field(default_factory=list)
    episodes: list[EpisodeHit] = field(default_factory=list)
    run_id: str | None = None  # the snapshot that answered (not part of the JSON object)
    warnings: list[str] = field(default_factory=list)  # e.g. a group with no data

    def to_dict(self) -> dict[str, list[Any]]:
        """Exactly the JSON object of `tkg search --json`."""
        # (vars, not dataclasses.asdict: hits hold only scalars and lists of strings, and
        # asdict's deep copy was a twentieth of a served request's CPU)
        found: dict[str, list[Any]] = {kind: [dict(vars(hit)) for hit in getattr(self, kind)]
                                       for kind in KINDS}
        return {**found, "warnings": list(self.warnings)}


class Provenance:
    """The episodes facts and entities cite, as far as the scope may see them: of its
    groups, and known at its `known_at`."""

    def __init__(self, snap: Snapshot, scope: Scope) -> None:
        self.snap, self.scope = snap, scope
        self._groups: set[int] | None = None  # codes of the scope's groups
        # episode ids -> their rows (the top facts' are asked twice a search: for the
        # episodes they cite, then for their hits)
        self._episode_rows: dict[tuple[str, ...], list[int]] = {}

    def visible(self, row: int) -> bool:
        snap = self.snap
        if self._groups is None:
            self._groups = {snap.groups[g] for g in self.scope.groups if g in snap.groups}
        return (int(snap.group_codes["episodes"][row]) in self._groups
                and snap.kinds["episodes"].times["created_at_us"][row] <= self.scope.known_at)

    def episode_rows(self, episode_ids: list[str]) -> list[int]:
        """Provenance episodes the scope may see, in time order."""
        key = tuple(episode_ids)
        found = self._episode_rows.get(key)
        if found is None:
            rows = [self.snap.episode_rows.get(e, -1) for e in episode_ids]
            rows = [r for r in rows if r >= 0 and self.visible(r)]
            valid = self.snap.kinds["episodes"].times["valid_at_us"]
            found = self._episode_rows[key] = sorted(set(rows), key=lambda r: (int(valid[r]), r))
        return list(found)

    def entity_episodes(self, row: int, newest: int) -> list[int]:
        """Up to `newest` of the episodes that mention an entity, newest first."""
        found = []
        for episode in self.snap.entity_episodes.of(row).tolist():
            if self.visible(episode):
                found.append(episode)
                if len(found) >= newest:
                    break
        return found

    def source_ids(self, rows: list[int]) -> list[str]:
        return column_values(self.snap.kinds["episodes"].meta, "source_id",
                             np.asarray(rows, dtype=np.int64))


def hydrate(snap: Snapshot, scope: Scope, ranked: dict[str, Hits],
            provenance: Provenance) -> SearchResult:
    """The hits of the ranked rows of each kind."""
    present = summaries_hold(snap, scope)
    return SearchResult(
        facts=_fact_hits(snap, ranked.get("facts", []), provenance),
        entities=[EntityHit(**{**entity, "summary": entity["summary"] if present else None},
                            score=round(score, 6))
                  for (_, score), entity in _with_rows(snap, "entities", ranked, (
                      "entity_id", "name", "summary"))],
        communities=[CommunityHit(**{**community, "summary": community["summary"]
                                     if present else None}, score=round(score, 6))
                     for (_, score), community in _with_rows(snap, "communities", ranked, (
                         "community_id", "name", "summary"))],
        episodes=[EpisodeHit(episode_id=episode["episode_id"], source_id=episode["source_id"],
                             speaker=episode["speaker"], content=episode["content"] or "",
                             valid_at=valid_at, score=round(score, 6))
                  for ((_, score), episode), valid_at in zip(
                      _with_rows(snap, "episodes", ranked, ("episode_id", "source_id",
                                                            "speaker", "content")),
                      iso_times(snap, "episodes", "valid_at", ranked.get("episodes", [])),
                      strict=True)],
        run_id=snap.run_id)


def _fact_hits(snap: Snapshot, facts: Hits, provenance: Provenance) -> list[FactHit]:
    if not facts:
        return []
    rows = np.array([row for row, _ in facts], dtype=np.int64)
    # the names of both ends and the cited episodes' source ids, one gather each (not a
    # pyarrow scalar a value)
    ends = np.concatenate([snap.fact_src[rows], snap.fact_tgt[rows]])
    names = column_values(snap.kinds["entities"].meta, "name", np.maximum(ends, 0))
    names = [name if end >= 0 else None for name, end in zip(names, ends.tolist(), strict=True)]
    found = rows_of(snap, "facts", facts, ("edge_id", "fact", "relation", "episode_ids"))
    cited = [provenance.episode_rows(fact["episode_ids"] or []) for fact in found]
    sources = iter(provenance.source_ids([e for episodes in cited for e in episodes]))
    hits = []
    for (_, score), fact, episodes, source, target, valid_at, invalid_at in zip(
            facts, found, cited, names[:len(facts)], names[len(facts):],
            iso_times(snap, "facts", "valid_at", facts),
            iso_times(snap, "facts", "invalid_at", facts), strict=True):
        hits.append(FactHit(
            edge_id=fact["edge_id"], fact=fact["fact"], relation=fact["relation"],
            source=source, target=target, valid_at=valid_at, invalid_at=invalid_at,
            score=round(score, 6), episodes=[next(sources) for _ in episodes]))
    return hits


def summaries_hold(snap: Snapshot, scope: Scope) -> bool:
    """Summaries are written from the facts that hold when the store was built: they speak
    for a time at or after the newest fact's start, as known once every fact was. An answer
    about an earlier time (or an earlier state of knowledge) leaves them out."""
    facts = snap.kinds["facts"]
    if not facts.rows:
        return True
    newest = facts.bounds.get("valid_at_us", (0, 0))[1]
    written = facts.bounds.get("created_at_us", (0, 0))[1]
    return scope.as_of >= newest and scope.known_at >= written


def _with_rows(snap: Snapshot, kind: str, ranked: dict[str, Hits], columns: tuple[str, ...]
               ) -> list[tuple[tuple[int, float], dict[str, Any]]]:
    hits = ranked.get(kind, [])
    return list(zip(hits, rows_of(snap, kind, hits, columns), strict=True))


def rows_of(snap: Snapshot, kind: str, hits: Hits, columns: tuple[str, ...]
            ) -> list[dict[str, Any]]:
    """Some columns of the hit rows, as Python values (`column_values`, a gather a column)."""
    if not hits:
        return []
    meta = snap.kinds[kind].meta
    rows = np.array([row for row, _ in hits], dtype=np.int64)
    values = [column_values(meta, column, rows) for column in columns]
    return [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)]


def column_values(meta: Any, column: str, rows: np.ndarray) -> list[Any]:
    """`meta[column].take(rows).to_pylist()`: for a string or list-of-strings column, read
    from its Arrow buffers (`_views`) with numpy and `str` alone. A search's five `take`s of
    ten rows cost 0.50 ms of its 5.0 in the 100,000-fact bench, 0.20 read this way (pyarrow's
    `take` and `to_pylist` are fast alone, 25-50 us a call; between the searches' scans of
    megabytes of vectors, with caches cold, 100 us)."""
    views = _views(meta, column)
    if views is None:
        import pyarrow as pa

        return meta[column].take(pa.array(rows, pa.int64())).to_pylist()
    strings, lists = views
    if lists is None:
        return strings.values(rows)
    starts = lists.offsets[rows]
    lengths = lists.offsets[rows + 1] - starts
    # every row's items end to end: the k-th overall is item k - (items before its row) of
    # its row, at starts[row] + that
    before = np.cumsum(lengths) - lengths
    flat = strings.values(np.repeat(starts - before, lengths) + np.arange(lengths.sum()))
    found = [flat[at:at + count] for at, count in zip(before.tolist(), lengths.tolist(),
                                                      strict=True)]
    return lists.nulled(rows, found)


@dataclass(frozen=True)
class _Strings:
    """One Arrow string array as numpy views of its buffers (no copy)."""

    offsets: np.ndarray  # int32, len + 1, from the array's own offset
    data: memoryview
    valid: np.ndarray | None  # the validity bitmap's bytes; None: no nulls
    first: int  # the array's offset into the bitmap

    @classmethod
    def of(cls, array: Any) -> _Strings:
        buffers = array.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int32)[
            array.offset:array.offset + len(array) + 1]
        data = memoryview(buffers[2]) if buffers[2] is not None else memoryview(b"")
        valid = np.frombuffer(buffers[0], dtype=np.uint8) if array.null_count else None
        return cls(offsets, data, valid, array.offset)

    def nulled(self, rows: np.ndarray, values: list[Any]) -> list[Any]:
        """`values` (one per row) with None where the row is null."""
        if self.valid is None or not len(rows):
            return values
        at = rows + self.first
        ok = ((self.valid[at >> 3] >> (at & 7).astype(np.uint8)) & 1).tolist()
        return [value if flag else None for value, flag in zip(values, ok, strict=True)]

    def values(self, rows: np.ndarray) -> list[str | None]:
        data = self.data
        found = [str(data[start:end], "utf-8") for start, end in zip(
            self.offsets[rows].tolist(), self.offsets[rows + 1].tolist(), strict=True)]
        return self.nulled(rows, found)


def _views(meta: Any, column: str) -> tuple[_Strings, _Strings | None] | None:
    """A column's strings, its lists or None, or None where the column is another type
    (then `column_values` takes it): made once per Arrow table and column."""
    views = derived(meta).setdefault("column views", {})
    if column not in views:
        views[column] = _column_views(meta[column])
    return views[column]


def _column_views(values: Any) -> tuple[_Strings, _Strings | None] | None:
    import pyarrow as pa

    if values.num_chunks != 1:  # (a snapshot's tables are one chunk; else take them)
        return None
    array = values.chunk(0)
    if pa.types.is_string(array.type):
        return _Strings.of(array), None
    if pa.types.is_list(array.type) and pa.types.is_string(array.type.value_type):
        return _Strings.of(array.values), _Strings.of(array)
    return None


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_times(snap: Snapshot, kind: str, column: str, hits: Hits) -> list[str | None]:
    """A time column of the hit rows as ISO-8601 strings (None for a null), from its
    `<column>_us` copy, as the `datetime.isoformat()` of the stored value: pyarrow's
    tz-aware datetimes cost 3-5 us a value, a tenth of a search at 100,000 facts."""
    if not hits:
        return []  # (a table without rows has no `_us` arrays either)
    micros = snap.kinds[kind].times[f"{column}_us"]
    null = dict(SPECS[kind].times)[column]  # (the sentinel a null was stored as)
    return [None if value == null else (EPOCH + timedelta(microseconds=value)).isoformat()
            for value in micros[[row for row, _ in hits]].tolist()]
