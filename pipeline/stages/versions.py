"""versions: bi-temporal versions of the facts against the previous snapshot."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
from ray.data import Dataset
from tkg.pipeline import engine, facts, schema
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.stages.common import only, open_versions, previous_table


def _tag(side: str, dim: int) -> Callable[[pa.Table], pa.Table]:
    def tag(batch: pa.Table) -> pa.Table:
        batch = schema.conform(batch, schema.facts(dim))
        return batch.append_column("side", pa.array([side] * batch.num_rows, pa.string()))

    return tag


def versions_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """A first run: every fact is its first version."""
    return {"facts_versioned": inputs["facts_embedded"]}


def versions_update(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Shuffled by edge against the stored versions: an unchanged fact keeps its version; a
    changed one closes the open version and appends the next. The output holds every
    version of the edges that met here (`_touched_edges`); the stored versions of every
    other edge are kept as they are, by publish (`FACTS`: `Publish.replaces`)."""
    edges = previous_table(ctx, "facts", ["edge_id", "source_entity_id", "expired_at"])
    if edges is None:
        return versions_stage(ctx, inputs)
    new = inputs["facts_embedded"]
    touched = engine.gather(ctx, _touched_edges(ctx, new, inputs["recomputed_subjects"],
                                                edges), ["edge_id"], what="touched edges")
    stored = previous_table(ctx, "facts", keys=("edge_id", touched["edge_id"]))
    both = engine.union(ctx, engine.map(ctx, new, _tag("new", ctx.dim)),
                        engine.map(ctx, stored, _tag("old", ctx.dim)))
    return {"facts_versioned": engine.shuffle(ctx, both, ["edge_id"], facts.version_edges,
                                              ctx.created_at)}


def _touched_edges(ctx: RunContext, new: Dataset, recomputed: Dataset, edges: Dataset
                   ) -> Dataset:
    """The edges that meet in the shuffle (edge_id, once each): those the facts stage passed
    on (new or changed) and the open ones of the subjects it rebuilt (rebuilt, or gone),
    found in the stored `edges` (read without their vectors: with them, the filter of the
    160,000-episode store's facts ran on Ray Data, 1.8 s). Every other stored version is
    kept as it is; of the stored table only these edges' rows are read."""
    rebuilt = engine.join(ctx, engine.map(ctx, engine.map(ctx, edges, open_versions), only,
                                          ["edge_id", "source_entity_id"]),
                          engine.map(ctx, recomputed, only, ["source_entity_id"]),
                          "inner", ("source_entity_id",))
    new_ids = engine.map(ctx, new, only, ["edge_id"])
    others = engine.join(ctx, engine.map(ctx, rebuilt, only, ["edge_id"]), new_ids,
                         "left_anti", ("edge_id",))
    return engine.union(ctx, new_ids, others).materialize()


# every version of the edges a run touched; the table keeps the other edges' stored rows
FACTS = Publish("facts_versioned", "facts", replaces="edge_id")
STAGE = Stage("versions", ("facts_embedded", "recomputed_subjects"), ("facts_versioned",),
              versions_stage, update=versions_update, state=("facts",), publishes=(FACTS,))
