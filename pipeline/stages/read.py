"""read + validate: one Ray task per input file; bad records become rejects."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
from ray.data import Dataset
from tkg.pipeline import engine, sources
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.context import Publish, RunContext, Stage


@ray.remote(num_returns=3)
def _read_file(path: Path | str, run_id: str, config: TkgConfig, created_at: datetime
               ) -> tuple[pa.Table, pa.Table, tuple[sources.ReadStats, list[Any]]]:
    episodes, rejects, stats = sources.read_file(
        path, run_id=run_id, limits=config.limits, created_at=created_at,
        storage_config=config.storage)
    return episodes, rejects, (stats, engine.described(episodes, rejects))


def read_stage(ctx: RunContext, _: dict[str, Dataset]) -> dict[str, Dataset]:
    """One Ray task per input file; bad records become rejects with file and line. The
    episodes and rejects stay in the object store; only the counts come to the driver."""
    (episodes, rejects), read = engine.task_blocks(
        _read_file, [(p, ctx.run_id, ctx.config, ctx.created_at) for p in ctx.files], 2)
    for stats in read:
        for key in ("episodes_in", "episodes_ok", "rejected", "missing_timezone"):
            ctx.count(key, getattr(stats, key))
    return {"raw_episodes": episodes, "read_rejects": rejects}


STAGE = Stage("read", (), ("raw_episodes", "read_rejects"), read_stage,
              publishes=(Publish("read_rejects", "rejects"),))
