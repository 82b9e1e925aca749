"""Rerankers: small pure functions over ranked candidate keys (Zep §3, Graphiti's set).

Every function takes keys in some order and returns `(key, score)` pairs best-first. Ties
keep the input order, so a reranker never shuffles what it cannot tell apart. Two of them
fix bugs of Graphiti's versions: `episode_mentions` ranks MORE mentions HIGHER, and
`node_distance` uses true shortest-path hops (BFS over the whole graph), not one hop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)
UNREACHABLE = 1_000_000  # hop distance of a node the center cannot reach


def rrf(lists: Sequence[Sequence[K]], k: int = 60, weights: Sequence[float] | None = None,
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
    return sorted(fused.items(), key=lambda item: -item[1])


def mmr(query: np.ndarray, keys: Sequence[K], vectors: np.ndarray, lam: float = 0.5,
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
    """BAAI bge-reranker through FlagEmbedding (the `gpu` extra): a true cross-encoder."""

    def __init__(self, model: str = "BAAI/bge-reranker-v2-m3", use_fp16: bool = True) -> None:
        try:
            from FlagEmbedding import FlagReranker
        except ImportError as exc:
            raise RuntimeError(
                "the BGE reranker needs FlagEmbedding: `pip install -e '.[gpu]'`, or use the "
                "CPU default (BiEncoderSecondPass)") from exc
        self.model = FlagReranker(model, use_fp16=use_fp16)

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
