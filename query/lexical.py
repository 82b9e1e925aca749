"""BM25 in memory: the twin of LanceDB's native full-text index, for tables small enough to
hold their postings (`query.memory_text_rows`), with statistics per group.

A LanceDB full-text search costs 5-20 ms of CPU however few rows the caller's groups hold
(planning, the group prefilter, posting decompression); the same ranking from numpy
postings costs well under a millisecond. The tokenizer is LanceDB's default one (simple
split on non-alphanumerics, tokens of 40+ bytes dropped, lower case, English Snowball
stemming, stop words, ASCII folding), and publish passes `STOP_WORDS` to the index, so both
paths see the same terms. Scores are BM25 with k1 = 1.2, b = 0.75, as LanceDB computes them,
but each row is scored with its own group's statistics (document count, the term's document
frequency, average length) where LanceDB's are table-wide: a tenant's scores, and so its
rankings, never depend on another tenant's rows. On a table of one group the two agree
(`tests/test_lexical.py`), and a group's scores are those of LanceDB's index over that group
alone. Tables above `query.memory_text_rows` rows are ranked by LanceDB itself
(`tkg.query.search.bm25`), with table-wide statistics.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tkg.pipeline.postings import Postings, tokens
from tkg.query.ranked import best_visible

__all__ = ["TermIndex", "tokens"]


class TermIndex(Postings):
    """A table's BM25 postings (`tkg.pipeline.postings.Postings`, built at publish or at
    open) and the searches over them."""

    def overlap(self, rows: np.ndarray, text: str) -> np.ndarray:
        """How many of the query's distinct terms each of `rows` contains."""
        found = np.zeros(len(rows), dtype=np.int64)
        for term in dict.fromkeys(tokens(text)):
            if term in self.terms and len(rows):
                t = self.terms[term]
                postings = self.rows[self.start[t]:self.start[t + 1]]
                # (needles of the postings' dtype: numpy casts the whole postings otherwise)
                at = np.minimum(np.searchsorted(postings, rows.astype(postings.dtype)),
                                len(postings) - 1)
                found += postings[at] == rows
        return found

    def search(self, text: str, spans: list[tuple[int, int]], limit: int,
               visible: Callable[[np.ndarray], np.ndarray] | None = None,
               newest: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The `limit` best rows within the row ranges `spans` for the query `text`, best
        first, keeping only rows `visible(rows)` allows. Each query term counts as often
        as it occurs, as in LanceDB's match query. Equal scores (common among short facts
        that share their words) go to the larger `newest[row]` (e.g. valid_at: the more
        recent first), then to the lower row; LanceDB leaves their order undefined."""
        query_terms = [self.terms[t] for t in tokens(text) if t in self.terms]
        if not query_terms or limit <= 0:
            return []
        # Scores accumulate in one dense array over the spans' rows (a bincount: no sort).
        sizes = np.array([end - start for start, end in spans], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        slots, gains = [], []
        for term in query_terms:
            first, last = self.start[term], self.start[term + 1]
            rows, term_gains = self.rows[first:last], self.gains[first:last]
            for (start, end), offset in zip(spans, offsets, strict=True):
                # (bounds of the postings' dtype: int64 ones made numpy copy every posting
                # of the term: a fifth of BM25's time at 1M facts)
                low, high = np.searchsorted(rows, np.array((start, end), dtype=rows.dtype))
                if high > low:
                    slots.append(rows[low:high] - (start - offset))
                    gains.append(term_gains[low:high])
        if not slots:
            return []
        total = np.bincount(np.concatenate(slots), weights=np.concatenate(gains),
                            minlength=int(sizes.sum()))
        found = np.flatnonzero(total)
        scores = total[found]
        if len(spans) == 1:  # (one group: its rows are one range)
            unique = found + spans[0][0]
        else:
            span_of = np.searchsorted(offsets, found, side="right") - 1
            unique = found + (np.array([s for s, _ in spans], dtype=np.int64)
                              - offsets)[span_of]
        rank = scores.astype(np.float32)  # (LanceDB's precision: ties are ties in float32)
        best = best_visible(unique, rank, limit, visible, ties=True)
        unique, scores, rank = unique[best], scores[best], rank[best]
        recency = newest[unique] if newest is not None else np.zeros(len(unique))
        order = np.lexsort((unique, -recency, -rank))[:limit]
        return list(zip(unique[order].tolist(), scores[order].tolist(), strict=True))
