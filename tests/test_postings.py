"""Postings extended from an earlier table's (a night's publish of an extended retrieval
table: `Postings.extended`) hold, term by term, the postings, counts and BM25 gains that
building them from every text gives, and the same per-row and per-group statistics."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from tkg.pipeline.postings import Postings

from tests.test_lexical import _texts


def _by_term(postings: Postings) -> dict[str, list[tuple[int, float, float]]]:
    """Each term with rows: its (row, count, gain) postings."""
    out = {}
    for term, number in postings.terms.items():
        span = slice(postings.start[number], postings.start[number + 1])
        if postings.start[number + 1] > postings.start[number]:
            out[term] = list(zip(postings.rows[span].tolist(), postings.counts[span].tolist(),
                                 postings.gains[span].tolist(), strict=True))
    return out


def _fields(postings: Postings) -> dict[str, np.ndarray]:
    return {"terms": postings.terms, "start": postings.start, "rows": postings.rows,
            "counts": postings.counts}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_extended_postings_are_those_built_from_every_text(seed):
    rng = np.random.default_rng(seed)
    texts = _texts()
    groups = np.sort(rng.integers(0, 3, len(texts)))  # rows sort by group, as published
    earlier = rng.random(len(texts)) < 0.7  # the earlier table's rows; the others added
    gone = rng.random(len(texts)) < 0.1  # rows of the earlier table deleted tonight
    before = np.flatnonzero(earlier)
    now = np.flatnonzero(~(earlier & gone))
    built_before = Postings.build(pa.array([texts[i] for i in before]), groups[before])
    position_now = {row: at for at, row in enumerate(now)}
    moved = np.array([position_now.get(row, -1) for row in before], dtype=np.int64)
    added = np.array([at for at, row in enumerate(now) if not earlier[row]], dtype=np.int64)
    texts_now = pa.array([texts[i] for i in now])

    extended = Postings.extended(_fields(built_before), moved, texts_now, added, groups[now])
    built = Postings.build(texts_now, groups[now])

    assert len(added) and (moved < 0).any()  # rows added and rows gone, both
    assert _by_term(extended) == _by_term(built)
    for field in ("lengths", "documents", "average_length"):
        assert np.array_equal(getattr(extended, field), getattr(built, field)), field


def test_nothing_added_and_nothing_kept():
    texts = pa.array(["the red fox", "a quiet river", ""])
    built = Postings.build(texts)
    same = Postings.extended(_fields(built), np.arange(3), texts, np.array([], np.int64))
    assert _by_term(same) == _by_term(built)
    fresh = Postings.extended(_fields(built), np.full(3, -1), pa.array(["red river"]),
                              np.array([0]))
    assert _by_term(fresh) == _by_term(Postings.build(pa.array(["red river"])))
