"""embed: vectors of episode contents, entity names and fact texts; names and facts the
previous snapshot holds with the same text keep their vectors."""

from __future__ import annotations

import pyarrow as pa
from ray.data import Dataset
from tkg.pipeline import engine
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.extract.records import record_text
from tkg.pipeline.stages.common import embed_changed, embed_column


def _episode_text(batch: pa.Table) -> pa.Table:
    texts = []
    for kind, speaker, title, source, content in zip(
        *(batch[c].to_pylist() for c in ("kind", "speaker", "title", "source", "content")),
        strict=True,
    ):
        if kind == "json":
            content = record_text(content or "{}")
        prefix = {"message": speaker, "text": title, "json": source}.get(kind)
        texts.append(f"{prefix}: {content}" if prefix else content)
    return batch.append_column("embed_text", pa.array(texts, pa.string()))


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
