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

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline.index import STOP_WORDS  # the index owns its tokenizer settings
from tkg.query.ranked import best_visible

K1, B = 1.2, 0.75
MAX_TOKEN_BYTES = 40  # tokens of this many UTF-8 bytes or more are not indexed
SEPARATOR = r"[^\p{L}\p{N}]+"  # (RE2 syntax: Arrow splits the texts)
WORD = re.compile(r"[^\W_]+")  # the same words in Python's syntax (for query text)

_STOP = frozenset(STOP_WORDS)


@lru_cache(maxsize=1)
def _stemmer() -> Any:  # PyStemmer has no type hints
    import Stemmer

    return Stemmer.Stemmer("english")


# Letters that Unicode does not decompose but ASCII folding still spells out.
_LIGATURES = str.maketrans({"æ": "ae", "ø": "o", "ß": "ss", "œ": "oe", "ð": "d", "þ": "th",
                            "đ": "d", "ł": "l", "ı": "i", "ŋ": "n", "ħ": "h"})


def _fold(word: str) -> str:
    if word.isascii():
        return word
    decomposed = unicodedata.normalize("NFKD", word.translate(_LIGATURES))
    return "".join(c for c in decomposed if not unicodedata.combining(c))


@lru_cache(maxsize=1 << 18)
def _term(word: str) -> str | None:
    """The indexed term of one lower-case word: None when too long or a stop word."""
    if len(word.encode("utf-8")) >= MAX_TOKEN_BYTES:
        return None
    stemmed = _stemmer().stemWord(word)
    return None if stemmed in _STOP else _fold(stemmed)


def _words(texts: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Every lower-case word of `texts` (split on anything not a letter or a digit) and the
    position of its text; Arrow does the splitting, so a million texts take seconds."""
    pieces = pc.split_pattern_regex(pc.utf8_lower(pc.fill_null(texts, "")), SEPARATOR)
    parents = pc.list_parent_indices(pieces).to_numpy()
    words = pc.list_flatten(pieces)
    keep = pc.greater(pc.binary_length(words), 0)
    return parents[keep.to_numpy(zero_copy_only=False)], words.filter(keep)


def tokens(text: str) -> list[str]:
    """The terms LanceDB's default English tokenizer indexes for `text`, in order (Python's
    letters-and-digits class is Unicode's L and N, the split `_words` makes)."""
    return [t for w in WORD.findall(text.lower()) if (t := _term(w)) is not None]


def _runs(first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(run of each item, length of each run) where `first` marks the items opening a run."""
    run = np.cumsum(first) - 1
    return run, np.bincount(run)


@dataclass
class TermIndex:
    """Postings of one table: the rows holding term t are `rows[start[t]:start[t + 1]]`
    (ascending), with their counts in `counts` and their BM25 gains in `gains`; `lengths`
    are rows' token counts, `documents` and `average_length` the statistics of each group."""

    terms: dict[str, int]
    start: np.ndarray  # int64, len(terms) + 1
    rows: np.ndarray  # int32
    counts: np.ndarray  # float32 (term frequency in that row)
    lengths: np.ndarray  # float32 per row
    documents: np.ndarray  # int64 per group: rows with a term (what LanceDB counts for idf)
    average_length: np.ndarray  # float32 per group: tokens of those rows over their count
    # per posting, its BM25 gain idf tf (k1 + 1) / (tf + k1 (1 - b + b len / avglen)), with
    # the idf and avglen of the row's group: fixed with the snapshot, so computed once
    gains: np.ndarray

    @classmethod
    def build(cls, texts: pa.Array | pa.ChunkedArray, groups: np.ndarray | None = None
              ) -> TermIndex:
        """The postings of `texts`; `groups` labels each row's group (integers, ascending
        where the table sorts by group), None = one group, the table-wide statistics."""
        texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
        size = max(len(texts), 1)
        rows, words = _words(texts)
        encoded = pc.dictionary_encode(words)
        vocabulary: dict[str, int] = {}
        term_of_word = np.array([-1 if (t := _term(w)) is None
                                 else vocabulary.setdefault(t, len(vocabulary))
                                 for w in encoded.dictionary.to_pylist()], dtype=np.int64)
        term_ids = term_of_word[encoded.indices.to_numpy()] if len(words) else rows[:0]
        kept = term_ids >= 0
        term_ids, rows = term_ids[kept], rows[kept].astype(np.int64)
        lengths = np.bincount(rows, minlength=len(texts)).astype(np.float32)
        unique, counts = np.unique(term_ids * size + rows, return_counts=True)
        start = np.searchsorted(unique // size, np.arange(len(vocabulary) + 1))
        group = _group_numbers(groups, len(texts))
        documents = np.bincount(group, weights=lengths > 0).astype(np.int64)
        # (1 for a group without terms: it has no postings to score)
        average = np.where(documents > 0, np.bincount(group, weights=lengths)
                           / np.maximum(documents, 1), 1.0).astype(np.float32)
        scaled = B * lengths / average[group]  # (per row, in the float32 steps a posting's
        # gain took when it was computed posting by posting: the same bits)
        postings = (unique % size).astype(np.int32)
        counts = counts.astype(np.float32)
        return cls(vocabulary, start.astype(np.int64), postings, counts, lengths, documents,
                   average, _gains(start, postings, counts, scaled, group, documents))

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


def _group_numbers(groups: np.ndarray | None, rows: int) -> np.ndarray:
    """Each row's group as 0, 1, ... (in order of first sight where `groups` ascend)."""
    if groups is None or rows == 0:
        return np.zeros(rows, dtype=np.int64)
    groups = np.asarray(groups)
    if np.all(groups[1:] >= groups[:-1]):  # (the snapshot's tables: a pass, not a sort)
        return _runs(np.concatenate([[True], groups[1:] != groups[:-1]]))[0]
    return np.unique(groups, return_inverse=True)[1].astype(np.int64)


def _gains(start: np.ndarray, rows: np.ndarray, counts: np.ndarray, scaled: np.ndarray,
           group: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """Every posting's BM25 gain, from its group's statistics: `scaled` is each row's
    b x length over its group's average, `group` each row's group number, `documents` each
    group's document count. A term's postings in one group are its document frequency
    there; postings ascend by row within a term, so where rows sort by group they form
    runs, counted in one pass (the sort of the general case is only for unsorted groups).
    At 1M rows of LoCoMo text in 100 groups (7.3M postings) this takes 0.13-0.15 s, where
    table-wide statistics took 0.06 s, of a 3.1-3.7 s build."""
    of_posting = group[rows]
    if np.all(group[1:] >= group[:-1]):
        first = np.empty(len(rows), dtype=bool)
        first[:1] = True
        first[1:] = of_posting[1:] != of_posting[:-1]
        first[start[:-1][np.diff(start) > 0]] = True  # (a term's first posting opens a run)
        run, frequency = _runs(first)
        group_of_run = of_posting[first]
    else:
        term = np.repeat(np.arange(len(start) - 1, dtype=np.int64), np.diff(start))
        keys, run, frequency = np.unique(term * len(documents) + of_posting,
                                         return_inverse=True, return_counts=True)
        group_of_run = keys % len(documents)
    # BM25's (LanceDB's) inverse document frequency of each term in each group, all at once
    # (float64, as the scalar formula was)
    idf = np.log(1.0 + (documents[group_of_run] - frequency + 0.5) / (frequency + 0.5))
    denominators = counts + K1 * (1.0 - B + scaled[rows])
    return idf[run] * counts * (K1 + 1.0) / denominators
