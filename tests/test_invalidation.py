"""Invalidation rules and the temporal invariants they must keep (property-based)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tkg.pipeline import schema
from tkg.pipeline.config import FactsConfig
from tkg.pipeline.facts import (
    fact_rows,
    invalidate,
    invalidate_subject,
    merge_facts,
    relation_class,
    version_edges,
)

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
    versions: list[dict] = []
    for run, belief in enumerate(beliefs):
        now = T0 + timedelta(days=run + 1)
        current = None
        if belief is not None:
            target, end = belief
            current = edge("e", "LIVES_IN", target, T0,
                           None if end is None else T0 + timedelta(days=end))
            current["created_at"] = now
        versions = versions_of([] if current is None else [current], versions, now)
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


TIE = [("WORKS_AT", "a", 0, None), ("LIVES_IN", "a", 0, None), ("LIKE", "a", 1, None),
       ("WORKS_AT", "b", 2, None), ("LIVES_IN", "b", 2, None)]  # two classes end at once


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(relations, st.sampled_from(["a", "b"]),
                          st.one_of(st.none(), st.integers(0, 3)),
                          st.one_of(st.none(), st.integers(0, 3))), max_size=12),
       st.randoms(use_true_random=False))
@example(TIE, random.Random(0))
def test_invalidation_does_not_depend_on_the_order_edges_arrive_in(items, rng):
    """A shuffle delivers a subject's edges in any order: the result is a function of the
    set (few days and objects, so that ends from several classes meet at one instant)."""
    edges = []
    for index, (relation, target, start, length) in enumerate(items):
        valid = None if start is None else T0 + timedelta(days=start)
        end = None if valid is None or length is None else valid + timedelta(days=length)
        edges.append(edge(f"e{index}", relation, target, valid, end))
    arrived = [dict(e) for e in edges]
    rng.shuffle(arrived)
    result = invalidate_subject([dict(e) for e in edges], CONFIG)
    assert invalidate_subject(arrived, CONFIG) == result
    assert invalidate_subject([dict(e) for e in reversed(edges)], CONFIG) == result


CREATED = T0 + timedelta(days=400)


def mention(episode: str, relation: str, target: str, day: int) -> dict:
    return {"group_id": "g", "episode_id": episode, "source_entity_id": "maria",
            "target_entity_id": target, "relation": relation, "fact": f"{relation} {target}",
            "valid_at": T0 + timedelta(days=day), "invalid_at": None}


def facts_of(blocks: list[list[dict]]) -> list[dict]:
    """Fact mentions -> invalidated edges as the facts stage makes them: each block merged
    on its own (a partition of the shuffle by edge), the blocks' edges then reaching the
    subject's invalidation in the order given."""
    merged = [merge_facts(fact_rows(pa.Table.from_pylist(block), CONFIG), CREATED)
              for block in blocks if block]
    return invalidate(pa.concat_tables(merged), CONFIG).to_pylist()


def versions_of(current: list[dict], stored: list[dict], now: datetime) -> list[dict]:
    """`version_edges` of this run's edges (`current`) and the `stored` versions."""
    rows = [{**e, "side": "new"} for e in current] + [{**e, "side": "old"} for e in stored]
    table = pa.Table.from_pylist(rows, schema=schema.MERGED_FACTS.append(
        pa.field("side", pa.string())))
    return version_edges(table, now).to_pylist()


def open_versions(current: list[dict], stored: list[dict], now: datetime) -> set[tuple]:
    return {(v["edge_id"], v["relation"], v["valid_at"], v["invalid_at"],
             v["invalidated_by"], tuple(v["episode_ids"]))
            for v in versions_of(current, stored, now) if v["expired_at"] is None}


def _versions_by_rows(current: list[dict], stored: list[dict], now: datetime) -> list[dict]:
    """The rule `version_edges` follows, an edge at a time with a dict per version (its
    implementation until it went column by column): the reference it is held to."""
    fields = ("source_entity_id", "target_entity_id", "relation", "fact", "episode_ids",
              "valid_at", "invalid_at", "invalidated_by")
    edges = sorted({e["edge_id"] for e in (*current, *stored)})
    out = []
    for edge_id in edges:
        versions = [dict(v) for v in sorted((v for v in stored if v["edge_id"] == edge_id),
                                            key=lambda v: v["version"])]
        now_said = next((e for e in current if e["edge_id"] == edge_id), None)
        open_version = next((v for v in versions if v["expired_at"] is None), None)
        if now_said is not None and open_version is not None and all(
                open_version[k] == now_said[k] for k in fields):
            out += versions
            continue
        if open_version is not None:
            open_version["expired_at"] = now
        if now_said is not None:
            versions.append({**now_said, "version": max(
                (v["version"] for v in versions), default=0) + 1, "created_at": now,
                "expired_at": None})
        out += versions
    return out


def test_versions_follow_the_rule_edge_by_edge():
    """`version_edges`, column by column, gives what the rule gives an edge at a time
    (`_versions_by_rows`): unchanged, changed, ended, gone and new edges, edges whose
    versions are all closed, two new rows of one edge (the first counts), and stored
    rows out of version order."""
    rng = random.Random(5)
    now = T0 + timedelta(days=40)
    current, stored = [], []
    for number in range(60):
        edge_id = f"e{number:02d}"
        count = rng.randint(0, 3)
        for version in range(1, count + 1):
            row = edge(edge_id, "LIVES_IN", rng.choice("ab"), T0,
                       rng.choice([None, T0 + timedelta(days=5)]))
            row.update(version=version, created_at=T0 + timedelta(days=version),
                       expired_at=T0 + timedelta(days=version + 1))
            stored.append(row)
        if count and rng.random() < 0.8:
            stored[-1]["expired_at"] = None  # the open version
        for _ in range(rng.choice([0, 1, 1, 1, 2])):
            said = edge(edge_id, "LIVES_IN", rng.choice("ab"), T0,
                        rng.choice([None, T0 + timedelta(days=5)]))
            if stored and stored[-1]["edge_id"] == edge_id and rng.random() < 0.5:
                said = {**stored[-1], "version": 1, "created_at": T0}  # says the same
            current.append(said)
    rng.shuffle(stored)
    want = _versions_by_rows(current, stored, now)
    assert versions_of(current, stored, now) == want
    assert sum(v["expired_at"] == now for v in want) > 5 and len(want) > len(stored)


def test_two_runs_over_parts_agree_with_one_run_over_all():
    """Maria worked at Initech (her contact record says so too), said where she runs the
    demo from, then one episode gives her new job and her record's new company: the demo
    fact ends with the change, by the same edge whichever run and block order made it."""
    first = [mention("m1", "WORK_AT", "initech", 0), mention("r1", "COMPANY", "initech", 0),
             mention("m2", "RUN_DEMO_FROM", "initech", 3)]
    second = [mention("r2", "JOIN", "globex", 9), mention("r2", "COMPANY", "globex", 9)]
    one_run = facts_of([first + second])
    (demo,) = [e for e in one_run if e["relation"] == "RUN_DEMO_FROM"]
    assert demo["invalid_at"] == T0 + timedelta(days=9)
    expected = open_versions(one_run, [], CREATED)
    run_1 = facts_of([first])
    later = CREATED + timedelta(days=1)
    for blocks in ([second, first], [first, second], [second[::-1], first],
                   [second[1:], first, second[:1]]):  # run 2: every mention of the subject
        assert open_versions(facts_of(blocks), run_1, later) == expected, blocks


def _combine_by_rows(stored: pa.Table, tonight: pa.Table) -> list[dict]:
    """`combine_edges`' rule, edge by edge (the reference it is held to)."""
    from tkg.pipeline.facts import _combined

    new = {row["edge_id"]: row for row in tonight.to_pylist()}
    out = []
    for old in stored.to_pylist():
        now = new.pop(old["edge_id"], None)
        out.append(old if now is None else _combined(old, now))
    out += new.values()
    return sorted(out, key=lambda e: e["edge_id"])


def test_combining_follows_the_rule_edge_by_edge():
    """Stored open edges with tonight's: restated ones combined (wording, episodes, start,
    stated end), the others as stored, tonight's new ones added, all by edge id; with a
    stored end from invalidation (not kept), from a statement (kept), nothing stored and
    nothing tonight."""
    from tkg.pipeline.facts import combine_edges

    rng = random.Random(5)
    day = timedelta(days=1)
    for case in range(40):
        stored, tonight = [], []
        for index in range(rng.randint(0, 12)):
            row = edge(f"e{index:02d}", rng.choice(["LIVES_IN", "WORKS_AT", "LIKES"]),
                       rng.choice("abc"), T0 + rng.randint(0, 9) * day,
                       rng.choice([None, T0 + 20 * day]))
            row["invalidated_by"] = rng.choice([None, "e99"]) if row["invalid_at"] else None
            row["episode_ids"] = sorted(rng.sample(["p", "q", "r", "s"], rng.randint(1, 2)))
            (stored if rng.random() < 0.7 else tonight).append(row)
            if rng.random() < 0.4:  # restated tonight, in other words, later or earlier
                tonight.append({**row, "fact": f"{row['relation']} {row['fact']} again",
                                "valid_at": row["valid_at"] + rng.randint(-3, 3) * day,
                                "invalid_at": rng.choice([None, T0 + 15 * day]),
                                "episode_ids": [f"t{case}"], "invalidated_by": None})
        rng.shuffle(stored)
        old = pa.Table.from_pylist(stored, schema=schema.MERGED_FACTS)
        new = pa.Table.from_pylist(tonight, schema=schema.MERGED_FACTS)
        assert combine_edges(old, new).to_pylist() == _combine_by_rows(old, new), case


def _invalidate_by_pairs(edges: list[dict], config: FactsConfig) -> list[dict]:
    """`invalidate_subject` with its exclusive-class rule as first written, every later
    member gathered for each and the earliest taken, every unclassed fact and scoping edge
    scanned (the reference the indexed `_exclusive_ends` is held to)."""
    from tkg.pipeline.facts import _comparable, _end, _kinds, _other_ends, _scoping

    kinds = _kinds(edges, config)
    per = _scoping(config)
    for name, members in kinds.classes.items():
        members.sort(key=lambda e: (e["valid_at"], e["edge_id"]))
        scoping = kinds.classes.get(per.get(name, ""), [])
        scope = {}
        for row in members:
            objects = {s["target_entity_id"] for s in scoping
                       if set(row["episode_ids"] or ()) & set(s["episode_ids"] or ())}
            scope[row["edge_id"]] = objects.pop() if len(objects) == 1 else None
        for index, old in enumerate(members):
            causes = [n for n in members[index + 1:]
                      if n["target_entity_id"] != old["target_entity_id"]
                      and n["valid_at"] > old["valid_at"]
                      and _comparable(scope[n["edge_id"]], scope[old["edge_id"]])]
            causes += [n for n in (*kinds.negations.get(name, ()), *kinds.endings)
                       if n["target_entity_id"] == old["target_entity_id"]
                       and n["valid_at"] >= old["valid_at"]]
            if not causes:
                continue
            cause = min(causes, key=lambda e: (e["valid_at"], e["edge_id"]))
            _end(old, cause["valid_at"], cause["edge_id"])
            for other in kinds.unclassed:
                if other["target_entity_id"] == old["target_entity_id"] and (
                        old["valid_at"] <= other["valid_at"] < cause["valid_at"]):
                    _end(other, cause["valid_at"], cause["edge_id"])
    _other_ends(kinds, config)
    return sorted(edges, key=lambda e: e["edge_id"])


def test_invalidation_follows_the_rule_of_every_pair():
    """A subject's edges of every kind (exclusive classes, a title scoped by its employer,
    memberships, negations, endings, unclassed facts, undated ones, stated ends) end as the
    all-pairs rule ends them: the earliest newer value of a class, found first in the
    members' order, and unclassed facts and scopes found by object and episode."""
    import copy

    relations = ["LIVES_IN", "MOVE_TO", "WORKS_AT", "JOIN", "WORKS_AS", "BE_PROMOTE_TO",
                 "MEMBER_OF", "NOT_LIVES_IN", "NOT_WORKS_AT", "LEFT", "NO_LONGER_LIKES",
                 "LIKES", "RUN_DEMO_FROM"]
    rng = random.Random(11)
    for case in range(150):
        rows = []
        for index in range(rng.randint(1, 40)):
            row = edge(f"e{index:03d}", rng.choice(relations), rng.choice("abcd"),
                       rng.choice([None, *(T0 + timedelta(days=d) for d in range(8))]),
                       rng.choice([None, None, T0 + timedelta(days=9)]))
            row["episode_ids"] = rng.sample(["p", "q", "r", "s", "t"], rng.randint(1, 2))
            rows.append(row)
        expected = _invalidate_by_pairs(copy.deepcopy(rows), CONFIG)
        assert invalidate_subject(copy.deepcopy(rows), CONFIG) == expected, case


def test_a_table_of_subjects_is_invalidated_as_its_rows_are():
    """`invalidate` over a table of several subjects and groups (the rules' columns as
    Python values, its times as integers, the ends written back) gives the table the rule
    gives row by row, every column and the order by subject and edge id included."""
    relations = ["LIVES_IN", "MOVE_TO", "WORKS_AT", "WORKS_AS", "NOT_LIVES_IN", "LEFT",
                 "NO_LONGER_LIKES", "LIKES", "MEMBER_OF"]
    rng = random.Random(3)
    for case in range(40):
        rows = []
        for index in range(rng.randint(0, 50)):
            row = edge(f"e{rng.randrange(10**6):06d}", rng.choice(relations),
                       rng.choice("abc"),
                       rng.choice([None, *(T0 + timedelta(days=d, hours=h)
                                           for d in range(5) for h in (0, 7))]),
                       rng.choice([None, None, T0 + timedelta(days=4)]),
                       source=rng.choice(["ana", "bo", "cy"]))
            row["group_id"] = rng.choice(["g", "h"])
            row["episode_ids"] = rng.sample(["p", "q", "r"], rng.randint(0, 2)) or None
            row["fact"] = f"fact {index}"
            rows.append(row)
        table = pa.Table.from_pylist(rows, schema=schema.MERGED_FACTS)
        by_subject: dict = {}
        for row in table.to_pylist():
            by_subject.setdefault((row["group_id"], row["source_entity_id"]), []).append(row)
        expected = [row for _, subject in sorted(by_subject.items())
                    for row in invalidate_subject(subject, CONFIG)]
        got = invalidate(table, CONFIG)
        assert got.schema == table.schema
        assert got.to_pylist() == expected, case
