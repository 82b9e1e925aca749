"""embed: vectors of episode contents, entity names and fact texts, each distinct text
embedded once; an entity's name takes its name node's vector (embed_names), a fact the
previous snapshot holds with the same text keeps its vector."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import engine
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.episode_kinds import embed_texts
from tkg.pipeline.stages.common import (
    embed_column,
    only,
    split_known,
    split_stored,
    with_kept,
)

TEXT, VECTOR = "embed_text", "embedding"  # a text to embed (never null) and its vector
NAME_VECTOR = ["group_id", "name", "name_embedding"]


def _episode_text(batch: pa.Table) -> pa.Table:
    return batch.append_column(TEXT, pa.array(embed_texts(batch), pa.string()).fill_null(""))


def _fact_text(batch: pa.Table) -> pa.Table:
    return batch.append_column(TEXT, pc.fill_null(batch["fact"], ""))


def _distinct(block: pa.Table) -> pa.Table:
    return block.group_by([TEXT]).aggregate([])


def _one_per_name(block: pa.Table) -> pa.Table:
    """One row per (group, name): two name nodes may share a surface form, and a vector is a
    function of its text."""
    rows = pa.table({"group_id": block["group_id"], "name": block["name"],
                     "row": pa.array(range(block.num_rows), pa.int64())})
    first = rows.group_by(["group_id", "name"], use_threads=False).aggregate([("row", "min")])
    return block.take(first["row_min"])


def _named(batch: pa.Table, vector: str, drop: list[str]) -> pa.Table:
    """The joined `VECTOR` column renamed `vector`, the `drop` columns dropped."""
    batch = batch.drop_columns([c for c in drop if c in batch.column_names])
    return batch.rename_columns([vector if c == VECTOR else c for c in batch.column_names])


def embed_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Vectors for episode contents, entity names and fact texts. A vector is a function of
    its text, so the distinct texts of episodes and new facts are embedded in one model
    pass, one actor pool, and joined back (`tkg bench build --episodes 20000`, bfloat16:
    this stage 121.3 s with a pool per column, 102.1 s with one; load ~3 in both runs).
    An entity is named by one of its name nodes' surface forms, which embed_names embedded
    with the same model: its vector is joined, not computed again (at 20,000 episodes
    4,751 names, 11.0 s of embedding on actors). Facts the previous snapshot holds with the
    same text keep their vectors."""
    episodes = engine.map(ctx, inputs["episodes"], _episode_text)
    facts, kept = split_stored(ctx, inputs["merged_facts"], "facts", "edge_id", "fact",
                               "fact_embedding", keyed=True)
    facts = engine.map(ctx, facts, _fact_text)
    texts = engine.union(ctx, *(engine.map(ctx, rows, only, [TEXT])
                                for rows in (episodes, facts)))
    vectors = embed_column(ctx, engine.shuffle(ctx, texts, [TEXT], _distinct), TEXT, VECTOR,
                           ranked=True)  # episodes and facts (embed.RANKED)
    names = engine.shuffle(ctx, engine.map(ctx, inputs["name_vectors"], only, NAME_VECTOR),
                           ["group_id", "name"], _one_per_name)
    entities, carried = split_known(ctx, inputs["entities_summarized"], names,
                                    ("group_id", "name"), "name_embedding", "entities")
    return {
        "episodes_embedded": engine.map(ctx, engine.join(
            ctx, episodes, vectors, "left_outer", (TEXT,)), _named, "content_embedding", []),
        "entities_embedded": with_kept(ctx, embed_column(ctx, entities, "name",
                                                         "name_embedding"), carried),
        "facts_embedded": with_kept(ctx, engine.map(ctx, engine.join(
            ctx, facts, vectors, "left_outer", (TEXT,)), _named, "fact_embedding", [TEXT]),
            kept),
    }


STAGE = Stage("embed", ("episodes", "entities_summarized", "merged_facts", "name_vectors"),
              ("episodes_embedded", "entities_embedded", "facts_embedded"), embed_stage,
              model=True, state=("facts",),
              publishes=(Publish("episodes_embedded", "episodes", grows=True),
                         Publish("entities_embedded", "entities")))
