"""Episode kinds: one descriptor per kind (`message`, `text`, `json`) says everything the
pipeline treats differently by kind, so that no other module switches on a kind's name:

- `fields`: the record fields a kind reads (and validates) into its episode's columns;
- `windowed`: whether its episodes are turns of a conversation, windowed per
  `conversation_id` with the previous turns as context, or each their own window;
- `header`: the field that names an episode ("Speaker: Ana" in a prompt, "Ana: ..." before
  the text it embeds), and whether it names who said it (the first entity, a Person);
- `embedded`: the content as it is embedded (a record as `key value` phrases);
- `mapping`: how entities and facts come out of it: None sends it to the configured
  extractor (spaCy or an LLM); a function maps it exactly, with no model call.

Adding a kind is its descriptor in `KINDS` (and its mapping function, when it has one). A
kind is looked up with `episode_kind`; an unknown kind is a `RecordError` naming the known.
The fields fill the columns of `schema.RAW_EPISODES` and `EpisodeInput`: a kind that needs
a column they lack adds it there too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline.config import LimitsConfig, RecordsConfig
from tkg.pipeline.extract.base import EpisodeInput, Extraction, guarded
from tkg.pipeline.extract.records import extract_record, record_text

MAX_ID_CHARS = 512  # ids and names of sources, whatever max_content_chars allows


class RecordError(ValueError):
    """Why one record cannot become an episode; the message is the reject reason."""


def text_field(record: Mapping[str, Any], key: str, *, required: bool, limit: int
               ) -> str | None:
    """A string (or integer) field of a record, at most `limit` characters; empty is None."""
    value = record.get(key)
    if value is None or value == "":
        if required:
            raise RecordError(f"missing field {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RecordError(f"field {key!r} must be a string, got {type(value).__name__}")
    value = str(value)
    if len(value) > limit:
        raise RecordError(f"field {key!r} is {len(value)} characters, over the limit of {limit}")
    return value


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, stopping at `limit` + 1."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def object_field(record: Mapping[str, Any], key: str, limits: LimitsConfig) -> str:
    """A JSON object field (a JSON string in Parquet) as canonical JSON text (sorted keys),
    so the same record always gives the same content and the same hash."""
    data = record.get(key)
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise RecordError(f"field {key!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RecordError(f"field {key!r} must be a JSON object")
    if _depth(data, limits.max_json_depth) > limits.max_json_depth:
        raise RecordError(f"field {key!r} is nested deeper than {limits.max_json_depth}")
    content = json.dumps(data, ensure_ascii=False, sort_keys=True)
    if len(content) > limits.max_content_chars:
        raise RecordError(f"field {key!r} is {len(content)} characters, "
                          f"over {limits.max_content_chars}")
    return content


@dataclass(frozen=True)
class Field:
    """One record field of a kind, read into the episode column `column` (its own name
    unless `into` names another). Every kind fills `content`."""

    name: str
    required: bool = False
    short: bool = False  # an id or a source name: at most MAX_ID_CHARS characters
    json_object: bool = False  # a JSON object, kept as canonical JSON text
    into: str | None = None

    @property
    def column(self) -> str:
        return self.into or self.name

    def read(self, record: Mapping[str, Any], limits: LimitsConfig) -> str | None:
        if self.json_object:
            return object_field(record, self.name, limits)
        limit = MAX_ID_CHARS if self.short else limits.max_content_chars
        return text_field(record, self.name, required=self.required, limit=limit)


@dataclass(frozen=True)
class Header:
    """The field that names an episode, and the word a prompt names it by."""

    field: str
    label: str
    speaker: bool = False  # it names who said the episode: the first entity, whom "I" means


# (episode, max JSON depth, config `records`) -> extraction
Mapper = Callable[[EpisodeInput, int, RecordsConfig | None], Extraction]


def _same(content: str | None) -> str | None:
    return content


def _record_phrases(content: str | None) -> str:
    return record_text(content or "{}")


@dataclass(frozen=True)
class EpisodeKind:
    """One kind of episode (the module doc says what each attribute decides)."""

    name: str
    fields: tuple[Field, ...]  # read in this order: the first bad one is the reject reason
    header: Header | None = None
    windowed: bool = False  # turns of a conversation: windowed per conversation_id
    embedded: Callable[[str | None], str | None] = _same  # content -> the text to embed
    mapping: Mapper | None = None  # None: the configured extractor's model reads it

    def read(self, record: Mapping[str, Any], limits: LimitsConfig) -> dict[str, str | None]:
        """The kind's episode columns of one input record; a bad field is a RecordError."""
        return {f.column: f.read(record, limits) for f in self.fields}

    def named(self, row: Mapping[str, Any] | EpisodeInput) -> str | None:
        """The header's value of an episode row (or EpisodeInput), None without one."""
        if self.header is None:
            return None
        if isinstance(row, EpisodeInput):
            return getattr(row, self.header.field)
        return row.get(self.header.field)


KINDS: dict[str, EpisodeKind] = {
    kind.name: kind for kind in (
        EpisodeKind(
            "message",
            (Field("conversation_id", required=True), Field("speaker", required=True),
             Field("role", short=True), Field("content", required=True)),
            header=Header("speaker", "Speaker", speaker=True), windowed=True),
        EpisodeKind(
            "text", (Field("title"), Field("content", required=True)),
            header=Header("title", "Title")),
        EpisodeKind(
            "json",
            (Field("source", required=True, short=True),
             Field("data", required=True, json_object=True, into="content")),
            header=Header("source", "Source"), embedded=_record_phrases,
            mapping=extract_record),
    )
}
DEFAULT_KIND = "message"


def episode_kind(name: Any) -> EpisodeKind:
    """The descriptor of a kind; any other value is a RecordError naming the known kinds."""
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise RecordError(
            f"unknown kind {str(name)[:32]!r}: expected one of {', '.join(KINDS)}")
    return kind


# --- what the stages read per kind ---------------------------------------------------------


def context_line(row: Mapping[str, Any]) -> str:
    """A turn as the later turns of its window see it: `speaker: content`."""
    return f"{episode_kind(row['kind']).named(row)}: {row['content']}"


def embed_text(row: Mapping[str, Any]) -> str:
    """The text an episode row is embedded by: its header's value, then its content."""
    kind = episode_kind(row["kind"])
    prefix = kind.named(row)
    content = kind.embedded(row["content"])
    return f"{prefix}: {content}" if prefix else content


def embed_texts(episodes: pa.Table) -> list[str]:
    """`embed_text` of each row of an episodes table."""
    headers = {k.header.field for k in KINDS.values() if k.header is not None}
    return [embed_text(row) for row in episodes.select(["kind", "content", *sorted(headers)])
            .to_pylist()]


def prompt_header(episode: EpisodeInput) -> str:
    """The header line of an extraction prompt ("\\nSpeaker: Ana"), empty without one."""
    kind = episode_kind(episode.kind)
    value = kind.named(episode)
    return f"\n{kind.header.label}: {value}" if value else ""


def speaker_of(episode: EpisodeInput) -> str | None:
    """Who said the episode, None when its kind has no speaker or the field is blank."""
    kind = episode_kind(episode.kind)
    if kind.header is None or not kind.header.speaker:
        return None
    return (kind.named(episode) or "").strip() or None


def speakers(episodes: pa.Table) -> list[str | None]:
    """Who said each episode row of a published table: its kind's speaker field as stored,
    None for kinds nobody says."""
    said = pa.nulls(episodes.num_rows, pa.string())
    for kind in KINDS.values():
        if kind.header and kind.header.speaker and kind.header.field in episodes.column_names:
            said = pc.if_else(pc.equal(episodes["kind"], kind.name),
                              episodes[kind.header.field], said)
    return said.to_pylist()


def mapped_extractions(episodes: list[EpisodeInput], max_depth: int,
                       records: RecordsConfig | None = None
                       ) -> tuple[list[Extraction | None], list[int]]:
    """(extractions, model indexes): the episodes whose kind maps them are extracted here
    (a failure is that episode's error, never the batch's); the others, listed by index for
    the extractor's model, are None in the extractions."""
    results: list[Extraction | None] = [None] * len(episodes)
    model: list[int] = []
    for index, episode in enumerate(episodes):
        mapping = episode_kind(episode.kind).mapping
        if mapping is None:
            model.append(index)
        else:
            results[index] = guarded(mapping, episode, max_depth, records)
    return results, model
