"""`tkg communities refresh --store DIR`: rerun label propagation for every group of the
current snapshot and publish the result as a new snapshot.

Incremental builds only extend communities (a new entity joins the community most of its
neighbours hold), so their partition drifts from what label propagation would find on the
whole graph. This job reruns it, keeps the ids of communities whose membership mostly
persists, and reports the drift (NMI, ARI) between the extended and the refreshed partition,
so users can see how often a refresh is worth it. Every other table of the snapshot is
hard-linked (or copied) into the new one; `CURRENT` switches last, atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import communities, schema, storage, store, visibility
from tkg.pipeline.build import run_row, table_writer
from tkg.pipeline.config import TkgConfig, load_config

INPUT_COLUMNS = {
    "entities": ["entity_id", "group_id", "name", "summary", "mention_count"],
    "facts": ["group_id", "source_entity_id", "target_entity_id", "fact", "episode_ids",
              "expired_at", "invalid_at"],
    "mentions": ["episode_id", "entity_id", "group_id"],
    "communities": ["community_id", "group_id", "name", "summary", "created_at"],
    "community_members": ["community_id", "entity_id", "group_id"],
}


def read_table(snapshot: Path, name: str) -> pa.Table:
    """The columns the refresh needs of one published table (all groups). None of them is a
    vector, so the schema's embedding size does not matter here."""
    return store.read_table(snapshot, name, schema.PUBLISHED[name](1), INPUT_COLUMNS[name])


def by_group(table: pa.Table, group: str) -> pa.Table:
    return table.filter(pc.equal(table["group_id"], group))


def refresh_tables(tables: dict[str, pa.Table], config: TkgConfig, created_at: datetime
                   ) -> tuple[pa.Table, dict[str, Any]]:
    """COMMUNITY_ROWS of every group (label propagation, ids matched to the current ones)
    and the drift report: per group and over all groups."""
    settings = config.communities
    summarizer = communities.build_summarizer(config)
    facts = visibility.current(tables["facts"])
    groups = sorted(pc.unique(tables["entities"]["group_id"]).drop_null().to_pylist())
    rows, report = [schema.COMMUNITY_ROWS.empty_table()], {}
    old_all, new_all, offset = [], [], 0
    for group in groups:
        graph = communities.build_graph(
            group, by_group(tables["entities"], group), by_group(facts, group),
            by_group(tables["mentions"], group), settings)
        previous = communities.Previous(by_group(tables["communities"], group),
                                        by_group(tables["community_members"], group))
        result = communities.group_communities(graph, previous, settings, created_at,
                                               "refresh", summarizer)
        rows.append(result.rows)
        report[group] = {"communities_before": previous.communities.num_rows,
                         "communities": result.rows.num_rows,
                         **communities.drift(result.previous_assign, result.assign)}
        old_all.append(np.where(result.previous_assign >= 0,
                                result.previous_assign + offset, -1))
        new_all.append(np.where(result.assign >= 0, result.assign + offset, -1))
        offset += graph.n
    overall = (communities.drift(np.concatenate(old_all), np.concatenate(new_all))
               if groups else communities.drift(np.zeros(0, int), np.zeros(0, int)))
    return pa.concat_tables(rows), {"groups": report, "overall": overall}


def _embed_names(rows: pa.Table, config: TkgConfig, dim: int) -> pa.Table:
    from tkg.pipeline.embed import build_embedder, embed_unique, to_vector_array

    names = [n or "" for n in rows["name"].to_pylist()]
    vectors = (embed_unique(build_embedder(config), names) if names
               else np.zeros((0, dim), np.float32))
    return rows.append_column("name_embedding", to_vector_array(vectors, dim))


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
    """Refresh the communities of the current snapshot into a new snapshot; returns the
    summary (counts, drift, seconds). Readers keep the old snapshot until CURRENT switches."""
    store_dir = storage.location(store_dir)
    previous = store.current_snapshot(store_dir)
    manifest = store.read_manifest(previous)
    config = config or snapshot_build_config(manifest)
    dim = int(manifest["embedding"]["dim"])
    started_at = store.now()
    run_id = run_id or f"{started_at:%Y%m%dT%H%M%SZ}-communities"
    seconds: dict[str, float] = {}

    clock = time.perf_counter()
    tables = {name: read_table(previous, name) for name in INPUT_COLUMNS}
    seconds["read"] = round(time.perf_counter() - clock, 3)
    clock = time.perf_counter()
    rows, report = refresh_tables(tables, config, started_at)
    seconds["label_propagation"] = round(time.perf_counter() - clock, 3)
    clock = time.perf_counter()
    named = schema.conform(_embed_names(rows, config, dim), schema.communities(dim))
    seconds["embed"] = round(time.perf_counter() - clock, 3)

    members = communities.member_rows(rows)
    replaced = {"communities": table_writer(named, schema.communities(dim)),
                "community_members": table_writer(members, schema.COMMUNITY_MEMBERS)}
    kept = [name for name in store.table_names(previous) if name not in replaced]

    def describe(done: store.Published) -> tuple[dict[str, Any], pa.Table]:
        seconds["publish"] = round(done.seconds, 3)
        summary = _summary(manifest, done, rows, report, seconds)
        return {
            **manifest, "run_id": run_id, "created_at": started_at.isoformat(),
            "config_hash": config.fingerprint(), "config": config.model_dump(),
            "tables": {**manifest.get("tables", {}), **done.rows}, "summary": summary,
            "refreshed_from": storage.name(previous), "retrieval": done.retrieval,
        }, run_row(summary, config, started_at, inputs=[],
                   stage_seconds=[(f"communities_{k}", v) for k, v in seconds.items()],
                   llm_calls=0, llm_prompt_tokens=0, llm_completion_tokens=0)

    published = store.publish(store_dir, run_id, replaced, previous=previous, dim=dim,
                              query=config.query, describe=describe, kept=kept)
    return published["summary"]


def _summary(manifest: dict[str, Any], done: store.Published, rows: pa.Table,
             report: dict[str, Any], seconds: dict[str, float]) -> dict[str, Any]:
    """The previous snapshot's summary with the refreshed communities and their drift."""
    return {
        **manifest.get("summary", {}), "run_id": storage.name(done.snapshot),
        "snapshot": str(done.snapshot), "previous_snapshot": manifest["run_id"],
        "communities": rows.num_rows,
        "communities_extended": int(pc.sum(rows["placed"]).as_py() or 0) if rows.num_rows else 0,
        "llm_calls": 0, "llm_tokens": 0,
        "drift": report["overall"], "drift_by_group": report["groups"],
        "seconds": seconds, "seconds_total": round(sum(seconds.values()), 3),
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
