"""JSON business records -> entities and facts, by a fixed mapping (not by flattening text).

The mapping, shared by every extractor backend:

1. The record is an entity. Its label is the singular of the source's last segment
   (`crm.customers` -> `Customer`). Its key is the value of `id`, `<label>_id` or the first
   `*_id` field; its name is `"<Label> <key>"` (`Customer C-001`), or `"<Label> <record id>"`
   when it has no key. Every other record that holds `customer_id: C-001` points at the
   same name, so records link by key without any text matching. A record about one person
   (an employee, a contact: PERSON_RECORDS) with a `name` is that person instead: entity
   `Marcus Bell`, label Person, which the resolver meets in the group's messages by name.
2. Each field becomes a fact from the record entity, with the key as the relation
   (SCREAMING_SNAKE_CASE, `_id` dropped) and the fact text `"<record>: <key> <value>"`:
   - id-like fields (`*_id`, `*Id`): the target is the referenced record, `"<Label> <value>"`;
   - name-like fields (`name`, `*_name`, `company`, `assignee`, `city`, ... see NAME_KEYS)
     and short categorical strings (at most MAX_VALUE_WORDS words): the target is an entity
     named by the value, labelled after the key;
   - nested objects and lists of objects become child records (label = singular key), linked
     by the key, up to a depth limit; lists of scalars give one fact per item.
3. Everything else (numbers, booleans, dates, long text) goes into the record entity's
   `attributes`, so nothing of the record is lost from the graph.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tkg.pipeline.extract.base import EpisodeInput, ExtractedFact, Extraction, relation_name

NAME_KEYS = {
    "name", "title", "company", "company_name", "organization", "employer", "assignee",
    "owner", "contact", "contact_name", "customer_name", "author", "manager", "city",
    "country", "region", "product", "product_name", "vendor", "artist", "album", "genre",
    "speaker", "team", "department", "first_name", "last_name", "full_name", "email",
}
KEY_LABELS = {
    "company": "Organization", "company_name": "Organization", "organization": "Organization",
    "employer": "Organization", "vendor": "Organization", "city": "Location",
    "country": "Location", "region": "Location", "assignee": "Person", "owner": "Person",
    "contact": "Person", "contact_name": "Person", "author": "Person", "manager": "Person",
    "full_name": "Person", "customer_name": "Organization", "email": "Email",
}
# Records about one person: named by the person (not "<Label> <key>"), so the resolver meets
# the same person in the group's messages by name; the key stays in the attributes.
PERSON_RECORDS = {"Contact", "Employee", "Person", "People", "User", "Staff", "Member",
                  "Patient", "Student", "Candidate", "Author", "Teacher"}
MAX_VALUE_WORDS = 6
MAX_VALUE_CHARS = 80
ID_KEY = re.compile(r"^(?:id|pk|key|(.+?)_?(?:id|Id|ID))$")


def singular(word: str) -> str:
    word = word.strip()
    if word.lower().endswith(("us", "ss", "is")):
        return word
    for suffix, replacement in (("ies", "y"), ("sses", "ss"), ("ses", "s"), ("s", "")):
        if word.lower().endswith(suffix) and len(word) > len(suffix) + 1:
            return word[: -len(suffix)] + replacement
    return word


def label_of(name: str) -> str:
    """`crm.customers` -> `Customer`, `line_items` -> `LineItem`."""
    last = re.split(r"[./:]", name.strip())[-1] or "record"
    return "".join(part.capitalize() for part in re.split(r"[_\-\s]+", singular(last)) if part)


def _referenced_label(key: str) -> str | None:
    match = ID_KEY.match(key)
    if not match or not match.group(1):
        return None
    return label_of(match.group(1))


def _record_key(data: dict, label: str) -> str | None:
    candidates = ["id", "pk", f"{label.lower()}_id", f"{label.lower()}Id"]
    candidates += [k for k in data if ID_KEY.match(k)]
    for key in candidates:
        value = data.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
            return key
    return None


def _is_short_text(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value.strip()) <= MAX_VALUE_CHARS
        and len(value.split()) <= MAX_VALUE_WORDS
    )


def _map_record(
    out: Extraction, data: dict, label: str, name: str, episode: EpisodeInput,
    depth: int, max_depth: int,
) -> None:
    attributes: dict[str, Any] = {}
    own_key = _record_key(data, label)
    for key, value in data.items():
        if key == own_key:
            attributes[key] = value
            continue
        relation = relation_name(re.sub(r"_?(id|Id|ID)$", "", key) or key)
        words = key.replace("_", " ")
        referenced = _referenced_label(key)
        if referenced and isinstance(value, str | int) and not isinstance(value, bool):
            target = f"{referenced} {value}"
            out.add_entity(target, referenced)
            out.facts.append(
                ExtractedFact(name, target, relation, f"{name}: {words} {value}",
                              valid_at=episode.valid_at)
            )
        elif isinstance(value, dict) and depth < max_depth:
            child_label = label_of(key)
            child_key = _record_key(value, child_label)
            child = f"{child_label} {value[child_key]}" if child_key else f"{name} {child_label}"
            out.add_entity(child, child_label)
            out.facts.append(
                ExtractedFact(name, child, relation, f"{name}: {words} {child}",
                              valid_at=episode.valid_at)
            )
            _map_record(out, value, child_label, child, episode, depth + 1, max_depth)
        elif isinstance(value, list) and value and depth < max_depth:
            child_label = label_of(key)
            for index, item in enumerate(value, start=1):
                if isinstance(item, dict):
                    item_key = _record_key(item, child_label)
                    child = (f"{child_label} {item[item_key]}" if item_key
                             else f"{name} {child_label} {index}")
                    out.add_entity(child, child_label)
                    out.facts.append(ExtractedFact(name, child, relation,
                                                   f"{name}: {words} {child}",
                                                   valid_at=episode.valid_at))
                    _map_record(out, item, child_label, child, episode, depth + 1, max_depth)
                elif _is_short_text(item):
                    out.add_entity(item.strip(), child_label)
                    out.facts.append(ExtractedFact(name, item.strip(), relation,
                                                   f"{name}: {words} {item.strip()}",
                                                   valid_at=episode.valid_at))
                else:
                    attributes.setdefault(key, []).append(item)
        elif _is_short_text(value) and (key.lower() in NAME_KEYS or not _looks_like_date(value)):
            if key.lower() in ("name", "title", "full_name") and depth == 0 and (
                    label not in PERSON_RECORDS):
                target_label = label
            else:
                target_label = KEY_LABELS.get(key.lower(), label_of(key))
            out.add_entity(value.strip(), target_label)
            out.facts.append(
                ExtractedFact(name, value.strip(), relation, f"{name}: {words} {value.strip()}",
                              valid_at=episode.valid_at)
            )
        else:
            attributes[key] = value
    for entity in out.entities:
        if entity.name == name:
            entity.attributes = json.dumps(attributes, ensure_ascii=False, sort_keys=True,
                                           default=str)


def _looks_like_date(value: str) -> bool:
    return bool(re.match(r"^\d{4}-\d{2}-\d{2}", value.strip())) or value.strip().isdigit()


def extract_record(episode: EpisodeInput, max_depth: int = 3) -> Extraction:
    """Entities and facts of one JSON record episode."""
    data = json.loads(episode.content)
    label = label_of(episode.source or "record")
    key = _record_key(data, label)
    name = f"{label} {data[key]}" if key else f"{label} {episode.source_id or episode.episode_id}"
    out = Extraction()
    person = _person_name(data, label)
    if person is not None:  # the record is the person: its fields are the person's facts
        name, data = data[person].strip(), {k: v for k, v in data.items() if k != person}
        out.add_entity(name, "Person")
    else:
        out.add_entity(name, label)
    _map_record(out, data, label, name, episode, 0, max_depth)
    return out


def _person_name(data: dict, label: str) -> str | None:
    """The key of a person record's name (`"name": "Marcus Bell"` on an employee), or None."""
    if label not in PERSON_RECORDS:
        return None
    return next((k for k in ("full_name", "name") if _is_short_text(data.get(k))), None)


def record_text(content: str, max_items: int = 48) -> str:
    """A record as short `key value` phrases for embedding: JSON punctuation costs tokens
    (about 2.5x more for the same record) and carries no meaning for a sentence encoder."""
    parts: list[str] = []
    stack: list[tuple[str, Any]] = [("", json.loads(content))]
    while stack and len(parts) < max_items:
        prefix, node = stack.pop(0)
        if isinstance(node, dict):
            stack[:0] = [(k.replace("_", " "), v) for k, v in node.items()]
        elif isinstance(node, list):
            stack[:0] = [(prefix, v) for v in node]
        elif node is not None and node != "":
            parts.append(f"{prefix} {node}".strip())
    return "; ".join(parts)
