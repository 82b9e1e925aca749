"""read + validate: one Ray task per input file (or span of a big one); bad records become
rejects."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
from ray.data import Dataset
from tkg.pipeline import engine, sources, storage
from tkg.pipeline.config import StorageConfig, TkgConfig
from tkg.pipeline.context import Publish, RunContext, Stage


@ray.remote(num_returns=3)
def _read_file(path: Path | str | sources.Span, run_id: str, config: TkgConfig,
               created_at: datetime
               ) -> tuple[pa.Table, pa.Table, tuple[sources.ReadStats, list[Any]]]:
    episodes, rejects, stats = sources.read_file(
        path, run_id=run_id, limits=config.limits, created_at=created_at,
        storage_config=config.storage)
    return episodes, rejects, (stats, engine.described(episodes, rejects))


@ray.remote
def _lines_starting(path: Path | str, start: int, end: int, config: StorageConfig | None
                    ) -> int:
    return sources.lines_starting(path, start, end, config)


def read_spans(files: list[Path | str], config: StorageConfig | None) -> list[sources.Span]:
    """What the read tasks read: each file whole, or a big JSON Lines file in spans
    (`sources.spans`), each numbered from the lines before it (a task per span counts
    them: bytes read twice, once as a count)."""
    cut = storage.each(lambda path: sources.spans(path, config), files)
    counts = iter(engine.run_tasks(_lines_starting, [
        (path, start, end, config) for path, parts in zip(files, cut, strict=True)
        if len(parts) > 1 for start, end in parts]))
    out: list[sources.Span] = []
    for path, parts in zip(files, cut, strict=True):
        if len(parts) == 1:
            out.append(sources.Span(path))
            continue
        first_line = 1
        for start, end in parts:
            out.append(sources.Span(path, start, end, first_line))
            first_line += next(counts)
    return out


def read_stage(ctx: RunContext, _: dict[str, Dataset]) -> dict[str, Dataset]:
    """One Ray task per input file (or span of a big one); bad records become rejects with
    file and line. The episodes and rejects stay in the object store; only the counts come
    to the driver."""
    (episodes, rejects), read = engine.task_blocks(
        _read_file, [(span, ctx.run_id, ctx.config, ctx.created_at)
                     for span in read_spans(list(ctx.files), ctx.config.storage)], 2)
    for stats in read:
        for key in ("episodes_in", "episodes_ok", "rejected", "missing_timezone"):
            ctx.count(key, getattr(stats, key))
    return {"raw_episodes": episodes, "read_rejects": rejects}


STAGE = Stage("read", (), ("raw_episodes", "read_rejects"), read_stage,
              publishes=(Publish("read_rejects", "rejects"),))
