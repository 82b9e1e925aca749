"""Search methods: how a recipe's part finds one kind's candidates, by name (`METHODS`, a
`Registry` like the rerankers). A name no entry has is an error that lists the known ones.

A method runs in one of three phases, and a part's lists are fused in phase order (then
in the part's order), since the order of the lists breaks RRF's ties:
- text searches (`cosine`, `bm25`) rank a kind's rows against a text; all of one search
  start at once (LanceDB's on its own loop while the in-memory ones run on the caller's);
- `bfs` expands the graph from the text searches' hits (or the seeds the caller gave);
- `linked` takes what the people and things the question names said or appear in.
Adding a method is a class here, one `register` line, and its use in a recipe.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Protocol

import numpy as np
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.registry import Registry
from tkg.query.search import (
    Hits,
    Scope,
    bm25,
    cosine,
    exact_cosine,
    exact_spans,
    memory_bm25,
    span_rows,
    text_spans,
    visible_mask,
)
from tkg.query.snapshot import Snapshot

TEXT, EXPANSION, NAMED = 0, 1, 2  # the phases, in the order they run


class Found(Protocol):
    """A kind's lists so far (`candidates.Found`)."""

    rows: list[list[int]]
    scores: list[list[float] | None]


class Searcher(Protocol):
    """What a method reads of one search (`candidates.OneSearch`)."""

    snap: Snapshot
    scope: Scope
    text: str

    @property
    def config(self) -> QueryConfig: ...

    @property
    def vector(self) -> np.ndarray: ...

    def vector_of(self, text: str) -> np.ndarray: ...

    def pool_of(self, kind: str) -> int: ...

    def named(self) -> tuple[list[int], list[int]]: ...

    def expansion(self, found: dict[str, Found]) -> dict[str, list[int]]: ...


class Method:
    """One search method (see the module doc)."""

    phase: ClassVar[int]
    zero_based: ClassVar[bool] = False  # a score of 0 means no match (`rerank.normalise`)


@dataclass(frozen=True)
class InMemory:
    """A text search that runs in this process: the search as a function of nothing, and
    the rows it ranks (how `candidates.OneSearch` orders and shares out such searches)."""

    run: Callable[[], Hits]
    rows: int


class TextSearch(Method):
    """Ranks a kind's rows against a text: in memory where the snapshot keeps what that
    needs, else on LanceDB."""

    phase = TEXT

    def in_memory(self, search: Searcher, kind: str, text: str) -> InMemory | None:
        """The search in this process, or None where it must ask LanceDB."""
        raise NotImplementedError

    def on_lance(self, search: Searcher, kind: str, text: str
                 ) -> Coroutine[Any, Any, Hits]:
        raise NotImplementedError


class FromSearch(Method):
    """Finds a kind's rows from what the search knows besides the text's own matches."""

    def hits(self, search: Searcher, kind: str, text_found: dict[str, Found]
             ) -> tuple[list[int], list[float] | None]:
        """(rows, their scores or None where they are only ordered) of one kind."""
        raise NotImplementedError


METHODS: Registry[Method] = Registry("search method")


@METHODS.register("cosine")
class Cosine(TextSearch):
    def in_memory(self, search: Searcher, kind: str, text: str) -> InMemory | None:
        spans = exact_spans(search.snap, kind, search.scope, search.config)
        return None if spans is None else InMemory(partial(
            exact_cosine, search.snap, kind, search.vector_of(text), search.scope,
            search.pool_of(kind), search.config, spans), span_rows(spans))

    def on_lance(self, search: Searcher, kind: str, text: str
                 ) -> Coroutine[Any, Any, Hits]:
        return cosine(search.snap.kinds[kind], search.vector_of(text), search.scope,
                      search.pool_of(kind), search.config)


@METHODS.register("bm25")
class BM25(TextSearch):
    zero_based = True  # (no shared term scores 0; a cosine has no natural zero)

    def in_memory(self, search: Searcher, kind: str, text: str) -> InMemory | None:
        spans = text_spans(search.snap, kind, search.scope)
        return None if spans is None else InMemory(partial(
            memory_bm25, search.snap, kind, text, search.scope, search.pool_of(kind), spans),
            span_rows(spans))

    def on_lance(self, search: Searcher, kind: str, text: str
                 ) -> Coroutine[Any, Any, Hits]:
        return bm25(search.snap.kinds[kind], text, search.scope, search.pool_of(kind))


@METHODS.register("bfs")
class Bfs(FromSearch):
    """The facts and entities the graph reaches from the seeds (`OneSearch.expansion`),
    ordered by hops and shared words: no scores, and no ties."""

    phase = EXPANSION

    def hits(self, search: Searcher, kind: str, text_found: dict[str, Found]
             ) -> tuple[list[int], list[float] | None]:
        return search.expansion(text_found).get(kind, []), None


@METHODS.register("linked")
class Linked(FromSearch):
    """The rows tied to the people and things the question names (`tkg.query.link`):
    episodes a named person spoke or that mention a named entity, facts touching a named
    entity; by cosine to the query, the kind's pool of them."""

    phase = NAMED

    def hits(self, search: Searcher, kind: str, text_found: dict[str, Found]
             ) -> tuple[list[int], list[float] | None]:
        rows = self._rows(search, kind)
        table = search.snap.kinds[kind]
        if not len(rows) or table.vectors is None:
            return [], []
        rows = rows[visible_mask(search.snap, kind, rows, search.scope)]
        query = search.vector / (np.linalg.norm(search.vector) or 1.0)
        similarity = table.vectors[rows] @ query
        order = np.lexsort((rows, -similarity))[:search.pool_of(kind)]
        return [int(rows[i]) for i in order], [float(similarity[i]) for i in order]

    @staticmethod
    def _rows(search: Searcher, kind: str) -> np.ndarray:
        entities, spoken = search.named()
        snap = search.snap
        if kind == "episodes":
            rows = np.asarray(spoken, dtype=np.int64)
            if entities:
                rows = np.union1d(rows, snap.entity_episodes.of_many(
                    np.asarray(entities, dtype=np.int64)))
            return rows
        if kind == "facts" and entities:
            return np.unique(snap.entity_facts.of_many(np.asarray(entities, np.int64)))
        return np.asarray([], dtype=np.int64)


def method(name: str) -> Method:
    """The registered method called `name`; an unknown name lists the known ones."""
    return METHODS.build(name)

