"""`tkg bench incremental`: a full build of N synthetic episodes, then a run of M newer ones
into the same store; what the night costs next to what the store cost."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from tkg.jobs.bench.figures import print_figures, report_ray_bench
from tkg.jobs.bench.synth import generate_episodes, write_jsonl

# Counted by the stages for every row they read from the previous snapshot.
PREVIOUS_ROWS = "previous_rows_read"


def _episodes(total: int, seed: int, groups: int) -> list[dict]:
    """The synthetic records in timestamp order (the generator interleaves groups by time;
    sorted again so that the last M are the newest whatever the generator does)."""
    return sorted(generate_episodes(total, seed=seed, groups=groups),
                  key=lambda r: r.get("timestamp") or r.get("valid_at") or "")


def _run_rows(work: Path) -> dict[str, int]:
    """Rows a run's stages wrote (their outputs) and read from the previous snapshot, from
    the markers the runner leaves in the work dir."""
    written = read = 0
    for marker in work.glob("*/_SUCCESS.json"):
        record = json.loads(marker.read_text())
        written += sum((record.get("rows") or {}).values())
        read += (record.get("counters") or {}).get(PREVIOUS_ROWS, 0)
    return {"rows_written": written, "rows_read": read}


def bench_incremental(episodes: int, new: int, *, config_path: str | None = None,
                      seed: int = 7, groups: int = 3, workdir: str | None = None
                      ) -> dict[str, Any]:
    """Build `episodes` records, then the `new` newer ones into the same store."""
    from tkg.pipeline.build import build, init_ray
    from tkg.pipeline.config import load_config

    config = load_config(config_path)
    records = _episodes(episodes + new, seed, groups)
    with tempfile.TemporaryDirectory(prefix="tkg-bench-incr-") as tmp:
        root = Path(workdir or tmp)
        old = write_jsonl(records[:episodes], root / "input" / "old" / "episodes.jsonl")
        fresh = write_jsonl(records[episodes:], root / "input" / "new" / "episodes.jsonl")
        init_ray(config)
        started = time.perf_counter()
        full = build(config, [str(old)], root / "store")
        full_seconds = time.perf_counter() - started
        started = time.perf_counter()
        incremental = build(config, [str(fresh)], root / "store")
        incremental_seconds = time.perf_counter() - started
        rows = _run_rows(root / "store" / "work" / incremental.summary["run_id"])
    summary = incremental.summary
    return {
        "episodes": episodes, "new": new, "groups": groups,
        "full_seconds": round(full_seconds, 2),
        "incremental_seconds": round(incremental_seconds, 2),
        "ratio": round(incremental_seconds / full_seconds, 3) if full_seconds else None,
        "seconds": summary["seconds"],
        "full_stage_seconds": full.summary["seconds"],
        **rows,
        "entities": summary["entities"], "facts": summary["facts"],
        "facts_current": summary["facts_current"],
    }


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("incremental", help="a full build of N synthetic episodes, "
                               "then M newer ones into the same store; seconds and rows")
    bench.add_argument("--episodes", type=int, default=20_000)
    bench.add_argument("--new", type=int, default=200)
    bench.add_argument("--groups", type=int, default=3)
    bench.add_argument("--seed", type=int, default=7)
    bench.add_argument("--config", default=None)
    bench.add_argument("--workdir", default=None, help="keep inputs and store here")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    return report_ray_bench(
        lambda: bench_incremental(args.episodes, args.new, config_path=args.config,
                                  seed=args.seed, groups=args.groups, workdir=args.workdir),
        args.json,
        lambda figures: print_figures(f"tkg bench incremental: {figures['episodes']:,} + "
                                      f"{figures['new']:,} episodes", figures))
