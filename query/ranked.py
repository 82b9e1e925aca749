"""A ranking cut to its best rows that the caller may see: the one visibility shortcut of
the in-memory BM25 (`tkg.query.lexical`) and the exact cosine scan (`tkg.query.search`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# How many times `limit` rows `best_visible` asks first (4: at 1M facts, where a fifth of a
# group's facts have ended, the 160 best hold 40 visible ones but for a few past `as_of`s).
PROBE = 4


def top_with_ties(scores: np.ndarray, limit: int) -> np.ndarray:
    """Positions of the `limit` best `scores` and of every score tied with the last of them,
    ascending (all positions where there are no more than `limit`)."""
    if len(scores) <= limit:
        return np.arange(len(scores))
    kth = len(scores) - limit  # (the `limit`-th best value, found without negating a copy)
    return np.flatnonzero(scores >= np.partition(scores, kth)[kth])


def best_visible(rows: np.ndarray, scores: np.ndarray, limit: int,
                 visible: Callable[[np.ndarray], np.ndarray] | None, ties: bool
                 ) -> np.ndarray:
    """Positions of the visible `rows` that are the `limit` best of the visible ones by
    `scores`: with `ties`, every row tied with the last of them too (BM25 breaks such
    ties later, by recency); without, exactly `limit` (an exact cosine scan), picked among
    a tie at the cut as `np.argpartition` picks over the visible rows alone.

    Visibility is asked first of the rows at or above the `PROBE` x `limit`-th best score
    of all (ties included): when `limit` of those are visible (and, without `ties`, no tie
    among them crosses their `limit`-th score), no other row can be among the best and the
    answer is the one of asking every row; else every row is asked. At 1M facts (100,000 a
    group) a query's terms reach 64,000 facts, and asking all of them took 1.0 of facts'
    3.6 ms of BM25; the exact cosine scan asked all of a group's 25,000 episodes and 20,000
    entities. Asking only the `limit` best was too few for facts, a fifth of which have
    ended (and more are not yet valid at a past `as_of`): the exact scan of a group's
    100,000 facts then asked every row, 2.4 of its 9.8 ms."""

    def cut(at: np.ndarray) -> np.ndarray:
        if len(at) <= limit:
            return at
        if ties:
            return at[top_with_ties(scores[at], limit)]
        return at[np.argpartition(-scores[at], limit - 1)[:limit]]

    if visible is None:
        return cut(np.arange(len(rows)))
    if len(rows) > limit:
        best = top_with_ties(scores, PROBE * limit)
        seen = best[visible(rows[best])]
        if len(seen) >= limit:
            top = top_with_ties(scores[seen], limit)
            if ties or len(top) == limit:  # (then `top` is what `cut(seen)` picks)
                return seen[top]
    return cut(np.flatnonzero(visible(rows)))
