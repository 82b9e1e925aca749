"""The build runner: stages in order, outputs materialized under the run's work dir, publish.

A stage whose `_SUCCESS.json` exists in the work dir is not run again, so `tkg build
--run-id ID` after a crash resumes after the last finished stage.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray
import ray.data
from ray.data import Dataset
from tkg.pipeline import faults, reliability, schema, sources, storage, store
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.datasets import read_parquet_files
from tkg.pipeline.embed import embedding_dim
from tkg.pipeline.llm.usage import llm_summary
from tkg.pipeline.stages import INTERNAL_EXTRACTIONS, STAGES, RunContext, Stage

log = logging.getLogger("tkg.build")
SUCCESS = "_SUCCESS.json"
# Work tables -> the published table they become.
PUBLISH = {
    "episodes_embedded": "episodes",
    "entities": "entities",
    "entity_aliases": "entity_aliases",
    "mentions": "mentions",
    "facts_versioned": "facts",
    "communities": "communities",
    "community_members": "community_members",
}
CARRIED = ("episodes", INTERNAL_EXTRACTIONS)  # tables that grow: earlier rows are kept
REJECT_OUTPUTS = ("read_rejects", "window_rejects", "extract_rejects")


@dataclass
class BuildResult:
    summary: dict[str, Any]
    snapshot: Path


def new_run_id(now: datetime, files: list[Path]) -> str:
    digest = hashlib.sha256("\n".join(map(str, files)).encode()).hexdigest()[:6]
    return f"{now:%Y%m%dT%H%M%SZ}-{digest}"


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


def init_ray(config: TkgConfig) -> int:
    """Join the configured cluster, or start a local Ray; returns the CPUs available."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        ray.init(
            address=config.ray.address,
            num_cpus=None if joins_cluster(config) else config.ray.num_cpus,
            object_store_memory=(int(config.ray.object_store_gb * 2**30)
                                 if config.ray.object_store_gb and not joins_cluster(config)
                                 else None),
            include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
            configure_logging=True, _system_config=_worker_pool(config),
        )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = config.ray.progress_bars
    context.verbose_progress = False
    cpus = int(ray.cluster_resources().get("CPU", 1))
    context.default_hash_shuffle_parallelism = config.ray.shuffle_partitions or max(2 * cpus, 2)
    return cpus


def _read_output(path: Path) -> Dataset:
    """A finished stage output, loaded before the next stage starts: actor pools then never
    wait for CPU slots held by read tasks (a deadlock on small machines)."""
    files = sorted(str(p) for p in path.glob("*.parquet"))
    return read_parquet_files(files)


def _materialize(dataset: Dataset, target: Path, table_schema: pa.Schema) -> int:
    """Write a stage output as Parquet in its declared schema (at least one file)."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    rows = 0
    for index, ref in enumerate(dataset.to_arrow_refs()):
        table = schema.conform(ray.get(ref), table_schema)
        if table.num_rows or index == 0:
            pq.write_table(table, target / f"part-{index:05d}.parquet")
            rows += table.num_rows
    if not any(target.iterdir()):
        pq.write_table(table_schema.empty_table(), target / store.EMPTY_PART)
    return rows


def _run_stage(ctx: RunContext, stage: Stage, outputs: dict[str, Path]) -> dict[str, int]:
    """One attempt at a stage: read its inputs, run it, write its outputs; rows per output."""
    inputs = {name: _read_output(outputs[name]) for name in stage.inputs}
    inputs = faults.worker_inputs(stage.name, inputs, ctx.work_dir)
    faults.hit("stage_error", stage.name)
    results = stage.run(ctx, inputs)
    rows = {}
    for name in stage.outputs:
        rows[name] = _materialize(results[name], ctx.work_dir / stage.name / name,
                                  schema.WORK_TABLES[name](ctx.dim))
        outputs[name] = ctx.work_dir / stage.name / name
    return rows


def run_stages(ctx: RunContext) -> dict[str, float]:
    """Run each stage not already finished in the work dir; returns seconds per stage."""
    seconds: dict[str, float] = {}
    outputs: dict[str, Path] = {}
    for stage in STAGES:
        stage_dir = ctx.work_dir / stage.name
        marker = stage_dir / SUCCESS
        if marker.is_file():
            done = json.loads(marker.read_text())
            for key, value in done["counters"].items():
                ctx.count(key, value)
            seconds[stage.name] = done["seconds"]
            outputs.update({name: stage_dir / name for name in stage.outputs})
            log.info("stage %s already finished, skipped", stage.name)
            continue
        started = time.perf_counter()
        before = dict(ctx.counters)
        rows = reliability.run_stage(stage.name, ctx,
                                     lambda stage=stage: _run_stage(ctx, stage, outputs))
        seconds[stage.name] = round(time.perf_counter() - started, 3)
        counters = {k: v - before.get(k, 0) for k, v in ctx.counters.items()}
        marker.write_text(json.dumps({"seconds": seconds[stage.name], "rows": rows,
                                      "counters": counters}))
        faults.hit("after_stage", stage.name)
    ctx.outputs.update(outputs)
    return seconds


def _publish_table(source: Path, target: Path, table_schema: pa.Schema) -> int:
    files = sorted(source.glob("*.parquet"))
    rows = 0
    if files:
        tasks = [_write_parts.remote(str(f), target, table_schema) for f in files]
        rows = sum(ray.get(tasks))
    store.write_empty(target, table_schema)
    return rows


@ray.remote
def _write_parts(path: str, target: Path, table_schema: pa.Schema) -> int:
    table = pq.read_table(path)
    if table.num_rows == 0:
        return 0
    store.write_group_parts(table, target, table_schema)
    return table.num_rows


def publish(ctx: RunContext, store_dir: Path, seconds: dict[str, float],
            started_at: datetime) -> BuildResult:
    """Write the snapshot (tables, catalog, manifest) and switch CURRENT last."""
    started = time.perf_counter()
    snapshot = store.prepare_snapshot(store_dir, ctx.run_id)
    outputs = ctx.outputs
    rows: dict[str, int] = {}
    for work_name, table in PUBLISH.items():
        rows[table] = _publish_table(outputs[work_name], snapshot / table,
                                     schema.PUBLISHED[table](ctx.dim))
    new_episodes = rows["episodes"]
    _publish_table(outputs["extractions"], snapshot / INTERNAL_EXTRACTIONS, schema.EXTRACTIONS)
    for table in CARRIED:
        rows[table] = rows.get(table, 0) + _carry(ctx.previous, snapshot, table)
    reject_tables = {name: schema.conform(pq.read_table(outputs[name]), schema.REJECTS)
                     for name in REJECT_OUTPUTS}
    rejects = pa.concat_tables([*reject_tables.values(), _previous_rejects(ctx.previous)])
    rows["rejects"] = rejects.num_rows
    _write_small(rejects, snapshot / "rejects", schema.REJECTS)

    # Records not in the graph: unreadable ones and conflicting duplicate ids. Episodes whose
    # extraction failed stay in the graph (and are listed in rejects as extract_failed).
    rejected = reject_tables["read_rejects"].num_rows + reject_tables["window_rejects"].num_rows
    episodes_ok = ctx.counters.get("episodes_in", 0) - rejected
    summary: dict[str, Any] = {
        "run_id": ctx.run_id,
        "store": str(store_dir),
        "snapshot": str(snapshot),
        "episodes_in": ctx.counters.get("episodes_in", 0),
        "episodes_ok": episodes_ok,
        "rejected": rejected,
        "duplicates": episodes_ok - new_episodes - ctx.counters.get("already_ingested", 0),
        "already_ingested": ctx.counters.get("already_ingested", 0),
        "previous_snapshot": ctx.previous.name if ctx.previous else None,
        "extract_failed": reject_tables["extract_rejects"].num_rows,
        "missing_timezone": ctx.counters.get("missing_timezone", 0),
        "ambiguous_pairs": ctx.counters.get("ambiguous_pairs", 0),
        "episodes": rows["episodes"],
        "entities": rows["entities"],
        "mentions": rows["mentions"],
        **_fact_counts(snapshot),
        "communities": rows["communities"],
        "communities_extended": ctx.counters.get("communities_extended", 0),
        **llm_summary(ctx.counters, rows["episodes"]),
        "seconds": {**seconds, "publish": 0.0},
    }
    runs = pa.concat_tables([store.previous_runs(store_dir), _run_row(ctx, summary, started_at)])
    _write_small(runs, snapshot / "runs", schema.RUNS)
    store.build_catalog(snapshot, list(schema.PUBLISHED))
    from tkg.pipeline.index import (
        build_indexes,  # retrieval indexes (LanceDB); lazy: query -> pipeline
    )

    retrieval = build_indexes(snapshot, ctx.dim, ctx.config.query)
    summary["seconds"]["publish"] = round(time.perf_counter() - started, 3)
    summary["seconds_total"] = round(sum(summary["seconds"].values()), 3)
    runs = pa.concat_tables([runs.slice(0, runs.num_rows - 1),
                             _run_row(ctx, summary, started_at)])  # now with publish seconds
    _write_small(runs, snapshot / "runs", schema.RUNS)
    store.write_manifest(snapshot, {
        "run_id": ctx.run_id, "created_at": ctx.created_at.isoformat(),
        "config_hash": ctx.config.fingerprint(), "config": ctx.config.model_dump(),
        "embedding": {"model": ctx.config.embed.model, "dim": ctx.dim},
        "inputs": [str(f) for f in ctx.files], "tables": rows, "summary": summary,
        "retrieval": retrieval, "schema_version": 1,
    })
    faults.hit("before_switch")  # a crash here must leave CURRENT on the last good snapshot
    store.switch_current(store_dir, ctx.run_id)
    return BuildResult(summary=summary, snapshot=snapshot)


def _carry(previous: Path | None, snapshot: Path, table: str) -> int:
    """Hard-link (or copy) the previous snapshot's files of a growing table; returns rows."""
    if previous is None or not (previous / table).is_dir():
        return 0
    rows = 0
    for source in (previous / table).rglob("part-*.parquet"):
        if source.name == store.EMPTY_PART:
            continue
        target = snapshot / table / source.relative_to(previous / table)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
        rows += pq.ParquetFile(target).metadata.num_rows
    return rows


def _previous_rejects(previous: Path | None) -> pa.Table:
    if previous is None or not (previous / "rejects").is_dir():
        return schema.REJECTS.empty_table()
    return schema.conform(pq.read_table(previous / "rejects", partitioning=None),
                          schema.REJECTS)


def _fact_counts(snapshot: Path) -> dict[str, int]:
    import duckdb

    glob = (snapshot / "facts").resolve() / "**" / "*.parquet"
    with duckdb.connect() as con:
        facts, current, invalidated = con.execute(
            "SELECT count(DISTINCT edge_id), count(*) FILTER (expired_at IS NULL), "
            "count(*) FILTER (expired_at IS NULL AND invalid_at IS NOT NULL) "
            "FROM read_parquet(?, hive_partitioning = false)", [glob.as_posix()]
        ).fetchone()
    return {"facts": facts, "facts_current": current, "facts_invalidated": invalidated}


def _write_small(table: pa.Table, target: Path, table_schema: pa.Schema) -> None:
    """Driver-side write of a small table (rejects, runs)."""
    if table.num_rows and "group_id" in table_schema.names:
        store.write_group_parts(table, target, table_schema)
    elif table.num_rows:
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(schema.conform(table, table_schema), target / "part-00000.parquet")
    store.write_empty(target, table_schema)


def _run_row(ctx: RunContext, summary: dict[str, Any], started_at: datetime) -> pa.Table:
    row = {key: summary.get(key) for key in schema.RUNS.names}
    row.update(
        status="succeeded", config_hash=ctx.config.fingerprint(),
        inputs=[str(f) for f in ctx.files], started_at=started_at, finished_at=store.now(),
        llm_prompt_tokens=summary["llm_prompt_tokens"],
        llm_completion_tokens=summary["llm_completion_tokens"],
        stage_seconds=list(summary["seconds"].items()),
    )
    return pa.Table.from_pylist([row], schema=schema.RUNS)


def build(config: TkgConfig, inputs: list[str], store_dir: str | Path,
          run_id: str | None = None) -> BuildResult:
    """Build a snapshot of `inputs` into `store_dir` and publish it."""
    storage.require_local(store_dir, "store")
    store_dir = Path(store_dir)
    files = sources.discover(inputs, config.storage)
    started_at = store.now()
    run_id = run_id or new_run_id(started_at, files)
    reliability.preflight(store_dir, files, config)  # disk and permissions, before any work
    work = store.work_dir(store_dir, run_id)
    work.mkdir(parents=True, exist_ok=True)
    created_file = work / "created_at"
    if created_file.is_file():  # a resumed run keeps its transaction time
        created_at = datetime.fromisoformat(created_file.read_text().strip())
    else:
        created_at = started_at
        created_file.write_text(created_at.isoformat())
    previous_file = work / "previous"  # a resumed run builds on the same snapshot
    if not previous_file.is_file():
        previous_file.write_text(store.current_run(store_dir) or "")
    previous_run = previous_file.read_text().strip()
    previous = store.snapshot_dir(store_dir, previous_run) if previous_run else None
    cpus = init_ray(config)
    ctx = RunContext(config=config, run_id=run_id, created_at=created_at, files=files,
                     work_dir=work, dim=embedding_dim(config), cpus=cpus, previous=previous)
    seconds = run_stages(ctx)
    with reliability.publishing(store_dir, run_id):
        return publish(ctx, store_dir, seconds, started_at)
