"""read + validate: one Ray task per input file; bad records become rejects."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import ray
from ray.data import Dataset
from tkg.pipeline import engine, sources
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.datasets import from_tables


@ray.remote
def _read_file(path: Path | str, run_id: str, config: TkgConfig, created_at: datetime):
    return sources.read_file(path, run_id=run_id, limits=config.limits, created_at=created_at,
                             storage_config=config.storage)


def read_stage(ctx: RunContext, _: dict[str, Dataset]) -> dict[str, Dataset]:
    """One Ray task per input file; bad records become rejects with file and line."""
    read = engine.run_tasks(_read_file, ((p, ctx.run_id, ctx.config, ctx.created_at)
                                         for p in ctx.files))
    episodes, rejects = [], []
    for ep_table, rej_table, stats in read:
        episodes.append(ep_table)
        rejects.append(rej_table)
        for key in ("episodes_in", "episodes_ok", "rejected", "missing_timezone"):
            ctx.count(key, getattr(stats, key))
    return {
        "raw_episodes": from_tables(episodes),
        "read_rejects": from_tables(rejects),
    }


STAGE = Stage("read", (), ("raw_episodes", "read_rejects"), read_stage,
              publishes=(Publish("read_rejects", "rejects"),))
