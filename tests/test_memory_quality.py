"""Memory you can trust, on the embedded default: real spaCy parses and the real MiniLM
classify relation phrases, and the invalidation rules end exactly the facts a reader would
end. No Ray: each storyline goes message -> extractor -> edges -> invalidate_subject."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.extract.base import EpisodeInput
from tkg.pipeline.extract.spacy_extractor import SpacyExtractor
from tkg.pipeline.facts import invalidate_subject, relation_class

CONFIG = TkgConfig()
SPEAKER = "Marcus Bell"


@pytest.fixture(scope="module")
def extractor() -> SpacyExtractor:
    return SpacyExtractor(CONFIG)


def day(month: int, date: int = 1) -> datetime:
    return datetime(2024, month, date, tzinfo=UTC)


def story(extractor: SpacyExtractor, messages: list[tuple[datetime, str]]) -> list[dict]:
    """The speaker's edges after invalidation, one per (relation, object), as the facts
    stage makes them (a fact without its own date holds from its message's time)."""
    episodes = [EpisodeInput(f"m{i}", "g", "message", text, when, speaker=SPEAKER)
                for i, (when, text) in enumerate(messages)]
    edges: dict[str, dict] = {}
    for episode, extraction in zip(episodes, extractor.extract(episodes), strict=True):
        assert extraction.error is None
        for fact in extraction.facts:
            if fact.source != SPEAKER:
                continue
            relation = relation_class(fact.relation, CONFIG.facts)[0]
            edge_id = f"{relation}:{fact.target}"
            edges.setdefault(edge_id, {
                "edge_id": edge_id, "source_entity_id": SPEAKER, "target_entity_id": fact.target,
                "relation": relation, "fact": fact.fact, "episode_ids": [episode.episode_id],
                "valid_at": fact.valid_at or episode.valid_at, "invalid_at": fact.invalid_at,
                "invalidated_by": None, "raw_relation": fact.relation})
    return invalidate_subject(list(edges.values()), CONFIG.facts)


def only(edges: list[dict], relation: str, target: str) -> dict:
    (found,) = [e for e in edges if e["relation"] == relation and e["target_entity_id"] == target]
    return found


@pytest.mark.parametrize("ending", [
    "I left Contoso.", "I quit Contoso.", "I retired from Contoso.",
    "I no longer work at Contoso.",
])
def test_each_ending_phrasing_ends_the_job(extractor, ending):
    edges = story(extractor, [(day(1), "I work at Contoso."), (day(3, 12), ending)])
    job = only(edges, "WORKS_AT", "Contoso")
    assert job["invalid_at"] == day(3, 12)
    assert job["invalidated_by"] is not None


def test_moving_out_ends_the_home_and_breaking_up_ends_the_relationship(extractor):
    edges = story(extractor, [
        (day(1), "I live in Denver."), (day(2), "I'm dating Jenna."),
        (day(5), "We moved out of Denver."), (day(6), "I broke up with Jenna."),
    ])
    assert only(edges, "LIVES_IN", "Denver")["invalid_at"] == day(5)
    assert only(edges, "PARTNER_OF", "Jenna")["invalid_at"] == day(6)


def test_ending_ends_only_the_fact_with_that_object(extractor):
    edges = story(extractor, [
        (day(1), "I live in Denver."), (day(1), "I work at Contoso."),
        (day(4), "I left Contoso."),
    ])
    assert only(edges, "WORKS_AT", "Contoso")["invalid_at"] == day(4)
    assert only(edges, "LIVES_IN", "Denver")["invalid_at"] is None


def test_a_job_change_worded_outside_the_synonyms_ends_the_old_job(extractor):
    edges = story(extractor, [
        (day(1), "I just started my new job at Contoso."),
        (day(6), "I accepted an offer from Fabrikam."),
    ])
    contoso, fabrikam = only(edges, "WORKS_AT", "Contoso"), only(edges, "WORKS_AT", "Fabrikam")
    synonyms = CONFIG.facts.relation_classes[1].synonyms
    assert contoso["raw_relation"] not in synonyms and fabrikam["raw_relation"] not in synonyms
    assert contoso["invalid_at"] == day(6)
    assert fabrikam["invalid_at"] is None


def test_meaning_classes_leave_trips_and_common_nouns_alone(extractor):
    edges = story(extractor, [
        (day(1), "I live in Denver."), (day(2), "I visited Paris."),
        (day(3), "I set up the meeting with Globex."),
    ])
    assert only(edges, "LIVES_IN", "Denver")["invalid_at"] is None
    assert not [e for e in edges if e["relation"] in ("LIVES_IN", "WORKS_AT")
                and e["target_entity_id"] in ("Paris", "meeting", "Globex")]


def test_a_title_change_ends_the_old_title(extractor):
    edges = story(extractor, [
        (day(1), "I work as a data engineer."),
        (day(7), "I was promoted to Senior Data Engineer."),
    ])
    assert only(edges, "WORKS_AS", "data engineer")["invalid_at"] == day(7)
    assert only(edges, "WORKS_AS", "Senior Data Engineer")["invalid_at"] is None


def test_titles_are_exclusive_per_employer():
    def edge(edge_id, relation, target, month, episode):
        return {"edge_id": edge_id, "target_entity_id": target, "relation": relation,
                "episode_ids": [episode], "valid_at": day(month), "invalid_at": None,
                "invalidated_by": None}

    edges = [edge("role1", "WORKS_AS", "engineer", 1, "a"),
             edge("job1", "WORKS_AT", "contoso", 1, "a"),
             edge("role2", "WORKS_AS", "advisor", 3, "b"),
             edge("board", "MEMBER_OF", "fabrikam", 3, "b"),  # no employer stated: scope unknown
             edge("role3", "WORKS_AS", "mentor", 5, "c"),
             edge("job3", "WORKS_AT", "fabrikam", 5, "c")]
    by_id = {e["edge_id"]: e for e in invalidate_subject(edges, CONFIG.facts)}
    assert by_id["role1"]["invalidated_by"] == "role2"  # an unscoped title replaces any
    assert by_id["role2"]["invalidated_by"] == "role3"
    contoso_only = [edge("r1", "WORKS_AS", "engineer", 1, "a"),
                    edge("j1", "WORKS_AT", "contoso", 1, "a"),
                    edge("r2", "WORKS_AS", "mentor", 5, "c"),
                    edge("j2", "WORKS_AT", "fabrikam", 5, "c")]
    ended = {e["edge_id"]: e for e in invalidate_subject(contoso_only, CONFIG.facts)}
    assert ended["j1"]["invalidated_by"] == "j2"
    # the mentor title is Fabrikam's, so it does not replace the engineer title at Contoso;
    # that title ends with the Contoso job
    assert ended["r1"]["invalid_at"] == day(5)
    assert ended["r1"]["invalidated_by"] == "j2"
    assert ended["r2"]["invalid_at"] is None


def test_facts_from_one_sentence_carry_only_their_own_text(extractor):
    edges = story(extractor, [(day(2, 5), "I live in Seattle with my partner Jenna.")])
    home = only(edges, "LIVES_IN", "Seattle")
    partner = only(edges, "LIVE_WITH", "partner")
    assert home["fact"] == "Marcus Bell: I live in Seattle."
    assert partner["fact"] == "Marcus Bell: I live with my partner Jenna."


def test_greetings_and_vocatives_are_not_entities(extractor):
    episode = EpisodeInput("m", "g", "message", "Hi Marcus, thanks Anna for the notes.",
                           day(1), speaker="Alice Chen")
    (extraction,) = extractor.extract([episode])
    assert [e.name for e in extraction.entities] == ["Alice Chen"]
