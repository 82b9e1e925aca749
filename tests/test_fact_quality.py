"""Facts that state one thing in one sentence (issue 25), on the embedded default: real
spaCy parses and the real MiniLM relation classifier, each case with its exact outcome.
No Ray: message -> extractor -> edges -> invalidate_subject, as the facts stage does it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.extract.base import EpisodeInput
from tkg.pipeline.extract.fact_rules import Voices, addressee_of
from tkg.pipeline.extract.spacy_extractor import SpacyExtractor
from tkg.pipeline.facts import invalidate_subject, relation_class

CONFIG = TkgConfig()
T_REF = datetime(2024, 5, 8, 14, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def extractor() -> SpacyExtractor:
    return SpacyExtractor(CONFIG)


def facts(extractor, content: str, speaker: str | None = "Melanie",
          context: tuple[str, ...] = ()) -> list[tuple[str, str, str, str]]:
    episode = EpisodeInput("e", "g", "message" if speaker else "text", content, T_REF,
                           speaker=speaker, context=context)
    (extraction,) = extractor.extract([episode])
    assert extraction.error is None
    return [(f.source, f.relation, f.target, f.fact) for f in extraction.facts]


def day(month: int, date: int = 1) -> datetime:
    return datetime(2024, month, date, tzinfo=UTC)


def story(extractor, speaker: str, messages: list[tuple[datetime, str]]) -> list[dict]:
    """The edges of every subject after invalidation, one per (subject, relation, object)."""
    episodes = [EpisodeInput(f"m{i}", "g", "message", text, when, speaker=speaker)
                for i, (when, text) in enumerate(messages)]
    edges: dict[str, dict] = {}
    for episode, extraction in zip(episodes, extractor.extract(episodes), strict=True):
        for fact in extraction.facts:
            relation = relation_class(fact.relation, CONFIG.facts)[0]
            edge_id = f"{fact.source}:{relation}:{fact.target}"
            edges.setdefault(edge_id, {
                "edge_id": edge_id, "source_entity_id": fact.source,
                "target_entity_id": fact.target, "relation": relation, "fact": fact.fact,
                "episode_ids": [episode.episode_id],
                "valid_at": fact.valid_at or episode.valid_at, "invalid_at": fact.invalid_at,
                "invalidated_by": None})
    out = []
    for subject in sorted({e["source_entity_id"] for e in edges.values()}):
        out += invalidate_subject([e for e in edges.values()
                                   if e["source_entity_id"] == subject], CONFIG.facts)
    return out


def only(edges: list[dict], relation: str, target: str) -> dict:
    (found,) = [e for e in edges if e["relation"] == relation and e["target_entity_id"] == target]
    return found


# --- third person, complete ---------------------------------------------------------------


def test_a_fact_keeps_what_completes_its_object(extractor):
    # was "Painting's a fun way." (the object's complement cut off)
    assert facts(extractor, "Thanks, Caroline! Painting's a fun way to express my feelings "
                 "and get creative.") == [
        ("Melanie", "BE_FUN_WAY", "Melanie",  # a kind of thing is no entity: Melanie's claim
         "Painting's a fun way to express Melanie's feelings and get creative.")]


def test_a_subject_no_rule_can_resolve_gives_no_fact(extractor):
    # was "Their inclusivity spoke to me."
    assert facts(extractor, "Their inclusivity spoke to me.") == []


def test_no_fact_without_a_finite_verb(extractor):
    # was also "Caroline: I playing my violin." (a gerund of a list cut from its verb)
    assert facts(extractor, "So I'm carving out some me-time each day - running, reading, "
                 "or playing my violin - which refreshes me!") == [
        ("Melanie", "CARVE_OUT_TIME", "Melanie", "Melanie is carving out time each day - running, "
         "reading, or playing their violin - which refreshes Melanie.")]


def test_a_misparsed_coordination_is_no_claim(extractor):
    # was also "Tania Tetlow: we have nots." ("the haves and have nots" read as a verb)
    found = facts(extractor, "We've really ratcheted up the cleaving between the haves and "
                  "have nots and that gets worse and worse.", speaker="Tania Tetlow")
    assert found == [("Tania Tetlow", "RATCHET_UP_CLEAVING_BETWEEN_HAVE", "Tania Tetlow",
                      "Tania Tetlow has really ratcheted up the cleaving between the haves.")]


def test_a_list_of_names_is_one_fact_each(extractor):
    # was "Our staff includes Alina Coleman Augusta Chapman Eleanor Osborne ..."
    found = facts(extractor, "Our staff also includes Alina Coleman, Augusta Chapman.",
                  speaker="Stephen Dubner")
    assert found == [
        ("Stephen Dubner", "INCLUDE", "Alina Coleman",
         "Stephen Dubner's staff also includes Alina Coleman."),
        ("Stephen Dubner", "INCLUDE", "Augusta Chapman",
         "Stephen Dubner's staff also includes Augusta Chapman.")]


def test_names_listed_before_one_noun_are_one_fact_each(extractor):
    # was one fact, Initech's: both texts were the whole sentence, and a text is kept once
    found = facts(extractor, "I handle the Initech and Globex accounts.", speaker="Sam Patel")
    assert found == [
        ("Sam Patel", "HANDLE_ACCOUNT", "Initech", "Sam Patel handles the Initech accounts."),
        ("Sam Patel", "HANDLE_ACCOUNT", "Globex", "Sam Patel handles the Globex accounts.")]


def test_the_speaker_is_named_and_the_verb_agrees(extractor):
    # a fact about one entity: its object is a kind of thing, named in the relation
    assert facts(extractor, "I create a daily schedule to stay organized.") == [
        ("Melanie", "CREATE_DAILY_SCHEDULE", "Melanie",
         "Melanie creates a daily schedule to stay organized.")]


def test_you_is_the_last_other_speaker(extractor):
    assert addressee_of("Melanie", ("Melanie: hi", "Caroline: hey", "Melanie: so")) == \
        "Caroline"
    assert Voices("Melanie", None).addressee is None
    found = facts(extractor, "You inspired me to paint again.",
                  context=("Caroline: I painted a mural.",))
    assert found == [("Caroline", "INSPIRE", "Melanie", "Caroline inspired Melanie to paint "
                      "again.")]


def test_a_claim_without_an_object_is_a_fact_about_its_speaker(extractor):
    assert facts(extractor, "Fitness goals have been hard to reach, but hey, that's life!") \
        == [("Melanie", "BE_FITNESS_GOAL", "Melanie",
             "Melanie says fitness goals have been hard to reach.")]
    assert facts(extractor, "Still working on my biz. Took a short trip last week to Rome.") \
        == [("Melanie", "WORK_BIZ", "Melanie", "Melanie is still working on their biz."),
            ("Melanie", "TAKE", "Rome", "Melanie took a short trip last week to Rome.")]


def test_questions_greetings_and_thanks_state_nothing(extractor):
    assert facts(extractor, "Did you finish the report? Thanks, Caroline!") == []


def entities(extractor, content: str, speaker: str | None = "Melanie",
             context: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    episode = EpisodeInput("e", "g", "message" if speaker else "text", content, T_REF,
                           speaker=speaker, context=context)
    (extraction,) = extractor.extract([episode])
    return [(e.name, e.label) for e in extraction.entities]


def test_a_message_mentions_whom_it_speaks_to(extractor):
    said = ("Caroline: I made a bowl in class.",)
    assert ("Caroline", "Person") in entities(extractor, "Your bowl is lovely!", context=said)
    assert ("Caroline", "Person") in entities(extractor, "Hey Caroline! Lovely.", context=said)
    assert entities(extractor, "I went for a run this morning.", context=said) == [
        ("Melanie", "Person")]
    # a name called out in a text without speakers is still no entity ("Quick, Dorothy")
    assert "Dorothy" not in {n for n, _ in entities(
        extractor, "Quick, Dorothy, run to the cellar!", speaker=None)}


def test_claims_about_one_entity_are_one_fact_each():
    import pyarrow as pa
    from tkg.pipeline import schema
    from tkg.pipeline.facts import fact_rows, merge_facts

    def mention(episode: str, fact: str, source: str = "sam", target: str = "sam") -> dict:
        return {"group_id": "g", "episode_id": episode, "source_entity_id": source,
                "target_entity_id": target, "source_normalized": source,
                "target_normalized": target, "relation": "MEAN_LOT", "fact": fact,
                "valid_at": T_REF, "invalid_at": None}

    rows = pa.Table.from_pylist([
        mention("e1", "Sam says Evan's encouragement means a lot."),
        mention("e2", "Sam says the trip meant a lot."),
        mention("e3", "sam says Evan's encouragement means a lot."),  # the first, said again
        mention("e4", "Sam: Evan means a lot.", target="evan"),
        mention("e5", "Sam: Evan meant a lot.", target="evan")])
    merged = merge_facts(fact_rows(rows, CONFIG.facts), T_REF).to_pylist()
    by_text = {e["fact"]: e["episode_ids"] for e in merged}
    assert by_text == {"Sam says Evan's encouragement means a lot.": ["e1", "e3"],
                       "Sam says the trip meant a lot.": ["e2"],
                       # an edge between two entities is one whatever its wording
                       "Sam: Evan means a lot.": ["e4", "e5"]}, by_text
    assert {r.name for r in schema.FACT_ROWS} <= set(fact_rows(rows, CONFIG.facts).column_names)


# --- the subject is the speaker, never the one greeted -----------------------------------


def test_a_greeted_name_is_never_the_subject(extractor):
    # was "Caroline 've had a lot of things happening to me" from Melanie's message
    found = facts(extractor, "Hey Caroline, I've had a lot of things happening to me.")
    assert found == [("Melanie", "HAVE_LOT_OF_THING_HAPPEN", "Melanie",
                      "Melanie has had a lot of things happening to Melanie.")]


# --- one fact per claim, one set of dates --------------------------------------------------


def test_one_claim_is_one_fact_with_one_date(extractor):
    # the governing verb's date is the claim's: no second fact dated otherwise
    episode = EpisodeInput("e", "g", "message", "Yesterday I started working at Globex.",
                           T_REF, speaker="Melanie")
    (extraction,) = extractor.extract([episode])
    (fact,) = extraction.facts
    assert (fact.source, fact.relation, fact.target) == ("Melanie", "WORK_AT", "Globex")
    assert fact.fact == "Yesterday Melanie started working at Globex."
    assert fact.valid_at == datetime(2024, 5, 7, 14, 0, tzinfo=UTC)  # a day before t_ref


def test_two_claims_keep_their_own_dates(extractor):
    episode = EpisodeInput("e", "g", "message",
                           "I moved to Paris in March and I started at Contoso in June.",
                           T_REF, speaker="Melanie")
    (extraction,) = extractor.extract([episode])
    dates = {f.target: f.valid_at for f in extraction.facts}
    assert dates == {"Paris": datetime(2024, 3, 1, tzinfo=UTC),
                     "Contoso": datetime(2024, 6, 1, tzinfo=UTC)}


def test_a_text_is_listed_once(extractor):
    found = facts(extractor, "I enjoy it after a day of volunteering.")
    texts = [f[3] for f in found]
    assert texts == ["Melanie enjoys it after a day of volunteering."]


# --- relation classes only where they fit -------------------------------------------------


def test_a_new_job_is_the_job_with_no_start_shadow(extractor):
    found = facts(extractor, "I just started my new job at Contoso.", speaker="Marcus Bell")
    assert [(s, relation_class(r, CONFIG.facts)[0], t, x) for s, r, t, x in found] == [
        ("Marcus Bell", "WORKS_AT", "Contoso", "Marcus Bell just started their new job at "
         "Contoso.")]


def test_joining_a_group_is_membership_which_ends_no_job(extractor):
    edges = story(extractor, "Caroline", [
        (day(1), "I work at Contoso."),
        (day(2), "I joined a mentorship program."),
        (day(3), "I joined an activist group."),
        (day(6), "I left the activist group."),
    ])
    assert only(edges, "WORKS_AT", "Contoso")["invalid_at"] is None
    # a kind of thing joined is in the relation (no generic node), which its leaving ends
    assert only(edges, "MEMBER_OF_MENTORSHIP_PROGRAM", "Caroline")["invalid_at"] is None
    assert only(edges, "MEMBER_OF_ACTIVIST_GROUP", "Caroline")["invalid_at"] == day(6)
    assert relation_class("MEMBER_OF", CONFIG.facts)[1].exclusive is False


def test_an_employer_is_an_organisation(extractor):
    (fact,) = facts(extractor, "I work for Bob.")  # a person is a boss, not an employer
    assert fact == ("Melanie", "REPORTS_TO", "Bob", "Melanie works for Bob.")
    assert relation_class(fact[1], CONFIG.facts)[1] is None


# --- endings end the fact they negate, however it was first worded ------------------------


def test_no_longer_ends_the_school_fact_however_worded(extractor):
    edges = story(extractor, "Alice Walker", [
        (day(1, 8), "Tom attends Oak Park Primary."),
        (day(1, 9), "Tom goes to Oak Park Primary."),
        (day(9, 14), "Tom no longer goes to Oak Park Primary."),
    ])
    assert only(edges, "ATTENDS", "Oak Park Primary")["invalid_at"] == day(9, 14)
    assert only(edges, "GO_TO", "Oak Park Primary")["invalid_at"] == day(9, 14)
    ending = only(edges, "NO_LONGER_GO_TO", "Oak Park Primary")
    assert relation_class(ending["relation"], CONFIG.facts)[1] is CONFIG.facts.ending


@pytest.mark.parametrize("ending", [
    "I left my job at Contoso.", "I quit my job at Contoso.", "I no longer work at Contoso.",
])
def test_each_wording_of_an_ending_ends_the_job(extractor, ending):
    edges = story(extractor, "Marcus Bell", [
        (day(1), "I just started my new job at Contoso."), (day(4), ending)])
    assert only(edges, "WORKS_AT", "Contoso")["invalid_at"] == day(4)
    assert not [e for e in edges if e["target_entity_id"] in ("new job", "job")]


def test_moving_out_ends_the_home(extractor):
    edges = story(extractor, "Marcus Bell", [
        (day(1), "I live in Seattle."), (day(6, 17), "We moved out of Seattle.")])
    assert only(edges, "LIVES_IN", "Seattle")["invalid_at"] == day(6, 17)


# --- on the sample corpus (the session's corpus build): group studio ---------------------


def _entity(con, group: str, name: str) -> str:
    (entity_id,) = con.execute("SELECT entity_id FROM entities WHERE group_id = ? AND name = ?",
                               [group, name]).fetchone()
    return entity_id


def _edges(con, group: str, subject: str, relation: str, obj: str) -> list[tuple]:
    return con.execute(
        "SELECT fact, valid_at, invalid_at, invalidated_by FROM facts_current "
        "WHERE group_id = ? AND source_entity_id = ? AND relation = ? AND target_entity_id = ?",
        [group, _entity(con, group, subject), relation, _entity(con, group, obj)]).fetchall()


def test_corpus_facts_read_as_written(corpus_db, expected):
    cases = expected["fact_quality"]
    group = cases["group_id"]
    for case in cases["texts"]:
        (row,) = _edges(corpus_db, group, case["subject"], case["relation"], case["object"])
        assert row[0] == case["fact"], case
        if "valid_at" in case:
            assert row[1].isoformat().replace("+00:00", "Z") == case["valid_at"]
    texts = [t for (t,) in corpus_db.execute(
        "SELECT f.fact FROM facts_current f JOIN episodes e ON e.episode_id = f.episode_ids[1] "
        "WHERE f.group_id = ? AND e.kind = 'message'", [group]).fetchall()]
    assert texts and not [t for t in texts if t.startswith(("I ", "My ")) or " my " in t]
    subjects = corpus_db.execute(
        "SELECT source_entity_id, fact, count(*) FROM facts_current WHERE group_id = ? "
        "GROUP BY ALL HAVING count(*) > 1", [group]).fetchall()
    assert subjects == []  # no text listed twice for one subject


def test_corpus_greeted_name_is_never_the_subject(corpus_db, expected):
    case = expected["fact_quality"]["speaker_subject"]
    group = expected["fact_quality"]["group_id"]
    sources = {name for (name,) in corpus_db.execute(
        "SELECT s.name FROM facts_current f JOIN episodes e ON list_contains(f.episode_ids, "
        "e.episode_id) JOIN entities s ON s.entity_id = f.source_entity_id "
        "WHERE f.group_id = ? AND e.source_id = ?", [group, case["episode"]]).fetchall()}
    assert sources == {case["speaker"]}


def test_corpus_a_new_job_has_no_start_shadow(corpus_db, expected):
    case = expected["fact_quality"]["no_shadow"]
    group = expected["fact_quality"]["group_id"]
    relations = {r for (r,) in corpus_db.execute(
        "SELECT relation FROM facts_current WHERE group_id = ? AND source_entity_id = ?",
        [group, _entity(corpus_db, group, case["subject"])]).fetchall()}
    assert not relations & set(case["relations"])
    names = {n for (n,) in corpus_db.execute(
        "SELECT name FROM entities WHERE group_id = ?", [group]).fetchall()}
    assert not names & set(case["not_entities"])


def test_corpus_endings_and_memberships(corpus_db, expected):
    cases = expected["fact_quality"]
    for case in cases["ends"]:
        group = case["group_id"]
        (_, _, invalid_at, cause), = _edges(corpus_db, group, case["subject"],
                                                case["relation"], case["object"])
        assert invalid_at.isoformat().replace("+00:00", "Z") == case["invalid_at"], case
        (episode,) = corpus_db.execute(
            "SELECT e.source_id FROM facts_current f JOIN episodes e "
            "ON e.episode_id = f.episode_ids[1] WHERE f.edge_id = ?", [cause]).fetchone()
        assert episode == case["ended_by"], case
    for case in cases["open"]:
        (row,) = _edges(corpus_db, case["group_id"], case["subject"], case["relation"],
                        case["object"])
        assert row[2] is None, case
