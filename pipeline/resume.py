"""Resume inside a stage: its input split into chunks by a stable hash of a key, each
chunk's outputs persisted with their own marker (`tkg.pipeline.outputs`), so a rerun after a
crash skips the chunks already done (extraction is the expensive stage: model calls are not
paid twice).

`resumable(stage, chunk_rows)` wraps any registered stage without knowing what it does: the stage
function runs unchanged once per chunk, on the rows of that chunk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import engine, faults, outputs, schema, storage
from tkg.pipeline.storage import Location

if TYPE_CHECKING:
    from ray.data import Dataset
    from tkg.pipeline.config import TkgConfig
    from tkg.pipeline.context import RunContext, Stage

log = logging.getLogger("tkg.resume")
CHUNKS = "_chunks"
PLAN = "plan.json"
BUCKET = "_chunk"


def bucket_of(key: str, chunks: int) -> int:
    """The chunk of a key: stable across processes and runs (unlike Python's hash)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % chunks


def _with_bucket(key: str, chunks: int):
    def add(batch: pa.Table) -> pa.Table:
        buckets = [bucket_of(k or "", chunks) for k in batch[key].to_pylist()]
        return batch.append_column(BUCKET, pa.array(buckets, pa.int32()))

    return add


def _only(bucket: int):
    def keep(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.equal(batch[BUCKET], bucket)).drop_columns([BUCKET])

    return keep


def _plan(root: Location, rows: Callable[[], int], chunk_rows: int) -> int:
    """The number of chunks, fixed at the first attempt so a resume splits the same way
    (`rows` is counted only then)."""
    plan = storage.join(root, PLAN)
    try:
        return int(json.loads(storage.read_text(plan))["chunks"])
    except FileNotFoundError:
        pass
    counted = rows()
    chunks = max(1, math.ceil(counted / max(chunk_rows, 1)))
    storage.write_text(plan, json.dumps({"chunks": chunks, "rows": counted}))
    return chunks


def run_in_chunks(ctx: RunContext, stage: Stage, key: str, chunk_rows: int,
                  inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Run `stage` once per unfinished chunk of its first input; return all chunks' outputs."""
    source = stage.inputs[0]
    root = storage.join(ctx.work_dir, stage.name, CHUNKS)
    data = inputs[source]
    chunks = _plan(root, data.count, chunk_rows)
    keyed = engine.map(ctx, data, _with_bucket(key, chunks)).materialize()
    chunk_dirs = [storage.join(root, f"{index:05d}") for index in range(chunks)]
    for index, chunk_dir in enumerate(chunk_dirs):
        done = outputs.finished(chunk_dir)
        if done is not None:
            ctx.count_all(done["counters"])
            log.info("%s chunk %d/%d already finished, skipped", stage.name, index + 1, chunks)
            continue
        faults.hit(f"{stage.name}_batch", str(index))
        before = dict(ctx.counters)
        part = engine.map(ctx, keyed, _only(index))
        results = stage.compute(ctx, {**inputs, source: part})
        rows = {name: outputs.write(results[name], storage.join(chunk_dir, name),
                                    schema.WORK_TABLES[name](ctx.dim)) for name in stage.outputs}
        outputs.mark_finished(chunk_dir, {"rows": rows, "counters": ctx.counted_since(before)})
        log.info("%s chunk %d/%d done: %s", stage.name, index + 1, chunks, rows)
    driver_bytes = engine.policy(ctx).driver_bytes
    return {name: outputs.read((storage.join(d, name) for d in chunk_dirs), driver_bytes)
            for name in stage.outputs}


def resumable(stage: Stage, chunk_rows: Callable[[TkgConfig], int],
              key: str = "episode_id") -> Stage:
    """The same stage, run chunk by chunk with a marker per chunk (see module doc); the
    stage's config says how many rows a chunk holds (`chunk_rows(config)`)."""

    def run(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
        return run_in_chunks(ctx, stage, key, chunk_rows(ctx.config), inputs)

    return dataclasses.replace(stage, run=run, update=None)
