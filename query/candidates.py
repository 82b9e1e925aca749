"""One search: each kind's candidates from its part's methods (`tkg.query.methods`), BFS
seeds, fusion and the part's reranker (`tkg.query.rerank`), then the hits
(`tkg.query.hits`); episodes are fused by `tkg.query.episodes` first."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from tkg.pipeline.config import QueryConfig
from tkg.query import link, rerank
from tkg.query.episodes import fused_episodes
from tkg.query.hits import KINDS, Provenance, SearchResult, hydrate
from tkg.query.methods import FromSearch, InMemory, TextSearch, method
from tkg.query.recipes import Part, Recipe
from tkg.query.search import (
    Hits,
    Scope,
    allowed_groups,
    bfs,
    entities_in_scope,
    neighbours,
    order_reached,
    start,
    together,
    vectors_of,
    with_labels,
)
from tkg.query.snapshot import QueryError, Snapshot


class Models(Protocol):
    """What a search asks of its retriever (`api.Retriever`)."""

    @property
    def config(self) -> QueryConfig: ...

    @property
    def cross_encoder(self) -> rerank.CrossEncoder: ...

    def embed(self, text: str) -> np.ndarray: ...

    def embed_all(self, texts: Sequence[str]) -> list[np.ndarray]: ...


class OneSearch:
    """One search: candidates per kind and method, graph expansion, rerank, hydrate."""

    def __init__(self, retriever: Models, snap: Snapshot, recipe: Recipe, scope: Scope,
                 text: str, limit: int, center: str | None, origins: Sequence[str] | None,
                 conversation_id: str | None) -> None:
        self.retriever, self.snap, self.recipe, self.scope = retriever, snap, recipe, scope
        self.text, self.limit = text, limit
        self.pool = max(recipe.candidates, limit)
        self.center = self._entity_row(center, "center") if center else None
        self.origins = [self._entity_row(o, "origin") for o in origins or ()]
        self.conversation_id = conversation_id
        self.provenance = Provenance(snap, scope)
        self._vectors: dict[str, np.ndarray] = {}  # per text searched: the question, unnamed
        self._unnamed_question: str | None = None  # the question without speakers' names
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

    def _embed_together(self, texts: list[str]) -> None:
        """Embed the texts a search will ask for in one call of the model (`vector_of` then
        finds them)."""
        wanted = [t for t in texts if t not in self._vectors]
        if len(wanted) > 1:
            self._vectors.update(zip(wanted, self.retriever.embed_all(wanted), strict=True))

    def unnamed_text(self) -> str:
        """The question without the names of the speakers it names (`Part.unnamed`)."""
        if self._unnamed_question is None:
            self._unnamed_question = link.name_index(self.snap).without_speakers(
                self.text, allowed_groups(self.snap, self.scope).tolist())
        return self._unnamed_question

    def pool_of(self, kind: str) -> int:
        """Candidates per method of one kind: its part's own number, else the recipe's."""
        part = getattr(self.recipe, kind)
        return max(part.candidates, self.limit) if part and part.candidates else self.pool

    def _candidates(self, wanted: list[tuple[str, str, str]]) -> list[Hits]:
        """Every (kind, method, text)'s hits: the LanceDB searches start first, then the
        in-memory searches run here (`in_memory`) while LanceDB works on its own."""
        searches = [(method(name), kind, text) for kind, name, text in wanted]
        local = {i: f for i, (search, kind, text) in enumerate(searches)
                 if (f := search.in_memory(self, kind, text)) is not None}
        lance = [search.on_lance(self, kind, text)
                 for i, (search, kind, text) in enumerate(searches) if i not in local]
        running = start(lance) if lance else None  # (an empty hop to LanceDB's loop: 0.05 ms)
        try:
            exact = dict(zip(local, in_memory(list(local.values()), shared=not lance),
                             strict=True))
            remote = iter(running.result() if running is not None else ())
        except BaseException:
            if running is not None:
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
        if unnamed and any(name == "cosine" for _, name in wanted):
            self._embed_together([self.text, self.unnamed_text()])
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
        """Each kind's lists, fused by its part, reranked, cut to the limit, as hits."""
        parts = {k: getattr(self.recipe, k) for k in KINDS if getattr(self.recipe, k)}
        found = self._found(parts)
        for kind, part in parts.items():
            if part.fusion == "scores":  # (BM25's 0 is no match; a cosine has no zero)
                found[kind].scores = [
                    None if v is None else rerank.normalise(v, method(m).zero_based)
                    for v, m in zip(found[kind].scores, found[kind].methods, strict=True)]
        ranked = {kind: self._reranked(kind, part, self._fused(part, found[kind]))
                  for kind, part in parts.items() if kind != "episodes"}
        if "episodes" in parts:
            episodes, part = found["episodes"], parts["episodes"]
            ranked["episodes"] = self._reranked("episodes", part, fused_episodes(
                self, part, (episodes.rows, episodes.scores), episodes.methods, ranked))
        return hydrate(self.snap, self.scope,
                       {kind: hits[:self.limit] for kind, hits in ranked.items()},
                       self.provenance)

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
            entities = expansion.entities
            if self.scope.filters.labels:
                entities = {e: entities[e] for e in with_labels(
                    self.snap, list(entities), self.scope.filters.labels)}
            self._expansion = {
                "facts": order_reached(expansion.facts, self.snap.kinds["facts"], self.text,
                                       self.pool),
                "entities": order_reached(entities, self.snap.kinds["entities"], self.text,
                                          self.pool)}
        return self._expansion

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
            if kind not in ("entities", "facts"):
                continue  # (only their top hits name entities)
            fused = [row for row, _ in rerank.rrf(found, self.recipe.rrf_k,
                                                  scores=scores[kind])][:top]
            if kind == "entities":
                seeds += fused
            elif kind == "facts":
                ends = np.concatenate([self.snap.fact_src[fused], self.snap.fact_tgt[fused]])
                seeds += [int(e) for e in ends if e >= 0]
        return list(dict.fromkeys(seeds))

    def _conversation_entities(self) -> list[int]:
        """The entities of the conversation's newest episodes (`conversation_episodes`)."""
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
        newest = rows[np.argsort(-episodes["valid_at_us"].to_numpy()[rows])]
        return [int(e) for e in self.snap.episode_entities.of_many(
            newest[:self.recipe.conversation_episodes])]

    def _fused(self, part: Part, found: Found) -> Hits:
        """RRF over the methods' lists (by the part's `fusion`)."""
        weights = [part.weight(m) for m in found.methods]
        lists, scores, weights = rerank.fused_lists(part.fusion, found.rows, found.scores,
                                                    weights)
        return rerank.rrf(lists, self.recipe.rrf_k, weights, scores=scores)

    def _reranked(self, kind: str, part: Part, fused: Hits) -> Hits:
        """The part's reranker (`rerank.RERANKERS`) over the kind's pool of the fused keys."""
        keys = [row for row, _ in fused][:self.pool_of(kind)]
        if not keys:
            return fused
        return rerank.RERANKERS.build(part.reranker, KindCandidates(self, kind, fused, keys))


# Rows a search's in-memory text searches rank together from which they share out the
# threads (`in_memory`). At 1M facts (a group: 100,000 facts, 25,000 episodes, 20,000
# entities; 290,000 rows for the default recipe's cosines and BM25s) they are about 19 ms of
# one core, the exact cosine of the facts 9 of it; at 100,000 facts (29,000 rows) about
# 2 ms, where a thread's hand-over costs more than it saves and a server's processes
# already keep every core busy (`together`'s docstring).
SHARED_ROWS = 100_000


def in_memory(searches: list[InMemory], shared: bool) -> list[Hits]:
    """The hits of each in-memory search: one after another on this thread, or, where they
    rank `SHARED_ROWS` rows or more and `shared` (no LanceDB search is running on the other
    cores meanwhile), on this thread and the helper threads at once (`search.together`),
    the largest first. The same hits either way: each search only reads the snapshot."""
    if not shared or len(searches) < 2 or sum(s.rows for s in searches) < SHARED_ROWS:
        return [search.run() for search in searches]
    order = sorted(range(len(searches)), key=lambda i: -searches[i].rows)
    hits: list[Hits] = [[] for _ in searches]
    for i, found in zip(order, together([searches[i].run for i in order]), strict=True):
        hits[i] = found
    return hits


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


