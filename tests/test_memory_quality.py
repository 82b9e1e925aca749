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


def test_an_announced_ending_ends_nothing_until_it_happens(extractor):
    edges = story(extractor, [
        (day(1), "I work at Contoso."), (day(5, 10), "I am leaving Contoso at the end of May."),
        (day(6), "I accepted an offer from Fabrikam."),
    ])
    assert only(edges, "WORKS_AT", "Contoso")["invalid_at"] == day(6)


def test_a_move_ends_what_was_said_about_the_old_place(extractor):
    edges = story(extractor, [
        (day(1), "I live in Berlin."), (day(2), "I can run the demo from Berlin."),
        (day(6), "I moved to Paris."),
    ])
    assert only(edges, "LIVES_IN", "Berlin")["invalid_at"] == day(6)
    assert only(edges, "RUN_DEMO_FROM", "Berlin")["invalid_at"] == day(6)
    assert only(edges, "LIVES_IN", "Paris")["invalid_at"] is None


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
    partner = only(edges, "LIVE_WITH_PARTNER", "Jenna")  # the name, not "partner" (issue 25)
    assert home["fact"] == "Marcus Bell lives in Seattle."
    assert partner["fact"] == "Marcus Bell lives with their partner Jenna."


def test_greetings_and_vocatives_are_not_entities(extractor):
    episode = EpisodeInput("m", "g", "message", "Hi Marcus, thanks Anna for the notes.",
                           day(1), speaker="Alice Chen")
    (extraction,) = extractor.extract([episode])
    assert [e.name for e in extraction.entities] == ["Alice Chen"]


# --- on the sample corpus (the session's corpus build) ----------------------------------


@pytest.fixture(scope="module")
def corpus_retriever(corpus_build):
    from tkg import query

    return query.open(corpus_build.snapshot.parent.parent)


def _entity(con, group: str, name: str) -> str:
    (entity_id,) = con.execute("SELECT entity_id FROM entities WHERE group_id = ? AND name = ?",
                               [group, name]).fetchone()
    return entity_id


def test_corpus_endings_end_the_right_fact(corpus_db, expected):
    for ending in expected["endings"]:
        group = ending["group_id"]
        rows = corpus_db.execute(
            "SELECT f.invalid_at, n.relation, n.episode_ids FROM facts_current f "
            "JOIN facts_current n ON n.edge_id = f.invalidated_by "
            "WHERE f.group_id = ? AND f.source_entity_id = ? AND f.target_entity_id = ? "
            "AND f.relation = ?", [group, _entity(corpus_db, group, ending["subject"]),
                                   _entity(corpus_db, group, ending["object"]),
                                   ending["relation"]]).fetchall()
        assert len(rows) == 1, ending
        (invalid_at, relation, episodes), = rows
        assert invalid_at.date().isoformat() == ending["invalid_at"]
        assert relation == CONFIG.facts.ending.relation
        (episode,) = corpus_db.execute("SELECT source_id FROM episodes WHERE episode_id = ?",
                                       [episodes[0]]).fetchone()
        assert episode == ending["ended_by"]


def test_corpus_facts_carry_their_own_text(corpus_db, expected):
    for case in expected["own_text"]:
        group = case["group_id"]
        texts = [t for (t,) in corpus_db.execute(
            "SELECT fact FROM facts_current WHERE group_id = ? AND source_entity_id = ? "
            "AND relation = ?", [group, _entity(corpus_db, group, case["subject"]),
                                 case["relation"]]).fetchall()]
        assert texts and not any(case["not_in_text"] in t for t in texts), (case, texts)


def test_a_person_in_a_record_and_in_the_chat_is_one_entity(corpus_db, expected):
    for case in expected["record_people"]:
        group = case["group_id"]
        entity = _entity(corpus_db, group, case["name"])
        (labels,) = corpus_db.execute("SELECT labels FROM entities WHERE entity_id = ?",
                                      [entity]).fetchone()
        assert list(labels) == ["Person"]
        sources = {s for (s,) in corpus_db.execute(
            "SELECT e.source_id FROM mentions m JOIN episodes e USING (episode_id) "
            "WHERE m.entity_id = ?", [entity]).fetchall()}
        assert {case["record"], *case["messages"]} <= sources
        assert not corpus_db.execute(
            "SELECT count(*) FROM entities WHERE group_id = ? AND name LIKE 'Employee %'",
            [group]).fetchone()[0]


def test_greetings_are_not_corpus_entities(corpus_db, expected):
    for group, names in expected["not_entities"].items():
        found = corpus_db.execute(
            f"SELECT name FROM entities WHERE group_id = ? AND name IN "
            f"({', '.join('?' * len(names))})", [group, *names]).fetchall()
        assert not found


def test_the_readme_query_puts_paris_first(corpus_retriever):
    result = corpus_retriever.search("Where does Daniel Okafor live?", ["acme"])
    assert "Paris" in result.facts[0].fact, [f.fact for f in result.facts]
    current = [f for f in result.facts if f.invalid_at is None]
    assert current and not any("Berlin" in f.fact for f in current)


AS_OF = [datetime(2024, month, 15, tzinfo=UTC) for month in (2, 4, 6, 8, 10)]
QUESTIONS = ["Where does Daniel Okafor live?", "Where does Marcus Bell work?",
             "What is Marcus Bell's title?", "Where does Maria Lopez work?",
             "Which school does Tom attend?", "Where does Helen Walker live?"]


def _moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize("as_of", AS_OF, ids=lambda t: t.date().isoformat())
def test_answers_at_a_time_are_about_that_time(corpus_retriever, as_of):
    """Every fact shown at T holds at T, no summary written later is shown, no line says
    "present" for a fact a later value of its relation replaced, no sentence twice; and the
    search at T answers (the checks below hold for an empty answer too): Daniel Okafor lived
    in Berlin until the summer of 2024 (2024-06-01), in Paris since."""
    from tkg.query.context import build_context

    lives = corpus_retriever.search(QUESTIONS[0], ["acme"], as_of=as_of, limit=20).facts
    city = "Berlin" if as_of < datetime(2024, 6, 1, tzinfo=UTC) else "Paris"
    assert any(f.relation == "LIVES_IN" and city in f.fact for f in lives), (
        as_of, [f.fact for f in lives])
    for question in QUESTIONS:
        for group in ("acme", "household"):
            result = corpus_retriever.search(question, [group], as_of=as_of, limit=20)
            for fact in result.facts:
                start, end = _moment(fact.valid_at), _moment(fact.invalid_at)
                assert start is None or start <= as_of, (question, fact.fact)
                assert end is None or end > as_of, (question, fact.fact)
            assert all(e.summary is None for e in result.entities)
            assert all(c.summary is None for c in result.communities)
            context = build_context(result, 4000)
            lines = [line for line in context.splitlines() if line.startswith("  - ")]
            assert len(lines) == len(set(lines))
            for fact in result.facts:
                later = [o for o in result.facts if o.source == fact.source
                         and o.relation == fact.relation and o.target != fact.target
                         and o.valid_at and fact.valid_at and o.valid_at > fact.valid_at]
                if later:
                    assert not [line for line in lines if line.startswith(f"  - {fact.fact} (")
                                and line.endswith("- present)")], (question, fact.fact)


def test_answers_now_keep_summaries(corpus_retriever):
    result = corpus_retriever.search("Daniel Okafor", ["acme"])
    assert any(e.summary for e in result.entities)
