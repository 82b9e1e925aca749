"""Tenancy of BM25's statistics (query/lexical.py): a group's full-text rows and scores are
the same whether or not other groups' rows, with the same words, share its table."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import store
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.index import SPECS
from tkg.query.lexical import TermIndex

CORPUS = Path(__file__).parent / "corpus"


def one_group_snapshot(root: Path, tables: dict[str, pa.Table], group: str,
                       config: QueryConfig) -> Any:
    """A store of the synthetic tables' rows of `group` only, published and opened."""
    from tkg.jobs.bench.query import write_store
    from tkg.query.snapshot import open_snapshot

    write_store(root, {name: table.filter(pc.equal(table["group_id"], group))
                       for name, table in tables.items()}, 32, config)
    return open_snapshot(store.current_snapshot(root), config)


def _tenants() -> dict[str, list[str]]:
    """The corpus's texts by tenant (group_id)."""
    texts: dict[str, list[str]] = {}
    for name in ("conversations", "documents", "records"):
        for line in (CORPUS / f"{name}.jsonl").read_text().splitlines():
            record = json.loads(line)
            text = record.get("content")
            texts.setdefault(record["group_id"], []).append(
                text if isinstance(text, str) else json.dumps(record, sort_keys=True))
    return texts


def test_a_groups_bm25_rows_and_scores_do_not_depend_on_another_groups_rows():
    """Group A's corpus texts indexed alone, and after group B's (the other tenants' texts
    and copies of A's own, so B shares every term of A): A's searches return the same rows
    (shifted by B's) and the same scores, bit for bit, with ties broken by recency and
    rows hidden by visibility as before. Table-wide statistics (LanceDB's) would not."""
    tenants = _tenants()
    a = tenants.pop("acme")
    b = [t for texts in tenants.values() for t in texts] + a[::2]
    rng = np.random.default_rng(5)
    newest_a = rng.integers(0, 4, size=len(a))  # (few values: many ties left to recency)
    newest = np.concatenate([rng.integers(0, 4, size=len(b)), newest_a])
    alone = TermIndex.build(pa.array(a))
    shared = TermIndex.build(pa.array(b + a), np.repeat([3, 8], [len(b), len(a)]))
    table_wide = TermIndex.build(pa.array(b + a))
    hidden = np.arange(len(a)) % 3 == 0

    def visible_alone(rows: np.ndarray) -> np.ndarray:
        return ~hidden[rows]

    def visible_shared(rows: np.ndarray) -> np.ndarray:
        return ~hidden[rows - len(b)]

    words = [w for t in a for w in t.split()]
    queries = ["Daniel Okafor", "renewal contract pricing", "support ticket"] + [
        " ".join(random.Random(i).sample(words, 1 + i % 4)) for i in range(150)]
    differs = 0
    for query in queries:
        for limit in (1, 10, 40):
            ours = alone.search(query, [(0, len(a))], limit, newest=newest_a)
            theirs = shared.search(query, [(len(b), len(b) + len(a))], limit, newest=newest)
            assert ours == [(row - len(b), score) for row, score in theirs], query
            assert alone.search(query, [(0, len(a))], limit, visible_alone, newest_a) == [
                (row - len(b), score) for row, score in shared.search(
                    query, [(len(b), len(b) + len(a))], limit, visible_shared, newest)]
        wide = table_wide.search(query, [(len(b), len(b) + len(a))], 10, newest=newest)
        differs += [s for _, s in wide] != [s for _, s in shared.search(
            query, [(len(b), len(b) + len(a))], 10, newest=newest)]
    assert differs > 100  # (the old table-wide statistics leaked B into A's scores)


def test_groups_need_not_be_sorted_or_contiguous():
    """Groups given in any order (interleaved rows) get the statistics of sorted ones."""
    texts = ["alpha beta", "alpha", "beta gamma", "alpha alpha gamma", "", "gamma delta"]
    labels = np.array([7, 2, 7, 2, 2, 7])
    mixed = TermIndex.build(pa.array(texts), labels)
    for label in (2, 7):
        rows = np.flatnonzero(labels == label)
        alone = TermIndex.build(pa.array([texts[r] for r in rows]))
        for query in ("alpha", "beta gamma", "delta alpha"):
            found = alone.search(query, [(0, len(rows))], 5)
            spans = [(int(r), int(r) + 1) for r in rows]
            assert mixed.search(query, spans, 5) == [
                (int(rows[row]), score) for row, score in found], (label, query)
    assert mixed.documents.tolist() == [2, 3]  # (group 2's empty row is no document)
    empty = TermIndex.build(pa.array(["", None, "alpha"]), np.array([0, 0, 1]))
    assert empty.documents.tolist() == [0, 1]
    alone = TermIndex.build(pa.array(["alpha"])).search("alpha", [(0, 1)], 5)
    assert empty.search("alpha", [(0, 3)], 5) == [(row + 2, score) for row, score in alone]
    assert empty.search("alpha", [(0, 2)], 5) == []


def test_a_groups_answers_in_a_store_do_not_depend_on_the_other_groups(tmp_path):
    """The synthetic store (three groups sharing one vocabulary) and a store of group g000
    alone: `memory_bm25` gives g000's callers the same rows (by key) and the same scores, in
    both timelines and a valid-time window."""
    from tkg.query import search

    from tests.query_store import synthetic_snapshot, twin_scopes

    tables, _, snap, config = synthetic_snapshot(tmp_path / "all", seed=6)
    alone = one_group_snapshot(tmp_path / "g000", tables, "g000", config)
    scopes = [s for s in twin_scopes() if s.groups == ("g000",)]
    scopes.append(search.make_scope(["g000", "g-elsewhere"]))  # (a group with no rows)
    compared = 0
    for kind in ("facts", "entities", "communities", "episodes"):
        key = SPECS[kind].key
        keys = {name: s.kinds[kind].meta[key].to_pylist()
                for name, s in (("all", snap), ("alone", alone))}
        column = {"facts": "fact", "episodes": "content"}.get(kind, "name")
        texts = tables[kind].filter(pc.equal(tables[kind]["group_id"], "g001"))[column]
        for i in range(40):  # (words of another group's rows: shared with g000's)
            text = " ".join(texts[i * 5 % len(texts)].as_py().split()[:3])
            for scope in scopes:
                found = {name: [(keys[name][row], score) for row, score in
                                search.memory_bm25(s, kind, text, scope, 15)]
                         for name, s in (("all", snap), ("alone", alone))}
                assert found["all"] == found["alone"], (kind, text, scope)
                compared += len(found["all"])
    assert compared > 500
