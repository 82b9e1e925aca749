"""embed_names: a vector per name node, for the embedding-neighbour blocking of resolution."""

from __future__ import annotations

from ray.data import Dataset
from tkg.pipeline.context import RunContext, Stage
from tkg.pipeline.stages.common import embed_changed


def embed_names_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Vectors of each name node, for the embedding-neighbour blocking of resolution. A name
    that a stored entity is named by keeps that entity's vector (an entity's name is one
    of its names' surface forms, so (group, name) is unique among entities)."""
    return {"name_vectors": embed_changed(ctx, inputs["name_nodes"], "entities", "group_id",
                                          "name", "name_embedding", what="names")}


STAGE = Stage("embed_names", ("name_nodes",), ("name_vectors",), embed_names_stage, model=True,
              state=("entities",))
