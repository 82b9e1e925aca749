"""`tkg.query.open(store)`: f(q) = constructor(rerank(search(q))) over the current snapshot.

The retriever opens a snapshot once (LanceDB tables, row metadata, graph arrays) and keeps
it until `STORE/CURRENT` changes (`snapshot.SnapshotHolder`), so a newly published
snapshot is picked up without a restart and an unchanged one costs a stat. A search runs
on the snapshot it started on. It is safe to share between threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from tkg.pipeline import storage
from tkg.pipeline.config import MAX_RESULTS, EmbedConfig, QueryConfig
from tkg.query import link, rerank, timewords
from tkg.query.context import build_context
from tkg.query.methods import FromSearch, TextSearch, method
from tkg.query.recipes import Part, Recipe, get_recipe
from tkg.query.search import (
    Filters,
    Hits,
    Scope,
    adjacent_turns,
    allowed_groups,
    bfs,
    entities_in_scope,
    latest_episode,
    make_scope,
    neighbours,
    order_reached,
    start,
    vectors_of,
    with_labels,
)
from tkg.query.snapshot import (
    QueryError,
    Snapshot,
    SnapshotHolder,
    open_snapshot,
    snapshot_config,
)

KINDS = ("facts", "entities", "communities", "episodes")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ENTITY_PROVENANCE = 2  # newest episodes cited per top entity


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


_EMBEDDERS: dict[str, Any] = {}
_EMBEDDERS_LOCK = threading.Lock()


def snapshot_embedder(manifest: dict[str, Any]) -> Any:
    """The embedder the snapshot was built with (model and dim from its manifest), loaded
    once per process: the numpy encoder where the model's layout allows, whatever precision
    the build used (float32's vectors to 3e-7; bfloat16's within 2e-3, cosine > 0.9999),
    without importing torch: a cold `tkg search` took 7-8 s of CPU with
    sentence-transformers and takes ~1.9 s."""
    from tkg.pipeline.embed import EMBEDDERS, numpy_embedder

    embedding = manifest.get("embedding") or {}
    try:
        config = EmbedConfig.model_validate(manifest["config"]["embed"])
    except (KeyError, TypeError, ValueError):
        config = EmbedConfig(model=embedding.get("model", EmbedConfig().model))
    key = config.model_dump_json()
    with _EMBEDDERS_LOCK:
        if key not in _EMBEDDERS:
            _EMBEDDERS[key] = (numpy_embedder(config)
                               or EMBEDDERS.build(config.backend, config))
    embedder = _EMBEDDERS[key]
    if embedding.get("dim") and int(embedding["dim"]) != int(embedder.dim):
        raise QueryError(f"the snapshot's vectors are {embedding['dim']}-d but {config.model} "
                         f"gives {embedder.dim}-d; query with the model it was built with")
    return embedder


class Retriever:
    """Search and context over a store's current snapshot (see the module docstring)."""

    def __init__(self, store_dir: str | Path, embedder: Any = None,
                 config: QueryConfig | None = None, cross_encoder: Any = None,
                 snapshots: SnapshotHolder[Snapshot] | None = None) -> None:
        self.store = storage.location(store_dir)  # a local path or an object-store URL
        self._embedder = embedder
        self._config = config
        self._cross_encoder = cross_encoder
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.snapshots = snapshots or SnapshotHolder(
            self.store, lambda path: open_snapshot(path, self._config))

    # --- snapshot and models -----------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The current snapshot (see `SnapshotHolder`: reopened only when CURRENT moved)."""
        return self.snapshots.get()

    @property
    def config(self) -> QueryConfig:
        if self._config is None:
            self._config = snapshot_config(self.snapshot().manifest)
        return self._config

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            self._embedder = snapshot_embedder(self.snapshot().manifest)
        return self._embedder

    @property
    def cross_encoder(self) -> rerank.CrossEncoder:
        """The model of `cross_encoder` rerankers (`query.cross_encoder`), loaded once."""
        if self._cross_encoder is None:
            self._cross_encoder = rerank.load_cross_encoder(self.config, lambda: self.embedder)
        return self._cross_encoder

    def load_models(self) -> None:
        """Load the query embedder and the cross-encoder now (a server's start), not in the
        first request; a configured model that is missing fails here."""
        _ = self.embedder, self.cross_encoder

    def embed(self, text: str) -> np.ndarray:
        """The query's vector (a small LRU: eval and retries ask the same text again)."""
        with self._cache_lock:
            cached = self._vectors.get(text)
            if cached is not None:
                self._vectors.move_to_end(text)
                return cached
        vector = np.asarray(self.embedder.embed([text])[0], dtype=np.float32)
        with self._cache_lock:
            self._vectors[text] = vector
            if len(self._vectors) > 1024:
                self._vectors.popitem(last=False)
        return vector

    # --- the query ------------------------------------------------------------------
    def search(self, text: str, group_ids: Sequence[str] | str, recipe: str | Recipe | None = None,
               limit: int | None = None, as_of: datetime | str | None = None,
               known_at: datetime | str | None = None, center: str | None = None,
               origins: Sequence[str] | None = None, conversation_id: str | None = None,
               filters: Filters | None = None) -> SearchResult:
        """Facts, entities, communities and episodes for `text`, within `group_ids`, as
        the world was at `as_of` and as the store knew it at `known_at` (both: now)."""
        if not isinstance(text, str):
            raise QueryError("the query text must be a string")
        snap = self.snapshot()
        recipe = self.recipe(recipe)
        limit = self.config.limit if limit is None else int(limit)
        if not 1 <= limit <= MAX_RESULTS:
            raise QueryError(f"limit must be within 1..{MAX_RESULTS}, got {limit}")
        scope = make_scope(group_ids, as_of, known_at, filters)
        result = OneSearch(self, snap, recipe, scope, text, limit, center, origins,
                           conversation_id).result()
        # Only groups the caller may read get here (servers refuse the rest first, with one
        # answer whether or not they exist), so this tells nothing about other tenants.
        result.warnings = [f"group {g!r} has no data in snapshot {snap.run_id}"
                           for g in scope.groups if g not in snap.groups]
        return result

    def context(self, text: str, group_ids: Sequence[str] | str, *,
                max_tokens: int | None = None, **search: Any) -> str:
        """The context string for an agent (facts with date ranges, entities, communities,
        cited episodes) within `max_tokens`."""
        return self.context_of(self.search(text, group_ids, **search), max_tokens)

    def context_of(self, result: SearchResult, max_tokens: int | None = None) -> str:
        """The context string of a search result (default budget: query.context_tokens)."""
        return build_context(result, max_tokens or self.config.context_tokens)

    def recipe(self, recipe: str | Recipe | None = None) -> Recipe:
        """A recipe by name, as given, or the configured one (query.recipe)."""
        return recipe if isinstance(recipe, Recipe) else get_recipe(recipe or self.config.recipe)


class OneSearch:
    """One search: candidates per kind and method, graph expansion, rerank, hydrate."""

    def __init__(self, retriever: Retriever, snap: Snapshot, recipe: Recipe, scope: Scope,
                 text: str, limit: int, center: str | None, origins: Sequence[str] | None,
                 conversation_id: str | None) -> None:
        self.retriever, self.snap, self.recipe, self.scope = retriever, snap, recipe, scope
        self.text, self.limit = text, limit
        self.pool = max(recipe.candidates, limit)
        self.center = self._entity_row(center, "center") if center else None
        self.origins = [self._entity_row(o, "origin") for o in origins or ()]
        self.conversation_id = conversation_id
        self._vectors: dict[str, np.ndarray] = {}  # per text searched: the question, unnamed
        self._episode_text: str | None = None
        self._groups: set[int] | None = None  # codes of the scope's groups
        self._named: tuple[list[int], list[int]] | None = None  # (entities, spoken turns)
        self._expansion: dict[str, list[int]] | None = None

    def _entity_row(self, entity_id: str, what: str) -> int:
        row = self.snap.entity_rows.get(str(entity_id), -1)
        if not entities_in_scope(self.snap, [row], self.scope):
            raise QueryError(f"{what} entity {entity_id!r} is not an entity of the groups "
                             f"{', '.join(self.scope.groups)}")
        return row

    @property
    def config(self) -> QueryConfig:
        return self.retriever.config

    @property
    def vector(self) -> np.ndarray:
        return self.vector_of(self.text)

    def vector_of(self, text: str) -> np.ndarray:
        """The embedding of `text`, once per search (facts and turns both search the
        question without its speakers' names)."""
        if text not in self._vectors:
            self._vectors[text] = self.retriever.embed(text)
        return self._vectors[text]

    def unnamed_text(self) -> str:
        """The question without the names of the speakers it names (`Part.unnamed`)."""
        if self._episode_text is None:
            self._episode_text = link.name_index(self.snap).without_speakers(
                self.text, allowed_groups(self.snap, self.scope).tolist())
        return self._episode_text

    def pool_of(self, kind: str) -> int:
        """Candidates per method of one kind: its part's own number, else the recipe's."""
        part = getattr(self.recipe, kind)
        return max(part.candidates, self.limit) if part and part.candidates else self.pool

    def _candidates(self, wanted: list[tuple[str, str, str]]) -> list[Hits]:
        """Every (kind, method, text)'s hits: the LanceDB searches start first, then the
        in-memory searches run on this thread while LanceDB works on its own."""
        searches = [(method(name), kind, text) for kind, name, text in wanted]
        local = {i: f for i, (search, kind, text) in enumerate(searches)
                 if (f := search.in_memory(self, kind, text)) is not None}
        running = start([search.on_lance(self, kind, text)
                         for i, (search, kind, text) in enumerate(searches) if i not in local])
        try:
            exact = {i: search() for i, search in local.items()}
            remote = iter(running.result())
        except BaseException:
            running.cancel()
            raise
        return [exact[i] if i in exact else next(remote) for i in range(len(wanted))]

    def _searched(self, wanted: list[tuple[str, str]]) -> list[Hits]:
        """Each (kind, method)'s hits; a part's `unnamed` methods search the question without
        the speakers' names, for episodes only turns (episodes with a speaker): records and
        documents keep the whole question."""
        parts = {kind: getattr(self.recipe, kind) for kind, _ in wanted}
        unnamed = [i for i, (kind, name) in enumerate(wanted)
                   if name in parts[kind].unnamed and self.unnamed_text() != self.text]
        texts = [self.unnamed_text() if i in unnamed and kind != "episodes" else self.text
                 for i, (kind, _) in enumerate(wanted)]
        twice = [i for i in unnamed if wanted[i][0] == "episodes"]
        found = self._candidates([(*search, text) for search, text in zip(wanted, texts,
                                                                             strict=True)]
                                 + [(*wanted[i], self.unnamed_text()) for i in twice])
        turns = link.name_index(self.snap).turns if twice else None
        for i, spoken in zip(twice, found[len(wanted):], strict=True):
            merged = ([h for h in spoken if turns[h[0]]]
                      + [h for h in found[i] if not turns[h[0]]])
            found[i] = sorted(merged, key=lambda h: -h[1])[:self.pool_of("episodes")]
        return found[:len(wanted)]

    def result(self) -> SearchResult:
        parts = {k: getattr(self.recipe, k) for k in KINDS if getattr(self.recipe, k)}
        found = self._found(parts)
        for kind, part in parts.items():
            if part.fusion == "scores":  # (BM25's 0 is no match; a cosine has no zero)
                found[kind].scores = [
                    None if v is None else rerank.normalise(v, method(m).zero_based)
                    for v, m in zip(found[kind].scores, found[kind].methods, strict=True)]
        ranked = {kind: self._rerank(kind, part, found[kind].rows, found[kind].scores,
                                     [part.weight(m) for m in found[kind].methods])
                  for kind, part in parts.items() if kind != "episodes"}
        if "episodes" in parts:
            episodes = found["episodes"]
            ranked["episodes"] = self._episodes(parts["episodes"], episodes.rows,
                                                episodes.scores, episodes.methods, ranked)
        return self._hydrate({kind: hits[:self.limit] for kind, hits in ranked.items()})

    def _found(self, parts: dict[str, Part]) -> dict[str, Found]:
        """Each kind's lists, one per method of its part: the text searches first (all at
        once), then the other methods by phase (`methods`), each reading the text
        searches' lists."""
        wanted = [(kind, name) for kind, part in parts.items() for name in part.methods
                  if isinstance(method(name), TextSearch)]
        found = {kind: Found() for kind in parts}
        for (kind, name), hits in zip(wanted, self._searched(wanted), strict=True):
            found[kind].add(name, [r for r, _ in hits], [s for _, s in hits])
        text_found = {kind: found[kind].copy() for kind in parts}
        for kind, part in parts.items():
            for name in sorted(part.methods, key=lambda m: method(m).phase):
                search = method(name)
                if isinstance(search, FromSearch):
                    found[kind].add(name, *search.hits(self, kind, text_found))
        return found

    def expansion(self, found: Mapping[str, Found]) -> dict[str, list[int]]:
        """The facts and entities BFS reaches from the seeds (`_seeds`, from the text
        searches' lists), each ordered by hops and words; computed once a search."""
        if self._expansion is None:
            lists = {kind: f.rows for kind, f in found.items()}
            scores = {kind: f.scores for kind, f in found.items()}
            expansion = bfs(self.snap, self._seeds(lists, scores), self.scope,
                            self.recipe.bfs_hops, self.recipe.bfs_max_edges)
            labelled = with_labels(self.snap, list(expansion.entities),
                                   self.scope.filters.labels)
            self._expansion = {
                "facts": order_reached(expansion.facts, self.snap.kinds["facts"], self.text,
                                       self.pool),
                "entities": order_reached({e: expansion.entities[e] for e in labelled},
                                          self.snap.kinds["entities"], self.text, self.pool)}
        return self._expansion

    def _episodes(self, part: Part, found: list[list[int]], scores: list[list[float] | None],
                  methods: list[str], ranked: dict[str, Hits]) -> Hits:
        """Episodes: each method's hits scored with their neighbouring turns, fused by RRF
        with the top facts' and entities' sources, weighed by who spoke them and by the
        times the question names, then the part's reranker."""
        recipe = self.recipe
        weights = [part.weight(m) for m in methods]
        if any(recipe.turn_window):
            adjacent = adjacent_turns(self.snap, [r for rows in found for r in rows],
                                      self.scope)
            for i, values in enumerate(scores):
                if values is not None:
                    window = rerank.turn_window(list(zip(found[i], values, strict=True)),
                                                adjacent, *recipe.turn_window)
                    found[i], scores[i] = [r for r, _ in window], [v for _, v in window]
        found, scores, weights = _combined(part, found, scores, weights)
        if recipe.provenance:
            found += [self._fact_sources(ranked.get("facts", [])[:recipe.provenance_facts]),
                      [e for row, _ in ranked.get("entities", [])[:self.limit]
                       for e in self._entity_episodes(row)]]
            scores += [None, None]
            weights += list(recipe.provenance_weights)
        fused = rerank.boost(rerank.rrf(found, recipe.rrf_k, weights, scores=scores),
                             self._episode_factor())
        keys = [row for row, _ in fused][:self.pool_of("episodes")]
        if not keys:
            return fused
        return rerank.RERANKERS.build(part.reranker, KindCandidates(self, "episodes", fused,
                                                                    keys))

    def _fact_sources(self, facts: Hits) -> list[int]:
        """The source episodes of some facts, fact by fact, each fact's in time order."""
        return [e for fact in _rows(self.snap, "facts", facts, ("episode_ids",))
                for e in self._episode_rows(fact["episode_ids"] or [])]

    def _episode_factor(self) -> Any:
        """Row -> score factor: `named_speaker` for a turn a named person spoke,
        `other_speaker` for a turn spoken by someone else that names no named person or
        thing, times `time_boost` inside the question's time windows."""
        recipe = self.recipe
        spoken: set[int] = set()
        about: set[int] = set()
        turns = None
        if recipe.other_speaker != 1.0 or recipe.named_speaker != 1.0:
            entities, spoken_rows = self.named()
            spoken, turns = set(spoken_rows), link.name_index(self.snap).turns
            if spoken and entities:  # what others said about a named person or thing
                about = set(self.snap.entity_episodes.of_many(
                    np.asarray(entities, dtype=np.int64)).tolist())
        windows = self._time_windows() if recipe.time_boost != 1.0 else []
        valid = self.snap.kinds["episodes"].times.get("valid_at_us")

        def factor(row: int) -> float:
            value = 1.0
            if row in spoken:
                value *= recipe.named_speaker
            elif spoken and turns is not None and turns[row] and row not in about:
                value *= recipe.other_speaker
            if windows and valid is not None and any(a <= valid[row] < b for a, b in windows):
                value *= recipe.time_boost
            return value

        return factor

    def _time_windows(self) -> list[tuple[int, int]]:
        """The question's own time words as [start, end) microseconds, counted back from
        the newest episode the scope sees; none when the caller set a valid-time filter."""
        f = self.scope.filters
        if f.valid_from is not None or f.valid_to is not None or not timewords.windows(
                self.text, EPOCH):  # (no time words: no scan for the newest episode)
            return []
        now = latest_episode(self.snap, self.scope)
        if now is None:
            return []
        moment = datetime.fromtimestamp(now / 1_000_000, UTC)
        return [(_micros(a), _micros(b)) for a, b in timewords.windows(self.text, moment)]

    def named(self) -> tuple[list[int], list[int]]:
        """(entity rows, episode rows spoken by a named speaker) the question names."""
        if self._named is None:
            self._named = link.name_index(self.snap).named(
                self.text, allowed_groups(self.snap, self.scope).tolist())
        return self._named

    def _seeds(self, lists: dict[str, list[list[int]]],
               scores: dict[str, list[list[float] | None]]) -> list[int]:
        """Where BFS starts: the center, given origins, a conversation's recent episodes'
        entities; without any of those, the entities of the top hits."""
        seeds = ([self.center] if self.center is not None else []) + self.origins
        seeds += self._conversation_entities()
        if seeds:
            return seeds
        top = self.recipe.bfs_seeds
        for kind, found in lists.items():
            fused = [row for row, _ in rerank.rrf(found, self.recipe.rrf_k,
                                                  scores=scores[kind])][:top]
            if kind == "entities":
                seeds += fused
            elif kind == "facts":
                ends = np.concatenate([self.snap.fact_src[fused], self.snap.fact_tgt[fused]])
                seeds += [int(e) for e in ends if e >= 0]
        return list(dict.fromkeys(seeds))

    def _conversation_entities(self, recent: int = 4) -> list[int]:
        if not self.conversation_id:
            return []
        import pyarrow as pa
        import pyarrow.compute as pc

        episodes = self.snap.kinds["episodes"].meta
        mask = pc.equal(episodes["conversation_id"], self.conversation_id)
        mask = pc.and_(mask, pc.is_in(episodes["group_id"],
                                      value_set=pa.array(self.scope.groups, pa.string())))
        mask = pc.and_(mask, pc.less_equal(episodes["created_at_us"], self.scope.known_at))
        rows = np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))
        newest = rows[np.argsort(-episodes["valid_at_us"].to_numpy()[rows])][:recent]
        return [int(e) for e in self.snap.episode_entities.of_many(newest)]

    def _rerank(self, kind: str, part: Part, found: list[list[int]],
                scores: list[list[float] | None], weights: list[float] | None = None) -> Hits:
        """RRF over the methods' lists, then the part's reranker (`rerank.RERANKERS`) over
        the recipe's pool of the fused keys."""
        found, scores, weights = _combined(part, found, scores, weights or [1.0] * len(found))
        fused = rerank.rrf(found, self.recipe.rrf_k, weights, scores=scores)
        keys = [row for row, _ in fused][:self.pool_of(kind)]
        if not keys:
            return fused
        return rerank.RERANKERS.build(part.reranker, KindCandidates(self, kind, fused, keys))

    # --- hydration ----------------------------------------------------------------
    def _hydrate(self, ranked: dict[str, Hits]) -> SearchResult:
        snap = self.snap
        result = SearchResult(run_id=snap.run_id)
        names = snap.kinds["entities"].meta["name"]
        facts = ranked.get("facts", [])
        for (row, score), fact in zip(facts, _rows(snap, "facts", facts, (
                "edge_id", "fact", "relation", "valid_at", "invalid_at", "episode_ids")),
                                      strict=True):
            src, tgt = int(snap.fact_src[row]), int(snap.fact_tgt[row])
            cited = self._episode_rows(fact["episode_ids"] or [])
            result.facts.append(FactHit(
                edge_id=fact["edge_id"], fact=fact["fact"], relation=fact["relation"],
                source=names[src].as_py() if src >= 0 else None,
                target=names[tgt].as_py() if tgt >= 0 else None,
                valid_at=_iso(fact["valid_at"]), invalid_at=_iso(fact["invalid_at"]),
                score=round(score, 6), episodes=[self._episode_source(e) for e in cited]))
        entities = ranked.get("entities", [])
        present = summaries_hold(snap, self.scope)
        for (_, score), entity in zip(entities, _rows(
                snap, "entities", entities, ("entity_id", "name", "summary")), strict=True):
            result.entities.append(EntityHit(**{**entity, "summary": entity["summary"]
                                                if present else None}, score=round(score, 6)))
        communities = ranked.get("communities", [])
        for (_, score), community in zip(communities, _rows(
                snap, "communities", communities, ("community_id", "name", "summary")),
                                         strict=True):
            result.communities.append(CommunityHit(**{
                **community, "summary": community["summary"] if present else None},
                score=round(score, 6)))
        hits = ranked.get("episodes", [])
        for (_, score), episode in zip(hits, _rows(
                snap, "episodes", hits, ("episode_id", "source_id", "content", "valid_at")),
                                       strict=True):
            result.episodes.append(EpisodeHit(
                episode_id=episode["episode_id"], source_id=episode["source_id"],
                content=episode["content"] or "", valid_at=_iso(episode["valid_at"]),
                score=round(score, 6)))
        return result

    def _visible_episode(self, row: int) -> bool:
        snap = self.snap
        if self._groups is None:
            self._groups = {snap.groups[g] for g in self.scope.groups if g in snap.groups}
        return (int(snap.group_codes["episodes"][row]) in self._groups
                and snap.kinds["episodes"].times["created_at_us"][row] <= self.scope.known_at)

    def _episode_rows(self, episode_ids: list[str]) -> list[int]:
        """Provenance episodes the scope may see, in time order."""
        rows = [self.snap.episode_rows.get(e, -1) for e in episode_ids]
        rows = [r for r in rows if r >= 0 and self._visible_episode(r)]
        valid = self.snap.kinds["episodes"].times["valid_at_us"]
        return sorted(set(rows), key=lambda r: (int(valid[r]), r))

    def _entity_episodes(self, row: int) -> list[int]:
        found = []
        for episode in self.snap.entity_episodes.of(row).tolist():
            if self._visible_episode(episode):
                found.append(episode)
                if len(found) >= ENTITY_PROVENANCE:
                    break
        return found

    def _episode_source(self, row: int) -> str:
        return self.snap.kinds["episodes"].meta["source_id"][row].as_py()


@dataclass
class Found:
    """One kind's candidate lists, one per method, in the order they are fused."""

    rows: list[list[int]] = field(default_factory=list)
    scores: list[list[float] | None] = field(default_factory=list)  # None: ordered only
    methods: list[str] = field(default_factory=list)

    def add(self, method: str, rows: list[int], scores: list[float] | None) -> None:
        self.rows.append(rows)
        self.scores.append(scores)
        self.methods.append(method)

    def copy(self) -> Found:
        return Found(list(self.rows), list(self.scores), list(self.methods))


@dataclass
class KindCandidates:
    """One kind's candidates in one search: what a reranker step reads
    (`rerank.Candidates`)."""

    search: OneSearch
    kind: str
    fused: Hits
    keys: list[int]

    @property
    def text(self) -> str:
        return self.search.text

    @property
    def limit(self) -> int:
        return self.search.limit

    @property
    def recipe(self) -> Recipe:
        return self.search.recipe

    def query_vector(self) -> np.ndarray:
        return self.search.vector

    def vectors(self, keys: list[int]) -> dict[int, np.ndarray]:
        return vectors_of(self.search.snap.kinds[self.kind], keys, self.search.scope)

    def mention_counts(self, keys: list[int]) -> dict[int, int]:
        """Entities: their mention count; facts: their provenance episodes."""
        meta = self.search.snap.kinds[self.kind].meta
        if self.kind == "entities":
            return {k: int(meta["mention_count"][k].as_py() or 0) for k in keys}
        if self.kind == "facts":
            return {k: len(meta["episode_ids"][k].as_py() or []) for k in keys}
        return {}

    def center_hops(self, keys: list[int]
                    ) -> tuple[Mapping[int, Sequence[int]], Mapping[Hashable, int]]:
        search, snap = self.search, self.search.snap
        if search.center is None:
            raise QueryError(f"recipe {search.recipe.name} ranks by distance from a center "
                             "entity: pass center=ENTITY_ID (--center)")
        distances = rerank.shortest_hops(search.center, neighbours(snap, search.scope))
        ends: dict[int, Sequence[int]] = (
            {k: (int(snap.fact_src[k]), int(snap.fact_tgt[k])) for k in keys}
            if self.kind == "facts" else {k: (k,) for k in keys})
        return ends, distances

    def passages(self, keys: list[int]) -> list[str]:
        meta = self.search.snap.kinds[self.kind].meta
        return [passage(meta, self.kind, k, self.search.snap) for k in keys]

    def cross_encoder(self) -> rerank.CrossEncoder:
        return self.search.retriever.cross_encoder


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


def passage(meta: Any, kind: str, row: int, snap: Snapshot) -> str:
    """The full text a cross-encoder sees for one candidate."""
    if kind == "facts":
        names = snap.kinds["entities"].meta["name"]
        src, tgt = int(snap.fact_src[row]), int(snap.fact_tgt[row])
        ends = " - ".join(names[e].as_py() or "" for e in (src, tgt) if e >= 0)
        return f"{meta['fact'][row].as_py()} ({ends})"
    if kind in ("entities", "communities"):
        return f"{meta['name'][row].as_py()}: {meta['summary'][row].as_py() or ''}"
    return meta["content"][row].as_py() or ""


def _rows(snap: Snapshot, kind: str, hits: Hits, columns: tuple[str, ...]
          ) -> list[dict[str, Any]]:
    """Some columns of the hit rows, as Python values (one `take`, not a lookup a cell)."""
    if not hits:
        return []
    import pyarrow as pa

    meta = snap.kinds[kind].meta.select(list(columns))
    return meta.take(pa.array([row for row, _ in hits], pa.int64())).to_pylist()


def _combined(part: Part, found: list[list[int]], scores: list[list[float] | None],
              weights: list[float]
              ) -> tuple[list[list[int]], list[list[float] | None], list[float]]:
    """For a part fused by "scores": its scored lists as one (`rerank.combine`, with their
    weights) at weight 1, then the unscored lists as they were."""
    scored = [i for i, values in enumerate(scores) if values is not None]
    if part.fusion != "scores" or not scored:
        return found, scores, weights
    one = rerank.combine([found[i] for i in scored], [scores[i] or [] for i in scored],
                         [weights[i] for i in scored])
    rest = [i for i in range(len(found)) if i not in scored]
    return ([[k for k, _ in one]] + [found[i] for i in rest],
            [[v for _, v in one]] + [scores[i] for i in rest],
            [1.0] + [weights[i] for i in rest])


def _micros(moment: datetime) -> int:
    return int((moment - EPOCH) / timedelta(microseconds=1))


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def open(store_dir: str | Path, embedder: Any = None, config: QueryConfig | None = None,
         cross_encoder: Any = None) -> Retriever:
    """Open a store for retrieval (`tkg.query.open(store)`); `embedder` overrides the one in the
    snapshot's manifest (benchmarks use a synthetic one)."""
    return Retriever(store_dir, embedder=embedder, config=config, cross_encoder=cross_encoder)
