"""names: name nodes, every surface form that normalizes the same within a group. A later
run maps only its own extractions to mentions and computes again only the nodes of the
names it mentions; the mentions of earlier runs and the other nodes are the snapshot's."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
from ray.data import Dataset
from tkg.pipeline import engine, node_merge, resolve
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.stages.common import (
    ENTITY_COLUMNS,
    INTERNAL_EXTRACTIONS,
    all_extractions,
    created_now,
    in_set,
    name_keys,
    previous_table,
)

INTERNAL_MENTIONS = "_entity_mentions"  # every run's mention rows (grows)
INTERNAL_NODES = "_name_nodes"  # every name node (the next run keeps those it does not mention)
# a later run's `entity_mentions` are its own; a stage after it reads them with the stored
# ones (`stages.common.grown`)
MENTIONS = Publish("entity_mentions", INTERNAL_MENTIONS, grows=True)


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


def names_update(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Tonight's mention rows; the nodes of the names they mention merged into the stored
    ones (`node_merge.merge_rows`), or, where a merge would not be exact, computed again
    from every mention of those names, the stored ones and tonight's (a node is a function
    of its name's mentions); every other node as stored, with this run's transaction time
    as every node gets. Mapping every stored extraction to mentions and grouping every
    mention again were 1.2 s of the 160,000-episode night's 1.8 (713,000 mentions)."""
    before = previous_table(ctx, INTERNAL_NODES)
    if before is None:  # a snapshot of an earlier tkg: every extraction mapped again
        return names_stage(ctx, inputs) if previous_table(
            ctx, INTERNAL_MENTIONS) is None else _nodes_again(ctx, inputs)
    new = engine.map(ctx, inputs["extractions"], resolve.mention_rows).materialize()
    named = engine.gather(ctx, new, ["group_id", "normalized"], what="tonight's names")
    names = set(name_keys(named["group_id"], named["normalized"]).to_pylist())
    tonight = engine.shuffle(ctx, new, ["group_id", "normalized"], name_nodes,
                             ctx.created_at)
    merged = engine.shuffle_together(
        ctx, {"later": tonight, "stored": engine.map(ctx, before, in_set(
            "normalized", names, group_column="group_id"))},
        node_merge.NODE_KEYS, node_merge.tagged, node_merge.merge_rows, ctx.created_at,
        False).materialize()
    nodes = engine.map(ctx, merged, node_merge.marked, False).materialize()
    again = engine.gather(ctx, engine.map(ctx, merged, node_merge.marked, True),
                          ["group_id", "normalized"], what="names made again")
    ctx.count("name_nodes_merged", nodes.count())
    if again.num_rows:
        nodes = engine.union(ctx, nodes, _made_again(ctx, new, set(
            name_keys(again["group_id"], again["normalized"]).to_pylist())))
    ctx.count("name_nodes_computed", nodes.count())
    kept = engine.map(ctx, engine.map(ctx, before, in_set(
        "normalized", names, keep=False, group_column="group_id")), created_now,
        ctx.created_at)
    return {"name_nodes": engine.union(ctx, nodes, kept).materialize(), "entity_mentions": new}


def _made_again(ctx: RunContext, new: Dataset, names: set[str]) -> Dataset:
    """The nodes of `names` from every mention of them, the stored ones and tonight's."""
    stored = previous_table(ctx, INTERNAL_MENTIONS)
    mentions = [engine.map(ctx, rows, in_set("normalized", names, group_column="group_id"))
                for rows in (new, stored) if rows is not None]
    return engine.shuffle(ctx, engine.union(ctx, *mentions), ["group_id", "normalized"],
                          name_nodes, ctx.created_at)


def _nodes_again(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Tonight's mention rows and every node made again from every mention (a snapshot
    that kept mentions but no nodes)."""
    new = engine.map(ctx, inputs["extractions"], resolve.mention_rows).materialize()
    stored = previous_table(ctx, INTERNAL_MENTIONS)
    nodes = engine.shuffle(ctx, engine.union(ctx, new, stored), ["group_id", "normalized"],
                           name_nodes, ctx.created_at).materialize()
    ctx.count("name_nodes_computed", nodes.count())
    return {"name_nodes": nodes, "entity_mentions": new}


STAGE = Stage("names", ("extractions",), ("name_nodes", "entity_mentions"), names_stage,
              update=names_update, state=(INTERNAL_EXTRACTIONS, INTERNAL_MENTIONS,
                                          INTERNAL_NODES),
              publishes=(MENTIONS, Publish("name_nodes", INTERNAL_NODES)))
