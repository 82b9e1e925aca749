"""`tkg.query.open(store)`: f(q) = constructor(rerank(search(q))) over the current snapshot.

The retriever opens a snapshot once (LanceDB tables, row metadata, graph arrays) and keeps
it until `STORE/CURRENT` changes (`snapshot.SnapshotHolder`), so a newly published
snapshot is picked up without a restart and an unchanged one costs a stat. A search runs
on the snapshot it started on. It is safe to share between threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from tkg.pipeline import inbox, storage
from tkg.pipeline.config import MAX_RESULTS, EmbedConfig, LimitsConfig, QueryConfig
from tkg.pipeline.inbox import Added
from tkg.query import rerank
from tkg.query.candidates import OneSearch
from tkg.query.context import build_context
from tkg.query.embedding import question_embedder
from tkg.query.hits import (
    KINDS,
    CommunityHit,
    EntityHit,
    EpisodeHit,
    FactHit,
    SearchResult,
)
from tkg.query.recipes import Recipe, get_recipe
from tkg.query.search import Filters, make_scope
from tkg.query.snapshot import (
    QueryError,
    Snapshot,
    SnapshotHolder,
    open_snapshot,
    snapshot_query_config,
)

# The public names: the retriever, and the hits it returns (`tkg.query.hits`).
__all__ = ["KINDS", "CommunityHit", "EntityHit", "EpisodeHit", "FactHit", "Retriever",
           "SearchResult", "add_episodes", "open", "snapshot_embedder"]

_EMBEDDERS: dict[str, Any] = {}
_EMBEDDERS_LOCK = threading.Lock()


def snapshot_embedder(manifest: dict[str, Any]) -> Any:
    """The embedder the snapshot was built with (model, precision and dim from its
    manifest), loaded once per process and laid out for a question's few tokens
    (`tkg.query.embedding.question_embedder`): the build's own encoder where the model's
    layout allows (a cold `tkg search` took 7-8 s of CPU with sentence-transformers; ~1.9 s
    on numpy, ~1.5 s more where bfloat16 imports torch)."""
    embedding = manifest.get("embedding") or {}
    try:
        config = EmbedConfig.model_validate(manifest["config"]["embed"])
    except (KeyError, TypeError, ValueError):
        config = EmbedConfig(model=embedding.get("model", EmbedConfig().model))
    key = config.model_dump_json()
    with _EMBEDDERS_LOCK:
        if key not in _EMBEDDERS:
            _EMBEDDERS[key] = question_embedder(config)
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
            self._config = snapshot_query_config(self.snapshot().manifest)
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
        return self.embed_all([text])[0]

    def embed_all(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The vectors of several texts of one query, those not cached in one pass of the
        model: its weights are read once for both (a question and the question without
        its speakers' names: 2 x 14 ms apart, 15 ms together on the 2-core machine)."""
        found: dict[str, np.ndarray] = {}
        with self._cache_lock:
            for text in texts:
                cached = self._vectors.get(text)
                if cached is not None:
                    self._vectors.move_to_end(text)
                    found[text] = cached
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            vectors = np.asarray(self.embedder.embed(missing), dtype=np.float32)
            found.update(zip(missing, vectors, strict=True))
            with self._cache_lock:
                for text in missing:
                    self._vectors[text] = found[text]
                while len(self._vectors) > 1024:
                    self._vectors.popitem(last=False)
        return [found[t] for t in texts]

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
        result.warnings += erased_since(snap.manifest, scope.known_at)
        return result

    def context(self, text: str, group_ids: Sequence[str] | str, *,
                max_tokens: int | None = None, **search: Any) -> str:
        """The context string for an agent (facts with date ranges, entities, communities,
        cited episodes) within `max_tokens`."""
        return self.context_of(self.search(text, group_ids, **search), max_tokens)

    def context_of(self, result: SearchResult, max_tokens: int | None = None) -> str:
        """The context string of a search result (default budget: query.context_tokens)."""
        return build_context(result, max_tokens or self.config.context_tokens)

    def add_episodes(self, records: Sequence[Any], limits: LimitsConfig | None = None
                     ) -> Added:
        """`add_episodes` on this retriever's store."""
        return add_episodes(self.store, records, limits)

    def recipe(self, recipe: str | Recipe | None = None) -> Recipe:
        """A recipe by name, as given, or the configured one (query.recipe)."""
        return recipe if isinstance(recipe, Recipe) else get_recipe(recipe or self.config.recipe)


def add_episodes(store_dir: str | Path, records: Sequence[Any],
                 limits: LimitsConfig | None = None) -> Added:
    """Add episodes (input-contract records: group_id, id, timestamp, kind and its fields) to
    the store's inbox, where the next `tkg build --inbox` finds them; answers per record its
    episode id or why it was rejected (`pipeline/inbox.py`). Searches see them once built."""
    return inbox.add(storage.location(store_dir), records, limits, storage.configured())


def erased_since(manifest: dict[str, Any], known_at: int) -> list[str]:
    """A warning per erasure (`tkg forget`) after `known_at` (microseconds): what the store
    knew then is shown without what was erased since, which is not the same as never known."""
    warnings = []
    for erasure in manifest.get("erasures") or []:
        at = datetime.fromisoformat(erasure["at"])
        if at.timestamp() * 1_000_000 > known_at:
            warnings.append(f"erased data was removed from this store at {erasure['at']} "
                            f"(request {erasure['request_id']}); what the store knew before "
                            "then is shown without it")
    return warnings


def open(store_dir: str | Path, embedder: Any = None, config: QueryConfig | None = None,
         cross_encoder: Any = None) -> Retriever:
    """Open a store for retrieval (`tkg.query.open(store)`); `embedder` overrides the one in the
    snapshot's manifest (benchmarks use a synthetic one)."""
    return Retriever(store_dir, embedder=embedder, config=config, cross_encoder=cross_encoder)
