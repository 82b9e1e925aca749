"""communities: label propagation per group; an incremental run extends the previous
snapshot's communities (`communities.refresh: always` reruns it)."""

from __future__ import annotations

import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import communities, engine, schema
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.llm.usage import take_usage
from tkg.pipeline.stages import resolve, versions
from tkg.pipeline.stages.common import embed_column, previous_table, replaced


def communities_run(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Label propagation over every group; ids matched against the previous snapshot's
    communities when there is one (a community refresh: `tkg communities refresh`)."""
    return _communities(ctx, inputs, "refresh")


def communities_update(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """An incremental run extends the previous snapshot's communities
    (`communities.refresh: always` reruns label propagation instead), over every fact and
    every episode's mentions: the versions and rows this run wrote and the stored ones of
    every other edge and episode."""
    facts = replaced(ctx, versions.FACTS, inputs["facts_versioned"],
                     communities.input_columns(schema.facts(ctx.dim)))
    mentions = replaced(ctx, resolve.MENTIONS_TABLE, inputs["mentions"])
    return _communities(ctx, {**inputs, "facts_versioned": facts, "mentions": mentions},
                        "extend" if ctx.config.communities.refresh == "extend" else "refresh")


def _communities(ctx: RunContext, inputs: dict[str, Dataset], mode: str
                 ) -> dict[str, Dataset]:
    """Label propagation per group or extension (`mode`), shuffled by group, one call per
    block."""
    parts = [engine.map(ctx, inputs[name], communities.input_rows, kind)
             for name, kind in (("entities_embedded", "entity"), ("facts_versioned", "fact"),
                                ("mentions", "mention"))]
    for table, kind in (("communities", "community"), ("community_members", "member")):
        stored = previous_table(ctx, table)
        if stored is not None:  # a refresh matches ids against them
            parts.append(engine.map(ctx, stored, communities.input_rows, kind))
    rows = engine.shuffle(ctx, engine.union(ctx, *parts), ["group_id"],
                          communities.community_block, ctx.config, ctx.created_at, mode
                          ).materialize()
    rows = take_usage(ctx, rows, "communities").materialize()  # an LLM summarizer's calls
    found = rows.count()
    ctx.count("communities_extended",
              engine.total(rows, lambda block: int(pc.sum(block["placed"]).as_py() or 0)))
    named = embed_column(ctx, rows, "name", "name_embedding") if found else rows
    return {"community_rows": rows, "communities": named,
            "community_members": engine.map(ctx, rows, communities.member_rows)}


STAGE = Stage("communities", ("entities_embedded", "facts_versioned", "mentions"),
              ("community_rows", "communities", "community_members"), communities_run,
              update=communities_update,
              state=("communities", "community_members", "facts", "mentions"),
              reads=communities.input_columns,  # no vectors: the 160,000-episode night read
              # 300 MB of fact vectors it never used, on Ray Data
              publishes=(Publish("communities", "communities"),
                         Publish("community_members", "community_members")))
