"""Entity resolution. This slice merges by exact normalized name within a group; the ids are
derived from (group, normalized name), so every stage can compute an entity's id locally.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import schema

GENERIC_LABELS = {"Entity", "Concept", "Thing"}
_PUNCT = re.compile(r"[^\w\s&+@.-]|(?<!\w)[.-]|[.-](?!\w)")


def normalize_name(name: str) -> str:
    """Casefolded, NFKC, punctuation-light, single-spaced, without a leading article."""
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _PUNCT.sub(" ", text)
    text = " ".join(text.split())
    if text.startswith("the ") and len(text) > 4:
        text = text[4:]
    return text


def entity_id(group_id: str, name: str) -> str:
    return schema.stable_id(group_id, "entity", normalize_name(name))


def mention_rows(extractions: pa.Table) -> pa.Table:
    """One row per (episode, extracted entity), with the resolution key."""
    entities = extractions["entities"]
    flat = pc.list_flatten(entities)
    parents = pc.list_parent_indices(entities)
    if len(flat) == 0:
        return pa.table({
            "group_id": pa.array([], pa.string()), "episode_id": pa.array([], pa.string()),
            "valid_at": pa.array([], schema.TS), "name": pa.array([], pa.string()),
            "label": pa.array([], pa.string()), "attributes": pa.array([], pa.string()),
            "normalized": pa.array([], pa.string()),
        })
    names = pc.struct_field(flat, "name")
    table = pa.table({
        "group_id": pc.take(extractions["group_id"], parents),
        "episode_id": pc.take(extractions["episode_id"], parents),
        "valid_at": pc.take(extractions["valid_at"], parents),
        "name": names,
        "label": pc.struct_field(flat, "label"),
        "attributes": pc.struct_field(flat, "attributes"),
        "normalized": pa.array([normalize_name(n or "") for n in names.to_pylist()]),
    })
    return table.filter(pc.not_equal(table["normalized"], ""))


def canonical_name(names: Counter[str]) -> str:
    """Most frequent surface form; ties go to the longest, then alphabetical (deterministic)."""
    return min(names, key=lambda n: (-names[n], -len(n), n))


def resolve_entities(mentions: pa.Table, created_at: datetime) -> pa.Table:
    """Mentions (any number of (group, normalized name) keys) -> one entity row per key."""
    by_key: dict[tuple[str, str], list[dict]] = {}
    for row in mentions.to_pylist():
        by_key.setdefault((row["group_id"], row["normalized"]), []).append(row)
    return pa.Table.from_pylist(
        [resolve_group(rows, created_at) for _, rows in sorted(by_key.items())],
        schema=schema.RESOLVED_ENTITIES,
    )


def resolve_group(rows: list[dict], created_at: datetime) -> dict:
    """All mentions of one (group, normalized name) -> the entity, with its aliases."""
    rows = sorted(rows, key=lambda r: (r["valid_at"], r["episode_id"]))
    names = Counter(r["name"] for r in rows)
    labels = sorted({r["label"] for r in rows if r["label"]} - GENERIC_LABELS) or sorted(
        {r["label"] for r in rows if r["label"]}
    )
    attributes: dict = {}
    for row in rows:  # later records win
        if row["attributes"]:
            attributes.update(json.loads(row["attributes"]))
    group_id, normalized = rows[0]["group_id"], rows[0]["normalized"]
    return {
        "entity_id": schema.stable_id(group_id, "entity", normalized),
        "group_id": group_id,
        "name": canonical_name(names),
        "normalized": normalized,
        "labels": labels,
        "summary": "",
        "attributes": json.dumps(attributes, ensure_ascii=False, sort_keys=True, default=str),
        "created_at": created_at,
        "first_seen": rows[0]["valid_at"],
        "last_seen": rows[-1]["valid_at"],
        "mention_count": len({r["episode_id"] for r in rows}),
        "aliases": sorted(names),
    }


def alias_rows(entities: pa.Table) -> pa.Table:
    """entity_aliases rows: every surface name that resolved to an entity, and why."""
    aliases = entities["aliases"]
    parents = pc.list_parent_indices(aliases)
    flat = pc.list_flatten(aliases)
    return pa.table({
        "group_id": pc.take(entities["group_id"], parents),
        "alias": flat,
        "normalized": pc.take(entities["normalized"], parents),
        "entity_id": pc.take(entities["entity_id"], parents),
        "merged_entity_id": pc.take(entities["entity_id"], parents),
        "evidence": pa.array(["exact"] * len(flat), pa.string()),
        "score": pa.array([1.0] * len(flat), pa.float64()),
        "created_at": pc.take(entities["created_at"], parents),
    })


def episode_mentions(mentions: pa.Table) -> pa.Table:
    """Distinct (episode, entity) edges of the episodic subgraph."""
    ids = [schema.stable_id(g, "entity", n) for g, n in
           zip(mentions["group_id"].to_pylist(), mentions["normalized"].to_pylist(), strict=True)]
    table = pa.table({"episode_id": mentions["episode_id"], "entity_id": pa.array(ids, pa.string()),
                      "group_id": mentions["group_id"]})
    return table.group_by(["episode_id", "entity_id", "group_id"]).aggregate([])
