"""read + validate: one Ray task per input file (or span of a big one); bad records become
rejects."""

from __future__ import annotations

from pathlib import Path

from ray.data import Dataset
from tkg.pipeline import engine, sources, storage
from tkg.pipeline.config import StorageConfig
from tkg.pipeline.context import Publish, RunContext, Stage


def read_spans(files: list[Path | str], config: StorageConfig | None) -> list[sources.Span]:
    """What the read tasks read: each file whole, or a big JSON Lines file in spans
    (`sources.spans`), each numbered from the lines before it (a task per span counts
    them: bytes read twice, once as a count)."""
    cut = storage.each(lambda path: sources.spans(path, config), files)
    counts = iter(engine.run_tasks(sources.lines_task, [
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
    """One Ray task per input file (or span of a big one), or the driver for an input one
    task would read alone; bad records become rejects with file and line. Read by tasks,
    the episodes and rejects stay in the object store; only the counts come to the
    driver."""
    spans = read_spans(list(ctx.files), ctx.config.storage)
    size = storage.total_size(list(ctx.files), ctx.config.storage)
    (episodes, rejects), read = engine.task_blocks(
        ctx, sources.read_task, [(span, ctx.run_id, ctx.config, ctx.created_at)
                                 for span in spans], 2, local=sources.read_span, size=size)
    for stats in read:
        for key in ("episodes_in", "episodes_ok", "rejected", "missing_timezone"):
            ctx.count(key, getattr(stats, key))
    return {"raw_episodes": episodes, "read_rejects": rejects}


STAGE = Stage("read", (), ("raw_episodes", "read_rejects"), read_stage,
              publishes=(Publish("read_rejects", "rejects"),))
