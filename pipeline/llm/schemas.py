"""JSON schemas of every LLM answer. Each is sent as the structured-output constraint and is
what `parse` validates against, so a constrained and an unconstrained model are held to the
same contract. Written in the subset that OpenAI strict mode, vLLM (xgrammar) and llama.cpp
all accept: every property required, no additional properties, nullable as a type union."""

from __future__ import annotations

from typing import Any

NULLABLE_STRING = {"type": ["string", "null"]}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


# An entity's attributes: the fields its type declares (`ontology.entity_types`) that the
# episode gives a value for, as pairs (strict mode takes no free-form object).
ATTRIBUTE = _object({"name": {"type": "string"}, "value": {"type": "string"}})
ENTITY = _object({"name": {"type": "string"}, "label": {"type": "string"},
                  "attributes": {"type": "array", "items": ATTRIBUTE}})
FACT = _object({
    "source": {"type": "string"},
    "target": {"type": "string"},
    "relation": {"type": "string"},
    "fact": {"type": "string"},
    "valid_at": NULLABLE_STRING,
    "invalid_at": NULLABLE_STRING,
    "date_text": NULLABLE_STRING,
    "undated": {"type": "boolean"},
})
EXTRACTION_SCHEMA = _object({
    "entities": {"type": "array", "items": ENTITY},
    "facts": {"type": "array", "items": FACT},
})
PAIR_DECISIONS_SCHEMA = _object({"decisions": {"type": "array", "items": _object(
    {"id": {"type": "integer"}, "same": {"type": "boolean"}})}})
INVALIDATION_DECISIONS_SCHEMA = _object({"decisions": {"type": "array", "items": _object(
    {"id": {"type": "integer"}, "ends": {"type": "boolean"}})}})
SUMMARY_SCHEMA = _object({"summary": {"type": "string"}})
NAMED_SUMMARY_SCHEMA = _object({"name": {"type": "string"}, "summary": {"type": "string"}})
