"""BM25 postings of a retrieval table's texts, with LanceDB's default tokenizer: built at
publish (`tkg.pipeline.table_arrays`) and, for a snapshot published without them, when a
query process opens it; `tkg.query.lexical` scores with them.

The tokenizer is LanceDB's default one (simple split on non-alphanumerics, tokens of 40+
bytes dropped, lower case, English Snowball stemming, stop words, ASCII folding), and
publish passes `STOP_WORDS` to the native index (`tkg.pipeline.index`), so both see the
same terms. Statistics are kept per group (document count, average length; a term's
document frequency per group in its postings' gains), so a tenant's scores never depend on
another tenant's rows.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# The English stop words LanceDB 0.40 drops by default (NLTK's list, as tokens: "don't" is
# "don" + "t"), passed to the index at publish so both agree whatever the default becomes.
_STOP_TEXT = """
a about above after again against ain all am an and any are aren as at be because been
before being below between both but by can couldn d did didn do does doesn doing don down
during each few for from further had hadn has hasn have haven having he her here hers
herself him himself his how i if in into is isn it its itself just ll m ma me mightn more
most mustn my myself needn no nor not now o of off on once only or other our ours
ourselves out over own re s same shan she should shouldn so some such t than that the
their theirs them themselves then there these they this those through to too under until
up ve very was wasn we were weren what when where which while who whom why will with won
wouldn y you your yours yourself yourselves
"""
STOP_WORDS: tuple[str, ...] = tuple(_STOP_TEXT.split())

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
class Postings:
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
              ) -> Self:
        """The postings of `texts`; `groups` labels each row's group (integers, ascending
        where the table sorts by group), None = one group, the table-wide statistics."""
        texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
        size = max(len(texts), 1)
        vocabulary: dict[str, int] = {}
        keys, counts = _occurrences(texts, np.arange(len(texts), dtype=np.int64), vocabulary,
                                    size)
        return cls._assembled(vocabulary, keys, counts, len(texts), groups)

    @classmethod
    def extended(cls, earlier: dict[str, Any], moved: np.ndarray,
                 texts: pa.Array | pa.ChunkedArray, added: np.ndarray,
                 groups: np.ndarray | None = None) -> Self:
        """The postings `build` gives for `texts`, from the `earlier` postings (`Postings`'
        fields, as `table_arrays.Saved.postings` reads them) of a table whose row `i` is
        row `moved[i]` of this one (-1: gone), and the texts of the `added` rows, the only
        ones tokenized. The same postings and gains for each term, under term numbers of
        their own (a term no row has any more keeps its number, with no postings): a
        night's publish tokenized every text of the 160,000-episode store's tables again
        (py-spy: 2.6 s) to add a few thousand."""
        texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
        size = max(len(texts), 1)
        vocabulary = dict(earlier["terms"])
        terms = np.repeat(np.arange(len(earlier["start"]) - 1, dtype=np.int64),
                          np.diff(earlier["start"]))
        rows = moved[np.asarray(earlier["rows"], dtype=np.int64)]
        kept = rows >= 0
        new_keys, new_counts = _occurrences(texts.take(pa.array(added)), added, vocabulary,
                                            size)
        keys = np.concatenate([terms[kept] * size + rows[kept], new_keys])
        counts = np.concatenate([np.asarray(earlier["counts"])[kept], new_counts])
        order = np.argsort(keys, kind="stable")  # (kept postings are in order already)
        return cls._assembled(vocabulary, keys[order], counts[order], len(texts), groups)

    @classmethod
    def _assembled(cls, vocabulary: dict[str, int], keys: np.ndarray, counts: np.ndarray,
                   rows: int, groups: np.ndarray | None) -> Self:
        """Postings from each (term, row) pair's key, term x `max(rows, 1)` + row, ascending
        and once each, with its count; every statistic from them."""
        size = max(rows, 1)
        postings = (keys % size).astype(np.int32)
        lengths = np.bincount(postings, weights=counts, minlength=rows).astype(np.float32)
        start = np.searchsorted(keys // size, np.arange(len(vocabulary) + 1))
        group = _group_numbers(groups, rows)
        documents = np.bincount(group, weights=lengths > 0).astype(np.int64)
        # (1 for a group without terms: it has no postings to score)
        average = np.where(documents > 0, np.bincount(group, weights=lengths)
                           / np.maximum(documents, 1), 1.0).astype(np.float32)
        scaled = B * lengths / average[group]  # (per row, in the float32 steps a posting's
        # gain took when it was computed posting by posting: the same bits)
        counts = counts.astype(np.float32)
        return cls(vocabulary, start.astype(np.int64), postings, counts, lengths, documents,
                   average, _gains(start, postings, counts, scaled, group, documents))


def _occurrences(texts: pa.Array, rows_of: np.ndarray, vocabulary: dict[str, int],
                 size: int) -> tuple[np.ndarray, np.ndarray]:
    """The (term, row) keys (term x `size` + row, ascending, once each) of `texts`, whose
    rows are `rows_of`, and how often each occurs; terms new to `vocabulary` are added."""
    positions, words = _words(texts)
    encoded = pc.dictionary_encode(words)
    term_of_word = np.array([-1 if (t := _term(w)) is None
                             else vocabulary.setdefault(t, len(vocabulary))
                             for w in encoded.dictionary.to_pylist()], dtype=np.int64)
    term_ids = term_of_word[encoded.indices.to_numpy()] if len(words) else positions[:0]
    kept = term_ids >= 0
    rows = rows_of[positions[kept]].astype(np.int64)
    return np.unique(term_ids[kept] * size + rows, return_counts=True)


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
