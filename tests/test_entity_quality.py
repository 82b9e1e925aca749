"""Entities a person would list (issue 25), on real spaCy (the project's loader and model):
names and specific things, not generic nouns; one right label each; no vocatives."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.extract.base import EpisodeInput, Extraction
from tkg.pipeline.extract.spacy_extractor import SpacyExtractor

WHEN = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def names_only() -> SpacyExtractor:
    return SpacyExtractor(TkgConfig.model_validate({"extract": {"common_noun_facts": False}}))


@pytest.fixture(scope="module")
def default() -> SpacyExtractor:
    return SpacyExtractor(TkgConfig())


def said(extractor: SpacyExtractor, speaker: str, text: str,
         context: tuple[str, ...] = ()) -> Extraction:
    episode = EpisodeInput("e1", "g", "message", text, WHEN, speaker=speaker, context=context)
    extraction = extractor.extract([episode])[0]
    assert extraction.error is None
    return extraction


def labels(extraction: Extraction) -> dict[str, str]:
    return {e.name: e.label for e in extraction.entities}


# --- generic nouns ---------------------------------------------------------------------------

def test_generic_nouns_are_no_entities(names_only):
    found = said(names_only, "Sam Patel", "The fix is ready and the demo went well. I got some "
                 "good news at the office, and we scheduled a call to review the problem.")
    assert labels(found) == {"Sam Patel": "Person"}
    assert {f.target for f in found.facts} <= {"Sam Patel"}  # facts of Sam Patel alone


def test_new_job_is_no_entity_but_the_employer_is(names_only):
    found = said(names_only, "Jon", "I just started my new job at Fabrikam.")
    assert labels(found) == {"Jon": "Person", "Fabrikam": "Organization"}
    assert [(f.source, f.target) for f in found.facts] == [("Jon", "Fabrikam")]


def test_specific_things_stay(names_only):
    found = labels(said(names_only, "Sam Patel", "Ticket T-23 is still open. We moved the "
                        "Enterprise plan to Room 101 and Order ORD-1001 shipped."))
    assert "T-23" in found and "Sam Patel" in found
    assert any("ORD-1001" in name for name in found)
    assert any("Enterprise" in name for name in found)
    assert not any(name.lower() in ("ticket", "order", "plan") for name in found)


def test_a_sentence_initial_surname_written_as_a_name_nearby_is_one(default):
    """spaCy's small model tags "Tetlow" opening a sentence a common noun: the context line
    that writes it as a name makes it one (the fact is Tetlow's, not the speaker's word);
    with no such evidence a sentence-initial common noun stays none ("Painting")."""
    context = ("Stephen Dubner: Today my guest is Tania Tetlow, the president of Fordham.",)
    found = said(default, "Stephen Dubner", "Tetlow taught law at Tulane.", context)
    assert "Tetlow" in labels(found)
    assert [(f.source, f.target, f.fact) for f in found.facts] == [
        ("Tetlow", "Tulane", "Tetlow taught law at Tulane.")]
    assert "Painting" not in labels(said(default, "Nora", "Painting is a fun way to relax.",
                                         context))


def test_counts_and_adjectives_are_not_names(names_only):
    found = labels(said(names_only, "Alice Chen", "Initech renewed 120 seats and the European "
                        "customers want fifty more seats."))
    assert set(found) == {"Alice Chen", "Initech"}


def test_common_nouns_of_kept_facts_are_concepts(default, names_only):
    """On the default (`extract.common_noun_facts`) a fact of a class of one value at a time
    about a common noun keeps it (a newer role ends it); the noun is a Concept, never typed
    by its relation or left a bare Entity, and named whole ("head of procurement"). Names
    only: no such entity and no such fact."""
    found = labels(said(default, "Caroline", "I work as a nurse."))
    assert found == {"Caroline": "Person", "nurse": "Concept"}
    found = said(default, "Maria", "I work at Initech as the head of procurement.")
    assert labels(found)["head of procurement"] == "Concept"
    assert labels(said(names_only, "Caroline", "I work as a nurse.")) == {"Caroline": "Person"}


@pytest.mark.parametrize(("text", "relation"), [
    ("I joined a mentorship program last month.", "MEMBER_OF_MENTORSHIP_PROGRAM"),
    ("I volunteered at the homeless shelter.", "MEMBER_OF_HOMELESS_SHELTER"),
    ("I left the activist group.", "NO_LONGER_MEMBER_OF_ACTIVIST_GROUP"),
    ("I can't volunteer at the shelter anymore.", "NO_LONGER_MEMBER_OF_SHELTER"),
])
def test_a_membership_of_a_kind_of_thing_is_in_its_relation(default, text, relation):
    """One holds many memberships, so a kind of thing joined is no node of its own: its words
    join the relation (which an ending of it ends, by `facts.ending_prefix`)."""
    found = said(default, "Caroline", text)
    assert labels(found) == {"Caroline": "Person"}
    assert [(f.source, f.relation, f.target) for f in found.facts] == [
        ("Caroline", relation, "Caroline")]


@pytest.mark.parametrize(("text", "relation", "target"), [
    ("I live with my partner Jenna.", "LIVE_WITH_PARTNER", "Jenna"),
    ("I met this amazing woman, Jean, who had been through a lot.", "MEET_WOMAN", "Jean"),
    ("I played this game Catan.", "PLAY_GAME", "Catan"),
    ("I'll take the bet, James!", "TAKE_BET", "Caroline"),  # James is addressed
    ("Your support really means a lot, Maria.", "MEAN_LOT", "Caroline"),
])
def test_a_noun_with_a_name_beside_it_is_the_name(default, text, relation, target):
    found = said(default, "Caroline", text)
    assert [(f.relation, f.target) for f in found.facts] == [(relation, target)]
    assert all(name[:1].isupper() for name in labels(found))


def test_a_documents_claim_about_a_kind_of_thing_is_its_named_objects(default):
    """Without a speaker, a claim whose subject is a kind of thing is about its object, if
    that is a name; of two kinds of thing, no entity holds it (the document says it)."""
    episode = EpisodeInput("d1", "g", "text", "The nightly export failed for Globex. The root "
                           "cause was an expired storage credential.", WHEN, title="Postmortem")
    found = default.extract([episode])[0]
    assert [(f.source, f.relation, f.target) for f in found.facts] == [
        ("Globex", "NIGHTLY_EXPORT_FAIL_FOR", "Globex")]
    assert {e.name for e in found.entities} == {"Globex"}


# --- labels ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("speaker", "text", "name", "label"), [
    # NER: PERSON; employment's target type decides (only "work for" a person is a boss)
    ("Sam Patel", "I joined Contoso in March.", "Contoso", "Organization"),
    ("Alice Chen", "Globex Corporation renewed their contract.", "Globex Corporation",
     "Organization"),  # NER: PERSON or PRODUCT
    ("Maria Lopez", "My kids go to Riverside Elementary.", "Riverside Elementary",
     "Organization"),  # NER: PERSON
    ("Tania", "It was hard on students, especially after Covid when they were isolated.",
     "Covid", "Event"),
    ("Kevin Brooks", "I met Dr. Okoye at the clinic on Monday.", "Okoye", "Person"),
    ("Kevin Brooks", "The report came from Prof. Whitcombe.", "Whitcombe", "Person"),
    ("Nina Sharp", "I talked to the Head of Procurement yesterday.", "Head of Procurement",
     "Person"),
    ("Daniel Okafor", "I moved to Lisbon last spring.", "Lisbon", "Location"),
])
def test_one_right_label(names_only, speaker, text, name, label):
    found = labels(said(names_only, speaker, text))
    assert found.get(name) == label, found


def test_joining_a_person_of_the_conversation_is_no_job(default):
    """"joined Contoso" types Contoso by employment's target type, but a speaker of the
    window is a person whatever the verb: no Organization, no employment."""
    from tkg.pipeline.facts import relation_class

    found = said(default, "Andrew", "I would love to join Audrey.", ("Audrey: Hi there!",))
    assert labels(found)["Audrey"] == "Person"
    assert [relation_class(f.relation, default.config.facts)[1] for f in found.facts] == [None]


def test_a_relation_types_its_object_where_ner_guessed():
    """"joined X" makes X an Organization (employment's target type), "moved to X" a
    Location; a name typed by its own words keeps its type whatever the relation."""
    extractor = SpacyExtractor(TkgConfig.model_validate({"extract": {"common_noun_facts": False}}))
    joined = said(extractor, "Priya Nair", "I joined Vandelay last week.")
    assert labels(joined)["Vandelay"] == "Organization"
    school = said(extractor, "Maria Lopez", "My son attends Oakwood Academy.")
    assert labels(school)["Oakwood Academy"] == "Organization"


def test_the_passive_types_its_agent_as_the_active_does(default):
    """"I was hired by Contoso" is "Contoso hired me" (spaCy's NER: PERSON): the passive
    form the employment class names (BE_HIRE_BY) makes Contoso an Organization and the fact
    a job; a passive form no class names keeps its words ("was born in": BEAR_IN)."""
    from tkg.pipeline.facts import relation_class

    hired = said(default, "Jon", "I was hired by Contoso.")
    assert labels(hired) == {"Jon": "Person", "Contoso": "Organization"}
    assert [(f.source, relation_class(f.relation, default.config.facts)[0], f.target, f.fact)
            for f in hired.facts] == [("Jon", "WORKS_AT", "Contoso", "Jon was hired by Contoso.")]
    born = said(default, "Ana", "I was born in Sweden.")
    assert [(f.relation, f.target) for f in born.facts] == [("BEAR_IN", "Sweden")]


# --- vocatives and greetings -----------------------------------------------------------------

@pytest.mark.parametrize(("speaker", "text", "addressed"), [
    ("Aunt Em", "Quick, Dorothy, run to the cellar!", "Dorothy"),
    ("Caroline", "Oh ya, Melanie, I went there last week.", "Melanie"),
    ("Melanie", "Hey Caroline, I've had a lot of things happening to me lately.", "Caroline"),
    ("Alice Chen", "Thanks, Maria! Great news.", "Maria"),
    ("Jon", "Wow, Gina, that sounds great!", "Gina"),
])
def test_vocatives_are_no_entities_and_no_subjects(default, speaker, text, addressed):
    found = said(default, speaker, text)
    names = {e.name for e in found.entities}
    assert not any(addressed in name for name in names), names
    assert not any("," in name for name in names)
    assert all(f.source != addressed for f in found.facts)


def test_a_named_person_beside_a_greeting_stays(default):
    found = labels(said(default, "Alice Chen", "Hi team! I met Maria Lopez, our new contact, "
                        "in Austin."))
    assert found.get("Maria Lopez") == "Person" and found.get("Austin") == "Location"


def test_a_mini_conversation(names_only):
    """Five turns in the style of LoCoMo: only the people and the named things."""
    turns = [
        ("Caroline", "Hey Mel! Good to see you! How have you been?"),
        ("Melanie", "Hey Caroline! I'm swamped with the kids & work. What's up with you?"),
        ("Caroline", "I went to a support group yesterday and it was so powerful."),
        ("Melanie", "That's great! I painted a lake sunrise last year, it was calming."),
        ("Caroline", "Ya, Melanie, I joined Lambda Legal as a volunteer in March."),
    ]
    names: dict[str, str] = {}
    for speaker, text in turns:
        names.update(labels(said(names_only, speaker, text)))
    assert names == {"Caroline": "Person", "Melanie": "Person",
                     "Lambda Legal": "Organization"}
