"""extract: entities and facts per episode, by a model over rows (spaCy in the driver or on
actors, an LLM on actors) or over the whole dataset (vLLM)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import engine, faults, runner, schema, sources
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.datasets import empty_dataset
from tkg.pipeline.extract import EpisodeInput, build_extractor
from tkg.pipeline.extract.base import EPISODE_COLUMNS
from tkg.pipeline.extract.llm import dataset_extractor
from tkg.pipeline.llm.usage import count_llm
from tkg.pipeline.resume import resumable
from tkg.pipeline.stages.common import INTERNAL_EXTRACTIONS


class ExtractBatch:
    """Ray Data UDF: one extractor per actor, Arrow batches in and out."""

    def __init__(self, config: TkgConfig, crash: bool = False) -> None:
        self.extractor = build_extractor(config)
        self.crash = crash  # faults.actor_exit: the process dies on every batch

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.crash:
            faults.die()
        episodes = [EpisodeInput.of(r) for r in batch.select(list(EPISODE_COLUMNS)).to_pylist()]
        rows = []
        for episode, result in zip(episodes, self.extractor.extract(episodes), strict=True):
            rows.append({
                "episode_id": episode.episode_id, "group_id": episode.group_id,
                "valid_at": episode.valid_at,
                "entities": [vars(e) for e in result.entities],
                "facts": [vars(f) for f in result.facts],
                "error": result.error, "raw_output": result.raw_output,
                **{k: getattr(result, k) for k in LLM_USAGE},
            })
        return schema.from_rows(rows, schema.EXTRACTIONS)


def _extraction_rejects(run_id: str, created_at: datetime) -> Callable[[pa.Table], pa.Table]:
    def to_rejects(batch: pa.Table) -> pa.Table:
        failed = batch.filter(pc.is_valid(batch["error"]))
        rows = [
            sources.reject_row(run_id=run_id, stage="extract", group_id=r["group_id"],
                               episode_id=r["episode_id"], reason=r["error"],
                               payload=r["raw_output"], created_at=created_at)
            for r in failed.select(["group_id", "episode_id", "error", "raw_output"]).to_pylist()
        ]
        return schema.from_rows(rows, schema.REJECTS)

    return to_rejects


LLM_USAGE = ("llm_calls", "llm_prompt_tokens", "llm_completion_tokens", "llm_retries")


_DRIVER_EXTRACTORS: dict[str, ExtractBatch] = {}  # per config: loaded once per process


def _driver_extractor(config: TkgConfig) -> ExtractBatch:
    """The driver's extractor, loaded once per process and config."""
    key = config.model_dump_json()
    if key not in _DRIVER_EXTRACTORS:
        _DRIVER_EXTRACTORS[key] = ExtractBatch(config)
    return _DRIVER_EXTRACTORS[key]


def extractor(config: TkgConfig, crash: bool) -> runner.Model:
    """Extraction as a model over episodes: spaCy may run in the driver (a night of a few
    hundred episodes spent most of its extract stage starting actors that load spaCy and a
    model each); an LLM extractor, or one told to crash, runs on actors."""
    in_driver = config.extract.backend in ("spacy", "synthetic") and not crash
    return runner.Model(ExtractBatch, (config, crash), batch_rows=config.extract.batch_size,
                        actors=config.extract.actors,
                        local=(lambda: _driver_extractor(config)) if in_driver else None)


def extract_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Entities and facts per episode; a failed episode stays, with no extraction, in rejects."""
    if (dataset_extract := dataset_extractor(ctx.config)) is not None:  # vLLM on GPU actors
        extractions = runner.over_dataset(
            inputs["episodes"], lambda episodes: dataset_extract(episodes, ctx.config))
    elif engine.nonempty(inputs["episodes"]) is None:  # no model load for no rows
        return {"extractions": empty_dataset(), "extract_rejects": empty_dataset()}
    else:
        model = extractor(ctx.config, crash=faults.actor_exit("extract"))
        extractions = runner.over_rows(ctx, inputs["episodes"], model)
    rejects = engine.map(ctx, extractions, _extraction_rejects(ctx.run_id, ctx.created_at))
    return {"extractions": count_llm(ctx, extractions), "extract_rejects": rejects}


# Chunked by a hash of episode_id, each chunk kept: a resumed run skips finished ones.
STAGE = resumable(Stage("extract", ("episodes",), ("extractions", "extract_rejects"),
                        extract_stage, model=True,
                        publishes=(Publish("extract_rejects", "rejects"),
                                   Publish("extractions", INTERNAL_EXTRACTIONS, grows=True))),
                  chunk_rows=lambda c: c.extract.chunk_rows)
