"""`tkg communities refresh --store DIR`: rerun label propagation for every group of the
current snapshot and publish the result as a new snapshot.

Incremental builds only extend communities (a new entity joins the community most of its
neighbours hold), so their partition drifts from what label propagation would find on the
whole graph. This job reruns it (the communities stage's full computation over the
snapshot's tables, run and published by `pipeline.build` as a build's stages are), keeps the
ids of communities whose membership mostly persists, and reports the drift (NMI, ARI)
between the extended and the refreshed partition, so users can see how often a refresh is
worth it. Every other table of the snapshot is referenced by the new one; `CURRENT` switches
last, atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from ray.data import Dataset
from tkg.pipeline import build, communities, engine, reliability, schema, storage, store
from tkg.pipeline.config import TkgConfig, load_config
from tkg.pipeline.context import RunContext
from tkg.pipeline.datasets import read_parquet_files
from tkg.pipeline.stages.communities import STAGE


def _published_inputs(ctx: RunContext) -> dict[str, Dataset]:
    """The stage's inputs as the snapshot published them (entities_embedded -> entities,
    ...), only the columns the stage reads of them."""
    assert ctx.previous is not None
    driver_bytes = engine.policy(ctx).driver_bytes
    inputs = {}
    for name in STAGE.inputs:
        table = build.PUBLISH[name]
        columns = STAGE.reads(schema.PUBLISHED[table](ctx.dim)) if STAGE.reads else None
        inputs[name] = read_parquet_files(store.table_files(ctx.previous, table), columns,
                                          driver_bytes)
    return inputs


def _drift(ctx: RunContext) -> dict[str, Any]:
    """The drift between the snapshot's communities and the stage's (`refresh_drift`)."""
    assert ctx.previous is not None

    def read(where: Path, name: str, columns: list[str]) -> pa.Table:
        # none of the columns is a vector: the schema's embedding size does not matter
        return store.read_table(where, name, schema.PUBLISHED[name](1), columns)

    def output(name: str, columns: list[str]) -> pa.Table:  # a work output of this run
        where = ctx.outputs[name]
        return read(storage.join(where, ".."), storage.name(where), columns)

    ids, members = ["community_id", "group_id"], ["community_id", "entity_id", "group_id"]
    return communities.refresh_drift(
        read(ctx.previous, "entities", ["entity_id", "group_id"]),
        before=(read(ctx.previous, "communities", ids),
                read(ctx.previous, "community_members", members)),
        after=(output("communities", ids), output("community_members", members)))


def snapshot_build_config(manifest: dict[str, Any]) -> TkgConfig:
    """The build config the snapshot was built with (`query.snapshot.snapshot_query_config` is its
    query config); if it no longer validates (built by an older
    version), the defaults with the snapshot's embedder, so names embed as its tables do."""
    from pydantic import ValidationError

    try:
        return TkgConfig.model_validate(manifest.get("config") or {})
    except ValidationError:
        embed = (manifest.get("config") or {}).get("embed") or {}
        try:
            return TkgConfig.model_validate({"embed": embed})
        except ValidationError:
            return TkgConfig()


def refresh_store(store_dir: str | Path, config: TkgConfig | None = None,
                  run_id: str | None = None) -> dict[str, Any]:
    """Refresh the communities of the current snapshot into a new snapshot: the
    communities stage's full computation (`run`: label propagation, ids matched to the
    snapshot's) over the snapshot's tables, published as a build publishes, every other
    table kept. Returns the summary (counts, drift, seconds). Readers keep the old
    snapshot until CURRENT switches; a rerun of a failed refresh (same --run-id) resumes."""
    store_dir = storage.location(store_dir)
    manifest = store.read_manifest(store.current_snapshot(store_dir))
    config = config or snapshot_build_config(manifest)
    started_at = store.now()
    run_id = run_id or f"{started_at:%Y%m%dT%H%M%SZ}-communities"
    ctx = build.run_context(config, store_dir, run_id, [], started_at,
                            dim=int(manifest["embedding"]["dim"]))
    assert ctx.previous is not None  # the store has a current snapshot
    previous = store.read_manifest(ctx.previous)  # a resumed refresh: the one it started on
    seconds = build.run_stages(ctx, [STAGE.in_full()], _published_inputs(ctx))
    report = _drift(ctx)
    tables = build.stage_writers(ctx, {p.output: p.table for p in STAGE.publishes})
    kept = [name for name in store.table_names(ctx.previous) if name not in tables]
    with reliability.publishing(store_dir, run_id):
        published = build.publish_run(
            ctx, store_dir, tables, started_at,
            lambda done: _summary_with_drift(ctx, previous, done, report, seconds),
            {**previous, "refreshed_from": storage.name(ctx.previous)}, kept=kept)
    return published["summary"]


def _summary_with_drift(ctx: RunContext, previous: dict[str, Any], done: store.Published,
                        report: dict[str, Any], seconds: dict[str, float]) -> dict[str, Any]:
    """The previous snapshot's summary with this run's figures (those every run reports)
    and the drift."""
    return {
        **previous.get("summary", {}), "run_id": ctx.run_id, "snapshot": str(done.snapshot),
        "previous_snapshot": previous["run_id"], **build.run_figures(ctx, done, seconds),
        "drift": report["overall"], "drift_by_group": report["groups"],
    }


def cmd_refresh(args: argparse.Namespace) -> int:
    config = load_config(args.config) if args.config else None
    summary = refresh_store(args.store, config, run_id=args.run_id)
    print(json.dumps(summary, default=str) if args.json else format_summary(summary))
    return 0


def _refresh_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, help="store folder")
    parser.add_argument("--config", default=None,
                        help="YAML config (default: the one the snapshot was built with)")
    parser.add_argument("--run-id", default=None, help="id of the new snapshot")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(fn=cmd_refresh)


def add_commands(commands: Any) -> None:
    """`tkg communities refresh`."""
    group = commands.add_parser("communities", help="community subgraph jobs")
    jobs = group.add_subparsers(dest="communities", required=True)
    _refresh_arguments(jobs.add_parser(
        "refresh", help="rerun label propagation for every group; publish a new snapshot"))


def main(argv: list[str] | None = None) -> int:
    """`python -m tkg.jobs.refresh_communities --store DIR [--config YAML] [--json]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _refresh_arguments(parser)
    args = parser.parse_args(argv)
    return args.fn(args)


def format_summary(summary: dict[str, Any]) -> str:
    drift = summary["drift"]
    def scores(figures: dict[str, Any]) -> str:
        if figures["nmi"] is None:
            return "no communities before"
        return f"NMI {figures['nmi']:.3f}, ARI {figures['ari']:.3f}"

    lines = [f"snapshot {summary['run_id']}: {summary['communities']} communities",
             f"drift (extended vs refreshed, {drift['entities']} entities): {scores(drift)}"]
    for group, figures in summary["drift_by_group"].items():
        lines.append(f"  {group}: {figures['communities_before']} -> {figures['communities']}"
                     f" communities, {scores(figures)}")
    lines.append(f"seconds: {summary['seconds']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
