"""The in-memory BM25 (query/lexical.py) is a twin of LanceDB's native full-text index: same
terms, same scores, same rows, on real text and within every scope, where each group's rows
are scored as LanceDB scores a table of that group alone."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.index import SPECS
from tkg.query.lexical import TermIndex, tokens

CORPUS = Path(__file__).parent / "corpus"
ODD = ["Café naïve résumé façade Zürich São Paulo", "ÆSIR straße øre Łódź", "doing does did",
       "x" * 45 + " after a very long token", "", "Bob's car isn't Robert's",
       "ignore previous instructions; DROP TABLE facts; -- \"quoted\" OR title:x AND (y)",
       "2024-06-01 v2.3 a_b_c under_score 42"]


def _texts() -> list[str]:
    texts = []
    for name in ("conversations", "documents", "records"):
        for line in (CORPUS / f"{name}.jsonl").read_text().splitlines():
            record = json.loads(line)
            texts.append(record.get("content") if isinstance(record.get("content"), str)
                         else json.dumps(record, sort_keys=True))
    return texts + ODD


def _agree(lance: list[tuple[int, float]], ours: list[tuple[int, float]]) -> bool:
    """Same scores in order and the same rows, except among rows tied at the cut-off."""
    a, b = [s for _, s in lance], [s for _, s in ours]
    if len(a) != len(b) or not np.allclose(a, b, rtol=1e-4):
        return False
    cut = a[-1] * (1 + 1e-4) if a else 0
    return {r for r, s in lance if s > cut} == {r for r, s in ours if s > cut}


def test_tokens_stem_fold_and_drop_what_the_native_index_drops():
    assert tokens("Running runs RUN") == ["run", "run", "run"]
    assert tokens("The café's façade") == ["cafe", "facad"]
    assert tokens("straße ØRE") == ["strasse", "ore"]  # folded after stemming
    assert tokens("x" * 40 + " kept") == ["kept"]  # 40 bytes or more: not indexed
    assert tokens("snake_case a-b") == ["snake", "case", "b"]
    assert tokens("the and of") == []


def test_bm25_in_memory_scores_as_lancedb_does_on_real_text(tmp_path):
    """Built as publish builds the index (`index_table`), queried with words from the text
    itself: every query gets the same rows and scores from both."""
    import lancedb
    from lancedb.query import MatchQuery
    from tkg.pipeline.index import TableSpec, index_table

    texts = _texts()
    spec = TableSpec("docs", "id", "vector", ("text",), ("id",), ())
    data = pa.table({"id": [f"d{i:04d}" for i in range(len(texts))], "text": texts,
                     "group_id": ["g"] * len(texts),
                     "vector": pa.array([[0.0, 1.0]] * len(texts), pa.list_(pa.float32(), 2))})
    table = lancedb.connect(str(tmp_path))
    index_table(table, spec, data, 2, QueryConfig())
    table = table.open_table("docs")
    memory = TermIndex.build(pa.array(texts))
    words = [w for t in texts for w in re.findall(r"\w+", t)]
    rng = random.Random(3)
    queries = ODD[:4] + ["running runs", "Globex support tickets", "Berlin"] + [
        " ".join(rng.sample(words, rng.randint(1, 4))) for _ in range(120)]
    for query in queries:
        found = (table.search(MatchQuery(query, "text"), query_type="fts")
                 .select(["row", "_score"]).limit(10).to_arrow())
        lance = list(zip(found["row"].to_pylist(), found["_score"].to_pylist(), strict=True))
        ours = memory.search(query, [(0, len(texts))], 10)
        assert _agree(lance, ours), (query, lance[:3], ours[:3])


def test_bm25_in_memory_ranks_as_lancedb_does_over_each_groups_own_rows(tmp_path):
    """Within groups and both timelines, `memory_bm25` over a table of three groups returns
    what LanceDB's native index returns over a table of the caller's groups alone: each
    group's own statistics (scopes of two groups: both groups' answers, merged by score)."""
    from tkg.query import search

    from tests.query_store import synthetic_snapshot, twin_scopes
    from tests.test_tenancy_bm25 import one_group_snapshot

    tables, _, snap, config = synthetic_snapshot(tmp_path / "all", seed=4)
    alone = {g: one_group_snapshot(tmp_path / g, tables, g, config)
             for g in ("g000", "g001", "g002")}
    compared = 0
    for kind in ("facts", "entities", "communities", "episodes"):
        assert snap.kinds[kind].terms is not None
        column = {"facts": "fact", "episodes": "content"}.get(kind, "name")
        key = SPECS[kind].key
        for i, scope in enumerate(twin_scopes() * 3):
            text = " ".join(tables[kind][column][i * 7 % tables[kind].num_rows].as_py()
                            .split()[:4])
            ours = _keyed(snap, kind, search.memory_bm25(snap, kind, text, scope, 15))
            lance = sorted((hit for g in scope.groups for hit in _keyed(
                alone[g], kind, search.start([search.bm25(alone[g].kinds[kind], text, scope,
                                                          15)]).result()[0])),
                           key=lambda hit: -hit[1])[:15]
            assert _agree(lance, ours), (kind, key, i, text)
            compared += len(ours)
    assert compared > 250


def _keyed(snap, kind: str, hits: list[tuple[int, float]]) -> list[tuple[str, float]]:
    """Hits by their rows' keys (the same row has other numbers in another table)."""
    keys = snap.kinds[kind].meta[SPECS[kind].key].to_pylist()
    return [(keys[row], score) for row, score in hits]


@pytest.mark.parametrize("limit", [0, 1])
def test_bm25_in_memory_handles_empty_queries_and_tiny_limits(limit):
    memory = TermIndex.build(pa.array(["alpha beta", None, "", "beta gamma"]))
    assert memory.search("the of", [(0, 4)], 5) == []
    found = memory.search("beta", [(0, 4)], limit)
    assert len(found) == limit
    assert memory.search("gamma", [(0, 3)], 5) == []  # row 3 is outside the span


def test_overlap_counts_the_query_terms_each_row_contains():
    memory = TermIndex.build(pa.array(["Alice works at Acme", "Bob runs", None, "acme acme"]))
    assert memory.overlap(np.array([0, 1, 2, 3]), "Acme working Bob the").tolist() == [
        2, 1, 0, 1]  # distinct terms: "acme" twice in row 3 counts once


def test_visibility_asked_of_the_best_rows_first_gives_the_answer_of_asking_all():
    """`search` asks `visible` of the rows at the top first, and of every row only when too
    few of those are visible: the answer is the one of filtering the full ranking, whether
    the hidden rows are the best, the worst, every other one or tied at the cut-off."""
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(12)]
    memory = TermIndex.build(pa.array([" ".join(rng.choice(words, size=rng.integers(1, 6)))
                                       for _ in range(3000)]))
    newest = rng.integers(0, 5, size=3000)
    full = memory.search("w1 w2 w3", [(0, 3000)], 3000, newest=newest)
    ranked = [row for row, _ in full]
    hides = {"best": ranked[:40], "worst": ranked[-2000:], "every other": ranked[::2],
             "all but 3": ranked[3:], "none": []}
    for name, rows in hides.items():
        hidden = np.zeros(3000, dtype=bool)
        hidden[rows] = True

        def visible(asked: np.ndarray, hidden: np.ndarray = hidden) -> np.ndarray:
            return ~hidden[asked]

        for limit in (1, 10, 40):
            expected = [(r, s) for r, s in full if not hidden[r]][:limit]
            assert memory.search("w1 w2 w3", [(0, 3000)], limit, visible,
                                 newest=newest) == expected, (name, limit)


def test_the_best_visible_cosines_are_those_of_asking_every_row():
    """`ranked.best_visible` without ties (the exact scan's cut) picks the set the visible
    rows' own argpartition does, ties at the cut-off included."""
    from tkg.query.ranked import best_visible

    rng = np.random.default_rng(3)
    for trial in range(200):
        scores = rng.integers(0, 30 if trial % 2 else 10_000, size=500).astype(np.float32)
        rows = np.arange(1000, 1500)
        hidden = rng.random(500) < (0.05, 0.5, 0.98)[trial % 3]

        def visible(asked: np.ndarray, hidden: np.ndarray = hidden) -> np.ndarray:
            return ~hidden[asked - 1000]

        limit = int(rng.integers(1, 60))
        best = best_visible(rows, scores, limit, visible, ties=False)
        got_rows, got_scores = rows[best], scores[best]
        keep = ~hidden
        shown_rows, shown_scores = rows[keep], scores[keep]
        if len(shown_rows) > limit:
            top = np.argpartition(-shown_scores, limit - 1)[:limit]
            shown_rows, shown_scores = shown_rows[top], shown_scores[top]
        assert sorted(got_rows.tolist()) == sorted(shown_rows.tolist()), trial
        assert sorted(got_scores.tolist()) == sorted(shown_scores.tolist()), trial
