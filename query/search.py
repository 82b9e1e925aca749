"""Search methods over one snapshot: cosine (vector index), BM25 (native FTS) and BFS
(graph expansion), each scoped to the caller's groups and the two timelines.

Tenancy is enforced before anything runs: group ids must match the strict group_id pattern
(anything else is refused, never quoted), and they are the only strings that enter a
LanceDB filter. Everything else in a filter is an integer we format ourselves (times as
microseconds, row numbers) or a value checked against a strict pattern (relations, labels).
Query text only ever reaches the engine as data: a vector, or the terms of a MatchQuery
(never parsed as query syntax). Filters are prefilters: the index only sees allowed rows.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np
from tkg.pipeline import visibility
from tkg.pipeline.config import GROUP_ID_PATTERN, QueryConfig
from tkg.pipeline.index import PAST
from tkg.query.derived import derived
from tkg.query.ranked import best_visible
from tkg.query.snapshot import Kind, QueryError, Snapshot

RELATION_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,127}")
LABEL_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
MAX_QUERY_CHARS = 4_000  # FTS terms beyond this add latency, not relevance
Hits = list[tuple[int, float]]  # (row, score), best first
T = TypeVar("T")


@dataclass(frozen=True)
class Filters:
    """Optional narrowing: fact relations, entity labels, a valid-time window."""

    relations: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    valid_from: datetime | None = None  # facts/episodes with valid_at >= this
    valid_to: datetime | None = None  # ... and valid_at <= this


@dataclass(frozen=True)
class Scope:
    """Who asks and at which point of both timelines: every method obeys it."""

    groups: tuple[str, ...]
    as_of: int  # valid time, microseconds since the epoch
    known_at: int  # transaction time, microseconds
    filters: Filters = field(default_factory=Filters)


def to_micros(moment: datetime | str | None, name: str) -> int:
    """An ISO-8601 string or datetime as UTC microseconds; None = now; no zone = UTC."""
    if moment is None:
        moment = datetime.now(UTC)
    elif isinstance(moment, str):
        try:
            moment = datetime.fromisoformat(moment.strip().replace("Z", "+00:00"))
        except ValueError:
            raise QueryError(f"{name} {moment!r} is not an ISO-8601 date or time, e.g. "
                             "2024-06-01 or 2024-06-01T12:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def make_scope(group_ids: Sequence[str] | str, as_of: datetime | str | None = None,
               known_at: datetime | str | None = None,
               filters: Filters | None = None) -> Scope:
    """Validate the caller's groups and filters; refuse anything outside the patterns."""
    groups = (group_ids,) if isinstance(group_ids, str) else tuple(group_ids)
    if not groups:
        raise QueryError("give at least one group id (--group G)")
    for group in groups:
        if not isinstance(group, str) or not GROUP_ID_PATTERN.fullmatch(group):
            raise QueryError(f"invalid group id {group!r}: group ids match [A-Za-z0-9_-]"
                             "{1,128}")
    filters = filters or Filters()
    for value in filters.relations:
        if not RELATION_PATTERN.fullmatch(value):
            raise QueryError(f"invalid relation {value!r}: relations are SCREAMING_SNAKE_CASE")
    for value in filters.labels:
        if not LABEL_PATTERN.fullmatch(value):
            raise QueryError(f"invalid label {value!r}: labels are letters, digits and _")
    return Scope(tuple(dict.fromkeys(groups)), to_micros(as_of, "as_of"),
                 to_micros(known_at, "known_at"), filters)


def _quoted(values: Sequence[str]) -> str:
    # Only values that passed a strict pattern (no quotes, no backslashes) get here.
    return ", ".join(f"'{v}'" for v in values)


def where(kind: str, scope: Scope, bounds: dict[str, tuple[int, int]] | None = None) -> str:
    """The prefilter of one kind: the visibility rule (`tkg.pipeline.visibility`: groups,
    both timelines) and the optional filters; `bounds` as in `visibility.lance_where`."""
    f = scope.filters
    parts = [visibility.lance_where(kind, scope.groups, as_of=scope.as_of,
                                    known_at=scope.known_at, bounds=bounds)]
    if kind == "facts" and f.relations:
        parts.append(f"relation IN ({_quoted(f.relations)})")
    if kind == "entities" and f.labels:
        parts.append(f"array_has_any(labels, [{_quoted(f.labels)}])")
    if kind in ("facts", "episodes"):
        if f.valid_from is not None:
            parts.append(f"valid_at_us >= {to_micros(f.valid_from, 'valid_from')}")
            parts.append(f"valid_at_us > {PAST}")
        if f.valid_to is not None:
            parts.append(f"valid_at_us <= {to_micros(f.valid_to, 'valid_to')}")
    return " AND ".join(parts)


async def cosine(kind: Kind, vector: np.ndarray, scope: Scope, limit: int,
                 config: QueryConfig) -> Hits:
    """Nearest rows by cosine similarity (exact below the ANN threshold, IVF above)."""
    if kind.atable is None or limit <= 0:
        return []
    query = (kind.atable.query().nearest_to(np.asarray(vector, dtype=np.float32))
             .column("vector").distance_type("cosine")
             .where(where(kind.name, scope, kind.bounds))
             .select(["row", "_distance"]).limit(limit))
    if kind.ann:
        query = query.nprobes(config.nprobes).refine_factor(config.refine_factor)
    result = await query.to_arrow()
    rows = kind.rows_of(result["row"].to_numpy())
    return [(r, 1.0 - d) for r, d in zip(rows, result["_distance"].to_pylist(), strict=True)]


Spans = list[tuple[int, int]]  # row ranges [start, end) of the caller's groups


def group_spans(snapshot: Snapshot, kind: str, scope: Scope) -> Spans | None:
    """The row ranges of the caller's groups, or None where an in-memory search cannot
    stand in for LanceDB's prefilter: rows not sorted by group. Label and relation filters
    are `visible_mask`'s, so those searches stay in memory too (and BM25 on each group's
    own statistics: LanceDB's are table-wide)."""
    table = snapshot.kinds[kind]
    if table.group_start is None:
        return None
    spans = [(int(table.group_start[c]), int(table.group_start[c + 1]))
             for c in allowed_groups(snapshot, scope).tolist()]
    return [(start, end) for start, end in spans if end > start]


def exact_spans(snapshot: Snapshot, kind: str, scope: Scope, config: QueryConfig
                ) -> Spans | None:
    """The rows an exact in-memory scan would cover, or None when `cosine` must ask LanceDB:
    the kind has no vectors in memory, the groups hold more than `exact_scan_rows` rows, or
    `group_spans` is None."""
    spans = group_spans(snapshot, kind, scope)
    if snapshot.kinds[kind].vectors is None or spans is None:
        return None
    return spans if span_rows(spans) <= config.exact_scan_rows else None


def span_rows(spans: Spans) -> int:
    """How many rows the row ranges `spans` cover."""
    return sum(end - start for start, end in spans)


def exact_cosine(snapshot: Snapshot, kind: str, vector: np.ndarray, scope: Scope, limit: int,
                 config: QueryConfig, spans: Spans | None = None) -> Hits | None:
    """The same ranking as `cosine` without an index call: an exact scan of the vectors kept
    in memory, over the rows of the caller's groups only (contiguous ranges, `exact_spans`),
    filtered by the in-memory twin of `where`. None where `exact_spans` is None."""
    spans = exact_spans(snapshot, kind, scope, config) if spans is None else spans
    if spans is None:
        return None
    if limit <= 0 or not spans:
        return []
    table = snapshot.kinds[kind]
    query = np.asarray(vector, dtype=np.float32)
    query = query / (np.linalg.norm(query) or 1.0)
    # einsum, not `@`: BLAS would spread a matrix-vector product over threads that then
    # spin-wait, which doubled the CPU of a whole query (101 -> 57 ms at 1M facts) and is
    # slower single-threaded too (25,000 x 384: 3.0 ms with BLAS, 1.6 ms with einsum).
    scores = [np.einsum("ij,j->i", table.vectors[start:end], query) for start, end in spans]
    scores = scores[0] if len(spans) == 1 else np.concatenate(scores)  # (one group: no copy)
    rows_all = (np.arange(*spans[0]) if len(spans) == 1
                else np.concatenate([np.arange(start, end) for start, end in spans]))
    best = best_visible(rows_all, scores, limit,
                        lambda rows: visible_mask(snapshot, kind, rows, scope), ties=False)
    rows_all, scores = rows_all[best], scores[best]
    order = np.lexsort((rows_all, -scores))
    return list(zip(rows_all[order].tolist(), scores[order].tolist(), strict=True))


def text_spans(snapshot: Snapshot, kind: str, scope: Scope) -> Spans | None:
    """The rows an in-memory BM25 would cover, or None when `bm25` must ask LanceDB: the
    kind keeps no postings, or `group_spans` is None."""
    if snapshot.kinds[kind].terms is None:
        return None
    return group_spans(snapshot, kind, scope)


def memory_bm25(snapshot: Snapshot, kind: str, text: str, scope: Scope, limit: int,
                spans: Spans | None = None) -> Hits | None:
    """The same ranking as `bm25` from the postings kept in memory (`tkg.query.lexical`), over
    the rows of the caller's groups only (`text_spans`), filtered by the in-memory twin of
    `where`; equal scores rank the more recent fact or episode first. None where
    `text_spans` is None."""
    spans = text_spans(snapshot, kind, scope) if spans is None else spans
    if spans is None:
        return None
    table = snapshot.kinds[kind]
    text = " ".join(text[:MAX_QUERY_CHARS].split())
    if limit <= 0 or not spans or not text:
        return []
    return table.terms.search(text, spans, limit,
                              lambda rows: visible_mask(snapshot, kind, rows, scope),
                              newest=table.times.get("valid_at_us"))


async def bm25(kind: Kind, text: str, scope: Scope, limit: int) -> Hits:
    """BM25 over the native full-text index; the text is matched as terms, never parsed."""
    from lancedb.query import MatchQuery

    text = " ".join(text[:MAX_QUERY_CHARS].split())
    if kind.atable is None or limit <= 0 or not text:
        return []
    result = await (kind.atable.query().nearest_to_text(MatchQuery(text, "text"))
                    .where(where(kind.name, scope, kind.bounds)).select(["row", "_score"])
                    .limit(limit)
                    .to_arrow())
    return list(zip(kind.rows_of(result["row"].to_numpy()), result["_score"].to_pylist(),
                    strict=True))


def start(searches: list[Coroutine[Any, Any, Hits]]) -> Future[list[Hits]]:
    """Start searches concurrently on LanceDB's event loop (they wait on I/O and Rust
    threads, so one query's searches overlap instead of queueing, and the caller's thread
    is free meanwhile); `.result()` waits for all of them."""
    from lancedb.background_loop import LOOP

    async def together() -> list[Hits]:
        return list(await asyncio.gather(*searches))

    return asyncio.run_coroutine_threadsafe(together(), LOOP.loop)


# One helper thread per core beside the caller's, shared by the process's searches.
HELPERS = max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")  # (not on macOS)
              else os.cpu_count() or 1, 2) - 1
_HELPERS = ThreadPoolExecutor(HELPERS, "tkg-query")


def together(calls: Sequence[Callable[[], T]]) -> list[T]:
    """The results of `calls`, run at once on the caller's thread and the helper threads,
    each thread taking the next call not yet started. The caller never waits for a helper
    that has not begun (it is cancelled), so a busy pool, or a call that itself calls
    `together`, makes it slower, never stuck. numpy lets go of the GIL in BLAS and in its
    loops over large arrays, so the halves of the question embedding's dense products
    (`NumpyBertEncoder._dense`) use both cores of the 2-core machine.

    Only the embedding uses it. The text searches in two rounds on it (the embedding at
    once with BM25, then the in-memory cosines at once) gave no gain out of the noise at 1M
    facts (`tkg bench query`, p50 20.5 / 22.9 ms against 18.0 / 22.5 without, load 2-4) or
    on LoCoMo, and cost the 16-client `tkg bench serve`, whose processes already keep both
    cores busy: 253.6 -> 225.2 requests/s, p99 112.9 -> 122.1 ms."""
    results: list[Any] = [None] * len(calls)
    order = iter(range(len(calls)))  # (`next` on it is atomic under the GIL)

    def work() -> None:
        for i in order:
            results[i] = calls[i]()

    helping = [_HELPERS.submit(work) for _ in range(min(HELPERS, len(calls) - 1))]
    try:
        work()
    finally:
        for future in helping:
            if not future.cancel():  # (begun: wait for the call it took)
                future.result()
    return results


def vectors_of(kind: Kind, rows: Sequence[int], scope: Scope) -> dict[int, np.ndarray]:
    """Stored vectors of some rows (for MMR), still within the caller's groups."""
    if kind.table is None or not rows:
        return {}
    ids = ", ".join(str(k) for k in kind.keys_of(rows))
    result = (kind.table.search().where(f"row IN ({ids}) AND {where(kind.name, scope)}")
              .select(["row", "vector"]).limit(len(rows)).to_arrow())
    vectors = result["vector"].combine_chunks().flatten().to_numpy().reshape(result.num_rows, -1)
    return dict(zip(kind.rows_of(result["row"].to_numpy()), vectors, strict=True))


def allowed_groups(snapshot: Snapshot, scope: Scope) -> np.ndarray:
    """The codes of the scope's groups in the snapshot (read-only: `_group_lookup`)."""
    return _group_lookup(snapshot, scope.groups)[0]


GROUP_LOOKUPS = 4_096  # scopes' group tuples kept per snapshot (past it, the lot is dropped)


def _group_lookup(snapshot: Snapshot, groups: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(codes of `groups` in the snapshot, their `visibility.group_table`), made once per
    snapshot and groups. A search asks `visible_mask` 11 times; between the
    scans of the vectors (caches cold) each made both again, 40 us a call in all."""
    known: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = derived(
        snapshot).setdefault("group lookups", {})
    found = known.get(groups)
    if found is None:
        codes = np.array([snapshot.groups[g] for g in groups if g in snapshot.groups],
                         dtype=np.int64)
        table = visibility.group_table(codes, len(snapshot.groups))
        codes.flags.writeable = table.flags.writeable = False
        if len(known) >= GROUP_LOOKUPS:
            known.clear()
        found = known[groups] = (codes, table)
    return found


def live_facts(snapshot: Snapshot, facts: np.ndarray, scope: Scope) -> np.ndarray:
    """The fact rows among `facts` that the scope may see (graph expansion)."""
    return facts[visible_mask(snapshot, "facts", facts, scope)] if len(facts) else facts


def visible_mask(snapshot: Snapshot, kind: str, rows: np.ndarray, scope: Scope) -> np.ndarray:
    """Which of `rows` the scope may see: the in-memory twin of `where(kind, ...)` (groups,
    both timelines, relation, label and date filters)."""
    table = snapshot.kinds[kind]
    t = table.times
    f = scope.filters
    ok = _group_lookup(snapshot, scope.groups)[1][snapshot.group_codes[kind][rows]]
    as_of = _bounding(table, "as_of", scope.as_of)
    known_at = _bounding(table, "known_at", scope.known_at)
    if as_of is not None or known_at is not None:  # (neither: every row meets both)
        ok &= visibility.numpy_mask(kind, t, as_of=as_of, known_at=known_at, rows=rows)
    if kind in ("facts", "episodes"):
        if f.valid_from is not None:
            ok &= (t["valid_at_us"][rows] >= to_micros(f.valid_from, "valid_from"))
            ok &= t["valid_at_us"][rows] > PAST
        if f.valid_to is not None:
            ok &= t["valid_at_us"][rows] <= to_micros(f.valid_to, "valid_to")
    if kind == "facts" and f.relations:
        ok &= _among(snapshot.kinds["facts"].meta["relation"].take(rows), f.relations)
    if kind == "entities" and f.labels:
        ok &= _labelled(snapshot.kinds["entities"].meta["labels"], rows, f.labels)
    return ok


def _labelled(labels: Any, rows: np.ndarray, wanted: tuple[str, ...]) -> np.ndarray:
    """Which of `rows` carry one of the `wanted` labels: `array_has_any(labels, [...])`
    in memory (a row without labels carries none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = labels.take(pa.array(rows, pa.int64()))
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    found = np.zeros(len(rows), dtype=bool)
    found[pc.list_parent_indices(lists).to_numpy()[_among(pc.list_flatten(lists), wanted)]] = True
    return found


def _among(values: Any, wanted: tuple[str, ...]) -> np.ndarray:
    """Which of the Arrow strings `values` are one of `wanted` (a null is none): the
    in-memory `IN (...)` of the relation and label prefilters."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.is_in(values, value_set=pa.array(list(wanted), pa.string())).fill_null(
        False).to_numpy(zero_copy_only=False)


def _bounding(table: Kind, timeline: str, moment: int) -> int | None:
    """`moment`, or None where every row of the table meets the bounds of its `timeline`
    (by the table's (min, max) per column), as `visibility.lance_where` leaves such
    conditions out: the same rows without a gather and a comparison a bound (at "now",
    all of them but facts' ends)."""
    for bound in visibility.RULES[table.name]:
        if bound.timeline != timeline:
            continue
        low, high = table.bounds.get(f"{bound.column}_us", (None, None))
        if high is None or (moment < high if bound.op == "<=" else moment >= low):
            return moment
    return None


def with_labels(snapshot: Snapshot, rows: list[int], labels: tuple[str, ...]) -> list[int]:
    """Entity rows carrying one of `labels` (all rows when no label filter is set): the
    in-memory twin of the label prefilter, for entities reached by graph expansion."""
    if not labels or not rows:
        return rows
    found = _labelled(snapshot.kinds["entities"].meta["labels"], np.asarray(rows), labels)
    return [r for r, ok in zip(rows, found.tolist(), strict=True) if ok]


def entities_in_scope(snapshot: Snapshot, rows: Sequence[int], scope: Scope) -> list[int]:
    """Entity rows of the caller's groups only (origins and centers come from callers)."""
    allowed = set(allowed_groups(snapshot, scope).tolist())
    codes = snapshot.group_codes["entities"]
    return [r for r in rows if 0 <= r < len(codes) and int(codes[r]) in allowed]


@dataclass
class Expansion:
    """What a BFS reached: fact rows and entity rows with their hop counts, in BFS order."""

    facts: dict[int, int] = field(default_factory=dict)
    entities: dict[int, int] = field(default_factory=dict)


def bfs(snapshot: Snapshot, origins: Sequence[int], scope: Scope, hops: int,
        max_edges: int) -> Expansion:
    """Breadth-first expansion over the facts the scope may see, `hops` hops from the
    origin entities. At most `max_edges` edges are followed per hop (the best-supported
    ones first), so a hub cannot make one query unbounded."""
    reached = Expansion(entities={e: 0 for e in entities_in_scope(snapshot, origins, scope)})
    frontier = np.array(list(reached.entities), dtype=np.int64)
    support = snapshot.fact_support
    # what was reached, as flags by row: a gather, where `np.isin` of the dicts' keys sorted
    # them at every hop (with `_sorted_unique`: 0.53 -> 0.29 ms a bfs, 300 searches of the
    # 100,000-fact bench)
    seen_facts = np.zeros(len(support), dtype=bool)
    seen_entities = np.zeros(len(snapshot.entity_facts.start), dtype=bool)
    seen_entities[frontier] = True
    for hop in range(1, max(hops, 0) + 1):
        if len(frontier) == 0:
            break
        edges = _sorted_unique(snapshot.entity_facts.of_many(frontier))
        edges = live_facts(snapshot, edges[~seen_facts[edges]], scope)
        if len(edges) > max_edges:
            edges = edges[np.argsort(-support[edges], kind="stable")[:max_edges]]
        else:
            edges = edges[np.argsort(-support[edges], kind="stable")]
        seen_facts[edges] = True
        reached.facts.update(dict.fromkeys(edges.tolist(), hop))
        # each edge's source then target, in edge order; new entities at their first sight
        ends = np.stack([snapshot.fact_src[edges], snapshot.fact_tgt[edges]], axis=1).ravel()
        ends = ends[ends >= 0]
        ends = ends[~seen_entities[ends]]
        _, first = np.unique(ends, return_index=True)
        frontier = ends[np.sort(first)]
        seen_entities[frontier] = True
        reached.entities.update(dict.fromkeys(frontier.tolist(), hop))
    return reached


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` by a sort: numpy 2's hashing `unique` took 85 against 31 us for
    the 1,650 facts of a second hop's entities."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


WORD = re.compile(r"[^\W_]+")


def terms(text: str) -> frozenset[str]:
    """Lower-case words of the query longer than two letters (a cheap lexical signal)."""
    return frozenset(w for w in WORD.findall(text[:MAX_QUERY_CHARS].lower()) if len(w) > 2)


def order_reached(reached: dict[int, int], kind: Kind, text: str, limit: int) -> list[int]:
    """The first `limit` rows reached by BFS: nearest hop first and, within a hop, those
    sharing more terms with the query first (BFS order breaks ties), so RRF sees a
    meaningful ranking. Only the hops that fill `limit` are scored."""
    if not reached or limit <= 0:
        return []
    rows = np.fromiter(reached.keys(), dtype=np.int64, count=len(reached))
    hops = np.fromiter(reached.values(), dtype=np.int64, count=len(reached))
    if len(rows) > limit:
        keep = hops <= np.partition(hops, limit - 1)[limit - 1]
        rows, hops = rows[keep], hops[keep]
    if kind.terms is not None:
        overlap = kind.terms.overlap(rows, text)
    else:  # no postings in memory: lower-case words of 3+ letters, from the texts
        import pyarrow as pa

        query_terms = terms(text)
        values = kind.meta["text"].take(pa.array(rows)).to_pylist()
        overlap = np.array([len(query_terms.intersection(WORD.findall(v.lower()))) if v
                            else 0 for v in values], dtype=np.int64)
    order = np.lexsort((np.arange(len(rows)), -overlap, hops))[:limit]
    return rows[order].tolist()


def neighbours(snapshot: Snapshot, scope: Scope):
    """Entity -> adjacent entities over the facts the scope may see (for node distance)."""
    def step(node: int) -> list[int]:
        edges = live_facts(snapshot, snapshot.entity_facts.of(node), scope)
        ends = np.concatenate([snapshot.fact_src[edges], snapshot.fact_tgt[edges]])
        return [int(e) for e in ends if e >= 0 and e != node]

    return step


def adjacent_turns(snapshot: Snapshot, scope: Scope
                   ) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Episode rows -> (previous, next) turn of each in its conversation, among the episodes
    the scope may see (rows sort by group and time, so a conversation's next turn is the
    next row; `Snapshot.follows_turn` says whether it is), -1 at a conversation's ends and
    for a row the scope may not see."""
    table = snapshot.kinds["episodes"]
    count, follows = table.meta.num_rows, snapshot.follows_turn

    def seen(rows: np.ndarray) -> np.ndarray:
        inside = (rows >= 0) & (rows < count)
        ok = np.zeros(len(rows), dtype=bool)
        ok[inside] = visible_mask(snapshot, "episodes", rows[inside], scope)
        return ok

    def neighbours(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        follows_before = follows[np.clip(rows, 0, max(count - 1, 0))]
        followed = follows[np.clip(rows + 1, 0, max(count - 1, 0))]
        linked_before = np.zeros(len(rows), dtype=bool)
        linked_after = np.zeros(len(rows), dtype=bool)
        # visibility only of the rows with a turn beside them in their conversation (in
        # the 100,000-fact bench store, few: a conversation's turns are rows apart)
        at = np.flatnonzero(follows_before | followed)
        if len(at):
            near = rows[at]
            before, here, after = seen(np.concatenate([near - 1, near, near + 1])
                                       ).reshape(3, -1)
            linked_before[at] = here & before & follows_before[at]
            linked_after[at] = here & after & followed[at]
        return (np.where(linked_before, rows - 1, -1), np.where(linked_after, rows + 1, -1))

    return neighbours


def latest_episode(snapshot: Snapshot, scope: Scope) -> int | None:
    """Valid time (microseconds) of the newest episode the scope may see: the "now" a
    question's relative time words count back from."""
    table = snapshot.kinds["episodes"]
    if not table.rows:
        return None
    spans = group_spans(snapshot, "episodes", scope)
    if spans is None:
        rows = np.flatnonzero(np.isin(snapshot.group_codes["episodes"],
                                      allowed_groups(snapshot, scope)))
    else:
        rows = np.concatenate([np.arange(s, e) for s, e in spans] or [np.zeros(0, np.int64)])
    rows = rows[visible_mask(snapshot, "episodes", rows, scope)]
    valid = table.times["valid_at_us"][rows]
    valid = valid[valid > PAST]
    return int(valid.max()) if len(valid) else None
