"""Model answers -> validated Python values, tolerant of what local models actually write:
`<think>` preambles, code fences, prose around the object, truncated JSON (cut at the last
complete item), wrong scalar types and extra keys. What cannot be used raises ParseError
with a message short enough to send back to the model in the one retry."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from tkg.pipeline.episode_kinds import speaker_of
from tkg.pipeline.extract.base import EpisodeInput, ExtractedFact, Extraction, relation_name
from tkg.pipeline.extract.dates import resolve_date

THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)(?:```|$)", re.S)
KEY_ALIASES = {"nodes": "entities", "edges": "facts", "relationships": "facts",
               "relations": "facts"}
MAX_NAME_CHARS = 200
MAX_SCAN_CHARS = 200_000


class ParseError(ValueError):
    """An answer that cannot be used; the message is what the retry tells the model."""


def strip_wrapping(text: str) -> str:
    """Remove reasoning blocks and code fences around the JSON."""
    text = THINK.sub("", text)
    if "</think>" in text.lower():  # an opening tag lost in a truncated prefix
        text = text[text.lower().rfind("</think>") + len("</think>"):]
    elif text.lstrip().lower().startswith("<think>"):  # unclosed: the answer may follow
        text = text[text.find("{"):] if "{" in text else ""
    fenced = FENCE.search(text)
    if fenced and "{" in fenced.group(1):
        text = fenced.group(1)
    return text.strip()


def _close_truncated(text: str) -> str | None:
    """A JSON text cut off mid-way -> the longest prefix that ends after a whole list item or
    top-level value, with its open brackets closed; None when no such prefix exists."""
    stack: list[str] = []
    in_string = escaped = False
    cut: tuple[int, list[str]] | None = None
    for index, char in enumerate(text[:MAX_SCAN_CHARS]):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]":
            if not stack or stack[-1] != char:
                return None
            stack.pop()
            if not stack:
                return text[: index + 1]
            if _whole_items(stack):
                cut = (index + 1, list(stack))
        elif char == "," and stack and _whole_items(stack):
            cut = (index, list(stack))
    if cut is None:
        return None
    end, open_brackets = cut
    return text[:end] + "".join(reversed(open_brackets))


def _whole_items(stack: list[str]) -> bool:
    """A cut here keeps only whole items: inside a list, or between top-level keys (an
    object cut half-way, like a fact without its relation, is dropped instead)."""
    return stack[-1] == "]" or len(stack) == 1


def load_json_object(text: str | None) -> tuple[dict[str, Any], bool]:
    """The JSON object in a model answer, and whether it had to be repaired (truncated)."""
    if not text or not text.strip():
        raise ParseError("the answer was empty")
    body = strip_wrapping(text)
    start = body.find("{")
    if start < 0:
        raise ParseError("the answer holds no JSON object")
    if (bracket := body.find("[")) >= 0 and bracket < start:
        try:
            listed, _ = json.JSONDecoder().raw_decode(body[bracket:])
        except json.JSONDecodeError:
            listed = None
        if isinstance(listed, list):
            raise ParseError("expected a JSON object, got list")
    body = body[start:]
    try:
        value, _ = json.JSONDecoder().raw_decode(body)
        repaired = False
    except json.JSONDecodeError as exc:
        closed = _close_truncated(body)
        if closed is None:
            raise ParseError(f"the JSON is malformed ({exc.msg} at char {exc.pos})") from None
        try:
            value = json.loads(closed)
        except json.JSONDecodeError:
            raise ParseError(f"the JSON is malformed ({exc.msg} at char {exc.pos})") from None
        repaired = True
    if not isinstance(value, dict):
        raise ParseError(f"expected a JSON object, got {type(value).__name__}")
    return value, repaired


def _text(value: Any) -> str | None:
    """A scalar as stripped text (numbers are accepted as names); None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float | str):
        text = " ".join(str(value).split())
        return text[:MAX_NAME_CHARS] if text else None
    return None


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1")
    return bool(value)


def parse_when(value: Any, t_ref: datetime) -> datetime | None:
    """A fact's date as the model wrote it -> UTC. ISO-8601 first (no zone means UTC); other
    text goes through the same resolver as the spaCy path, against t_ref."""
    text = _text(value)
    if text and text.lower() not in ("null", "none", "unknown", "n/a"):
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
            if 1800 <= moment.year <= 2200:
                return moment.astimezone(UTC)
        except ValueError:
            pass
        resolved = resolve_date(text, t_ref)
        if resolved is not None:
            return resolved
    return None


def _items(data: dict[str, Any], key: str) -> list[Any]:
    for name, value in data.items():
        if KEY_ALIASES.get(name, name) == key:
            if value is None:
                return []
            if not isinstance(value, list):
                raise ParseError(f'"{key}" must be a list, got {type(value).__name__}')
            return value
    return []


def extraction_from(data: dict[str, Any], episode: EpisodeInput) -> Extraction:
    """A parsed answer -> the same Extraction the spaCy extractor returns. Items that cannot
    be used (a fact without two named ends) are dropped, never the whole answer."""
    if not any(KEY_ALIASES.get(k, k) in ("entities", "facts") for k in data):
        raise ParseError('the object has neither "entities" nor "facts"')
    out = Extraction()
    speaker = speaker_of(episode)
    if speaker:
        out.add_entity(speaker, "Person")
    for item in _items(data, "entities"):
        attributes = None
        if isinstance(item, dict):
            name, label = _text(item.get("name")), _text(item.get("label") or item.get("type"))
            attributes = _attributes(item.get("attributes"))
        else:
            name, label = _text(item), None
        if name:
            out.add_entity(name, label or "Entity", attributes)
    for item in _items(data, "facts"):
        if not isinstance(item, dict):
            continue
        source, target = _text(item.get("source")), _text(item.get("target"))
        if not source or not target or source == target:
            continue
        relation = relation_name(_text(item.get("relation")) or "RELATED_TO")
        date_text = _text(item.get("date_text"))
        valid_at = parse_when(item.get("valid_at"), episode.valid_at)
        invalid_at = parse_when(item.get("invalid_at"), episode.valid_at)
        if valid_at is None and invalid_at is None and date_text:
            valid_at = resolve_date(date_text, episode.valid_at)
        fact = _text(item.get("fact")) or f"{source} {relation.replace('_', ' ').lower()} {target}"
        for name in (source, target):
            out.add_entity(name, "Entity")
        out.facts.append(ExtractedFact(
            source=source, target=target, relation=relation, fact=fact, valid_at=valid_at,
            invalid_at=invalid_at, date_text=date_text,
            undated=_flag(item.get("undated")) and valid_at is None and invalid_at is None,
        ))
    return out


def _attributes(value: Any) -> str | None:
    """An entity's attribute pairs ([{"name", "value"}], or an object) as a JSON object text;
    None when there are none. Pairs without a name or a scalar value are dropped."""
    pairs = value.items() if isinstance(value, dict) else (
        (p.get("name"), p.get("value")) for p in value or () if isinstance(p, dict)
    ) if isinstance(value, list) else ()
    found = {k: v for name, raw in pairs if (k := _text(name)) and (v := _text(raw))}
    return json.dumps(found, ensure_ascii=False, sort_keys=True) if found else None


def parse_extraction(text: str | None, episode: EpisodeInput) -> tuple[Extraction, bool]:
    """An extraction answer -> (Extraction, repaired?); ParseError when it cannot be used."""
    data, repaired = load_json_object(text)
    return extraction_from(data, episode), repaired


def parse_decisions(text: str | None, key: str, ids: list[int]) -> dict[int, bool]:
    """A batched judgement -> {item id: decision}; ids the model skipped are absent."""
    data, _ = load_json_object(text)
    decisions = data.get("decisions")
    if not isinstance(decisions, list):
        raise ParseError('"decisions" must be a list')
    wanted = set(ids)
    out: dict[int, bool] = {}
    for item in decisions:
        if not isinstance(item, dict):
            continue
        try:
            item_id = int(item.get("id"))
        except (TypeError, ValueError):
            continue
        if item_id in wanted and key in item:
            out[item_id] = _flag(item[key])
    if not out and ids:
        raise ParseError(f"no usable decision for ids {ids[:5]}")
    return out


def parse_fields(text: str | None, fields: tuple[str, ...]) -> dict[str, str]:
    """A summary-like answer -> its string fields (missing ones are a ParseError)."""
    data, _ = load_json_object(text)
    out = {name: _text(data.get(name)) if not isinstance(data.get(name), str)
           else data[name].strip() for name in fields}
    missing = [name for name, value in out.items() if not value]
    if missing:
        raise ParseError(f"missing or empty: {', '.join(missing)}")
    return out  # type: ignore[return-value]
