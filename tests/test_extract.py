"""The embedded-default extractor on sentences whose outcome is known."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from tkg.pipeline.extract import EpisodeInput, build_extractor
from tkg.pipeline.extract.base import relation_name
from tkg.pipeline.extract.records import extract_record, label_of, record_text

T_REF = datetime(2024, 10, 11, 9, 35, tzinfo=UTC)


@pytest.fixture(scope="module")
def extractor(config):
    return build_extractor(config)


def run(extractor, content, speaker="Maria Lopez", kind="message"):
    episode = EpisodeInput("e1", "acme", kind, content, T_REF, speaker=speaker)
    return extractor.extract([episode])[0]


def triples(result):
    return {(f.source, f.relation, f.target) for f in result.facts}


def test_speaker_is_the_first_entity(extractor):
    result = run(extractor, "Sounds good, thanks!")
    assert result.entities[0].name == "Maria Lopez"
    assert result.entities[0].label == "Person"
    assert not result.facts


def test_first_person_is_the_speaker(extractor):
    result = run(extractor, "I work at Initech.")
    assert ("Maria Lopez", "WORK_AT", "Initech") in triples(result)


def test_relation_is_verb_lemma_and_preposition_with_dated_clause(extractor):
    result = run(extractor, "Daniel Okafor moved to Paris last summer.", speaker="Sam Patel")
    (fact,) = [f for f in result.facts if f.target == "Paris"]
    assert (fact.source, fact.relation) == ("Daniel Okafor", "MOVE_TO")
    assert fact.fact == "Daniel Okafor moved to Paris last summer."
    assert fact.valid_at == datetime(2024, 6, 1, tzinfo=UTC)
    assert fact.date_text == "last summer"
    names = [e.name for e in result.entities]
    assert names[0] == "Sam Patel" and "Daniel Okafor" in names and "Paris" in names
    assert not any("summer" in n for n in names)  # no dates as entities


def test_negation_is_part_of_the_relation(extractor):
    result = run(extractor, "Maria Lopez does not work at Initech.")
    assert ("Maria Lopez", "NOT_WORK_AT", "Initech") in triples(result)


def test_no_longer_states_an_end(extractor):
    result = run(extractor, "Maria Lopez no longer works at Initech.")
    assert ("Maria Lopez", "NO_LONGER_WORK_AT", "Initech") in triples(result)


def test_until_sets_the_end_of_a_fact(extractor):
    result = run(extractor, "I lived in Berlin until 2019.")
    (fact,) = [f for f in result.facts if f.target == "Berlin"]
    assert fact.invalid_at == datetime(2019, 1, 1, tzinfo=UTC)
    assert fact.valid_at is None


def test_text_episodes_have_no_speaker(extractor):
    result = run(extractor, "Robert Kim joined Globex in 2021.", speaker=None, kind="text")
    assert result.entities[0].name == "Robert Kim"
    (fact,) = result.facts
    assert (fact.source, fact.relation, fact.target) == ("Robert Kim", "JOIN", "Globex")
    assert fact.valid_at == datetime(2021, 1, 1, tzinfo=UTC)


def test_a_batch_keeps_order_and_mixes_kinds(extractor):
    episodes = [
        EpisodeInput("a", "g", "message", "I live in Lisbon.", T_REF, speaker="Ana"),
        EpisodeInput("b", "g", "json", json.dumps({"customer_id": "C-1", "name": "Globex"}),
                     T_REF, source="crm.customers"),
        EpisodeInput("c", "g", "text", "", T_REF),
    ]
    results = extractor.extract(episodes)
    assert len(results) == 3
    assert ("Ana", "LIVE_IN", "Lisbon") in triples(results[0])
    assert results[1].entities[0].name == "Globex"  # named by its name, known by its key
    assert json.loads(results[1].entities[0].attributes)["record"] == "Customer C-1"
    assert results[2].facts == []


def test_relation_names():
    assert relation_name("work", "at") == "WORK_AT"
    assert relation_name("NOT", "live", "in") == "NOT_LIVE_IN"
    assert relation_name("customerId") == "CUSTOMER_ID"
    assert relation_name("") == "RELATED_TO"


def test_record_mapping_links_by_key_and_keeps_attributes():
    data = {"ticket_id": "T-17", "customer_id": "C-001", "status": "open",
            "assignee": "Sam Patel", "priority": 2, "opened_at": "2024-04-02",
            "description": " ".join(["long"] * 40),
            "line_items": [{"sku": "A1", "qty": 2}]}
    episode = EpisodeInput("e", "acme", "json", json.dumps(data), T_REF,
                           source="support.tickets")
    result = extract_record(episode)
    assert result.entities[0].name == "Ticket T-17"
    assert result.entities[0].label == "Ticket"
    facts = {(f.source, f.relation, f.target) for f in result.facts}
    assert ("Ticket T-17", "CUSTOMER", "Customer C-001") in facts
    assert ("Ticket T-17", "STATUS", "open") in facts
    assert ("Ticket T-17", "ASSIGNEE", "Sam Patel") in facts
    assert ("Ticket T-17", "LINE_ITEMS", "Ticket T-17 LineItem 1") in facts
    item = next(e for e in result.entities if e.name == "Ticket T-17 LineItem 1")
    assert json.loads(item.attributes) == {"sku": "A1", "qty": 2}  # a code: no entity
    labels = {e.name: e.label for e in result.entities}
    assert labels["Sam Patel"] == "Person"
    attributes = json.loads(result.entities[0].attributes)
    assert attributes["priority"] == 2
    assert attributes["opened_at"] == "2024-04-02"
    assert attributes["description"].startswith("long")
    assert all(f.valid_at == T_REF for f in result.facts)


def test_a_references_text_is_named_after_resolution():
    """A reference's text calls its target by the key name, marked for the facts stage,
    which writes the resolved entity's name in its place (other facts pass as they are);
    its words drop the id word of the field (`reports_to_id` -> reports to)."""
    import pyarrow as pa
    from tkg.pipeline import schema
    from tkg.pipeline.config import FactsConfig
    from tkg.pipeline.extract.records import field_words
    from tkg.pipeline.facts import fact_mentions, fact_rows, name_targets

    assert [field_words(f, reference=True) for f in (
        "reports_to_id", "support_rep_id", "customer_id", "SupportRepId", "manager")] == [
        "reports to", "support rep", "customer", "support rep", "manager"]
    data = {"employee_id": 3, "first_name": "Jane", "last_name": "Peacock",
            "reports_to_id": 2, "city": "Calgary"}
    episode = EpisodeInput("e", "hr", "json", json.dumps(data), T_REF, source="hr.employees")
    facts = {f.relation: f for f in extract_record(episode).facts}
    assert (facts["REPORTS_TO"].fact, facts["REPORTS_TO"].target_by_key) == (
        "Jane Peacock: reports to ReportsTo 2", True)
    assert (facts["CITY"].fact, facts["CITY"].target_by_key) == ("Jane Peacock: city Calgary",
                                                                False)
    extraction = {"episode_id": "e", "group_id": "hr", "valid_at": T_REF,
                  "facts": [vars(f) for f in facts.values()]}
    mentions = fact_mentions(pa.Table.from_pylist([extraction], schema=schema.EXTRACTIONS))
    resolved = mentions.append_column("source_entity_id", pa.array(["jane"] * 2)) \
        .append_column("target_entity_id", pa.array(["nancy", "calgary"]))
    rows = fact_rows(resolved, FactsConfig())
    keyed = rows.filter(pa.array([key is not None for key in rows["target_key"].to_pylist()]))
    named = name_targets(keyed.append_column("target_name", pa.array(["Nancy Edwards"])))
    assert named["fact"].to_pylist() == ["Jane Peacock: reports to Nancy Edwards"]
    assert name_targets(keyed)["fact"].to_pylist() == ["Jane Peacock: reports to ReportsTo 2"]
    # extractions stored before the mark existed still read: no fact is marked
    old = pa.struct([f for f in schema.EXTRACTED_FACT if f.name != "target_by_key"])
    stored = pa.table({"facts": pa.array([extraction["facts"]], pa.list_(old))})
    conformed = schema.conform(stored, schema.EXTRACTIONS)
    assert [f["target_by_key"] for f in conformed["facts"][0].as_py()] == [None, None]


def test_record_without_key_uses_the_callers_id():
    episode = EpisodeInput("e", "g", "json", json.dumps({"note": "hi"}), T_REF,
                           source_id="rec-9", source="misc.events")
    assert extract_record(episode).entities[0].name == "Event rec-9"


def test_a_records_source_section_changes_how_its_records_map():
    """Issue 25: `"state": "AB"` became the relation STATUS and no config key changed how
    records map. Inferred, a short code is an attribute; `records.sources` sets the key,
    label, name, references, entity and attribute fields, dropped fields and relation names."""
    from tkg.pipeline.config import RecordsConfig

    data = {"staff_no": 3, "employee_id": 99, "firstname": "Jane", "lastname": "Peacock",
            "reports_to_id": 2, "state": "AB", "city": "Calgary", "phone": "+1 403 262 3443",
            "title": "Sales Support Agent"}
    episode = EpisodeInput("e", "hr", "json", json.dumps(data), T_REF, source="hr.staff")
    inferred = extract_record(episode)
    assert {e.name for e in inferred.entities} >= {"Jane Peacock", "Calgary"}
    assert "AB" not in {e.name for e in inferred.entities}
    assert not [f for f in inferred.facts if f.relation in ("STATUS", "STATE")]
    assert json.loads(inferred.entities[0].attributes)["state"] == "AB"
    configured = extract_record(episode, config=RecordsConfig.model_validate({"sources": {
        "hr.staff": {"key": "staff_no", "label": "Employee", "name_fields": ["lastname"],
                     "references": {"reports_to_id": "Employee"}, "entities": ["state"],
                     "attributes": ["city"], "drop": ["title", "employee_id"],
                     "relations": {"state": "IN_PROVINCE", "reports_to_id": "MANAGED_BY"}}}}))
    own = configured.entities[0]
    assert (own.name, own.label) == ("Peacock", "Person")  # an Employee record is a person
    assert triples(configured) == {("Employee 3", "MANAGED_BY", "Employee 2"),
                                   ("Employee 3", "IN_PROVINCE", "AB")}
    assert json.loads(own.attributes) == {"record": "Employee 3", "staff_no": 3,
                                          "firstname": "Jane", "city": "Calgary",
                                          "phone": "+1 403 262 3443"}


def test_labels_and_record_text():
    assert label_of("crm.customers") == "Customer"
    assert label_of("support.tickets") == "Ticket"
    assert label_of("line_items") == "LineItem"
    assert label_of("status") == "Status"
    assert record_text(json.dumps({"name": "Globex", "tags": ["a"], "x": {"city": "Paris"}})) \
        == "name Globex; tags a; city Paris"


def test_one_bad_episode_does_not_fail_the_batch(extractor):
    episodes = [
        EpisodeInput("a", "g", "json", "{not json", T_REF, source="s"),
        EpisodeInput("b", "g", "message", "I live in Lisbon.", T_REF, speaker="Ana"),
    ]
    bad, good = extractor.extract(episodes)
    assert bad.error and "extraction failed" in bad.error
    assert good.facts
