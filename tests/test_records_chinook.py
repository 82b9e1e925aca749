"""Business records mapped as records, on the Chinook sample store (../shared/data): its
customers, employees and invoices built once (in the store of the tiny graph bench,
tests/graph_store.py, in a group of their own), checked against the fixture's own keys."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

FIXTURE = SHARED_DATA / "chinook_fixture.json"
pytestmark = pytest.mark.skipif(not FIXTURE.is_file(), reason="../shared/data is absent")


@pytest.fixture(scope="module")
def chinook(ray_session, config, tmp_path_factory):
    """The records and the build that holds them (records_config, as the bench builds)."""
    from tkg.jobs.bench.chinook import to_episodes
    from tkg.pipeline import store
    from tkg.pipeline.build import BuildResult

    from tests.graph_store import tiny_graph

    snapshot = store.current_snapshot(Path(tiny_graph(config, tmp_path_factory)["store"]))
    result = BuildResult(summary=store.read_manifest(snapshot)["summary"], snapshot=snapshot)
    return to_episodes(FIXTURE), result


@pytest.fixture(scope="module")
def catalog(chinook):
    from tkg.pipeline import store

    with store.open_catalog(chinook[1].snapshot) as con:
        yield con


def test_every_record_is_one_entity(chinook, catalog):
    from tkg.jobs.bench.chinook import record_entities, records_by_label

    _, result = chinook
    assert result.summary["rejected"] == 0
    assert records_by_label(catalog) == {"Customer": 59, "Employee": 8, "Invoice": 412}
    names = {name for _, name in record_entities(catalog).values()}
    assert {"Andrew Adams", "Nancy Edwards", "Jane Peacock", "Luís Gonçalves"} <= names
    # an employee is a Person, however often others' records refer to it as Employee
    employees = [entity for key, (entity, _) in record_entities(catalog).items()
                 if key.startswith("Employee ")]
    labels = catalog.execute(
        f"SELECT name, labels FROM entities WHERE entity_id IN "
        f"({', '.join('?' * len(employees))})", employees).fetchall()
    assert len(labels) == 8 and all(list(found) == ["Person"] for _, found in labels), labels


def test_reference_edges_match_the_fixture_keys(chinook, catalog):
    from tkg.jobs.bench.chinook import reference_edges

    records, _ = chinook
    edges = reference_edges(records, catalog)
    assert edges["missing_record_entities"] == 0
    assert {relation: (e["expected"], e["recall"], e["precision"]) for relation, e in
            edges.items() if relation != "missing_record_entities"} == {
        "overall": (478, 1.0, 1.0), "REPORTS_TO": (7, 1.0, 1.0),
        "SUPPORT_REP": (59, 1.0, 1.0), "CUSTOMER": (412, 1.0, 1.0)}
    # every referenced record arrived: no reference's text names it by its key name
    texts = [fact for (fact,) in catalog.execute(
        "SELECT fact FROM facts WHERE group_id = 'chinook' AND relation IN ('REPORTS_TO', "
        "'SUPPORT_REP', 'CUSTOMER')").fetchall()]
    assert len(texts) == 478 and not [t for t in texts if re.search(
        r"\b(Employee|Customer) \d+$|\bid\b", t)], texts[:5]


def test_scalars_are_attributes_not_entities(chinook, catalog):
    records, _ = chinook
    scalars = {str(record["data"][field]).casefold() for record in records
               for field in ("phone", "fax", "postalcode", "billingpostalcode", "email")
               if record["data"].get(field)}
    names = {name.casefold() for (name,) in catalog.execute(
        "SELECT name FROM entities WHERE group_id = 'chinook'").fetchall()}
    assert not names & scalars
    from tkg.jobs.bench.chinook import attribute_only_entities

    assert attribute_only_entities(records, catalog) == []
    assert not [n for n in names if re.fullmatch(r"[+\d\s().-]{7,}", n)]  # no phone number
    andrew = json.loads(catalog.execute(
        "SELECT attributes FROM entities WHERE name = 'Andrew Adams'").fetchone()[0])
    assert andrew["phone"] == "+1 (780) 428-9482" and andrew["postalcode"] == "T5K 2N1"


def test_who_jane_peacock_reports_to_is_found_by_search(chinook):
    from tkg import query

    retriever = query.open(chinook[1].snapshot.parent.parent)
    result = retriever.search("Who does Jane Peacock report to?", ["chinook"], limit=5)
    assert any(f.source == "Jane Peacock" and f.relation == "REPORTS_TO"
               and f.target == "Nancy Edwards" for f in result.facts), [
        (f.source, f.relation, f.target) for f in result.facts]
    # its text names the record it refers to, not the key name the reference carried
    top = next(f for f in result.facts if f.relation == "REPORTS_TO")
    assert top.fact == "Jane Peacock: reports to Nancy Edwards", top.fact
