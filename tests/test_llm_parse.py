"""Prompt building and output parsing of the LLM path, on real messages of the sample corpus
and of ../shared/data (DMR), with the answers local models really give: `<think>` preambles,
code fences, truncated JSON, wrong types, extra keys."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tkg.pipeline.config import ExtractConfig
from tkg.pipeline.extract.base import EpisodeInput
from tkg.pipeline.llm.parse import ParseError, load_json_object, parse_decisions, parse_extraction
from tkg.pipeline.llm.prompting import (
    extraction_request,
    load_prompt,
    prompt_set_version,
    reflexion_request,
    retry_request,
)
from tkg.pipeline.llm.schemas import EXTRACTION_SCHEMA

CORPUS = Path(__file__).resolve().parent / "corpus"
CONTEXT = ExtractConfig().context_messages
RECORDED = json.loads((Path(__file__).resolve().parent / "llm_recorded" / "acme_conv.json")
                      .read_text())["episodes"]


def corpus_messages(conversation: str) -> list[EpisodeInput]:
    """A conversation of the sample corpus as the window stage sees it (4 messages back)."""
    rows = [json.loads(line) for line in (CORPUS / "conversations.jsonl").read_text()
            .splitlines() if json.loads(line)["conversation_id"] == conversation]
    out, history = [], []
    for row in rows:
        out.append(EpisodeInput(
            episode_id=row["id"], group_id=row["group_id"], kind="message",
            content=row["content"], source_id=row["id"], speaker=row["speaker"],
            valid_at=datetime.fromisoformat(row["timestamp"].replace("Z", "+00:00")),
            context=tuple(history[-4:])))
        history.append(f"{row['speaker']}: {row['content']}")
    return out


@pytest.fixture(scope="module")
def acme() -> list[EpisodeInput]:
    return corpus_messages("acme-conv-2024-01-15")


# --- prompts ------------------------------------------------------------------------------


def test_extraction_prompt_of_a_corpus_message(acme):
    episode = acme[6]  # "Bob is Robert Kim, the CTO of Globex Corporation."
    request = extraction_request(episode, CONTEXT)
    system, user = request.messages
    assert system["role"] == "system" and "speaker is always the first entity" in system[
        "content"]
    assert "SCREAMING_SNAKE_CASE" in system["content"]
    assert "ISO-8601 with a time zone" in system["content"]
    assert user["content"] == (
        "Reference time of the episode: 2024-01-15T09:08:00Z\n"
        "Episode kind: message\n"
        "Speaker: Alice Chen\n\n"
        "Previous messages (context only):\n"
        "- Initech Inc.: Initech is our biggest account this quarter. Initech Inc. renewed "
        "120 seats in December.".replace("Initech Inc.: ", "Alice Chen: ") + "\n"
        "- Daniel Okafor: I can cover the European customers. I live in Berlin, so travel is "
        "easy for me.\n"
        "- Alice Chen: Thanks Daniel. Daniel Okafor lives in Berlin, so he covers Europe.\n"
        "- Sam Patel: Globex opened two tickets last week. Bob is unhappy about the "
        "dashboard.\n\n"
        "Current episode:\n"
        "Bob is Robert Kim, the CTO of Globex Corporation."
    )
    assert request.schema is EXTRACTION_SCHEMA


def test_first_message_has_no_context_and_fewer_when_configured(acme):
    assert "Previous messages (context only):\n(none)" in extraction_request(
        acme[0], CONTEXT).messages[1]["content"]
    two = extraction_request(acme[6], 2).messages[1]["content"]
    assert two.count("\n- ") == 2 and "Sam Patel: Globex opened" in two


def test_user_text_is_never_a_template():
    episode = EpisodeInput("e", "g", "text", "Invoice $amount of $$120 for {customer} ${x}",
                           datetime(2024, 1, 1, tzinfo=UTC), title="Q1 $notes")
    user = extraction_request(episode, CONTEXT).messages[1]["content"]
    assert "Title: Q1 $notes" in user
    assert user.endswith("Invoice $amount of $$120 for {customer} ${x}")


def test_templates_are_versioned_package_data():
    names = ["extract", "reflexion", "retry", "judge_pairs", "judge_invalidation",
             "summarize_map", "summarize_reduce"]
    for name in names:
        prompt = load_prompt(name)
        assert prompt.name == name and prompt.version >= 1
    assert len(prompt_set_version()) == 12
    with pytest.raises(FileNotFoundError, match="no prompt template"):
        load_prompt("nope")


def test_retry_and_reflexion_requests(acme):
    first = extraction_request(acme[7], CONTEXT)
    retry = retry_request(first, "Sure! Here you go", "the answer holds no JSON object")
    assert retry.messages[:2] == first.messages
    assert retry.messages[2] == {"role": "assistant", "content": "Sure! Here you go"}
    assert retry.messages[3]["content"].startswith(
        "Your answer could not be used: the answer holds no JSON object")
    found, _ = parse_extraction(RECORDED[acme[6].content]["completion"], acme[6])
    reflect = reflexion_request(acme[6], found, CONTEXT)
    assert '"relation": "CTO_OF"' in reflect.messages[1]["content"]
    assert "ONLY the" in reflect.messages[0]["content"]


def test_dmr_message_prompt(shared_data):
    row = json.loads((shared_data / "dmr_msc_sample.jsonl").read_text().splitlines()[0])
    turns = row["dialog"][:3]
    episode = EpisodeInput("e", "dmr", "message", turns[2]["text"],
                           datetime(2023, 1, 1, 0, 2, tzinfo=UTC), speaker=turns[2]["id"],
                           context=tuple(f"{t['id']}: {t['text']}" for t in turns[:2]))
    user = extraction_request(episode, CONTEXT).messages[1]["content"]
    assert "Speaker: Speaker 1" in user
    assert "- Speaker 1: I won my fight today." in user
    assert user.endswith(turns[2]["text"])
    answer = json.dumps({"entities": [{"name": "Speaker 1", "label": "Person"}],
                         "facts": [{"source": "Speaker 1", "target": "fight", "relation":
                                    "won", "fact": "Speaker 1 won a fight today.",
                                    "valid_at": "2023-01-01T00:00:00Z", "invalid_at": None,
                                    "date_text": "today", "undated": False}]})
    found, _ = parse_extraction(answer, episode)
    assert [(f.relation, f.valid_at) for f in found.facts] == [
        ("WON", datetime(2023, 1, 1, tzinfo=UTC))]


# --- parsing ------------------------------------------------------------------------------


def test_think_preamble_and_code_fence(acme):
    episode = acme[2]
    found, repaired = parse_extraction(RECORDED[episode.content]["completion"], episode)
    assert not repaired
    assert [(e.name, e.label) for e in found.entities] == [
        ("Alice Chen", "Person"), ("Initech Inc.", "Organization")]
    fact = found.facts[0]
    assert (fact.source, fact.relation, fact.target) == (
        "Initech Inc.", "RENEWED_SEATS_WITH", "Alice Chen")
    assert fact.valid_at == datetime(2023, 12, 1, tzinfo=UTC) and fact.date_text == "in December"


def test_truncated_json_keeps_whole_items(acme):
    episode = acme[4]
    text = RECORDED[episode.content]["completion"]
    cut = text[: text.index('"fact": "Daniel Okafor covers Europe')]
    found, repaired = parse_extraction(cut, episode)
    assert repaired
    assert [e.name for e in found.entities] == ["Alice Chen", "Daniel Okafor", "Berlin", "Europe"]
    assert [(f.relation, f.target) for f in found.facts] == [("LIVES_IN", "Berlin")]
    value, repaired = load_json_object('{"entities": [{"name": "A"}, {"na')
    assert (value, repaired) == ({"entities": [{"name": "A"}]}, True)


def test_wrong_types_and_extra_keys(acme):
    episode = acme[3]  # Daniel Okafor, 2024-01-15T09:04Z
    answer = json.dumps({
        "entities": ["Daniel Okafor", {"name": "Berlin"}, {"name": 42, "label": 7}, None],
        "facts": [
            {"source": "Daniel Okafor", "target": "Berlin", "relation": "lives in",
             "fact": "Daniel Okafor lives in Berlin.", "valid_at": "two weeks ago",
             "undated": "no", "confidence": 0.9},
            {"source": "Daniel Okafor", "target": "Munich", "relation": "VISITED",
             "fact": None, "valid_at": "2024-01-10", "invalid_at": "null", "undated": False},
            {"source": "Daniel Okafor", "target": "Daniel Okafor", "relation": "IS"},
            {"source": "Daniel Okafor", "relation": "LIKES"},
            "not a fact",
        ],
        "notes": "extra",
    })
    found, repaired = parse_extraction(answer, episode)
    assert not repaired
    assert [(e.name, e.label) for e in found.entities] == [
        ("Daniel Okafor", "Person"), ("Berlin", "Entity"), ("42", "7"), ("Munich", "Entity")]
    assert [(f.relation, f.target, f.fact, f.valid_at, f.invalid_at, f.undated)
            for f in found.facts] == [
        ("LIVES_IN", "Berlin", "Daniel Okafor lives in Berlin.",
         datetime(2024, 1, 1, 9, 4, tzinfo=UTC), None, False),
        ("VISITED", "Munich", "Daniel Okafor visited Munich",
         datetime(2024, 1, 10, tzinfo=UTC), None, False),
    ]


def test_dates_resolve_to_utc(acme):
    episode = acme[5]  # 2024-01-15T09:07Z
    answer = json.dumps({"entities": [], "facts": [
        {"source": "Globex", "target": "Sam Patel", "relation": "R", "fact": "f",
         "valid_at": "2024-01-08T09:00:00+02:00", "invalid_at": None},
        {"source": "Globex", "target": "Bob", "relation": "R", "fact": "g", "valid_at": None,
         "invalid_at": None, "date_text": "last week"},
        {"source": "Globex", "target": "Alice", "relation": "R", "fact": "h", "valid_at": None,
         "invalid_at": None, "undated": True},
    ]})
    found, _ = parse_extraction(answer, episode)
    assert [(f.valid_at, f.undated) for f in found.facts] == [
        (datetime(2024, 1, 8, 7, tzinfo=UTC), False),
        (datetime(2024, 1, 8, 9, 7, tzinfo=UTC), False),
        (None, True),
    ]
    assert found.entities[0].name == "Sam Patel"  # the speaker first, though not listed


def test_aliases_of_top_level_keys(acme):
    found, _ = parse_extraction(
        '{"nodes": [{"name": "Robert Kim", "type": "Person"}], "edges": [{"source": '
        '"Robert Kim", "target": "Globex Corporation", "relation": "CTO_OF", "fact": "x"}]}',
        acme[6])
    assert [(e.name, e.label) for e in found.entities] == [
        ("Alice Chen", "Person"), ("Robert Kim", "Person"), ("Globex Corporation", "Entity")]


@pytest.mark.parametrize(("answer", "message"), [
    ("", "empty"),
    ("Sure! The entities are Robert Kim and Globex.", "holds no JSON object"),
    ('[{"name": "A"}]', "expected a JSON object, got list"),
    ('{"entities": "Robert Kim", "facts": []}', '"entities" must be a list'),
    ('{"people": []}', 'neither "entities" nor "facts"'),
    ('{"entities": [}', "malformed"),
    ("<think>I should answer with JSON but I keep thinking", "holds no JSON object"),
])
def test_unusable_answers_say_why(acme, answer, message):
    with pytest.raises(ParseError, match=message):
        parse_extraction(answer, acme[0])


def test_decisions():
    text = ('<think>pair 0 is the same company</think>{"decisions": [{"id": 0, "same": true},'
            ' {"id": "1", "same": "false"}, {"id": 9, "same": true}, {"same": true}]}')
    assert parse_decisions(text, "same", [0, 1, 2]) == {0: True, 1: False}
    with pytest.raises(ParseError, match="no usable decision"):
        parse_decisions('{"decisions": []}', "same", [0])


def test_every_truncation_keeps_only_whole_items():
    """Cut a real answer at every character: the parser either says why it cannot use it, or
    returns lists that are prefixes of the full answer's lists (never a half-written item)."""
    text = RECORDED["Thanks Daniel. Daniel Okafor lives in Berlin, so he covers Europe."][
        "completion"]
    full = json.loads(text)
    repaired = 0
    for cut in range(len(text)):
        try:
            value, was_repaired = load_json_object(text[:cut])
        except ParseError:
            continue
        repaired += was_repaired
        assert set(value) <= {"entities", "facts"}
        for name, items in value.items():
            assert items == full[name][:len(items)]
    assert repaired > len(text) // 2  # most cuts still give something usable


def test_the_extraction_prompt_names_the_relation_classes(acme):
    """The LLM path groups wordings by meaning from the same classes and prototype sentences
    as spaCy's classifier: the prompt names each class's relation and examples."""
    from tkg.pipeline.config import FactsConfig

    system = extraction_request(acme[6], CONTEXT).messages[0]["content"]
    assert ('\n  - WORKS_AT (employment; to Organization; one at a time): "I work at the '
            'company"') in system
    assert '\n  - LEFT (ending): "I left the company"' in system
    renamed = FactsConfig().model_copy(update={"relation_classes": ()})
    assert "WORKS_AT (employment)" not in extraction_request(
        acme[6], CONTEXT, renamed).messages[0]["content"]
