"""Run a model over rows: in the driver, with one instance loaded once per process, or on a
pool of Ray actors, one instance each; or, for a model that takes a whole dataset (vLLM
through `ray.data.llm`), over the dataset at once.

Every model stage goes through `over_rows` (spaCy and LLM extraction, sentence-transformers
and BGE-m3 embedding, the resolution adjudicator) or `over_dataset` (vLLM extraction), so the
choice of where a model runs is the engine's size policy (`ray.driver_rows`) in one place.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from ray.data import ActorPoolStrategy, Dataset
from tkg.pipeline import engine
from tkg.pipeline.context import RunContext
from tkg.pipeline.datasets import empty_dataset

BatchFn = Callable[[pa.Table], pa.Table]


@dataclass(frozen=True)
class Model:
    """How a model runs over rows. `udf`: a class whose instances map an Arrow batch (built
    once per actor from `args`); `local`: the driver's instance (loaded once per process),
    or None where the model must not run in the driver (an LLM backend, a GPU model, an
    injected crash); `batch_rows`: rows per actor call (None: Ray's default); `actors`: the
    pool size asked for (None: one per CPU); `fixed_pool`: that size whatever the rows,
    and no split of the input's blocks."""

    udf: type
    args: tuple = ()
    batch_rows: int | None = None
    actors: int | None = None
    gpus: float = 0
    local: Callable[[], BatchFn] | None = None
    fixed_pool: bool = False


def model_actors(ctx: RunContext) -> dict[str, int]:
    """Ray options of a model actor pool: a dead actor is restarted and its batch retried
    `ray.actor_restarts` times, then the stage fails (and `ray.stage_attempts` decides)."""
    restarts = ctx.config.ray.actor_restarts
    return {"max_restarts": restarts, "max_task_retries": restarts}


def pool_size(configured: int, rows: int, rows_per_block: int) -> int:
    """Actors for a model stage: no more than the blocks `spread` makes of its rows, since
    an actor without a block only loads a model (an 18-record build started two actors, two
    model loads, for each of its five model pools)."""
    return max(1, min(configured, math.ceil(rows / max(rows_per_block, 1))))


def spread(ds: Dataset, rows_per_block: int) -> Dataset:
    """Split big blocks before an actor pool: one block feeds one actor at a time, so a
    stage whose input is a single block would leave every other actor idle. Materialized
    first, because an actor pool holding every CPU starves the tasks that would split."""
    return ds.repartition(target_num_rows_per_block=rows_per_block).materialize()


def over_rows(ctx: RunContext, ds: Dataset, model: Model) -> Dataset:
    """`model` over every row of `ds`, computed: in the driver when it may run there and the
    rows are few (`SizePolicy.model_on_driver`: a night of a few hundred rows spent most of
    a model stage starting actors that each load the model), else on an actor pool. No
    rows: no model load at all."""
    rows = engine.nonempty(ds)
    if rows is None:
        return empty_dataset()
    count = rows.count()
    if model.local is not None and engine.policy(ctx).model_on_driver(count):
        return engine.map_on_driver(rows, model.local())
    return _on_actors(ctx, rows, count, model).materialize()


def _on_actors(ctx: RunContext, rows: Dataset, count: int, model: Model) -> Dataset:
    options: dict[str, Any] = model_actors(ctx)
    if model.gpus:
        options["num_gpus"] = model.gpus
    if model.batch_rows is not None:
        options["batch_size"] = model.batch_rows
    if model.fixed_pool:
        actors = model.actors or 1
    else:
        actors = pool_size(model.actors or ctx.cpus, count, model.batch_rows or count)
        rows = spread(rows, model.batch_rows or count)
    return rows.map_batches(model.udf, fn_constructor_args=model.args, batch_format="pyarrow",
                            compute=ActorPoolStrategy(size=actors), num_cpus=1, **options)


def over_dataset(ds: Dataset, run: Callable[[Dataset], Dataset]) -> Dataset:
    """A model that takes the whole dataset (vLLM's processor places its own GPU actors),
    computed."""
    return run(ds).materialize()
