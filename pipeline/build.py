"""The build runner: stages in order, outputs materialized under the run's work dir, publish.

A stage whose output is marked finished in the work dir (`tkg.pipeline.outputs`) is not run
again, so `tkg build --run-id ID` after a crash resumes after the last finished stage.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from ray.data import Dataset
from tkg.pipeline import (
    engine,
    faults,
    local_ray,
    lock,
    outputs,
    reliability,
    schema,
    sources,
    storage,
    store,
    visibility,
)
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.datasets import EMPTY_PART, DriverDataset
from tkg.pipeline.embed import embedding_dim
from tkg.pipeline.llm.usage import llm_summary
from tkg.pipeline.stages import PUBLISHES, STAGES, Publish, RunContext, Stage
from tkg.pipeline.storage import Location

log = logging.getLogger("tkg.build")
REJECTS = "rejects"  # one table of every stage's rejects, the earlier snapshots' included


def _catalog_first(publish: Publish) -> int:
    """The catalog's tables in their order, then the internal ones."""
    return list(schema.PUBLISHED).index(publish.table) if (
        publish.table in schema.PUBLISHED) else len(schema.PUBLISHED)


# What a run publishes, from the stages' declarations: work table -> published table, the
# tables that grow (earlier rows kept by reference), the reject outputs.
PUBLISH = {p.output: p.table for p in sorted(PUBLISHES, key=_catalog_first)
           if p.table != REJECTS}
CARRIED = tuple(p.table for p in sorted(PUBLISHES, key=_catalog_first) if p.grows)
REPLACED = {p.table: p.replaces for p in PUBLISHES if p.replaces}  # table -> key column
REJECT_OUTPUTS = tuple(p.output for p in PUBLISHES if p.table == REJECTS)


@dataclass
class BuildResult:
    summary: dict[str, Any]
    snapshot: Location


def joins_cluster(config: TkgConfig) -> bool:
    """Whether ray.init joins a running cluster: an address in the config, or RAY_ADDRESS, which
    `ray job submit` sets for its drivers even when the config says `address: null`. A
    cluster refuses local-only settings (_system_config, num_cpus, object store size)."""
    return config.ray.address not in (None, "local") or bool(os.environ.get("RAY_ADDRESS"))


def _worker_pool(config: TkgConfig) -> dict[str, int] | None:
    """Keep idle workers of a local Ray alive. Ray Data runs more tasks at once than there
    are CPUs (shuffle maps and reduces, reads), and by default Ray kills every worker past
    one per CPU after a second idle: each operation then starts Python workers again, which
    cost a small build 3-4 s per join or shuffle (measured: a join of 1,000 rows took 3.7 s
    with the default, 0.07 s with warm workers)."""
    if joins_cluster(config) or not config.ray.idle_workers:
        return None  # a cluster's pool is the cluster's business
    cpus = config.ray.num_cpus or os.cpu_count() or 1
    return {"num_workers_soft_limit": cpus + config.ray.idle_workers,
            "idle_worker_killing_time_threshold_ms": 300_000}


# A hash shuffle's map phase takes its input blocks in batches of this many bytes per node, a
# task each. Ray's default, 1 GiB, gave every shuffle under it one map task while the other
# CPUs waited: at 1,000,000 mentions resolution's shuffle by group was one 5.6 s task over
# 622 MB on one of 2 cores (`ray.timeline()`); at 128 MiB, five. `tkg bench resolution
# --mentions 1000000 --json`, eight runs alternating, the same pairs: 1 GiB 50.4 / 54.4 /
# 58.0 / 57.1 s, 128 MiB 51.0 / 48.5 / 48.4 / 58.3 s (means 55.0 and 51.5).
SHUFFLE_MAP_BYTES = 128 * 2**20


def init_ray(config: TkgConfig) -> int:
    """Join the configured cluster, or start a local Ray; returns the CPUs available."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet = {"include_dashboard": False, "log_to_driver": False,
             "logging_level": logging.WARNING, "configure_logging": True}
    if ray.is_initialized():
        pass
    elif joins_cluster(config):
        ray.init(address=config.ray.address, **quiet)
    else:  # ports of its own, one retry, nothing left behind (pipeline/local_ray.py)
        local_ray.start(
            num_cpus=config.ray.num_cpus, _system_config=_worker_pool(config),
            object_store_memory=(int(config.ray.object_store_gb * 2**30)
                                 if config.ray.object_store_gb else None), **quiet)
    context = ray.data.DataContext.get_current()
    # Bars only on a terminal: written to a log file (tkg build without --verbose) they are
    # thousands of lines of carriage returns.
    context.enable_progress_bars = config.ray.progress_bars and sys.stderr.isatty()
    context.verbose_progress = False
    cpus = int(ray.cluster_resources().get("CPU", 1))
    context.default_hash_shuffle_parallelism = config.ray.shuffle_partitions or max(2 * cpus, 2)
    context.shuffle_input_batch_bytes = SHUFFLE_MAP_BYTES
    return cpus


@dataclass
class Done:
    """A run's finished outputs: where each lies, and the driver's own outputs held for
    the stages after it that read them (`outputs.handed`), each until its last reader."""

    at: dict[str, Location]
    held: dict[str, list[pa.Table]]
    readers: dict[str, int]  # output -> stages left that read it

    def read(self, name: str, driver_bytes: int, columns: Sequence[str] | None) -> Dataset:
        held = self.held.get(name)
        self.release([name])
        return outputs.handed(held, columns) if held is not None else outputs.read(
            [self.at[name]], driver_bytes, columns)

    def release(self, names: Sequence[str]) -> None:
        """One reader of each of `names` is done (or skipped: a stage finished earlier)."""
        for name in names:
            self.readers[name] = self.readers.get(name, 1) - 1
            if self.readers[name] <= 0:
                self.held.pop(name, None)


def _run_stage(ctx: RunContext, stage: Stage, done: Done, given: Mapping[str, Dataset]
               ) -> dict[str, int]:
    """One attempt at a stage: read its inputs (`given` ones as they are), run it, write its
    outputs; rows per output. An output the driver made, within the size policy, is held
    for the stages that read it (`Done`)."""
    driver_bytes = engine.policy(ctx).driver_bytes
    inputs = {name: given[name] if name in given else done.read(
        name, driver_bytes,
        stage.reads(schema.WORK_TABLES[name](ctx.dim)) if stage.reads else None)
        for name in stage.inputs}
    inputs = faults.worker_inputs(stage.name, inputs, ctx.work_dir)
    faults.hit("stage_error", stage.name)
    results = stage.compute(ctx, inputs)
    targets = {name: storage.join(ctx.work_dir, stage.name, name) for name in stage.outputs}
    held = {name: [] for name in stage.outputs if done.readers.get(name) and isinstance(
        results[name], DriverDataset) and results[name].size_bytes() <= driver_bytes}
    rows = {name: outputs.write(results[name], targets[name],
                                schema.WORK_TABLES[name](ctx.dim), held.get(name))
            for name in stage.outputs}
    done.at.update(targets)
    done.held.update(held)
    return rows


def run_stages(ctx: RunContext, stages: Sequence[Stage] = STAGES,
               given: Mapping[str, Dataset] | None = None) -> dict[str, float]:
    """Run each of `stages` not already finished in the work dir; returns seconds per stage.
    `given`: inputs from outside the run (a community refresh: a snapshot's tables)."""
    seconds: dict[str, float] = {}
    done = Done({}, {}, {})
    for stage in stages:
        for name in stage.inputs:
            done.readers[name] = done.readers.get(name, 0) + 1
    for stage in stages:
        stage_dir = storage.join(ctx.work_dir, stage.name)
        record = outputs.finished(stage_dir)
        if record is not None:
            ctx.count_all(record["counters"])
            seconds[stage.name] = record["seconds"]
            done.at.update({name: storage.join(stage_dir, name) for name in stage.outputs})
            done.release(stage.inputs)
            log.info("stage %s already finished, skipped", stage.name)
            continue
        started = time.perf_counter()
        before = dict(ctx.counters)
        rows = reliability.run_stage(
            stage.name, ctx, lambda stage=stage: _run_stage(ctx, stage, done, given or {}))
        seconds[stage.name] = round(time.perf_counter() - started, 3)
        outputs.mark_finished(stage_dir, {"seconds": seconds[stage.name], "rows": rows,
                                          "counters": ctx.counted_since(before)})
        faults.hit("after_stage", stage.name)
    ctx.outputs.update(done.at)
    return seconds


# A published file holds up to this many bytes of a stage's part files (on disk). A stage
# writes a part per block; published one file each, the 160,000-episode synthetic store's
# `_extractions` was 639 files of 40 KB, and every later run read all of their footers and
# bodies (py-spy: 5.2 s of a 200-episode night's reads).
PUBLISHED_FILE_BYTES = 64 << 20


def _writer(source: Location, table_schema: pa.Schema, policy: engine.SizePolicy,
            replacing: tuple[Sequence[Location], str] | None = None) -> store.TableWriter:
    """Publish a stage output: each batch of its part files (`_batches`) written as the
    batch's group partitions (`store.write_parts`). `replacing` (the previous snapshot's
    files of the table and its key, `Publish.replaces`): and each batch of those files,
    without the rows of the keys the output holds. The 160,000-episode night's `versions`
    had read the stored facts (315 MB) on Ray Data to join them with 10,000 edge ids and
    write them out again (3.2 s of its 3.6); here each file is read, filtered and written
    once, and small files of earlier nights are merged up to `PUBLISHED_FILE_BYTES`. The
    driver writes them itself, a thread per core, where they fit
    (`SizePolicy.writes_on_driver`); else a Ray task per batch (a fresh worker's first
    task took 0.5-1 s, most of a 10,000-episode night's writes)."""

    def write(target: Location) -> int:
        config = storage.configured()
        limit = PUBLISHED_FILE_BYTES
        parts = storage.file_sizes(source, suffixes={".parquet"})
        stored = _sized(replacing[0]) if replacing is not None else []
        threads = os.cpu_count() or 1
        here = policy.writes_on_driver(sum(size for _, size in (*parts, *stored)), threads)
        calls = [(batch, target, table_schema, config) for batch in _batches(parts, limit)]
        if replacing is not None:
            keys = _keys([path for path, _ in parts], replacing[1])
            held = keys if here else ray.put(keys)
            calls += [(batch, target, table_schema, config, replacing[1], held)
                      for batch in _batches(stored, limit)]
        rows = sum(storage.each(lambda call: store.write_parts(*call), calls, threads)
                   if here else engine.run_tasks(store.write_parts_task, calls))
        store.write_empty(target, table_schema)
        return rows

    return write


def _keys(files: Sequence[str], key: str) -> pa.Array:
    """The distinct `key` values of a stage output's part `files`."""
    columns = storage.each(lambda path: storage.read_parquet(path, columns=[key])[key], files)
    return pc.unique(pa.chunked_array([chunk.cast(pa.string()) for column in columns
                                       for chunk in column.chunks], pa.string()))


def _sized(files: Sequence[Location]) -> list[tuple[str, int]]:
    """(file, bytes) of `files` that hold rows (placeholders of empty tables left out)."""
    with_rows = [str(f) for f in files if storage.name(f) != EMPTY_PART]
    return list(zip(with_rows, storage.each(storage.size, with_rows), strict=True))


def _batches(files: Sequence[tuple[str, int]], limit: int) -> list[list[str]]:
    """Consecutive files, each batch up to `limit` bytes (a bigger file alone)."""
    batches: list[list[str]] = []
    room = 0
    for path, size in files:
        if not batches or size > room:
            batches.append([])
            room = limit
        batches[-1].append(path)
        room -= size
    return batches


def publish(ctx: RunContext, store_dir: Location, seconds: dict[str, float],
            started_at: datetime) -> BuildResult:
    """Publish the run's outputs as a snapshot (`store.publish`), CURRENT switched last."""
    out = ctx.outputs
    tables = stage_writers(ctx, PUBLISH, REPLACED)
    rejects = {name: store.read_table(storage.join(out[name], ".."), storage.name(out[name]),
                                      schema.REJECTS) for name in REJECT_OUTPUTS}
    every_reject = pa.concat_tables([
        *rejects.values(),
        store.read_table(ctx.previous, "rejects", schema.REJECTS) if ctx.previous
        else schema.REJECTS.empty_table()])
    tables[REJECTS] = table_writer(every_reject, schema.REJECTS)
    manifest = publish_run(
        ctx, store_dir, tables, started_at,
        lambda done: _summary(ctx, store_dir, done, rejects, seconds),
        {"embedding": {"model": ctx.config.embed.model, "dim": ctx.dim},
         "inputs": [str(f) for f in ctx.files], "schema_version": 1}, grown=CARRIED,
        replaced={table: [f for f, _ in storage.file_sizes(out[work], suffixes={".parquet"})]
                  for work, table in PUBLISH.items() if table in REPLACED} if ctx.previous
        else None)
    return BuildResult(summary=manifest["summary"],
                       snapshot=store.snapshot_dir(store_dir, ctx.run_id))


def stage_writers(ctx: RunContext, publishes: Mapping[str, str],
                  replaced: Mapping[str, str] | None = None) -> dict[str, store.TableWriter]:
    """Published table -> its writer, for each finished output -> table of `publishes`;
    `replaced` (table -> key, `Publish.replaces`): of these tables the previous snapshot's
    rows of the keys the output lacks are kept."""
    replaced = replaced if ctx.previous is not None else None
    return {table: _writer(ctx.outputs[work], _published_schema(work, table, ctx.dim),
                           engine.policy(ctx),
                           (store.table_files(ctx.previous, table), replaced[table])
                           if replaced and table in replaced else None)
            for work, table in publishes.items()}


def publish_run(ctx: RunContext, store_dir: Location, tables: Mapping[str, store.TableWriter],
                started_at: datetime, summarize: Callable[[store.Published], dict[str, Any]],
                manifest: dict[str, Any], *, grown: Sequence[str] = (),
                kept: Sequence[str] = (), carry: Mapping[str, Sequence[str]] | None = None,
                extend: bool = True,
                replaced: Mapping[str, Sequence[Location]] | None = None) -> dict[str, Any]:
    """`store.publish` of a run, a build, a community refresh or a forget: its manifest is
    `manifest` (what the caller adds) with the run's fields over it, its `runs` row is the
    summary's; returns the manifest. `extend`, `replaced`: as `store.publish`'s."""

    def describe(done: store.Published) -> tuple[dict[str, Any], pa.Table]:
        summary = summarize(done)
        return {
            **manifest, "run_id": ctx.run_id, "created_at": ctx.created_at.isoformat(),
            "config_hash": ctx.config.fingerprint(), "config": ctx.config.model_dump(),
            "tables": {**manifest.get("tables", {}), **done.rows}, "summary": summary,
            "retrieval": done.retrieval,
        }, run_row(summary, ctx.config, started_at, inputs=[str(f) for f in ctx.files],
                   stage_seconds=list(summary["seconds"].items()),
                   llm_prompt_tokens=summary["llm_prompt_tokens"],
                   llm_completion_tokens=summary["llm_completion_tokens"])

    return store.publish(store_dir, ctx.run_id, tables, previous=ctx.previous, dim=ctx.dim,
                         query=ctx.config.query, describe=describe, grown=grown, kept=kept,
                         carry=carry, extend=extend, replaced=replaced)


def _published_schema(work: str, table: str, dim: int) -> pa.Schema:
    """A catalog table's schema; an internal table (earlier extractions, resolution pairs)
    keeps its work table's."""
    return (schema.PUBLISHED[table] if table in schema.PUBLISHED else schema.WORK_TABLES[work])(dim)


def _summary(ctx: RunContext, store_dir: Location, done: store.Published,
             rejects: dict[str, pa.Table], seconds: dict[str, float]) -> dict[str, Any]:
    """The run's figures. Every record read is rejected (unreadable, or an id seen with other
    content) or ok: stored by this run, a re-delivery within this run, or already in the
    store. Each part is measured where it happens, so episodes_in == episodes_ok + rejected
    holds only if no record was lost on the way. Episodes whose extraction failed stay in
    the graph (listed in rejects as extract_failed)."""
    counters, rows = ctx.counters, done.rows
    new = {"stored": rows["episodes"] - store.table_rows(ctx.previous, "episodes"),
           "duplicates": counters.get("duplicates", 0),
           "already_ingested": counters.get("already_ingested", 0)}
    return {
        "run_id": ctx.run_id, "store": str(store_dir), "snapshot": str(done.snapshot),
        "episodes_in": counters.get("episodes_in", 0),
        "episodes_ok": sum(new.values()),
        "rejected": rejects["read_rejects"].num_rows + rejects["window_rejects"].num_rows,
        "duplicates": new["duplicates"], "already_ingested": new["already_ingested"],
        "previous_snapshot": storage.name(ctx.previous) if ctx.previous else None,
        "extract_failed": rejects["extract_rejects"].num_rows,
        "missing_timezone": counters.get("missing_timezone", 0),
        "ambiguous_pairs": counters.get("ambiguous_pairs", 0),
        "episodes": rows["episodes"], "entities": rows["entities"], "mentions": rows["mentions"],
        **_fact_counts(done), **run_figures(ctx, done, seconds),
    }


def run_figures(ctx: RunContext, done: store.Published, seconds: dict[str, float]
                ) -> dict[str, Any]:
    """What every run's summary ends with, a build's or a community refresh's: the
    snapshot's communities, the run's LLM use and seconds per stage and to publish."""
    counters, rows = ctx.counters, done.rows
    return {
        "communities": rows["communities"],
        "communities_extended": counters.get("communities_extended", 0),
        **llm_summary(counters, rows["episodes"]),
        "seconds": {**seconds, "publish": round(done.seconds, 3)},
        "seconds_total": round(sum(seconds.values()) + done.seconds, 3),
    }


def _fact_counts(done: store.Published) -> dict[str, int]:
    """Fact versions, facts the store believes now, and those among them that ended."""
    now = visibility.duckdb_where("facts", known_at=visibility.LATEST)
    held = visibility.duckdb_where("facts", as_of=visibility.LATEST)
    with done.connect() as con:
        facts, current, ended = con.execute(
            f"SELECT count(DISTINCT edge_id), count(*) FILTER ({now}), "
            f"count(*) FILTER ({now} AND NOT ({held})) FROM facts").fetchone()
    return {"facts": facts, "facts_current": current, "facts_invalidated": ended}


def run_row(summary: dict[str, Any], config: TkgConfig, started_at: datetime, *,
            inputs: list[str], stage_seconds: list[tuple[str, float]],
            **figures: int) -> pa.Table:
    """The `runs` row of a finished run (a build or a community refresh): the summary's
    fields, with the run's own `figures` (LLM calls, tokens) over the summary's."""
    row = {key: summary.get(key) for key in schema.RUNS.names}
    row.update(status="succeeded", config_hash=config.fingerprint(), inputs=inputs,
               started_at=started_at, finished_at=store.now(), stage_seconds=stage_seconds,
               **figures)
    return schema.from_rows([row], schema.RUNS)


def table_writer(table: pa.Table, table_schema: pa.Schema) -> store.TableWriter:
    """Publish a table made in this process (the rejects)."""
    return lambda target: store.write_table(table, target, table_schema)


def _remembered(location: Location, first: Callable[[], str]) -> str:
    """What the first attempt of a run wrote at `location` (`first()`, written now if none)."""
    try:
        return storage.read_text(location).strip()
    except FileNotFoundError:
        value = first()
        storage.write_text(location, value)
        return value


def build(config: TkgConfig, inputs: list[str], store_dir: str | Path,
          run_id: str | None = None) -> BuildResult:
    """Build a snapshot of `inputs` into `store_dir` and publish it."""
    storage.configure(config.storage)
    store_dir = storage.location(store_dir)
    files = sources.discover(inputs, config.storage)
    started_at = store.now()
    run_id = run_id or store.new_run_id(started_at, files)
    reliability.preflight(store_dir, files, config)  # disk and permissions, before any work
    with lock.held(store_dir, "build", run_id):  # never interleaved with a forget
        ctx = run_context(config, store_dir, run_id, files, started_at)
        seconds = run_stages(ctx)
        with reliability.publishing(store_dir, run_id):
            result = publish(ctx, store_dir, seconds, started_at)
    return result


def run_context(config: TkgConfig, store_dir: Location, run_id: str, files: list[Path],
                started_at: datetime, dim: int | None = None) -> RunContext:
    """The context of run `run_id` on the store's current snapshot, Ray started. A resumed
    run keeps its transaction time and builds on the same snapshot. `dim`: the vectors'
    width when already known (a snapshot's), else the embedder's."""
    work = store.work_dir(store_dir, run_id)
    created_at = datetime.fromisoformat(
        _remembered(storage.join(work, "created_at"), started_at.isoformat))
    previous_run = _remembered(storage.join(work, "previous"),
                               lambda: store.current_run(store_dir) or "")
    previous = store.snapshot_dir(store_dir, previous_run) if previous_run else None
    cpus = init_ray(config)
    return RunContext(config=config, run_id=run_id, created_at=created_at, files=files,
                      work_dir=work, dim=dim or embedding_dim(config), cpus=cpus,
                      previous=previous)
