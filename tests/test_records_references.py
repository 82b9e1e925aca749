"""A reference field's fact names the referenced record by its name, whichever run brought
that record: extracted, its text calls the target by the key name ("Employee 2"), and the
facts stage writes the resolved entity's name in its place; a record that never arrives
keeps its key name. Two tiny runs into one store, in the driver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tkg.pipeline import store
from tkg.pipeline.build import BuildResult, build

GROUP = "hr"


def _record(id_: str, source: str, data: dict) -> dict:
    return {"group_id": GROUP, "id": id_, "kind": "json", "timestamp": "2024-03-01T09:00:00Z",
            "source": source, "data": data}


JANE = _record("e3", "hr.employees", {"employee_id": 3, "first_name": "Jane",
                                      "last_name": "Peacock", "reports_to_id": 2})
# customer_id is inferred (a Customer); Customer 5 never arrives
INVOICE = _record("i7", "hr.invoices", {"invoice_id": 7, "customer_id": 5, "total": 3.96})
NANCY = _record("e2", "hr.employees", {"employee_id": 2, "first_name": "Nancy",
                                       "last_name": "Edwards"})


def _write(folder: Path, records: tuple[dict, ...]) -> str:
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


@pytest.fixture(scope="module")
def runs(ray_session, config, tmp_path_factory) -> list[BuildResult]:
    """Run 1: Jane's record (referring to Employee 2) and an invoice; run 2, on the same
    store: Employee 2's record."""
    records = config.records.model_validate({**config.records.model_dump(), "sources": {
        "hr.employees": {"references": {"reports_to_id": "Employee"}}}})
    config = config.model_copy(update={"records": records})
    root = tmp_path_factory.mktemp("references")
    return [build(config, [_write(root / f"in{i}", part)], root / "store", run_id=f"r{i}")
            for i, part in enumerate(((JANE, INVOICE), (NANCY,)), start=1)]


def _facts(result: BuildResult) -> list[tuple]:
    with store.open_catalog(result.snapshot) as con:
        return sorted(con.execute(
            "SELECT f.relation, o.name, f.fact FROM facts f JOIN entities o ON o.entity_id = "
            "f.target_entity_id WHERE f.group_id = ? AND f.expired_at IS NULL AND f.relation "
            "IN ('REPORTS_TO', 'CUSTOMER')", [GROUP]).fetchall())


def test_a_reference_is_named_once_its_record_arrives(runs):
    first, second = runs
    assert _facts(first) == [("CUSTOMER", "Customer 5", "Invoice 7: customer Customer 5"),
                             ("REPORTS_TO", "Employee 2", "Jane Peacock: reports to Employee 2")]
    assert _facts(second) == [  # renamed by the run that brought the record; Customer 5 never
        ("CUSTOMER", "Customer 5", "Invoice 7: customer Customer 5"),
        ("REPORTS_TO", "Nancy Edwards", "Jane Peacock: reports to Nancy Edwards")]
    with store.open_catalog(second.snapshot) as con:
        versions = con.execute(
            "SELECT version, fact, expired_at IS NOT NULL, fact_embedding FROM facts "
            "WHERE group_id = ? AND relation = 'REPORTS_TO' ORDER BY version",
            [GROUP]).fetchall()
        summary = con.execute("SELECT summary FROM entities WHERE group_id = ? AND name = "
                              "'Nancy Edwards'", [GROUP]).fetchone()[0]
    assert [v[:3] for v in versions] == [(1, "Jane Peacock: reports to Employee 2", True),
                                         (2, "Jane Peacock: reports to Nancy Edwards", False)]
    assert versions[0][3] != versions[1][3]  # the new text is embedded, not carried
    assert "Jane Peacock: reports to Nancy Edwards." in summary and "Employee" not in summary


def test_record_names_are_the_entities_keyed_as_a_record() -> None:
    """An entity is a record's when its attributes carry the record key, not when a value
    of another attribute merely reads "record"."""
    import pyarrow as pa
    from tkg.pipeline.extract import records

    entities = pa.table({
        "group_id": ["g"] * 4, "entity_id": ["a", "b", "c", "d"],
        "name": ["Nancy Edwards", "Jane Peacock", "Acme", "Bob"],
        "attributes": [json.dumps({"record": "Employee 2", "title": "Manager"}),
                       json.dumps({"kind": "record"}), None, json.dumps({"record": ""})]})
    assert records.record_names(entities)["entity_id"].to_pylist() == ["a"]
