"""The Chinook sample store (../shared/data/chinook_fixture.json) as business records, and
how well a built store maps them: one place for the records test
(tests/test_records_chinook.py) and `tkg bench graph`.

The fixture is a Django dump (`model`, `pk`, `fields`); each row becomes a `json` episode
whose foreign keys are `<field>_id` fields, the key field form records are mapped by
(pipeline/extract/records.py). Every figure is checked against the fixture's own keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GROUP = "chinook"
MODELS = ("customer", "employee", "invoice")
# Django foreign keys (each holds the pk of another record) -> `<field>_id`.
FOREIGN_KEYS = {"customer", "artist", "album", "support_rep", "reports_to", "genre",
                "mediatype", "invoice", "track", "playlist"}
DATES = ("invoicedate", "hiredate")
UNDATED = "2007-01-01T00:00:00Z"  # the fixture's first invoice day: employees and customers
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


def to_episodes(path: Path, models: tuple[str, ...] = MODELS, group_id: str = GROUP
                ) -> list[dict]:
    """Chinook fixture rows of the given models -> JSON business records."""
    records = []
    for item in json.loads(Path(path).read_text()):
        model = item["model"].split(".")[-1]
        if model not in models:
            continue
        data = {f"{model}_id": item["pk"]}
        for key, value in item["fields"].items():
            data[f"{key}_id" if key in FOREIGN_KEYS and value is not None else key] = value
        when = next((item["fields"][k] for k in DATES if item["fields"].get(k)), UNDATED)
        records.append({
            "group_id": group_id, "id": f"{model}-{item['pk']}", "kind": "json",
            "timestamp": when, "source": f"chinook.{model}s", "data": data,
        })
    return records


def records_config(config: Any) -> Any:
    """`config` with the chinook `records` section (SOURCES) added."""
    return config.model_copy(update={"records": config.records.model_validate(
        {**config.records.model_dump(), "sources": {**config.records.sources, **SOURCES}})})


def record_entities(con: Any, group_id: str = GROUP) -> dict[str, tuple[str, str]]:
    """key name ("Employee 2") -> (entity id, name) of every record's entity."""
    from tkg.pipeline.schema import RECORD_ATTRIBUTE

    rows = con.execute("SELECT entity_id, name, attributes FROM entities WHERE group_id = ?",
                       [group_id]).fetchall()
    found = {}
    for entity_id, name, attributes in rows:
        record = json.loads(attributes or "{}").get(RECORD_ATTRIBUTE)
        if record:
            found[record] = (entity_id, name)
    return found


def records_by_label(con: Any, group_id: str = GROUP) -> dict[str, int]:
    """Record entities per label (the first word of the key name: `Employee 2`)."""
    counts: dict[str, int] = {}
    for record in record_entities(con, group_id):
        label = record.split()[0]
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))


def reference_edges(records: list[dict], con: Any, group_id: str = GROUP
                    ) -> dict[str, Any]:
    """The reference edges (REFERENCES) the store holds against those the fixture's keys
    imply: expected, found, recall, precision, overall and per relation."""
    entities = record_entities(con, group_id)
    expected: set[tuple[str, str, str]] = set()
    missing_records = 0
    for record in records:
        data = record["data"]
        model = record["id"].split("-")[0]  # the converter's `<model>-<pk>`
        source = entities.get(_key_name(record))
        for field, (relation, label) in REFERENCES.items():
            if field == f"{model}_id" or data.get(field) is None:  # its own key, or unset
                continue
            target = entities.get(f"{label} {data[field]}")
            if source is None or target is None:
                missing_records += 1
                continue
            expected.add((source[0], relation, target[0]))
    relations = [relation for relation, _ in REFERENCES.values()]
    found = set(con.execute(
        "SELECT DISTINCT source_entity_id, relation, target_entity_id FROM facts "
        "WHERE group_id = ? AND list_contains(?, relation)", [group_id, relations]).fetchall())
    figures = {"overall": _recall_precision(expected, found),
               "missing_record_entities": missing_records}
    for relation in relations:
        figures[relation] = _recall_precision({e for e in expected if e[1] == relation},
                                              {f for f in found if f[1] == relation})
    return figures


def _recall_precision(expected: set, found: set) -> dict[str, Any]:
    hit = len(expected & found)
    return {"expected": len(expected), "found": len(found),
            "recall": round(hit / len(expected), 4) if expected else None,
            "precision": round(hit / len(found), 4) if found else None}


def attribute_only_entities(records: list[dict], con: Any, group_id: str = GROUP
                            ) -> list[str]:
    """Entities named by a value that the input holds only in fields the store keeps as
    attributes of their record's entity or in a field naming it (a phone, a postal code, a
    first name): what a record mapped as text makes an entity of. A value some record maps
    to an edge (Dublin, one customer's state and another's city; a company name short
    enough to be an entity) is a fine entity."""
    from tkg.pipeline.schema import RECORD_ATTRIBUTE

    kept: dict[str, tuple[set[str], str]] = {}  # key name -> (attribute fields, name)
    for name, attributes in con.execute(
            "SELECT name, attributes FROM entities WHERE group_id = ?", [group_id]).fetchall():
        fields = json.loads(attributes or "{}")
        if fields.get(RECORD_ATTRIBUTE):
            kept[fields[RECORD_ATTRIBUTE]] = (set(fields) - {RECORD_ATTRIBUTE},
                                              name.casefold())
    mapped_otherwise: set[str] = set()  # values some record maps to an edge
    held: set[str] = set()
    for record in records:
        attributes, name = kept.get(_key_name(record), (set(), ""))
        for field, value in record["data"].items():
            if isinstance(value, str | int) and str(value).strip():
                folded = str(value).strip().casefold()
                held.add(folded)
                # a name field's part (a first name) is the record's, as its attributes are
                if field not in attributes and folded not in name.split():
                    mapped_otherwise.add(folded)
    names = con.execute("SELECT name FROM entities WHERE group_id = ?", [group_id]).fetchall()
    return sorted(name for (name,) in names
                  if name.strip().casefold() in held - mapped_otherwise)


def _key_name(record: dict) -> str:
    """The key name of a converted record (`<model>-<pk>` -> `Customer 5`)."""
    model = record["id"].split("-")[0]
    return f"{model.capitalize()} {record['data'][f'{model}_id']}"
