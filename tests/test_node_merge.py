"""A later run's name nodes merged into the stored ones (pipeline/node_merge.py) are the
nodes of every mention of each name, where the merge is exact; the others are marked to be
made again."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from tkg.pipeline import node_merge, resolve, schema

WHEN = datetime(2025, 1, 2, tzinfo=UTC)
SPELLINGS = {"acme corp": ["Acme Corp", "ACME Corp", "acme corp", "Acme  Corp"],
             "employee 2": ["Employee 2", "employee 2", "Dana Lee"],  # a record called so
             "dana lee": ["Dana Lee", "dana lee", "DANA LEE"],
             "kite": ["Kite", "kite"]}
LABELS = [None, "Person", "Organization", "Entity", "Concept", "Location"]


def _mentions(rng: random.Random, episodes: range, start: datetime, undated: float
              ) -> list[dict]:
    rows = []
    for episode in episodes:
        valid_at = None if rng.random() < undated else start + timedelta(
            hours=rng.randrange(0, 48))
        # an episode's mentions tie in time, with other attributes and "Dana Lee" under
        # two normalized names (`resolve_entities` orders them by content)
        chosen = rng.sample(sorted(SPELLINGS), rng.randint(1, 3))
        for normalized in chosen:
            for _ in range(rng.randint(1, 2)):  # a name twice in an episode counts once
                role = json.dumps({"role": rng.choice("ab")})
                keyed = json.dumps({schema.RECORD_ATTRIBUTE: SPELLINGS[normalized][0]}) \
                    if normalized == "employee 2" else role  # (one record name per entity)
                name = rng.choice(SPELLINGS[normalized])
                attributes = rng.choice([None, None, role, keyed])
                rows.append({"episode_id": f"ep-{episode}", "group_id": rng.choice("gh"),
                             "valid_at": valid_at, "name": name,
                             "label": rng.choice(LABELS), "attributes": attributes,
                             "normalized": normalized})
    return rows


def _nodes(rows: list[dict]) -> pa.Table:
    return resolve.resolve_entities(pa.Table.from_pylist(rows, schema=resolve.MENTION_ROWS),
                                    WHEN, ids=False)


def _by_name(table: pa.Table) -> dict[tuple[str, str], dict]:
    return {(r["group_id"], r["normalized"]): r for r in table.to_pylist()}


def _merge_cases(rng: random.Random, rows_of: Callable[[list[dict]], pa.Table],
                 key: Callable[[dict], tuple[str, str]], entities: bool,
                 mapped: Callable[[list[dict]], list[dict]] = lambda rows: rows
                 ) -> dict[str, int]:
    """60 random cases of stored and later mentions (`mapped` to entities or not): every
    row `merge_rows` merges equals `rows_of` every mention; one it marks had a stored row.
    Returns how many rows merged, were marked and were new."""
    outcomes = {"merged": 0, "again": 0, "new": 0}

    def by_key(table: pa.Table) -> dict[tuple[str, str], dict]:
        return {key(r): r for r in table.to_pylist()}

    for case in range(60):
        early = datetime(2024, 1, 1, tzinfo=UTC)
        # later mentions after the stored ones, or (a third of the cases) overlapping them
        late = early + timedelta(hours=rng.choice([49, 60, 24 if case % 3 == 0 else 49]))
        stored = mapped(_mentions(rng, range(0, rng.randint(0, 12)), early, 0.1))
        later = mapped(_mentions(rng, range(100, 100 + rng.randint(1, 6)), late,
                                 0.15 if case % 5 == 0 else 0.0))
        rows = pa.concat_tables([node_merge.tagged(rows_of(later), "later")]
                                + ([node_merge.tagged(rows_of(stored), "stored")]
                                   if stored else []))
        merged = node_merge.merge_rows(rows, WHEN, entities)
        assert merged.schema == node_merge.MERGED
        whole = by_key(rows_of(stored + later))
        before = by_key(rows_of(stored)) if stored else {}
        got = by_key(merged)
        assert got.keys() == by_key(rows_of(later)).keys()
        for at, row in got.items():
            if row.pop(node_merge.AGAIN):
                assert at in before
                outcomes["again"] += 1
                continue
            outcomes["merged" if at in before else "new"] += 1
            assert row == whole[at], (case, at)
    return outcomes


def test_merged_nodes_are_the_nodes_of_every_mention():
    outcomes = _merge_cases(random.Random(11), _nodes,
                            lambda r: (r["group_id"], r["normalized"]), False)
    assert min(outcomes.values()) > 10, outcomes


def test_the_order_mentions_arrive_in_decides_nothing():
    """Mentions of one episode tie in time; whatever order they arrive in (the driver and
    Ray Data deliver them differently), a name node and an entity are the same: the same
    winning attributes, the same normalized name of a surface form under two."""
    rng = random.Random(5)
    for case in range(20):
        rows = _mentions(rng, range(0, rng.randint(1, 4)), datetime(2024, 1, 1, tzinfo=UTC),
                         0.2)
        for of in (_nodes, lambda r: _entities(_mapped(r))):
            first = of(rows).to_pylist()
            for _ in range(4):
                shuffled = rows[:]
                rng.shuffle(shuffled)
                assert of(shuffled).to_pylist() == first, case


def test_a_node_stored_without_its_surface_counts_is_made_again():
    rng = random.Random(3)
    early = datetime(2024, 1, 1, tzinfo=UTC)
    stored = _nodes(_mentions(rng, range(0, 5), early, 0.0))
    stored = stored.set_column(stored.schema.get_field_index("alias_mentions"),
                               "alias_mentions", pa.nulls(stored.num_rows,
                                                          pa.list_(pa.int64())))
    later = _nodes(_mentions(rng, range(10, 14), early + timedelta(days=5), 0.0))
    merged = node_merge.merge_rows(pa.concat_tables([
        node_merge.tagged(later, "later"), node_merge.tagged(stored, "stored")]), WHEN, False)
    known = set(_by_name(stored))
    assert [r[node_merge.AGAIN] for r in merged.to_pylist()] == [
        (r["group_id"], r["normalized"]) in known for r in merged.to_pylist()]


def test_a_later_mention_no_later_than_the_stored_ones_makes_the_node_again():
    """At the stored node's last time, an episode id that sorts first would come first:
    the merge cannot know, so the node is made again; so is one with an undated mention."""
    at = datetime(2024, 3, 1, tzinfo=UTC)
    row = {"group_id": "g", "name": "Dana Lee", "label": "Person", "normalized": "dana lee"}
    stored = _nodes([{**row, "episode_id": "ep-9", "valid_at": at,
                      "attributes": json.dumps({"role": "a"})}])
    for valid_at in (at, None, at - timedelta(hours=1)):
        later = _nodes([{**row, "episode_id": "ep-10", "valid_at": valid_at,
                         "attributes": json.dumps({"role": "b"})}])
        merged = node_merge.merge_rows(pa.concat_tables([
            node_merge.tagged(later, "later"), node_merge.tagged(stored, "stored")]), WHEN, False)
        assert merged[node_merge.AGAIN].to_pylist() == [True], valid_at
    later = _nodes([{**row, "episode_id": "ep-10", "valid_at": at + timedelta(seconds=1),
                     "attributes": json.dumps({"role": "b"})}])
    merged = node_merge.merge_rows(pa.concat_tables([
        node_merge.tagged(later, "later"), node_merge.tagged(stored, "stored")]), WHEN, False)
    assert merged[node_merge.AGAIN].to_pylist() == [False]
    assert merged["attributes"].to_pylist() == ['{"role": "b"}']
    assert merged["mention_count"].to_pylist() == [2]


# entities: (normalized name, its root, evidence, score) of the names mapped to each
ENTITIES = {"ent-acme": [("acme corp", "acme corp", "exact", 1.0),
                         ("kite", "acme corp", "nickname", 0.7)],
            "ent-dana": [("dana lee", "dana lee", "exact", 1.0),
                         ("employee 2", "dana lee", "record", 0.9)]}


def _mapped(rows: list[dict]) -> list[dict]:
    """`rows` as the resolver maps them: each name's entity, root, evidence and score."""
    of = {name: (entity, root, evidence, score) for entity, names in ENTITIES.items()
          for name, root, evidence, score in names}
    return [{**row, **dict(zip(("entity_id", "root", "evidence", "score"),
                               of[row["normalized"]], strict=True))} for row in rows]


def _entities(rows: list[dict]) -> pa.Table:
    return resolve.resolve_entities(pa.Table.from_pylist(rows), WHEN)


def test_merged_entities_are_the_entities_of_every_mention():
    """An entity's strongest label, name, aliases (their evidence and scores) and
    attributes from the stored row and the later mentions' row alone."""
    outcomes = _merge_cases(random.Random(5), _entities,
                            lambda r: (r["group_id"], r["entity_id"]), True, _mapped)
    assert min(outcomes.values()) > 10, outcomes
