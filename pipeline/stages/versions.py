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
    changed one closes the open version and appends the next."""
    stored = previous_table(ctx, "facts")
    if stored is None:
        return versions_stage(ctx, inputs)
    new = inputs["facts_embedded"]
    # Stored edges keep their versions as they are unless the facts stage passed them on
    # (new or changed) or rebuilt their subject (rebuilt, or gone): only those meet in the
    # shuffle. Which edges are carried is a join, on Ray Data when the store is big.
    untouched = engine.join(ctx, engine.map(ctx, stored, open_versions),
                            engine.map(ctx, inputs["recomputed_subjects"], only,
                                       ["source_entity_id"]),
                            "left_anti", ("source_entity_id",))
    carried = engine.join(ctx, engine.map(ctx, untouched, only, ["edge_id"]),
                          engine.map(ctx, new, only, ["edge_id"]),
                          "left_anti", ("edge_id",)).materialize()
    both = engine.union(ctx, engine.map(ctx, new, _tag("new", ctx.dim)), engine.map(
        ctx, engine.join(ctx, stored, carried, "left_anti", ("edge_id",)),
        _tag("old", ctx.dim)))
    versioned = engine.shuffle(ctx, both, ["edge_id"], facts.version_edges, ctx.created_at)
    kept = engine.join(ctx, stored, carried, "inner", ("edge_id",))
    return {"facts_versioned": engine.union(ctx, versioned, kept)}


STAGE = Stage("versions", ("facts_embedded", "recomputed_subjects"), ("facts_versioned",),
              versions_stage, update=versions_update, state=("facts",),
              publishes=(Publish("facts_versioned", "facts"),))
