"""Invalidation rules and the temporal invariants they must keep (property-based)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from tkg.pipeline import schema
from tkg.pipeline.config import FactsConfig
from tkg.pipeline.facts import invalidate, invalidate_subject, relation_class

CONFIG = FactsConfig()
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def edge(edge_id, relation, target, valid_at, invalid_at=None, source="ana"):
    return {"edge_id": edge_id, "group_id": "g", "source_entity_id": source,
            "target_entity_id": target, "relation": relation, "version": 1, "fact": edge_id,
            "episode_ids": ["e"], "valid_at": valid_at, "invalid_at": invalid_at,
            "created_at": T0, "expired_at": None, "invalidated_by": None}


def test_relation_classes():
    assert relation_class("MOVE_TO", CONFIG)[0] == "LIVES_IN"
    assert relation_class("JOIN", CONFIG)[0] == "WORKS_AT"
    assert relation_class("NOT_WORK_AT", CONFIG) [0] == "NOT_WORKS_AT"
    assert relation_class("NOT_WORK_AT", CONFIG)[2]
    assert relation_class("MANAGE", CONFIG) == ("MANAGE", None, False)


def test_newer_value_ends_the_older_one():
    berlin = edge("berlin", "LIVES_IN", "berlin", T0)
    paris = edge("paris", "LIVES_IN", "paris", T0 + timedelta(days=100))
    invalidate_subject([paris, berlin], CONFIG)
    assert berlin["invalid_at"] == paris["valid_at"]
    assert berlin["invalidated_by"] == "paris"
    assert paris["invalid_at"] is None


def test_unrelated_relations_and_undated_facts_are_left_alone():
    home = edge("home", "LIVES_IN", "berlin", T0)
    job = edge("job", "WORKS_AT", "globex", T0 + timedelta(days=5))
    hobby = edge("hobby", "LIKE", "chess", T0 + timedelta(days=9))
    old = edge("old", "LIVES_IN", "bristol", None)
    invalidate_subject([home, job, hobby, old], CONFIG)
    assert all(e["invalid_at"] is None for e in (home, job, hobby, old))


def test_negation_ends_the_same_object_only():
    initech = edge("initech", "WORKS_AT", "initech", T0)
    other = edge("other", "WORKS_AT", "hooli", T0)
    quit_ = edge("quit", "NOT_WORKS_AT", "initech", T0 + timedelta(days=30))
    invalidate_subject([initech, other, quit_], CONFIG)
    assert initech["invalidated_by"] == "quit"
    assert other["invalidated_by"] is None


def test_a_stated_end_that_is_earlier_is_kept():
    school = edge("oak", "ATTENDS", "oak", T0, invalid_at=T0 + timedelta(days=150))
    newer = edge("river", "ATTENDS", "river", T0 + timedelta(days=240))
    invalidate_subject([school, newer], CONFIG)
    assert school["invalid_at"] == T0 + timedelta(days=150)
    assert school["invalidated_by"] is None


def test_other_subjects_never_interact():
    table = pa.Table.from_pylist(
        [edge("a", "LIVES_IN", "x", T0, source="s1"),
         edge("b", "LIVES_IN", "y", T0 + timedelta(days=1), source="s2")],
        schema=schema.MERGED_FACTS)
    out = invalidate(table, CONFIG)
    assert out["invalid_at"].to_pylist() == [None, None]


relations = st.sampled_from(["LIVES_IN", "MOVE_TO", "WORKS_AT", "JOIN", "NOT_WORKS_AT",
                             "STATUS", "LIKE", "NOT_LIVE_IN"])
facts_strategy = st.lists(
    st.tuples(relations, st.sampled_from(["a", "b", "c", "d"]),
              st.one_of(st.none(), st.integers(0, 1000)),
              st.one_of(st.none(), st.integers(0, 1000))),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(facts_strategy)
def test_interval_invariants_hold_for_any_sequence(items):
    edges = []
    for index, (relation, target, start, length) in enumerate(items):
        valid = None if start is None else T0 + timedelta(days=start)
        end = None if valid is None or length is None else valid + timedelta(days=length)
        edges.append(edge(f"e{index}", relation, target, valid, end))
    before = {e["edge_id"]: (e["valid_at"], e["invalid_at"]) for e in edges}
    out = invalidate_subject([dict(e) for e in edges], CONFIG)
    assert sorted(e["edge_id"] for e in out) == sorted(before)
    by_id = {e["edge_id"]: e for e in out}
    for e in out:
        valid, invalid = e["valid_at"], e["invalid_at"]
        if valid is not None and invalid is not None:
            assert valid <= invalid
        if e["valid_at"] is None:  # undated facts are never invalidated
            assert e["invalidated_by"] is None
        if e["invalidated_by"] is not None:
            cause = by_id[e["invalidated_by"]]
            assert cause["valid_at"] == e["invalid_at"]
            assert cause["valid_at"] >= e["valid_at"]
            cause_class = relation_class(cause["relation"], CONFIG)[1]
            own_class = relation_class(e["relation"], CONFIG)[1]
            # its own class, an ending, the job a title was held at, or (for an unclassed
            # fact about the same object) the change that ended the subject's fact about it
            assert cause_class is own_class or cause_class is CONFIG.ending or (
                own_class is None) or own_class.per == cause_class.name
        old_invalid = before[e["edge_id"]][1]
        if old_invalid is not None:  # invalidation only ever moves an end earlier
            assert e["invalid_at"] <= old_invalid


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.tuples(st.sampled_from(["a", "b"]),
                                               st.one_of(st.none(), st.integers(0, 50)))),
                min_size=1, max_size=12))
def test_versions_never_overlap_and_one_is_open(beliefs):
    """Any sequence of runs (each believing some content of one edge, or nothing) leaves
    contiguous, non-overlapping transaction intervals and at most one open version."""
    from tkg.pipeline.facts import version_edge

    versions: list[dict] = []
    for run, belief in enumerate(beliefs):
        now = T0 + timedelta(days=run + 1)
        current = None
        if belief is not None:
            target, end = belief
            current = edge("e", "LIVES_IN", target, T0,
                           None if end is None else T0 + timedelta(days=end))
            current["created_at"] = now
        versions = version_edge(versions, current, now)
        open_versions = [v for v in versions if v["expired_at"] is None]
        assert len(open_versions) <= 1
        assert (len(open_versions) == 1) == (current is not None)
        if current is not None:
            assert open_versions[0]["target_entity_id"] == current["target_entity_id"]
        ordered = sorted(versions, key=lambda v: v["version"])
        assert [v["version"] for v in ordered] == list(range(1, len(ordered) + 1))
        for older, newer in pairwise(ordered):
            assert older["expired_at"] is not None
            assert older["created_at"] <= older["expired_at"] <= newer["created_at"]
