"""`rerank.window_rows` where no hit has a turn beside it (it then reuses the hits' own
turns instead of asking again): the same rows and scores as asking every candidate."""

from __future__ import annotations

import numpy as np
from tkg.query import rerank


def _asked_twice(rows, own, neighbours, before, after):
    """window_rows as written before: `neighbours` asked of the hits, then the candidates."""
    rows = np.asarray(rows, dtype=np.int64)
    previous, following = neighbours(rows)
    met = np.stack([rows, previous, following], axis=1).ravel()
    met = met[met >= 0]
    _, first = np.unique(met, return_index=True)
    candidates = met[np.sort(first)]
    order = np.argsort(rows, kind="stable")
    listed, values = rows[order], np.asarray(own, dtype=np.float64)[order]

    def score_of(wanted):
        at = np.searchsorted(listed, wanted, side="right") - 1
        hit = (at >= 0) & (listed[np.maximum(at, 0)] == wanted)
        return np.where(hit, values[np.maximum(at, 0)], 0.0)

    previous, following = neighbours(candidates)
    scores = np.maximum(score_of(candidates), np.maximum(
        np.where(previous >= 0, before * score_of(previous), 0.0),
        np.where(following >= 0, after * score_of(following), 0.0)))
    best = np.argsort(-scores, kind="stable")
    return candidates[best], scores[best]


def test_window_rows_reuses_the_hits_turns():
    rng = np.random.default_rng(29)
    rows = np.arange(200)
    for linked in (0.0, 0.02, 0.3):  # none, few, many turns beside each other
        joined = rng.random(200) < linked
        previous = np.where(joined, rows - 1, -1)
        following = np.where(np.roll(joined, -1) & (rows < 199), rows + 1, -1)

        def neighbours(r, previous=previous, following=following):
            return previous[r], following[r]

        for _ in range(200):
            hits = rng.choice(200, int(rng.integers(1, 40)))
            own = rng.choice([-0.2, 0.0, 0.2, 0.5, 1.0], len(hits))
            got = rerank.window_rows(hits, own, neighbours, 0.6, 0.3)
            want = _asked_twice(hits, own, neighbours, 0.6, 0.3)
            assert got[0].tolist() == want[0].tolist()
            assert got[1].tolist() == want[1].tolist()
