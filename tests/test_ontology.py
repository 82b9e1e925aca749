"""Declared types (`ontology`): they guide the spaCy path's labels and relation classes and
the LLM prompt alike; relation types are relation classes (one rule for both)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml
from tkg.pipeline.config import ConfigError, TkgConfig, load_config
from tkg.pipeline.extract.base import EpisodeInput
from tkg.pipeline.extract.spacy_extractor import SpacyExtractor
from tkg.pipeline.facts import relation_class
from tkg.pipeline.llm.prompting import extraction_request

ONTOLOGY = {
    "entity_types": [
        {"name": "Company", "description": "a business that employs people", "ner": ["ORG"],
         "attributes": ["industry", "headquarters"], "name_words": ["labs"]},
        {"name": "School", "description": "a school or university",
         "name_words": ["elementary", "academy", "university"]},
    ],
    "relation_types": [
        {"name": "employment", "relation": "WORKS_AT", "target_types": ["Company"],
         "synonyms": ["WORK_AT", "WORK_FOR", "JOIN"], "exclusive": True},
        {"name": "sponsorship", "relation": "SPONSORS", "synonyms": ["SPONSOR", "FUND"],
         "source_types": ["Company"], "exclusive": False,
         "description": "pays for an event or team"},
    ],
}
WHEN = datetime(2024, 5, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def config() -> TkgConfig:
    return TkgConfig.model_validate({"ontology": ONTOLOGY})


def test_relation_types_are_relation_classes(config):
    classes = {c.name: c for c in config.facts.relation_classes}
    assert classes["employment"].target_types == ("Company",)  # replaced by name
    assert classes["employment"].synonyms == ("WORK_AT", "WORK_FOR", "JOIN")
    assert classes["sponsorship"].exclusive is False  # added
    assert "residence" in classes  # the others kept
    assert relation_class("FUND", config.facts)[0] == "SPONSORS"
    assert relation_class("JOIN", config.facts)[1].exclusive is True
    assert TkgConfig.model_validate(config.model_dump()) == config  # merging is idempotent


def test_ontology_from_yaml(tmp_path):
    path = tmp_path / "tkg.yaml"
    path.write_text(yaml.safe_dump({"ontology": ONTOLOGY}))
    assert load_config(path).ontology.entity_types[0].attributes == ("industry", "headquarters")
    path.write_text(yaml.safe_dump({"ontology": {"entity_types": [{"nam": "X"}]}}))
    with pytest.raises(ConfigError, match=r"ontology\.entity_types"):
        load_config(path)


def test_declared_types_label_the_spacy_path(config):
    extractor = SpacyExtractor(config)

    def labels(speaker: str, text: str) -> dict[str, str]:
        episode = EpisodeInput("e", "g", "message", text, WHEN, speaker=speaker)
        return {e.name: e.label for e in extractor.extract([episode])[0].entities}

    assert labels("Sam Patel", "I joined Initech in March.")["Initech"] == "Company"
    assert labels("Maria Lopez", "My kids go to Riverside Elementary.")[
        "Riverside Elementary"] == "School"
    # outside the declared types, the built-in ones keep their names
    assert labels("Daniel Okafor", "I moved to Lisbon last spring.")["Lisbon"] == "Location"


def test_declared_types_guide_the_llm_prompt(config):
    episode = EpisodeInput("e", "g", "message", "I joined Contoso.", WHEN, speaker="Sam")
    system = extraction_request(episode, 4, config.facts, config.ontology).messages[0]["content"]
    assert "  - Company: a business that employs people (attributes: industry, headquarters)" \
        in system
    assert "  - School: a school or university" in system
    assert "  - Person: " in system  # the built-in types follow the declared ones
    assert "  - WORKS_AT (employment; to Company; one at a time)" in system
    assert "  - SPONSORS (sponsorship; pays for an event or team; from Company)" in system
    default = extraction_request(episode, 4).messages[0]["content"]
    assert "Company" not in default and "  - WORKS_AT (employment; to Organization" in default


def test_an_unknown_endpoint_type_is_a_clear_error():
    config = TkgConfig.model_validate({"ontology": {"relation_types": [
        {"name": "ownership", "relation": "OWNS", "target_types": ["Vehicle"]}]}})
    with pytest.raises(ValueError, match=r"'ownership' names entity types \['Vehicle'\]"):
        SpacyExtractor(config)


def test_the_llm_answers_attributes_of_declared_types(config):
    """The schema asks for each entity's attribute pairs; they become its attributes."""
    from tkg.pipeline.llm.parse import parse_extraction
    from tkg.pipeline.llm.schemas import EXTRACTION_SCHEMA

    entity = EXTRACTION_SCHEMA["properties"]["entities"]["items"]
    assert entity["required"] == ["name", "label", "attributes"]
    episode = EpisodeInput("e", "g", "message", "Contoso, a fintech in Oslo, hired me.", WHEN,
                           speaker="Sam")
    answer = ('{"entities": [{"name": "Contoso", "label": "Company", "attributes": ['
              '{"name": "industry", "value": "fintech"}, {"name": "headquarters", '
              '"value": "Oslo"}, {"name": "", "value": "x"}]}, {"name": "Oslo", "label": '
              '"Location"}], "facts": []}')
    found, _ = parse_extraction(answer, episode)
    by_name = {e.name: e for e in found.entities}
    assert by_name["Contoso"].attributes == '{"headquarters": "Oslo", "industry": "fintech"}'
    assert by_name["Oslo"].attributes is None
    system = extraction_request(episode, 4, config.facts, config.ontology).messages[0]["content"]
    assert '`attributes`: the values the episode states' in system
