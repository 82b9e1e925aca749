"""embed: vectors of episode contents, entity names and fact texts; names and facts the
previous snapshot holds with the same text keep their vectors."""

from __future__ import annotations

import pyarrow as pa
from ray.data import Dataset
from tkg.pipeline import engine
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.episode_kinds import embed_texts
from tkg.pipeline.stages.common import embed_changed, embed_column


def _episode_text(batch: pa.Table) -> pa.Table:
    return batch.append_column("embed_text", pa.array(embed_texts(batch), pa.string()))


def embed_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Vectors for episode contents, entity names and fact texts (one model per actor);
    names and facts the previous snapshot holds with the same text keep their vectors."""
    episodes = engine.map(ctx, inputs["episodes"], _episode_text)
    return {
        "episodes_embedded": embed_column(ctx, episodes, "embed_text", "content_embedding"),
        "entities_embedded": embed_changed(ctx, inputs["entities_summarized"], "entities",
                                           "entity_id", "name", "name_embedding"),
        "facts_embedded": embed_changed(ctx, inputs["merged_facts"], "facts", "edge_id", "fact",
                                        "fact_embedding"),
    }


STAGE = Stage("embed", ("episodes", "entities_summarized", "merged_facts"),
              ("episodes_embedded", "entities_embedded", "facts_embedded"), embed_stage,
              model=True, state=("entities", "facts"),
              publishes=(Publish("episodes_embedded", "episodes", grows=True),
                         Publish("entities_embedded", "entities")))
