"""The build as named steps, each in its own module: a function from Ray datasets to Ray
datasets (`run`), its update on top of the previous snapshot where it has one (`update`),
the previous snapshot's tables it reads (`state`) and the outputs a run publishes
(`publishes`). `tkg.pipeline.build` runs them in this order and derives what it publishes
and carries from these declarations; `tkg.pipeline.engine` decides where each step runs.

The runner materializes every output under `STORE/work/<run_id>/<stage>/`, so a stage sees
only finished tables and a rerun can resume after the last finished stage. Keys of heavy
work (conversations, entity names, edges) are shuffled with group_id in the key, so memory
per worker is bounded by the largest block, never by the dataset.
"""

from __future__ import annotations

from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.stages import (
    communities,
    embed,
    embed_names,
    extract,
    facts,
    names,
    read,
    resolve,
    versions,
    window,
)
from tkg.pipeline.stages.common import INTERNAL_EXTRACTIONS, INTERNAL_PAIRS
from tkg.pipeline.stages.names import names_stage
from tkg.pipeline.stages.resolve import resolve_stage

STAGES: tuple[Stage, ...] = tuple(module.STAGE for module in (
    read, window, extract, names, embed_names, resolve, facts, embed, versions, communities))
REGISTRY: dict[str, Stage] = {stage.name: stage for stage in STAGES}
PUBLISHES: tuple[Publish, ...] = tuple(p for stage in STAGES for p in stage.publishes)

__all__ = ["INTERNAL_EXTRACTIONS", "INTERNAL_PAIRS", "PUBLISHES", "REGISTRY", "STAGES",
           "Publish", "RunContext", "Stage", "names_stage", "resolve_stage"]
