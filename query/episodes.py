"""Episode scoring: how one search fuses its episode lists before the part's reranker.

Each method's hits are scored with their neighbouring turns (`Recipe.turn_window`), fused
by RRF with the sources of the top facts and the latest mentions of the top entities
(`Recipe.provenance`), then weighed by who spoke them (`other_speaker`, `named_speaker`)
and by the times the question's own words name (`time_boost`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

import numpy as np
from tkg.query import link, rerank, timewords
from tkg.query.hits import Provenance, rows_of
from tkg.query.recipes import Part, Recipe
from tkg.query.search import Hits, Scope, adjacent_turns, latest_episode
from tkg.query.snapshot import Snapshot

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Question(Protocol):
    """What episode scoring reads of one search (`candidates.OneSearch`)."""

    snap: Snapshot
    scope: Scope
    text: str
    recipe: Recipe
    limit: int
    provenance: Provenance

    def named(self) -> tuple[list[int], list[int]]: ...


Lists = tuple[list[list[int]], list[list[float] | None]]  # rows and scores, one per method


def fused_episodes(search: Question, part: Part, lists: Lists, methods: list[str],
                   ranked: dict[str, Hits]) -> Hits:
    """The episode methods' lists (`lists`, by `methods`) scored with their neighbouring
    turns, fused with the top facts' and entities' (`ranked`) sources and weighed by
    speaker and time."""
    recipe = search.recipe
    weights = [part.weight(m) for m in methods]
    found, scores = with_turn_windows(search, *lists)
    found, scores, weights = rerank.fused_lists(part.fusion, found, scores, weights)
    if recipe.provenance:
        found += cited_episodes(search, ranked)
        scores += [None, None]
        weights += list(recipe.provenance_weights)
    fused = rerank.rrf(found, recipe.rrf_k, weights, scores=scores)
    return rerank.boost(fused, episode_factors(search, np.array([r for r, _ in fused],
                                                                  dtype=np.int64)))


def with_turn_windows(search: Question, found: list[list[int]],
                      scores: list[list[float] | None]) -> Lists:
    """Each scored list's turns scored with their neighbours (`rerank.window_rows`)."""
    if not any(search.recipe.turn_window):
        return found, scores
    neighbours = adjacent_turns(search.snap, search.scope)
    found, scores = list(found), list(scores)
    for i, values in enumerate(scores):
        if values is not None:
            rows, window = rerank.window_rows(np.asarray(found[i], dtype=np.int64), values,
                                              neighbours, *search.recipe.turn_window)
            found[i], scores[i] = rows.tolist(), window.tolist()
    return found, scores


def cited_episodes(search: Question, ranked: dict[str, Hits]) -> list[list[int]]:
    """[the source episodes of the top facts, fact by fact, each fact's in time order;
    the newest episodes mentioning each top entity]."""
    facts = ranked.get("facts", [])[:search.recipe.provenance_facts]
    sources = [e for fact in rows_of(search.snap, "facts", facts, ("episode_ids",))
               for e in search.provenance.episode_rows(fact["episode_ids"] or [])]
    mentions = [e for row, _ in ranked.get("entities", [])[:search.limit]
                for e in search.provenance.entity_episodes(row, search.recipe.entity_provenance)]
    return [sources, mentions]


def episode_factors(search: Question, rows: np.ndarray) -> np.ndarray:
    """Each row's score factor: the speaker's (`speaker_factors`) times `time_boost` inside
    the question's time windows."""
    recipe = search.recipe
    factors = speaker_factors(search, rows)
    windows = time_windows(search) if recipe.time_boost != 1.0 else []
    valid = search.snap.kinds["episodes"].times.get("valid_at_us")
    if windows and valid is not None and len(rows):
        at = valid[rows]
        inside = np.zeros(len(rows), dtype=bool)
        for start, end in windows:
            inside |= (start <= at) & (at < end)
        factors[inside] *= recipe.time_boost
    return factors


def speaker_factors(search: Question, rows: np.ndarray) -> np.ndarray:
    """Each row's factor: `named_speaker` for a turn a named person spoke, `other_speaker`
    for a turn spoken by someone else that names no named person or thing, else 1."""
    recipe = search.recipe
    factors = np.ones(len(rows), dtype=np.float64)
    if (recipe.other_speaker == 1.0 and recipe.named_speaker == 1.0) or not len(rows):
        return factors
    entities, spoken_rows = search.named()
    if not spoken_rows:
        return factors
    turns = link.name_index(search.snap).turns
    spoken = np.isin(rows, np.asarray(spoken_rows, dtype=np.int64))
    about = np.zeros(len(rows), dtype=bool)
    if entities:  # what others said about a named person or thing
        about = np.isin(rows, search.snap.entity_episodes.of_many(
            np.asarray(entities, dtype=np.int64)))
    factors[turns[rows] & ~spoken & ~about] = recipe.other_speaker
    factors[spoken] = recipe.named_speaker
    return factors


def time_windows(search: Question) -> list[tuple[int, int]]:
    """The question's own time words as [start, end) microseconds, counted back from the
    newest episode the scope sees; none when the caller set a valid-time filter."""
    f = search.scope.filters
    if f.valid_from is not None or f.valid_to is not None or not timewords.windows(
            search.text, EPOCH):  # (no time words: no scan for the newest episode)
        return []
    now = latest_episode(search.snap, search.scope)
    if now is None:
        return []
    moment = datetime.fromtimestamp(now / 1_000_000, UTC)
    return [(_micros(a), _micros(b)) for a, b in timewords.windows(search.text, moment)]


def _micros(moment: datetime) -> int:
    return int((moment - EPOCH) / timedelta(microseconds=1))
