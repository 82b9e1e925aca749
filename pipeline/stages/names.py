"""names: name nodes, every surface form that normalizes the same within a group."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
from ray.data import Dataset
from tkg.pipeline import engine, resolve
from tkg.pipeline.context import RunContext, Stage
from tkg.pipeline.stages.common import ENTITY_COLUMNS, INTERNAL_EXTRACTIONS, all_extractions


def name_nodes(mentions: pa.Table, created_at: datetime) -> pa.Table:
    """One node per normalized name of a group: the mentions, not yet mapped to entities,
    grouped by name (what `resolve.resolve_entities` does with unmapped mentions). Without
    entity ids: no stage reads a name node's (611,317 ids, about 1 s of the driver's time at
    1,000,000 mentions); an entity's id comes from its cluster (`resolve.cluster`)."""
    return resolve.resolve_entities(mentions, created_at, ids=False)


def names_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Name nodes: every surface form that normalizes the same, per group (exact match)."""
    extractions = all_extractions(ctx, inputs["extractions"], ENTITY_COLUMNS)
    mentions = engine.map(ctx, extractions, resolve.mention_rows).materialize()
    nodes = engine.shuffle(ctx, mentions, ["group_id", "normalized"], name_nodes,
                           ctx.created_at)
    return {"name_nodes": nodes, "entity_mentions": mentions}  # resolve maps the mentions


STAGE = Stage("names", ("extractions",), ("name_nodes", "entity_mentions"), names_stage,
              state=(INTERNAL_EXTRACTIONS,))
