"""What a stage sees while it runs (RunContext) and how it is declared (Stage).

Apart from the stage registry (`pipeline.stages`) so that the runner's helpers
(`pipeline.resume`) and the registry both depend on it and not on each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from ray.data import Dataset
from tkg.pipeline.config import TkgConfig


@dataclass
class RunContext:
    config: TkgConfig
    run_id: str
    created_at: datetime
    files: list[Path]
    work_dir: Path
    dim: int
    cpus: int
    previous: Path | None = None  # the snapshot an incremental run builds on
    counters: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, Path] = field(default_factory=dict)  # finished stage outputs

    @property
    def partitions(self) -> int:
        """Hash-shuffle partitions for groupbys and joins."""
        return self.config.ray.shuffle_partitions or 2 * self.cpus

    def partitions_for(self, rows: int) -> int:
        """More partitions for big shuffles, so one block (one task's memory) stays near
        `ray.rows_per_partition` rows whatever the input size."""
        return max(self.partitions, math.ceil(rows / self.config.ray.rows_per_partition))

    def count(self, name: str, value: int) -> None:
        self.counters[name] = self.counters.get(name, 0) + int(value)

    def count_all(self, counters: dict[str, int]) -> None:
        """Add counters a finished step recorded (replayed when a resumed run skips it)."""
        for name, value in counters.items():
            self.count(name, value)

    def counted_since(self, before: dict[str, int]) -> dict[str, int]:
        """What was counted since `before` (a copy of `counters`), for a step's marker."""
        return {k: v - before.get(k, 0) for k, v in self.counters.items()
                if v != before.get(k, 0)}


StageFn = Callable[[RunContext, dict[str, Dataset]], dict[str, Dataset]]


@dataclass(frozen=True)
class Publish:
    """An output of a stage that a run publishes as `table` of the snapshot; `grows`: the
    table keeps the earlier snapshots' rows (carried by reference), this run's are added;
    `replaces` (a key column): a later run's output holds only the keys it changed, every
    row of each, and the table keeps the previous snapshot's rows of every other key
    (rewritten by publish, `build._writer`; what a stage after it reads of the table:
    `stages.common.replaced`)."""

    output: str
    table: str
    grows: bool = False
    replaces: str | None = None


@dataclass(frozen=True)
class Stage:
    """A step of the build. `run`: its full computation; `update`: its computation on top of
    the previous snapshot (incremental runs; none: `run` serves both), from the same domain
    functions; `state`: the previous snapshot's tables the stage reads (what it carries
    between runs); `publishes`: which outputs become which published tables; `reads`: the
    columns it reads of its inputs."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    run: StageFn
    model: bool = False  # a model stage (extraction, embedding): reported apart in benchmarks
    update: StageFn | None = None
    state: tuple[str, ...] = ()
    publishes: tuple[Publish, ...] = ()
    # of each input, only the columns this names (from the input's schema); None: all
    reads: Callable[[pa.Schema], list[str]] | None = None

    def compute(self, ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
        """`update` when the run builds on a snapshot and the stage has one, else `run`."""
        if ctx.previous is not None and self.update is not None:
            return self.update(ctx, inputs)
        return self.run(ctx, inputs)

    def in_full(self) -> Stage:
        """This stage computing in full even on top of a snapshot (`run`, never `update`): a
        community refresh reruns the communities stage over the current snapshot."""
        return replace(self, update=None)
