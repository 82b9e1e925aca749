"""Episode kinds (`tkg.pipeline.episode_kinds`): each kind's descriptor decides its fields,
window, header, embedded text, speaker and extraction route; an unknown kind is an error;
a new kind is one descriptor that every reader picks up; no other module switches on a
kind's name."""

from __future__ import annotations

import ast
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from tkg.pipeline import sources
from tkg.pipeline.config import LimitsConfig
from tkg.pipeline.episode_kinds import (
    KINDS,
    EpisodeKind,
    Field,
    Header,
    RecordError,
    embed_text,
    embed_texts,
    episode_kind,
    mapped_extractions,
    prompt_header,
    speaker_of,
    speakers,
)
from tkg.pipeline.extract.base import EpisodeInput, Extraction
from tkg.pipeline.llm.prompting import extraction_request

ROOT = Path(__file__).resolve().parents[1]
T_REF = datetime(2024, 3, 1, 10, tzinfo=UTC)


def episode(kind: str, content: str, **fields: str) -> EpisodeInput:
    return EpisodeInput("e1", "g", kind, content, T_REF, source_id="r1", **fields)


@pytest.mark.parametrize("name", ["audio", "", "MESSAGE", 3, None, ["message"], {"a": 1}])
def test_an_unknown_kind_is_an_error_naming_the_known(name):
    with pytest.raises(RecordError, match=r"unknown kind .*expected one of message, text, json"):
        episode_kind(name)


def test_a_record_of_an_unknown_kind_is_rejected_with_that_reason():
    record = {"group_id": "g", "id": "a1", "kind": "audio", "timestamp": "2024-03-01T10:00:00Z",
              "content": "hi"}
    with pytest.raises(RecordError, match="unknown kind 'audio'"):
        sources.to_episode(record, LimitsConfig())


@pytest.mark.parametrize("kind, fields, header, embedded, speaker", [
    ("message", {"speaker": " Ana "}, "\nSpeaker:  Ana ", " Ana : I live in Porto.", "Ana"),
    ("text", {"title": "Q1"}, "\nTitle: Q1", "Q1: I live in Porto.", None),
    ("text", {}, "", "I live in Porto.", None),
    ("text", {"speaker": "Ana"}, "", "I live in Porto.", None),  # only messages are said
])
def test_header_embedded_text_and_speaker_of_text_kinds(kind, fields, header, embedded,
                                                        speaker):
    item = episode(kind, "I live in Porto.", **fields)
    assert prompt_header(item) == header
    assert embed_text({"kind": kind, "content": item.content, **fields}) == embedded
    assert speaker_of(item) == speaker


def test_a_record_is_embedded_as_phrases_after_its_source():
    row = {"kind": "json", "source": "crm.customers", "content": '{"name": "Globex"}'}
    assert embed_text(row) == "crm.customers: name Globex"
    assert prompt_header(episode("json", row["content"], source="crm.customers")) \
        == "\nSource: crm.customers"


def test_an_episodes_table_is_embedded_row_by_row():
    table = pa.table({"kind": ["message", "text", "json"], "speaker": ["Ana", None, None],
                      "title": [None, None, None], "source": [None, None, "crm"],
                      "content": ["Hi.", "Plain.", '{"city": "Paris"}'], "other": [1, 2, 3]})
    assert embed_texts(table) == ["Ana: Hi.", "Plain.", "crm: city Paris"]
    assert embed_texts(table.slice(0, 0)) == []


def test_only_messages_are_windowed_per_conversation():
    assert sources.window_key("g", "message", "c1", "e1") == "g\x1fc\x1fc1"
    for kind in ("text", "json"):
        assert sources.window_key("g", kind, "c1", "e1") == "g\x1fe\x1fe1"


def test_speakers_of_a_published_table_follow_the_kind():
    table = pa.table({"kind": ["message", "text", "json", "message"],
                      "speaker": ["Ana", "Bo", None, None]})
    assert speakers(table) == ["Ana", None, None, None]


def test_records_are_mapped_and_the_rest_left_to_the_model():
    items = [episode("message", "I live in Lisbon.", speaker="Ana"),
             episode("json", '{"customer_id": "C-1", "name": "Initech"}', source="crm.customers"),
             episode("text", "Robert joined Globex."),
             episode("json", "{not json", source="s")]
    found, model = mapped_extractions(items, max_depth=3)
    assert model == [0, 2] and found[0] is None and found[2] is None
    assert found[1].entities[0].name == "Initech"
    assert found[3].error.startswith("extraction failed: JSONDecodeError")


# --- a new kind is one descriptor ---------------------------------------------------------


def _note_mapping(item: EpisodeInput, _max_depth: int, _records: object) -> Extraction:
    out = Extraction()
    out.add_entity(item.title or "", "Note")
    return out


NOTE = EpisodeKind("note", (Field("title", required=True), Field("content", required=True)),
                   header=Header("title", "Note"))


@pytest.fixture()
def with_note(monkeypatch):
    monkeypatch.setitem(KINDS, "note", NOTE)


def test_a_new_kind_is_read_windowed_prompted_and_embedded_from_its_descriptor(with_note):
    record = {"group_id": "g", "id": "n1", "kind": "note", "timestamp": "2024-03-01T10:00:00Z",
              "title": "Standup", "content": "Ana moved to Porto."}
    row, _ = sources.to_episode(record, LimitsConfig())
    assert (row["kind"], row["title"], row["content"]) == ("note", "Standup", record["content"])
    with pytest.raises(RecordError, match="missing field 'title'"):
        sources.to_episode({**record, "title": None}, LimitsConfig())
    assert sources.window_key("g", "note", None, row["episode_id"]).endswith(row["episode_id"])
    item = episode("note", row["content"], title="Standup")
    user = extraction_request(item, 4).messages[-1]["content"]
    assert "Episode kind: note" in user and "Note: Standup" in user
    assert embed_text({**row, "kind": "note"}) == "Standup: Ana moved to Porto."
    assert speaker_of(item) is None
    assert mapped_extractions([item], 3)[1] == [0]  # no mapping: the model reads it


def test_a_new_kind_with_a_mapping_is_extracted_by_it(monkeypatch):
    monkeypatch.setitem(KINDS, "note", replace(NOTE, mapping=_note_mapping))
    found, model = mapped_extractions([episode("note", "x", title="Standup")], 3)
    assert model == [] and found[0].entities[0].name == "Standup"


# --- no module switches on a kind's name ---------------------------------------------------


def _kind_switches(source: str, where: str) -> list[str]:
    """Comparisons of a kind with a kind's name, and dicts keyed by kind names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = [o for o in operands if isinstance(o, ast.Constant) and o.value in KINDS]
            if names and any("kind" in ast.unparse(o) for o in operands if o not in names):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if len(keys & set(KINDS)) > 1:
                found.append(f"{where}:{node.lineno}: a dict keyed by kinds")
    return found


def test_only_the_descriptors_switch_on_a_kind():
    modules = [p for layer in ("pipeline", "query", "jobs") for p in (ROOT / layer).rglob("*.py")
               if p.name != "episode_kinds.py"]
    assert [s for p in modules for s in _kind_switches(p.read_text(encoding="utf-8"),
                                                       str(p.relative_to(ROOT)))] == []


@pytest.mark.parametrize("source", [
    'def f(row):\n    return row["kind"] == "json"\n',
    'def f(kind, a, b):\n    return {"message": a, "text": b}.get(kind)\n',
])
def test_the_scan_sees_a_switch(source):
    assert len(_kind_switches(source, "m.py")) == 1
