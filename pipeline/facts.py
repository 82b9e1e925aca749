"""Facts (entity edges). This slice: one edge per (pair, relation, fact text) with merged
provenance, `valid_at` from the text's dates or else the episode's time, version 1.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from pipeline import schema
from pipeline.resolve import entity_id, normalize_name


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
    return pa.Table.from_pylist(rows, schema=schema.FACT_ROWS)


def merge_facts(rows: pa.Table, created_at: datetime) -> pa.Table:
    """Fact rows (any number of edges) -> the first version of each edge."""
    by_edge: dict[str, list[dict]] = {}
    for row in rows.to_pylist():
        by_edge.setdefault(row["edge_id"], []).append(row)
    return pa.Table.from_pylist(
        [merge_edge(occurrences, created_at) for _, occurrences in sorted(by_edge.items())],
        schema=schema.MERGED_FACTS,
    )


def merge_edge(occurrences: list[dict], created_at: datetime) -> dict:
    """All occurrences of one edge -> its first version, provenance merged. An edge is valid
    from its earliest occurrence; an end date stated anywhere ends it."""
    first = occurrences[0]
    valid = [o["valid_at"] for o in occurrences if o["valid_at"] is not None]
    invalid = [o["invalid_at"] for o in occurrences if o["invalid_at"] is not None]
    return {
        **{k: first[k] for k in ("edge_id", "group_id", "source_entity_id", "target_entity_id",
                                 "relation")},
        "version": 1,
        "fact": min((o["fact"] for o in occurrences), key=lambda f: (-len(f), f)),
        "episode_ids": sorted({o["episode_id"] for o in occurrences}),
        "valid_at": min(valid) if valid else None,
        "invalid_at": min(invalid) if invalid else None,
        "created_at": created_at,
        "expired_at": None,
        "invalidated_by": None,
    }
