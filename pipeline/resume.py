"""Resume inside a stage: its input split into chunks by a stable hash of a key, each chunk's
outputs persisted with their own `_SUCCESS.json`, so a rerun after a crash skips the chunks
already done (extraction is the expensive stage: model calls are not paid twice).

`resumable(stage)` wraps any registered stage without knowing what it does: the stage
function runs unchanged once per chunk, on the rows of that chunk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
import ray.data
from tkg.pipeline import faults, schema
from tkg.pipeline.datasets import read_parquet_files

if TYPE_CHECKING:
    from ray.data import Dataset
    from tkg.pipeline.context import RunContext, Stage

log = logging.getLogger("tkg.resume")
CHUNKS = "_chunks"
PLAN = "plan.json"
SUCCESS = "_SUCCESS.json"
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


def _write(dataset: Dataset, target: Path, table_schema: pa.Schema) -> int:
    """One chunk output as Parquet, written to a temp dir and renamed into place."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rows = 0
    for index, ref in enumerate(dataset.to_arrow_refs()):
        table = schema.conform(ray.get(ref), table_schema)
        if table.num_rows:
            pq.write_table(table, tmp / f"part-{index:05d}.parquet")
            rows += table.num_rows
    if rows == 0:
        pq.write_table(table_schema.empty_table(), tmp / "part-empty.parquet")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return rows


def _plan(root: Path, rows: int, chunk_rows: int) -> int:
    """The number of chunks, fixed at the first attempt so a resume splits the same way."""
    plan = root / PLAN
    if plan.is_file():
        return int(json.loads(plan.read_text())["chunks"])
    chunks = max(1, math.ceil(rows / max(chunk_rows, 1)))
    root.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps({"chunks": chunks, "rows": rows}))
    return chunks


def run_in_chunks(ctx: RunContext, stage: Stage, key: str, inputs: dict[str, Dataset]
                  ) -> dict[str, Dataset]:
    """Run `stage` once per unfinished chunk of its first input; return all chunks' outputs."""
    source = stage.inputs[0]
    root = ctx.work_dir / stage.name / CHUNKS
    data = inputs[source]
    plan_file = root / PLAN
    chunks = _plan(root, 0 if plan_file.is_file() else data.count(), ctx.config.extract.chunk_rows)
    keyed = data.map_batches(_with_bucket(key, chunks), batch_format="pyarrow").materialize()
    for index in range(chunks):
        chunk_dir = root / f"{index:05d}"
        marker = chunk_dir / SUCCESS
        if marker.is_file():
            for name, value in json.loads(marker.read_text())["counters"].items():
                ctx.count(name, value)
            log.info("%s chunk %d/%d already finished, skipped", stage.name, index + 1, chunks)
            continue
        faults.hit(f"{stage.name}_batch", str(index))
        before = dict(ctx.counters)
        part = keyed.map_batches(_only(index), batch_format="pyarrow")
        results = stage.run(ctx, {**inputs, source: part})
        rows = {name: _write(results[name], chunk_dir / name,
                             schema.WORK_TABLES[name](ctx.dim)) for name in stage.outputs}
        counters = {k: v - before.get(k, 0) for k, v in ctx.counters.items()
                    if v != before.get(k, 0)}
        marker.write_text(json.dumps({"rows": rows, "counters": counters}))
        log.info("%s chunk %d/%d done: %s", stage.name, index + 1, chunks, rows)
    return {name: read_parquet_files(sorted(str(p) for p in root.glob(f"*/{name}/*.parquet")))
            for name in stage.outputs}


def resumable(stage: Stage, key: str = "episode_id") -> Stage:
    """The same stage, run chunk by chunk with a marker per chunk (see module doc)."""

    def run(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
        return run_in_chunks(ctx, stage, key, inputs)

    return dataclasses.replace(stage, run=run)
