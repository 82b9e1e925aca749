"""Business records mapped as records, on the Chinook sample store (../shared/data): its
customers, employees and invoices built once, checked against the fixture's own keys."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import SHARED_DATA

FIXTURE = SHARED_DATA / "chinook_fixture.json"
MODELS = ("customer", "employee", "invoice")
# What inference cannot know: which record a Django foreign key points at (the README's
# example of a `records` section).
SOURCES = {
    "chinook.employees": {"references": {"reports_to_id": "Employee"}},
    "chinook.customers": {"references": {"support_rep_id": "Employee"}},
}
REFERENCES = {  # field -> (relation, label of the record it points at)
    "reports_to_id": ("REPORTS_TO", "Employee"), "support_rep_id": ("SUPPORT_REP", "Employee"),
    "customer_id": ("CUSTOMER", "Customer"),
}
pytestmark = pytest.mark.skipif(not FIXTURE.is_file(), reason="../shared/data is absent")


@pytest.fixture(scope="module")
def chinook(ray_session, config, tmp_path_factory):
    from tkg.pipeline.build import build

    from tests.converters import chinook_to_episodes, write_jsonl

    records = chinook_to_episodes(FIXTURE, MODELS)
    folder = tmp_path_factory.mktemp("chinook")
    inputs = write_jsonl(records, folder / "chinook.jsonl")
    configured = config.model_copy(update={"records": config.records.model_validate(
        {"sources": SOURCES})})
    result = build(configured, [str(inputs)], folder / "store")
    return records, result


@pytest.fixture(scope="module")
def catalog(chinook):
    from tkg.pipeline import store

    with store.open_catalog(chinook[1].snapshot) as con:
        yield con


def _record_entities(catalog) -> dict[str, tuple[str, str]]:
    """key name ("Employee 2") -> (entity id, name) of every record's entity."""
    rows = catalog.execute("SELECT entity_id, name, attributes FROM entities "
                           "WHERE group_id = 'chinook'").fetchall()
    found = {}
    for entity_id, name, attributes in rows:
        record = json.loads(attributes or "{}").get("record")
        if record:
            found[record] = (entity_id, name)
    return found


def test_every_record_is_one_entity(chinook, catalog):
    _, result = chinook
    assert result.summary["rejected"] == 0
    by_label: dict[str, int] = {}
    for record in _record_entities(catalog):
        label = record.split()[0]
        by_label[label] = by_label.get(label, 0) + 1
    assert by_label == {"Employee": 8, "Customer": 59, "Invoice": 412}
    names = {name for _, name in _record_entities(catalog).values()}
    assert {"Andrew Adams", "Nancy Edwards", "Jane Peacock", "Luís Gonçalves"} <= names


def test_reference_edges_match_the_fixture_keys(chinook, catalog):
    records, _ = chinook
    entities = _record_entities(catalog)
    expected = set()
    for record in records:
        data = record["data"]
        model = record["id"].split("-")[0]  # the converter's `<model>-<pk>`
        source = entities[f"{model.capitalize()} {data[f'{model}_id']}"][0]
        for field, (relation, label) in REFERENCES.items():
            if field != f"{model}_id" and data.get(field) is not None:  # not its own key
                expected.add((source, relation, entities[f"{label} {data[field]}"][0]))
    relations = tuple(relation for relation, _ in REFERENCES.values())
    found = set(catalog.execute(
        f"SELECT source_entity_id, relation, target_entity_id FROM facts WHERE group_id = "
        f"'chinook' AND relation IN {relations}").fetchall())
    recall = len(found & expected) / len(expected)
    precision = len(found & expected) / len(found)
    assert (recall, precision) == (1.0, 1.0), (len(expected), len(found))


def test_scalars_are_attributes_not_entities(chinook, catalog):
    records, _ = chinook
    scalars = {str(record["data"][field]).casefold() for record in records
               for field in ("phone", "fax", "postalcode", "billingpostalcode", "email")
               if record["data"].get(field)}
    names = {name.casefold() for (name,) in catalog.execute(
        "SELECT name FROM entities WHERE group_id = 'chinook'").fetchall()}
    assert not names & scalars
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
