"""The resolution benchmark's generator and scoring, and the adjudicator hook (no Ray)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
from tkg.jobs.bench.resolution import SyntheticVectors, pairwise_scores, synthetic_mentions
from tkg.pipeline import resolve, schema
from tkg.pipeline.adjudicate import NamePair, adjudicate
from tkg.pipeline.config import ResolveConfig


def test_pairwise_scores_count_pairs_from_the_contingency_table():
    truth = np.array([0, 0, 0, 1, 1])
    assert pairwise_scores(truth, truth)["precision"] == 1.0
    split = pairwise_scores(truth, np.array([0, 0, 5, 1, 1]))  # 4 true pairs, 2 found
    assert (split["precision"], split["recall"]) == (1.0, 0.5)
    lumped = pairwise_scores(truth, np.zeros(5))
    assert lumped["recall"] == 1.0 and lumped["precision"] == 0.4


def test_synthetic_mentions_are_deterministic_with_known_truth():
    first, second = synthetic_mentions(500, seed=3), synthetic_mentions(500, seed=3)
    assert first.equals(second)
    assert first.num_rows == 500
    assert 80 <= len(set(first["truth"].to_pylist())) <= 100


def test_resolver_finds_the_synthetic_duplicates():
    """The vectorized resolver on 3,000 generated mentions, without Ray."""
    config = ResolveConfig()
    table = synthetic_mentions(3000, seed=1)
    rows = [{"episode_id": f"e{i}", "group_id": g, "valid_at": datetime(2024, 1, 1, tzinfo=UTC),
             "name": n, "label": label, "attributes": None,
             "normalized": resolve.normalize_name(n)}
            for i, (g, n, label) in enumerate(zip(*(table[c].to_pylist() for c in
                                                     ("group_id", "name", "label")), strict=True))]
    nodes = resolve.resolve_entities(pa.Table.from_pylist(rows, schema=resolve.MENTION_ROWS),
                                     datetime(2024, 1, 2, tzinfo=UTC))
    truth_of = {(r["group_id"], r["normalized"]): t for r, t in
                zip(rows, table["truth"].to_pylist(), strict=True)}
    vectors = SyntheticVectors(truth_of, 32, 0.9, 0)(nodes)
    pairs = resolve.candidate_pairs(resolve.blocking_keys(vectors, config), config)
    alias_map = resolve.cluster(pa.concat_tables([pairs, resolve.node_pairs(nodes)]))
    entity = {(r["group_id"], r["normalized"]): r["entity_id"] for r in alias_map.to_pylist()}
    predicted = np.array([hash(entity[(r["group_id"], r["normalized"])]) for r in rows])
    scores = pairwise_scores(table["truth"].to_numpy(), predicted)
    assert scores["precision"] >= 0.99
    assert scores["recall"] >= 0.95


def test_name_nodes_without_ids_are_those_with_ids():
    """The names stage's nodes (`resolve_entities` without ids) are the nodes with ids but
    for `entity_id`, null: the rows, names, labels and aliases of each name alike."""
    table = synthetic_mentions(2000, seed=2)
    mentions = pa.Table.from_pylist([
        {"episode_id": f"e{i}", "group_id": g, "valid_at": datetime(2024, 1, 1, tzinfo=UTC),
         "name": n, "label": label, "attributes": None, "normalized": resolve.normalize_name(n)}
        for i, (g, n, label) in enumerate(zip(*(table[c].to_pylist() for c in
                                                 ("group_id", "name", "label")), strict=True))],
        schema=resolve.MENTION_ROWS)
    when = datetime(2024, 1, 2, tzinfo=UTC)
    with_ids = resolve.resolve_entities(mentions, when)
    without = resolve.resolve_entities(mentions, when, ids=False)
    assert without["entity_id"].null_count == without.num_rows > 300
    same = [f.name for f in schema.RESOLVED_ENTITIES if f.name != "entity_id"]
    assert without.select(same).equals(with_ids.select(same))
    assert without.schema == schema.RESOLVED_ENTITIES
    assert with_ids["entity_id"].null_count == 0


class SharedPrefixJudge:
    """A rule judge: the same entity when the names share their first four letters."""

    def __init__(self) -> None:
        self.calls: list[list[NamePair]] = []

    def same_entity(self, pairs):
        self.calls.append(list(pairs))
        return [p.a[:4] == p.b[:4] or None for p in pairs]


def test_adjudicator_decides_only_undecided_pairs_in_batches():
    pairs = pa.Table.from_pylist([
        {"group_id": "g", "a": "globex", "b": "globex corp", "evidence": "exact", "score": 1.0,
         "merge": True},
        {"group_id": "g", "a": "acme", "b": "acme labs", "evidence": "embedding",
         "score": 0.9, "merge": False},
        {"group_id": "g", "a": "initech", "b": "initrode", "evidence": "embedding",
         "score": 0.88, "merge": False},
        {"group_id": "g", "a": "hooli", "b": "pied piper", "evidence": "embedding",
         "score": 0.86, "merge": False},
    ], schema=resolve.PAIRS)
    judge = SharedPrefixJudge()
    judged, calls = adjudicate(pairs, judge, batch_size=2)
    # The judge is asked about the undecided pairs only, in batches, each with its group,
    # names, evidence and score as the pairs table holds them.
    assert calls == 2
    assert judge.calls == [[NamePair("g", "acme", "acme labs", "embedding", 0.9),
                            NamePair("g", "initech", "initrode", "embedding", 0.88)],
                           [NamePair("g", "hooli", "pied piper", "embedding", 0.86)]]
    decided = {(r["a"], r["b"]): (r["evidence"], r["merge"]) for r in judged.to_pylist()}
    assert decided[("acme", "acme labs")] == ("llm", True)
    assert decided[("initech", "initrode")] == ("llm", True)
    assert decided[("hooli", "pied piper")] == ("embedding", False)  # None keeps apart
    assert decided[("globex", "globex corp")] == ("exact", True)
