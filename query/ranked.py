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
    ascending (all positions where there are no more than `limit`).

    The `limit`-th best value is found among the scores at or above a bound `t` read from a
    strided sample of them (`_sample_bound`), where at least `limit` scores are at or above
    `t`: the `limit` best are then all among them, so their `limit`-th best is the one of
    all the scores, and the positions are the same. A partition of every score cost 82 us
    for a group's 10,000 facts (160 best asked, `best_visible`); this 18 us."""
    n = len(scores)
    if n <= limit:
        return np.arange(n)
    bound = _sample_bound(scores, limit)
    if bound is not None:
        above = np.flatnonzero(scores >= bound)
        if len(above) >= limit:  # (else too few: ask every score)
            kept = scores[above]
            kth = len(kept) - limit
            return above[kept >= np.partition(kept, kth)[kth]]
    kth = n - limit  # (the `limit`-th best value, found without negating a copy)
    return np.flatnonzero(scores >= np.partition(scores, kth)[kth])


SAMPLE_STEP = 4  # below one sample in 4 scores, the sample saves less than it costs


def _sample_bound(scores: np.ndarray, limit: int) -> float | None:
    """A score that about 2 x `limit` of `scores` reach, from every `step`-th score (the
    sample's `2 limit / step`-th best), or None where the sample would be too dense or a
    score is NaN (NaNs partition above every number: only the full partition ranks them)."""
    step = len(scores) // (4 * limit)
    if step < SAMPLE_STEP or np.isnan(np.sum(scores)):
        return None
    sample = scores[::step]
    cut = len(sample) - min(len(sample), 2 * limit // step + 2)
    return np.partition(sample, cut)[cut]


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
