"""`tkg bench forget`: a full build of N synthetic episodes, then the erasure of whole
conversations of one group (about 0.5 % of the episodes by default) from it; what the
forget and its purge cost next to what the store cost.

The forget runs on a copy of the built store, so a kept `--workdir` is built once and
measured again (`--workdir DIR` with a store already built there reuses it and the full
build's recorded seconds): a build of 20,000 episodes is most of the benchmark's time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tkg.jobs.bench.figures import print_figures, report_ray_bench
from tkg.jobs.bench.incremental import _run_rows
from tkg.jobs.bench.synth import generate_episodes, write_jsonl

BUILT = "full_build.json"  # beside the kept store: the full build's figures


def conversations_to_forget(records: list[dict], share: float) -> list[tuple[str, str]]:
    """(group, id) of the messages of whole conversations of the first group, taken in
    order of their ids until they hold `share` of all episodes (at least one conversation):
    what an erasure request for one person's chats removes."""
    by_conversation: dict[str, list[dict]] = defaultdict(list)
    first_group = min(r["group_id"] for r in records)
    for record in records:
        if record["group_id"] == first_group and record.get("conversation_id"):
            by_conversation[record["conversation_id"]].append(record)
    chosen: list[tuple[str, str]] = []
    for conversation in sorted(by_conversation):
        chosen += [(r["group_id"], r["id"]) for r in by_conversation[conversation]]
        if len(chosen) >= share * len(records):
            break
    return chosen


def _built(config: Any, records: list[dict], root: Path) -> tuple[Path, dict[str, Any]]:
    """The built store under `root` and its full build's figures: built now, or reused from
    an earlier run of the same input (its digest is kept with the figures)."""
    from tkg.pipeline.build import build

    store_dir, marker = root / "store", root / BUILT
    key = {"episodes": len(records), "input": hashlib.sha256(
        json.dumps(records, sort_keys=True).encode()).hexdigest()}
    if marker.is_file() and json.loads(marker.read_text()).get("key") == key:
        return store_dir, json.loads(marker.read_text())
    shutil.rmtree(store_dir, ignore_errors=True)
    inputs = write_jsonl(records, root / "input" / "episodes.jsonl")
    started = time.perf_counter()
    result = build(config, [str(inputs)], store_dir)
    figures = {"key": key, "full_seconds": round(time.perf_counter() - started, 2),
               "full_stage_seconds": result.summary["seconds"],
               "entities": result.summary["entities"], "facts": result.summary["facts"]}
    marker.write_text(json.dumps(figures))
    return store_dir, figures


def _files(folder: Path) -> int:
    return sum(1 for f in folder.rglob("*") if f.is_file())


def _snapshot_files(store_dir: Path) -> int:
    return _files(store_dir / "snapshots")


def bench_forget(episodes: int, share: float, *, config_path: str | None = None,
                 seed: int = 7, groups: int = 3, workdir: str | None = None
                 ) -> dict[str, Any]:
    """Build `episodes` records (or reuse the build kept in `workdir`), then forget whole
    conversations holding `share` of them from a copy, then purge the history."""
    from tkg.pipeline import forget as fg
    from tkg.pipeline import lock, storage, store
    from tkg.pipeline.build import init_ray
    from tkg.pipeline.config import load_config

    config = load_config(config_path)
    records = generate_episodes(episodes, seed=seed, groups=groups)
    chosen = conversations_to_forget(records, share)
    gone = set(chosen)
    conversations = {r["conversation_id"] for r in records if (r["group_id"], r["id"]) in gone}
    with tempfile.TemporaryDirectory(prefix="tkg-bench-forget-") as tmp:
        root = Path(workdir or tmp)
        init_ray(config)
        built, full = _built(config, records, root)
        copy = root / "forgotten"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(built, copy)
        files_before = _snapshot_files(copy)
        started = time.perf_counter()
        result = fg.forget(config, copy, fg.Selector(episodes=tuple(chosen)), by="bench")
        forget_seconds = time.perf_counter() - started
        rows = _run_rows(copy / "work" / result.request_id)
        stages = fg.stage_seconds(storage.location(copy), result.request_id)
        files_forgotten = _snapshot_files(copy)
        work_files = _files(copy / "work")
        started = time.perf_counter()
        with lock.held(storage.location(copy), "forget", result.request_id):
            retired, works = fg.purge_history(storage.location(copy))
        purge_seconds = time.perf_counter() - started
        files_after = _snapshot_files(copy)
        work_files_purged = work_files - _files(copy / "work")
        summary = store.read_manifest(store.current_snapshot(copy))["summary"]
    full_seconds = full["full_seconds"]
    return {
        "episodes": episodes, "groups": groups,
        "forgotten_episodes": len(chosen),
        "forgotten_share": round(len(chosen) / episodes, 4) if episodes else None,
        "conversations": len(conversations),
        "full_seconds": full_seconds,
        "forget_seconds": round(forget_seconds, 2),
        "ratio": round(forget_seconds / full_seconds, 3) if full_seconds else None,
        "purge_seconds": round(purge_seconds, 2),
        "forget_stage_seconds": {**stages, **summary.get("seconds", {})},
        **rows,
        "removed": result.counts,
        "snapshot_files_before": files_before,
        "snapshot_files_written": files_forgotten - files_before,
        "snapshot_files_purged": files_forgotten - files_after,
        "work_files_purged": work_files_purged,
        "snapshots_retired": len(retired), "work_dirs_removed": works,
        "full_stage_seconds": full["full_stage_seconds"],
        "entities": full["entities"], "facts": full["facts"],
    }


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("forget", help="a full build of N synthetic episodes, then "
                               "the erasure of whole conversations (--share of them) and "
                               "its purge; seconds, rows and files")
    bench.add_argument("--episodes", type=int, default=20_000)
    bench.add_argument("--share", type=float, default=0.005,
                       help="share of the episodes to forget, as whole conversations of "
                       "one group")
    bench.add_argument("--groups", type=int, default=3)
    bench.add_argument("--seed", type=int, default=7)
    bench.add_argument("--config", default=None)
    bench.add_argument("--workdir", default=None, help="keep inputs and the built store "
                       "here; a later run with the same size and seed reuses the build")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    return report_ray_bench(
        lambda: bench_forget(args.episodes, args.share, config_path=args.config,
                             seed=args.seed, groups=args.groups, workdir=args.workdir),
        args.json,
        lambda figures: print_figures(f"tkg bench forget: {figures['forgotten_episodes']:,} of "
                                      f"{figures['episodes']:,} episodes", figures))
