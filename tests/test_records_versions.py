"""Record versions: a newer version of a record (same key) ends every edge field it changes,
whatever the field's name, and every one it drops (all of them, in V3), in the driver, on
Ray Data, and when the new version arrives in a later run; two records that share a name
keep a key each."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from tkg.pipeline import store
from tkg.pipeline.build import BuildResult, build

GROUP = "crm"


def _contact(id_: str, day: str, data: dict) -> dict:
    return {"group_id": GROUP, "id": id_, "kind": "json", "timestamp": f"{day}T09:00:00Z",
            "source": "crm.contacts", "data": data}


# company and city are entity fields, segment one in no relation class, tags a list
V1 = _contact("c1-v1", "2024-01-10", {
    "contact_id": "C-1", "name": "Maria Lopez", "company": "Initech", "city": "Austin",
    "segment": "Enterprise", "tags": ["vip", "beta"], "email": "maria@initech.example"})
V2 = _contact("c1-v2", "2024-06-01", {  # company and segment changed, city and beta dropped
    "contact_id": "C-1", "name": "Maria Lopez", "company": "Globex", "segment": "SMB",
    "tags": ["vip"], "email": "maria@globex.example"})
V3 = _contact("c1-v3", "2024-09-01", {  # every edge field dropped
    "contact_id": "C-1", "name": "Maria Lopez", "email": "maria@hooli.example"})
# two records of one name, in a group of their own
TWINS = tuple({**_contact(f"twin-{key}", "2024-02-01", {
    "contact_id": key, "name": "Ana Silva", "company": company, "email": email}),
    "group_id": "crm-twins"} for key, company, email in (
        ("C-7", "Umbrella", "ana@umbrella.example"), ("C-8", "Hooli", None)))
JUNE, SEPTEMBER = datetime(2024, 6, 1, 9, tzinfo=UTC), datetime(2024, 9, 1, 9, tzinfo=UTC)


def _write(folder: Path, records: tuple[dict, ...]) -> str:
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


@pytest.fixture(scope="module")
def builds(ray_session, config, tmp_path_factory) -> dict[str, BuildResult]:
    """One run in the driver, one on Ray Data, and three runs (V2, then V3, a night each
    after the first)."""
    from tests.paths import on_ray_data

    root = tmp_path_factory.mktemp("versions")
    every = (V1, *TWINS, V2, V3)
    later = [build(config, [_write(root / f"in{i}", part)], root / "later", run_id=f"r{i}")
             for i, part in enumerate(((V1, *TWINS), (V2,), (V3,)), start=1)]
    return {"driver": build(config, [_write(root / "all", every)], root / "driver"),
            "ray_data": build(on_ray_data(config), [_write(root / "all-ray", every)],
                              root / "ray"),
            "later_run": later[-1]}


def _current(result: BuildResult) -> list[tuple]:
    """The current belief: (subject's record key, relation, object, valid from, to,
    caused by an edge?) of every edge."""
    with store.open_catalog(result.snapshot) as con:
        return sorted(con.execute(
            "SELECT json_extract_string(s.attributes, '$.record'), f.relation, o.name, "
            "f.valid_at, f.invalid_at, f.invalidated_by IS NOT NULL FROM facts f "
            "JOIN entities s ON s.entity_id = f.source_entity_id "
            "JOIN entities o ON o.entity_id = f.target_entity_id "
            "WHERE f.group_id = ? AND f.expired_at IS NULL", [GROUP]).fetchall())


PATHS = ("driver", "ray_data", "later_run")


@pytest.mark.parametrize("path", PATHS)
def test_a_newer_version_ends_what_it_changes_and_drops(builds, path):
    jan = datetime(2024, 1, 10, 9, tzinfo=UTC)
    assert _current(builds[path]) == [
        ("Contact C-1", "CITY", "Austin", jan, JUNE, False),  # dropped: a stated end
        ("Contact C-1", "COMPANY", "Globex", JUNE, SEPTEMBER, False),
        ("Contact C-1", "COMPANY", "Initech", jan, JUNE, True),
        ("Contact C-1", "SEGMENT", "Enterprise", jan, JUNE, True),
        ("Contact C-1", "SEGMENT", "SMB", JUNE, SEPTEMBER, False),
        ("Contact C-1", "TAGS", "beta", jan, JUNE, False),
        ("Contact C-1", "TAGS", "vip", jan, SEPTEMBER, False),
    ]
    with store.open_catalog(builds[path].snapshot) as con:
        attributes = con.execute("SELECT attributes FROM entities WHERE group_id = ? AND "
                                 "name = 'Maria Lopez'", [GROUP]).fetchone()[0]
    assert json.loads(attributes)["email"] == "maria@hooli.example"  # an attribute: replaced


@pytest.mark.parametrize("path", PATHS)
def test_two_records_of_one_name_keep_a_key_each(builds, path):
    """A record's identity is its key, its name only a label: two contacts called Ana Silva
    are two entities, each with its own attributes and edges (in a later run too)."""
    with store.open_catalog(builds[path].snapshot) as con:
        rows = con.execute("SELECT name, attributes FROM entities WHERE group_id = "
                           "'crm-twins'").fetchall()
        edges = con.execute(
            "SELECT json_extract_string(s.attributes, '$.record'), f.relation, o.name "
            "FROM facts f JOIN entities s ON s.entity_id = f.source_entity_id "
            "JOIN entities o ON o.entity_id = f.target_entity_id "
            "WHERE f.group_id = 'crm-twins' AND f.expired_at IS NULL").fetchall()
    assert sorted((name, json.loads(a).get("record"), json.loads(a).get("email"))
                  for name, a in rows) == [
        ("Ana Silva", "Contact C-7", "ana@umbrella.example"),
        ("Ana Silva", "Contact C-8", None), ("Hooli", None, None), ("Umbrella", None, None)]
    assert sorted(edges) == [("Contact C-7", "COMPANY", "Umbrella"),
                             ("Contact C-8", "COMPANY", "Hooli")]


def test_a_name_meets_a_record_only_when_it_can_mean_one():
    """Resolution of name nodes: two records of one name never merge; a name (or a first
    name) merges with the record it can only mean, and stays apart beside two records."""
    from tkg.pipeline.config import ResolveConfig
    from tkg.pipeline.resolve import blocking_keys, candidate_pairs, cluster, node_pairs

    def node(name: str, record: str | None = None) -> dict:
        attributes = json.dumps({"record": record}) if record else None
        return {"group_id": "g", "normalized": (record or name).casefold(), "name": name,
                "labels": ["Person"], "mention_count": 1, "attributes": attributes,
                "name_embedding": None, "first_seen": JUNE, "last_seen": SEPTEMBER}

    nodes = pa.Table.from_pylist([
        node("Ana Silva", "Contact C-7"), node("Ana Silva", "Contact C-8"), node("Ana Silva"),
        node("Ana"), node("Nancy Edwards", "Employee 2"), node("Nancy Edwards"),
        node("Nancy"), node("Employee 3")])
    config = ResolveConfig()
    pairs = candidate_pairs(blocking_keys(nodes, config), config)
    roots = {row["normalized"]: row["root"] for row in cluster(
        pa.concat_tables([pairs, node_pairs(nodes)])).to_pylist()}
    assert roots == {"contact c-7": "contact c-7", "contact c-8": "contact c-8",
                     "ana silva": "ana silva", "ana": "ana silva",  # either record
                     "employee 2": "nancy edwards", "nancy edwards": "nancy edwards",
                     "nancy": "nancy edwards", "employee 3": "employee 3"}


def test_a_later_run_supersedes_the_stored_version(builds):
    """A night's version appends versions of the stored edges it ends: Initech was current
    after the first run and is ended, not rewritten, by the second; Globex, current after
    the second, is ended by the third, whose version states no edge at all."""
    with store.open_catalog(builds["later_run"].snapshot) as con:
        versions = con.execute(
            "SELECT o.name, f.version, f.invalid_at, f.expired_at IS NOT NULL FROM facts f "
            "JOIN entities o ON o.entity_id = f.target_entity_id WHERE f.group_id = ? AND "
            "o.name IN ('Initech', 'Globex') ORDER BY o.name, f.version", [GROUP]).fetchall()
    assert versions == [("Globex", 1, None, True), ("Globex", 2, SEPTEMBER, False),
                        ("Initech", 1, None, True), ("Initech", 2, JUNE, False)]


def test_a_later_run_rebuilds_only_the_subjects_it_changed(builds):
    """The third run's one record version rebuilds its record's subject, and only it: a
    version may state again what an earlier one dropped, so its record is rebuilt rather
    than extended from stored edges whose ends it may undo; the twins and every other
    subject keep their stored edges (issue 26: a night compares alias maps, not the
    aliases listed, and rebuilds no more than what changed)."""
    import pyarrow.dataset as pads

    result = builds["later_run"]
    work = Path(result.summary["store"]) / "work" / "r3" / "facts"
    rebuilt = pads.dataset(work / "recomputed_subjects", format="parquet").to_table()
    with store.open_catalog(result.snapshot) as con:
        maria = con.execute("SELECT entity_id FROM entities WHERE group_id = ? AND "
                            "name = 'Maria Lopez'", [GROUP]).fetchall()
    assert sorted(rebuilt["source_entity_id"].to_pylist()) == [e for (e,) in maria]


def test_version_ends_change_only_the_ends_of_the_rows_they_end():
    """`apply_version_ends` ends each edge a newer record version ends unless it already
    ends earlier (`facts._end`), row by row as a dict each did before, and leaves every
    other row and column as it was."""
    from tkg.pipeline.extract.records import apply_version_ends
    from tkg.pipeline.facts import _end

    day = [datetime(2024, 1, d, tzinfo=UTC) for d in range(1, 6)]
    edges = pa.table({
        "edge_id": [f"e{i}" for i in range(6)],
        "fact": ["a", "b", "c", "d", "e", "f"],
        "invalid_at": pa.array([None, day[1], day[3], None, day[2], day[2]],
                               pa.timestamp("us", tz="UTC")),
        "invalidated_by": [None, "x", None, None, "z", "y"],
        "record_invalid_at": pa.array([day[2], day[2], None, None, day[2], day[2]],
                                      pa.timestamp("us", tz="UTC")),
        "record_invalidated_by": ["v2", "v2", None, None, "v2", "a"],
    })
    want = edges.to_pylist()
    for edge in want:
        if edge["record_invalid_at"] is not None:
            _end(edge, edge["record_invalid_at"], edge["record_invalidated_by"])
        del edge["record_invalid_at"], edge["record_invalidated_by"]
    got = apply_version_ends(pa.concat_tables([edges.slice(0, 2), edges.slice(2)]))
    assert got.column_names == ["edge_id", "fact", "invalid_at", "invalidated_by"]
    assert got.to_pylist() == want
    assert [e["invalidated_by"] for e in want] == ["v2", "x", None, None, "v2", "a"]


def _version_ends_by_rows(statements: pa.Table, config) -> list[dict]:
    """The rule `version_ends` follows, statement by statement (its implementation until it
    went column by column): the reference its output is held to."""
    from tkg.pipeline import schema
    from tkg.pipeline.facts import relation_class

    def earlier(one, other) -> bool:
        return (one[0], one[1] is not None, one[1] or "") < (
            other[0], other[1] is not None, other[1] or "")

    by_record: dict[tuple[str, str], list[dict]] = {}
    for row in statements.to_pylist():
        by_record.setdefault((row["group_id"], row["record"]), []).append(row)
    ends, about = {}, {}
    for (group_id, _), rows in sorted(by_record.items()):
        tonight = any(r["tonight"] for r in rows)
        versions = sorted({(r["valid_at"], r["episode_id"]) for r in rows
                           if r["valid_at"] is not None})
        order = {episode: index for index, (_, episode) in enumerate(versions)}
        last, by_version = {}, {}
        for row in rows:
            source, target = row.get("source_entity_id"), row.get("target_entity_id")
            if row["relation"] is None or source is None or target is None or (
                    source == target or row["episode_id"] not in order):
                continue
            relation = relation_class(row["relation"], config)[0]
            edge = schema.stable_id(group_id, "fact", source, target, relation)
            index = order[row["episode_id"]]
            last[edge] = max(last.get(edge, -1), index)
            about[edge] = (source, tonight or about.get(edge, ("", False))[1])
            by_version.setdefault((index, relation), []).append(edge)
        relations = {e: r for (_, r), edges in by_version.items() for e in edges}
        for edge, index in last.items():
            if index + 1 < len(versions):
                kept = by_version.get((index, relations[edge]), [])
                causes = [e for e in by_version.get((index + 1, relations[edge]), [])
                          if e not in kept]
                end = (versions[index + 1][0], min(causes) if causes else None)
                if edge not in ends or earlier(end, ends[edge]):
                    ends[edge] = end
    return [{"edge_id": e, "record_invalid_at": at, "record_invalidated_by": by,
             "source_entity_id": about[e][0], "tonight": about[e][1]}
            for e, (at, by) in sorted(ends.items())]


TARGETS = ["x1", "x2", "x3", "x4", None, "s1"]  # an unresolved one, a subject of its own


def test_version_ends_follow_the_rule_statement_by_statement():
    """`version_ends`, column by column, gives what the rule gives statement by statement
    (`_version_ends_by_rows`): changed, dropped and restated fields, several relations of
    one class, an edge two records state, versions without statements, self-loops,
    unresolved endpoints, statements without a valid time, and nothing at all."""
    import random

    from tkg.pipeline.config import FactsConfig
    from tkg.pipeline.extract.records import RESOLVED_STATEMENTS, version_ends

    config = FactsConfig()
    rng = random.Random(11)
    relations = ["works at", "employed by", "lives in", "based in", "tagged", "tagged", None]
    rows = []
    for record in range(60):  # several records of one key, several keys of one subject
        group, key, subject = f"g{record % 2}", f"k{record % 25}", f"s{record % 9}"
        fields = [(rng.choice(relations), rng.choice(TARGETS)) for _ in range(3)]
        for version in range(rng.randint(1, 4)):
            episode = f"r{record}-v{version}"
            valid_at = None if rng.random() < 0.05 else datetime(
                2024, 1 + rng.randint(0, 5), 1 + version, tzinfo=UTC)
            rows.append({"group_id": group, "record": key, "episode_id": episode,
                         "valid_at": valid_at, "relation": None,
                         "tonight": rng.random() < 0.3})
            for relation, target in fields:
                rows.append({"group_id": group, "record": key, "episode_id": episode,
                             "valid_at": valid_at, "relation": relation,
                             "source_entity_id": subject, "target_entity_id": target,
                             "tonight": None})
            # the next version keeps a field, changes its value, or drops it
            fields = [(relation, rng.choice(TARGETS)) if roll < 0.3 else (relation, target)
                      for (relation, target), roll in
                      ((field, rng.random()) for field in fields) if roll < 0.8]
            fields += [(rng.choice(relations), rng.choice(TARGETS))] * (rng.random() < 0.3)
    statements = pa.Table.from_pylist(rows, schema=RESOLVED_STATEMENTS)
    want = _version_ends_by_rows(statements, config)
    assert len(want) > 20 and any(row["record_invalidated_by"] for row in want) and any(
        row["record_invalidated_by"] is None for row in want)
    assert version_ends(statements, config).to_pylist() == want
    assert version_ends(statements.slice(0, 0), config).num_rows == 0
