"""Rerankers: small pure functions over ranked candidate keys (Zep §3, Graphiti's set).

Every function takes keys in some order and returns `(key, score)` pairs best-first. Ties
keep the input order, so a reranker never shuffles what it cannot tell apart. `RERANKERS`
names the step a recipe's `reranker` picks (each reads what it needs from `Candidates`);
`CROSS_ENCODERS` the model behind `cross_encoder` (`query.cross_encoder`). Two of them
fix bugs of Graphiti's versions: `episode_mentions` ranks MORE mentions HIGHER, and
`node_distance` uses true shortest-path hops (BFS over the whole graph), not one hop.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Protocol, TypeVar

import numpy as np
from tkg.pipeline.config import RECIPE_DEFAULTS, QueryConfig
from tkg.pipeline.registry import Registry

K = TypeVar("K", bound=Hashable)
UNREACHABLE = 1_000_000  # hop distance of a node the center cannot reach


def rrf(lists: Sequence[Sequence[K]], k: int = RECIPE_DEFAULTS.rrf_k,
        weights: Sequence[float] | None = None,
        scores: Sequence[Sequence[float] | None] | None = None) -> list[tuple[K, float]]:
    """Reciprocal rank fusion: score(x) = sum_i w_i / (k + rank_i(x)), ranks from 1. With
    `scores` (per list, parallel to it, or None), keys a method scored equally (in float32)
    share the best rank of their run: BM25 often ties short facts, and an arbitrary order
    among them would otherwise decide the fusion."""
    weights = weights or [1.0] * len(lists)
    given = scores or [None] * len(lists)
    fused: dict[K, float] = {}
    for ranked, weight, values in zip(lists, weights, given, strict=True):
        seen: set[K] = set()
        rank, previous = 0, None
        rounded = None if values is None else np.asarray(values, dtype=np.float32).tolist()
        for position, key in enumerate(ranked):
            if key in seen:
                continue
            seen.add(key)
            value = None if rounded is None else rounded[position]
            if value is None or value != previous:
                rank = len(seen)
            previous = value
            fused[key] = fused.get(key, 0.0) + weight / (k + rank)
    return best_first(fused)


def normalise(scores: Sequence[float], zero_based: bool) -> list[float]:
    """A method's scores (best first) on [0, 1], its best at 1: divided by the best where 0
    means no match (BM25: no shared term), else with the last candidate's score as 0 (a
    cosine has no natural zero: MiniLM scores unrelated texts 0.1-0.3)."""
    if not len(scores):
        return []
    values = np.asarray(scores, dtype=np.float64)
    top, low = float(values.max()), 0.0 if zero_based else float(values.min())
    if top <= low:
        return [1.0] * len(values)
    return ((values - low) / (top - low)).tolist()


def combine(lists: Sequence[Sequence[K]], scores: Sequence[Sequence[float]],
            weights: Sequence[float]) -> list[tuple[K, float]]:
    """Score fusion: sum_i w_i * s_i(x) over the lists that hold x, their scores already on
    [0, 1] (`normalise`). Unlike RRF it keeps how far apart a method put two keys. Best
    first; ties keep the order keys were first met in."""
    fused: dict[K, float] = {}
    for ranked, values, weight in zip(lists, scores, weights, strict=True):
        for key, value in zip(ranked, values, strict=True):
            fused[key] = fused.get(key, 0.0) + weight * value
    return best_first(fused)


def best_first(scores: dict[K, float]) -> list[tuple[K, float]]:
    """(key, score) by descending score; ties keep the dict's order (a reversed sort is
    stable too, and a key function in C costs a third of the sort's lambda)."""
    return sorted(scores.items(), key=itemgetter(1), reverse=True)


def _best_first(keys: list[K], scores: np.ndarray) -> list[tuple[K, float]]:
    """(key, score) pairs by descending score; ties keep the order of `keys`."""
    order = np.argsort(-scores, kind="stable")
    return list(zip([keys[i] for i in order.tolist()], scores[order].tolist(), strict=True))


def fused_lists(fusion: str, found: list[list[K]], scores: list[list[float] | None],
                weights: list[float]
                ) -> tuple[list[list[K]], list[list[float] | None], list[float]]:
    """The lists RRF fuses for a part's `fusion`: for "scores", its scored lists as one
    (`combine`, with their weights) at weight 1, then the unscored lists as they were; for
    "rrf", the lists as they are."""
    scored = [i for i, values in enumerate(scores) if values is not None]
    if fusion != "scores" or not scored:
        return found, scores, weights
    one = combine([found[i] for i in scored], [scores[i] or [] for i in scored],
                  [weights[i] for i in scored])
    rest = [i for i in range(len(found)) if i not in scored]
    return ([[k for k, _ in one]] + [found[i] for i in rest],
            [[v for _, v in one]] + [scores[i] for i in rest],
            [1.0] + [weights[i] for i in rest])


def mmr(query: np.ndarray, keys: Sequence[K], vectors: np.ndarray,
        lam: float = RECIPE_DEFAULTS.mmr_lambda,
        limit: int | None = None) -> list[tuple[K, float]]:
    """Maximal marginal relevance, greedy: each step takes the candidate maximising
    lam * cos(q, x) - (1 - lam) * max cos(x, chosen). `vectors[i]` belongs to `keys[i]`."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"MMR lambda must be within [0, 1], got {lam}")
    if len(keys) == 0:
        return []
    vecs = _unit(np.asarray(vectors, dtype=np.float32))
    relevance = vecs @ _unit(np.asarray(query, dtype=np.float32).reshape(1, -1))[0]
    similarity = vecs @ vecs.T
    chosen: list[int] = []
    scores: list[float] = []
    redundancy = np.full(len(keys), -np.inf, dtype=np.float32)
    remaining = np.ones(len(keys), dtype=bool)
    for _ in range(min(limit or len(keys), len(keys))):
        penalty = np.where(np.isfinite(redundancy), redundancy, 0.0)
        marginal = lam * relevance - (1.0 - lam) * penalty
        marginal[~remaining] = -np.inf
        best = int(np.argmax(marginal))  # first maximum: ties keep the input order
        chosen.append(best)
        scores.append(float(marginal[best]))
        remaining[best] = False
        redundancy = np.maximum(redundancy, similarity[best])
    return [(keys[i], s) for i, s in zip(chosen, scores, strict=True)]


def turn_window(hits: Sequence[tuple[K, float]], adjacent: Mapping[K, tuple[K | None, K | None]],
                before: float, after: float) -> list[tuple[K, float]]:
    """Score each turn with its neighbours in the conversation: max(own score, `before` x the
    previous turn's, `after` x the next turn's). A question's answer is often the turn after
    the one that matches it ("How did it feel to seal the deal?" -> "It felt crazy"), and a
    reply's topic is set by the turn before. `adjacent[key]` = (previous, next) key or None;
    turns next to a hit join the list. Best first; ties keep the input order. (The search
    calls `window_rows` on row numbers; this is its form for any keys.)"""
    nearby = [n for key, _ in hits for n in (key, *adjacent.get(key, ())) if n is not None]
    nearby += [n for key in list(nearby) for n in adjacent.get(key, ()) if n is not None]
    code = {key: i for i, key in enumerate(dict.fromkeys(nearby))}
    keys, codes = list(code), np.array([code[key] for key, _ in hits], dtype=np.int64)
    links = np.array([[code.get(n, -1) if n is not None else -1
                       for n in adjacent.get(key, (None, None))] for key in keys],
                     dtype=np.int64).reshape(-1, 2)
    found, scores = window_rows(codes, np.array([s for _, s in hits], dtype=np.float64),
                                lambda rows: (links[rows, 0], links[rows, 1]), before, after)
    return [(keys[i], s) for i, s in zip(found.tolist(), scores.tolist(), strict=True)]


Neighbours = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # rows -> (prev, next)


def window_rows(rows: np.ndarray, own: np.ndarray, neighbours: Neighbours, before: float,
                after: float) -> tuple[np.ndarray, np.ndarray]:
    """`turn_window` over integer rows: (rows, scores) best first. `own[i]` is `rows[i]`'s
    score (a row listed twice: its last); `neighbours(rows)` gives each row's previous and
    next turn, -1 where there is none. Each hit comes first, then its previous and next
    turn, for the order ties keep."""
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows):
        return rows, np.zeros(0, dtype=np.float64)
    previous, following = neighbours(rows)
    met = np.stack([rows, previous, following], axis=1).ravel()
    met = met[met >= 0]
    _, first = np.unique(met, return_index=True)
    candidates = met[np.sort(first)]
    order = np.argsort(rows, kind="stable")
    listed, values = rows[order], np.asarray(own, dtype=np.float64)[order]

    def score_of(wanted: np.ndarray) -> np.ndarray:
        at = np.searchsorted(listed, wanted, side="right") - 1  # the last of equal rows
        hit = (at >= 0) & (listed[np.maximum(at, 0)] == wanted)
        return np.where(hit, values[np.maximum(at, 0)], 0.0)

    # A row's turns depend on the row alone: where no hit has a turn beside it (as in the
    # 100,000-fact bench), the candidates are the hits, whose turns are known (one call of
    # `neighbours` of two, 20-40 us a list).
    if len(candidates) == 1 + np.count_nonzero(listed[1:] != listed[:-1]):  # (the hits)
        at = order[np.searchsorted(listed, candidates)]
        previous, following = previous[at], following[at]
    else:
        previous, following = neighbours(candidates)
    scores = np.maximum(score_of(candidates), np.maximum(
        np.where(previous >= 0, before * score_of(previous), 0.0),
        np.where(following >= 0, after * score_of(following), 0.0)))
    best = np.argsort(-scores, kind="stable")
    return candidates[best], scores[best]


def boost(hits: Sequence[tuple[K, float]], factors: Sequence[float] | np.ndarray
          ) -> list[tuple[K, float]]:
    """Scores times their `factors` (one per hit), best first; ties keep the input order."""
    scores = np.array([s for _, s in hits], dtype=np.float64) * np.asarray(factors,
                                                                            dtype=np.float64)
    return _best_first([key for key, _ in hits], scores)


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)


def episode_mentions(keys: Sequence[K], mentions: Mapping[K, int]) -> list[tuple[K, float]]:
    """More mentions rank higher (Graphiti sorted this ascending); ties keep input order."""
    order = sorted(range(len(keys)), key=lambda i: (-mentions.get(keys[i], 0), i))
    return [(keys[i], float(mentions.get(keys[i], 0))) for i in order]


def shortest_hops(center: Hashable, neighbours: Callable[[Hashable], Iterable[Hashable]],
                  max_hops: int = 6, max_nodes: int = 100_000) -> dict[Hashable, int]:
    """True shortest-path hop counts from `center` (BFS), up to `max_hops` hops and
    `max_nodes` nodes (caps keep one query bounded on a hub)."""
    distances = {center: 0}
    frontier = deque([center])
    while frontier and len(distances) < max_nodes:
        node = frontier.popleft()
        if distances[node] >= max_hops:
            continue
        for other in neighbours(node):
            if other not in distances:
                distances[other] = distances[node] + 1
                frontier.append(other)
    return distances


def node_distance(keys: Sequence[K], endpoints: Mapping[K, Sequence[Hashable]],
                  distances: Mapping[Hashable, int]) -> list[tuple[K, float]]:
    """Rank by hops from the center: an item's distance is that of its nearest endpoint
    (an entity is its own endpoint). Score = 1 / (1 + hops); unreachable items go last."""
    def hops(key: K) -> int:
        return min((distances.get(n, UNREACHABLE) for n in endpoints.get(key, ())),
                   default=UNREACHABLE)

    order = sorted(range(len(keys)), key=lambda i: (hops(keys[i]), i))
    return [(keys[i], 0.0 if hops(keys[i]) >= UNREACHABLE else 1.0 / (1 + hops(keys[i])))
            for i in order]


class CrossEncoder(Protocol):
    """Scores (query, passage) pairs jointly; higher is more relevant."""

    def score(self, query: str, passages: list[str]) -> np.ndarray: ...


class BiEncoderSecondPass:
    """The CPU stand-in for a cross-encoder: a second-pass bi-encoder score. Query and
    candidate texts are embedded afresh with the project's embedder (the one of the build)
    and scored by cosine. It sees the full candidate text (a fact with its entities, an
    entity with its summary), but it is NOT a cross-encoder: no joint attention over the
    pair. No PyPI package carries cross-encoder weights for offline CPU use."""

    def __init__(self, embedder: object) -> None:
        self.embedder = embedder

    def score(self, query: str, passages: list[str]) -> np.ndarray:
        if not passages:
            return np.zeros(0, dtype=np.float32)
        vectors = _unit(self.embedder.embed([query, *passages]))
        return vectors[1:] @ vectors[0]


class BGEReranker:
    """BAAI bge-reranker through FlagEmbedding: a true cross-encoder. `model` is a local
    folder or a Hugging Face name already in the local cache: nothing is downloaded."""

    def __init__(self, model: str = "BAAI/bge-reranker-v2-m3", use_fp16: bool = True) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from FlagEmbedding import FlagReranker
        except ImportError as exc:
            raise RuntimeError(
                "the BGE reranker needs FlagEmbedding: `pip install -e '.[gpu]'`, or use the "
                "CPU default (query.cross_encoder: bi_encoder)") from exc
        try:
            self.model = FlagReranker(model, use_fp16=use_fp16)
        except OSError as exc:  # (a ValueError: a config naming what is not there)
            raise ValueError(
                f"the BGE reranker model {model!r} is not available offline: put its files in "
                "a folder and set query.cross_encoder_model to it (or pre-fill the Hugging "
                f"Face cache), or use query.cross_encoder: bi_encoder ({exc})") from None

    def score(self, query: str, passages: list[str]) -> np.ndarray:
        if not passages:
            return np.zeros(0, dtype=np.float32)
        scores = self.model.compute_score([[query, p] for p in passages], normalize=True)
        return np.asarray(scores if isinstance(scores, list) else [scores], dtype=np.float32)


def cross_encoder(query: str, keys: Sequence[K], texts: Sequence[str],
                  encoder: CrossEncoder) -> list[tuple[K, float]]:
    """Rank candidates by the encoder's joint score; ties keep the input order."""
    scores = np.asarray(encoder.score(query, list(texts)), dtype=np.float64)
    order = sorted(range(len(keys)), key=lambda i: (-scores[i], i))
    return [(keys[i], float(scores[i])) for i in order]


# Factories take the query config and a function giving the query embedder (only the
# bi-encoder pass loads it). (FlagEmbedding runs fp32 on a CPU whatever use_fp16 says.)
CROSS_ENCODERS: Registry[CrossEncoder] = Registry("cross-encoder")
CROSS_ENCODERS.register("bi_encoder", lambda config, embedder: BiEncoderSecondPass(embedder()))
CROSS_ENCODERS.register("bge", lambda config, embedder: BGEReranker(config.cross_encoder_model))


def load_cross_encoder(config: QueryConfig, embedder: Callable[[], Any]) -> CrossEncoder:
    """The model `query.cross_encoder` names."""
    return CROSS_ENCODERS.build(config.cross_encoder, config, embedder)


class RecipeKnobs(Protocol):
    """What rerankers read of a recipe (`recipes.Recipe` has it; recipes name rerankers, so
    rerank must not import recipes)."""

    mmr_lambda: float
    cross_encoder_top: int


class Candidates(Protocol):
    """One kind's candidates in one search, as a reranker step sees them."""

    kind: str
    text: str  # the query
    limit: int
    recipe: RecipeKnobs
    fused: list[tuple[int, float]]  # RRF over the methods' lists, best first
    keys: list[int]  # the fused keys, cut to the recipe's candidate pool

    def query_vector(self) -> np.ndarray: ...

    def vectors(self, keys: list[int]) -> dict[int, np.ndarray]: ...

    def mention_counts(self, keys: list[int]) -> dict[int, int]: ...

    def center_hops(self, keys: list[int]
                    ) -> tuple[Mapping[int, Sequence[int]], Mapping[Hashable, int]]:
        """Each key's endpoint entities and the hops from the center to every entity."""
        ...

    def passages(self, keys: list[int]) -> list[str]: ...

    def cross_encoder(self) -> CrossEncoder: ...


RERANKERS: Registry[list[tuple[int, float]]] = Registry("reranker")


@RERANKERS.register("rrf")
def by_rrf(c: Candidates) -> list[tuple[int, float]]:
    return c.fused


@RERANKERS.register("mmr")
def by_mmr(c: Candidates) -> list[tuple[int, float]]:
    vectors = c.vectors(c.keys)
    keys = [k for k in c.keys if k in vectors]
    if not keys:
        return []
    return mmr(c.query_vector(), keys, np.stack([vectors[k] for k in keys]),
               c.recipe.mmr_lambda, c.limit)


@RERANKERS.register("episode_mentions")
def by_episode_mentions(c: Candidates) -> list[tuple[int, float]]:
    return episode_mentions(c.keys, c.mention_counts(c.keys))


@RERANKERS.register("node_distance")
def by_node_distance(c: Candidates) -> list[tuple[int, float]]:
    endpoints, distances = c.center_hops(c.keys)
    return node_distance(c.keys, endpoints, distances)


@RERANKERS.register("cross_encoder")
def by_cross_encoder(c: Candidates) -> list[tuple[int, float]]:
    keys = c.keys[:max(c.recipe.cross_encoder_top, c.limit)]
    return cross_encoder(c.text, keys, c.passages(keys), c.cross_encoder())
