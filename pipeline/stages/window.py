"""window: deduplicate by episode id, attach the previous n messages of each conversation;
an update also leaves out what the store already holds."""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import engine, schema, sources
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.stages.common import previous_table


def _with_window_key(batch: pa.Table) -> pa.Table:
    keys = [sources.window_key(g, k, c, e) for g, k, c, e in zip(
        batch["group_id"].to_pylist(), batch["kind"].to_pylist(),
        batch["conversation_id"].to_pylist(), batch["episode_id"].to_pylist(), strict=True)]
    return batch.append_column("window_key", pa.array(keys, pa.string()))


WINDOW_OUT = schema.WINDOWED_EPISODES.append(pa.field("reject", pa.string()))


def _window_block(rows: pa.Table, args: dict) -> pa.Table:
    episodes, rejects = sources.window_episodes(rows.drop_columns(["window_key"]), **args)
    out = schema.conform(episodes, WINDOW_OUT)
    if rejects:
        marked = [{"reject": json.dumps(r, default=str)} for r in rejects]
        out = pa.concat_tables([out, pa.Table.from_pylist(marked, schema=WINDOW_OUT)])
    return out


def window_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Deduplicate by episode id and attach the previous n messages of each conversation."""
    args = {
        "context_messages": ctx.config.extract.context_messages, "run_id": ctx.run_id,
        "created_at": ctx.created_at, "payload_chars": ctx.config.limits.reject_payload_chars,
    }
    keyed = engine.map(ctx, inputs["raw_episodes"], _with_window_key)
    grouped = engine.shuffle(ctx, keyed, ["window_key"], _window_block, args).materialize()
    # Re-deliveries (same id, same content) are what the window dropped: rows in minus rows
    # out, kept or rejected.
    ctx.count("duplicates", inputs["raw_episodes"].count() - grouped.count())
    return {"episodes": engine.map(ctx, grouped, _kept_episodes),
            "window_rejects": engine.map(ctx, grouped, _decode_rejects)}


def window_update(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """`window_stage` less the episodes the store holds: re-ingesting them is a no-op."""
    out = window_stage(ctx, inputs)
    stored = previous_table(ctx, "episodes", ["episode_id"])
    if stored is None:
        return out
    episodes = out["episodes"].materialize()  # counted and joined: computed once
    before = episodes.count()
    episodes = engine.join(ctx, episodes, stored, "left_anti", ("episode_id",)).materialize()
    ctx.count("already_ingested", before - episodes.count())
    return {**out, "episodes": episodes}


def _kept_episodes(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.is_null(batch["reject"])).drop_columns(["reject"])


def _decode_rejects(batch: pa.Table) -> pa.Table:
    rows = [json.loads(r) for r in batch["reject"].to_pylist() if r is not None]
    for row in rows:
        row["created_at"] = datetime.fromisoformat(row["created_at"])
    return schema.from_rows(rows, schema.REJECTS)


STAGE = Stage("window", ("raw_episodes",), ("episodes", "window_rejects"), window_stage,
              update=window_update, state=("episodes",),
              publishes=(Publish("window_rejects", "rejects"),))
