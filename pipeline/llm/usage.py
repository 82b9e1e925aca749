"""LLM usage as run counters: extraction carries its calls and tokens per episode (columns
of the extractions table, so a resumed run still knows them); driver-side judgements add
their Usage directly. The build summary and `runs` read the counters (`llm_*`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import engine
from tkg.pipeline.llm.base import Usage
from tkg.pipeline.llm.prompting import prompt_set_version

USAGE_COLUMNS = ("llm_calls", "llm_prompt_tokens", "llm_completion_tokens", "llm_retries")


class Counts(Protocol):
    def count(self, name: str, value: int) -> None: ...


def count_llm(ctx: Counts, extractions: Dataset) -> Dataset:
    """Add the per-episode usage columns of `extractions` (materialized) to the run counters
    (zeros for rule-based extractors: any extractor may call a model)."""
    totals = _totals(extractions, USAGE_COLUMNS)
    for name, value in totals.items():
        ctx.count(name, value)
    ctx.count("llm_calls_extract", totals["llm_calls"])
    return extractions


def _totals(ds: Dataset, names: Sequence[str]) -> dict[str, int]:
    """The sum of each of the `names` columns over `ds`, block by block (`engine.stream`:
    a driver dataset's blocks where they are; a Ray Data `select_columns` started an
    execution, and with it Ray Data's actors, whose worker imported Ray Data and pandas:
    3.9 s of a core in every night)."""
    totals = dict.fromkeys(names, 0)
    for block in engine.stream(ds):
        for name in names:
            totals[name] += int(pc.sum(block[name]).as_py() or 0) if block.num_rows else 0
    return totals


def count_usage(ctx: Counts, counters: dict[str, int], stage: str) -> None:
    """A driver-side LLM step's usage (`usage_snapshot`), in total and under the stage's own
    name."""
    for name, value in counters.items():
        ctx.count(name, value)
    ctx.count(f"llm_calls_{stage}", counters.get("llm_calls", 0))


def llm_summary(counters: dict[str, int], episodes: int) -> dict[str, object]:
    """The build summary's LLM figures: totals, per-stage calls, and calls per episode over
    extraction + resolution + invalidation (communities excluded; the budget is 1.2)."""
    calls = counters.get("llm_calls", 0)
    budgeted = calls - counters.get("llm_calls_communities", 0)
    return {
        "llm_calls": calls,
        "llm_tokens": counters.get("llm_prompt_tokens", 0)
        + counters.get("llm_completion_tokens", 0),
        "llm_prompt_tokens": counters.get("llm_prompt_tokens", 0),
        "llm_completion_tokens": counters.get("llm_completion_tokens", 0),
        "llm_retries": counters.get("llm_retries", 0),
        "llm_calls_by_stage": {name.removeprefix("llm_calls_"): value
                               for name, value in sorted(counters.items())
                               if name.startswith("llm_calls_") and value},
        "llm_calls_per_episode": round(budgeted / episodes, 3) if episodes else 0.0,
        "llm_prompts": prompt_set_version() if calls else None,  # which templates ran
    }


def usage_snapshot(owner: object) -> dict[str, int]:
    """The run counters of whatever LLM `owner` holds (`owner.usage`), zeros without one."""
    usage = getattr(owner, "usage", None)
    return usage.counters() if isinstance(usage, Usage) else dict.fromkeys(
        Usage().counters(), 0)


def with_usage(table: pa.Table, before: dict[str, int], after: dict[str, int]) -> pa.Table:
    """A batch with what its LLM calls cost, as `llm_*` columns on its first row: for LLM
    steps that run in Ray actors, whose Usage the driver never sees."""
    for name, value in after.items():
        column = [value - before.get(name, 0)] + [0] * (table.num_rows - 1)
        table = table.append_column(name, pa.array(column[:table.num_rows], pa.int64()))
    return table


def take_usage(ctx: Counts, ds: Dataset, stage: str) -> Dataset:
    """Count the `llm_*` columns of a materialized dataset under `stage`, then drop them."""
    names = [n for n in Usage().counters() if n in (ds.schema().names if ds.schema() else [])]
    if not names:
        return ds
    totals = _totals(ds, names)
    for name, value in totals.items():
        ctx.count(name, value)
    ctx.count(f"llm_calls_{stage}", totals.get("llm_calls", 0))
    return ds.drop_columns(names)
