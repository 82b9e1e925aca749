"""Facts (entity edges). This slice: one edge per (pair, relation, fact text) with merged
provenance, `valid_at` from the text's dates or else the episode's time, version 1.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import schema
from pipeline.resolve import entity_id, normalize_name

FACT_ROWS = pa.schema([
    ("edge_id", pa.string()), ("group_id", pa.string()), ("episode_id", pa.string()),
    ("source_entity_id", pa.string()), ("target_entity_id", pa.string()),
    ("relation", pa.string()), ("fact", pa.string()), ("valid_at", schema.TS),
    ("invalid_at", schema.TS),
])


def fact_rows(extractions: pa.Table) -> pa.Table:
    """One row per extracted fact, with entity ids and an edge id computed locally."""
    rows = []
    for group_id, episode_id, t_ref, facts in zip(
        extractions["group_id"].to_pylist(), extractions["episode_id"].to_pylist(),
        extractions["valid_at"].to_pylist(), extractions["facts"].to_pylist(), strict=True,
    ):
        for fact in facts or ():
            if not fact["source"] or not fact["target"]:
                continue
            source = entity_id(group_id, fact["source"])
            target = entity_id(group_id, fact["target"])
            rows.append({
                "edge_id": schema.stable_id(group_id, "fact", source, target, fact["relation"],
                                            normalize_name(fact["fact"])),
                "group_id": group_id, "episode_id": episode_id,
                "source_entity_id": source, "target_entity_id": target,
                "relation": fact["relation"], "fact": fact["fact"],
                "valid_at": fact["valid_at"] or (None if fact["invalid_at"] else t_ref),
                "invalid_at": fact["invalid_at"],
            })
    return pa.Table.from_pylist(rows, schema=FACT_ROWS)


def merge_edge(rows: pa.Table, created_at: datetime) -> pa.Table:
    """All occurrences of one edge -> its first version, provenance merged."""
    first = rows.slice(0, 1).to_pylist()[0]
    valid = pc.min(rows["valid_at"]).as_py()
    invalid = pc.min(rows["invalid_at"]).as_py()
    edge = {
        **{k: first[k] for k in ("edge_id", "group_id", "source_entity_id", "target_entity_id",
                                 "relation")},
        "version": 1,
        "fact": min(rows["fact"].to_pylist(), key=lambda f: (-len(f), f)),
        "episode_ids": sorted(set(rows["episode_id"].to_pylist())),
        "valid_at": valid,
        "invalid_at": invalid,
        "created_at": created_at,
        "expired_at": None,
        "invalidated_by": None,
    }
    return pa.Table.from_pylist([edge], schema=MERGED_FACTS)


MERGED_FACTS = pa.schema([f for f in schema.facts(1) if f.name != "fact_embedding"])
