"""`tkg bench incremental`: a full build of N synthetic episodes, then a run of M newer ones
into the same store; what the night costs next to what the store cost. It also gives the
driver's memory in the night. `--embed synthetic` and `--extract synthetic` take the models
out (as in `tkg bench scale`), so that stores of 10^5 episodes are built in minutes on 2
cores and what grows with the store is the non-model work.

The night runs in the process that built the store, so its driver RSS starts from what the
full build left (freed heap returned first: `_release_memory`); `night_driver_rss_growth_mb`
is the night's own peak over its start, the figure that must not grow with the store.

`--workdir D --reuse` keeps the full build in D (its run id and figures in `D/full.json`)
and, on a later call with the same episodes, seed and groups, puts `CURRENT` back on it,
removes earlier nights' snapshots and work, and runs only the night (in a fresh process:
its start RSS is lower than after a build). A 160,000-episode store costs its build once."""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tkg.jobs.bench.figures import print_figures, report_ray_bench
from tkg.jobs.bench.scale import MB, PeakMemory, bench_config
from tkg.jobs.bench.synth import generate_episodes, write_jsonl

# Counted by the stages for every row they read from the previous snapshot.
PREVIOUS_ROWS = "previous_rows_read"


def _episodes(total: int, seed: int, groups: int) -> list[dict]:
    """The synthetic records in timestamp order (the generator interleaves groups by time;
    sorted again so that the last M are the newest whatever the generator does)."""
    return sorted(generate_episodes(total, seed=seed, groups=groups),
                  key=lambda r: r.get("timestamp") or r.get("valid_at") or "")


def _run_rows(work: Path) -> dict[str, Any]:
    """Rows a run's stages wrote (their outputs) and read from the previous snapshot, in
    all and per stage, from the markers the runner leaves in the work dir."""
    stages: dict[str, dict[str, int]] = {}
    for marker in sorted(work.glob("*/_SUCCESS.json")):
        record = json.loads(marker.read_text())
        stages[marker.parent.name] = {
            "written": sum((record.get("rows") or {}).values()),
            "read": (record.get("counters") or {}).get(PREVIOUS_ROWS, 0)}
    return {"rows_written": sum(s["written"] for s in stages.values()),
            "rows_read": sum(s["read"] for s in stages.values()), "stage_rows": stages}


def _release_memory() -> int:
    """Return the heap freed since the full build to the system (Python's, Arrow's pool,
    glibc's arenas), so the night's RSS starts from what is still held; the RSS after."""
    import psutil
    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    libc = ctypes.util.find_library("c")
    if libc:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)
        if trim is not None:  # glibc only
            trim(0)
    return psutil.Process().memory_info().rss


FULL = "full.json"  # in a kept workdir: the full build's run id, its key and figures


def _reusable(root: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a full build kept in `root` for the same inputs, with the store put
    back on it (later nights' snapshots and work removed), or None."""
    from tkg.pipeline import store

    try:
        record = json.loads((root / FULL).read_text())
    except FileNotFoundError:
        return None
    if record.get("key") != key:
        return None
    keep = record["run_id"]
    for folder in ("snapshots", "work"):
        for path in (root / "store" / folder).iterdir():
            if path.name != keep:
                shutil.rmtree(path)
    store.switch_current(root / "store", keep)
    return record


def bench_incremental(episodes: int, new: int, *, config_path: str | None = None,
                      seed: int = 7, groups: int = 3, workdir: str | None = None,
                      embed: str = "model", extract: str = "model",
                      reuse: bool = False) -> dict[str, Any]:
    """Build `episodes` records, then the `new` newer ones into the same store (`reuse`:
    the full build kept in `workdir` by an earlier call, if any)."""
    from tkg.pipeline.build import build, init_ray
    from tkg.pipeline.config import load_config

    if reuse and workdir is None:
        raise ValueError("--reuse keeps the full build in --workdir: name one")

    config = bench_config(load_config(config_path), "driver", embed, extract)
    records = _episodes(episodes + new, seed, groups)
    with tempfile.TemporaryDirectory(prefix="tkg-bench-incr-") as tmp:
        root = Path(workdir or tmp)
        key = {"episodes": episodes, "new": new, "seed": seed, "groups": groups,
               "embed": embed, "extract": extract, "config": config_path}
        kept = _reusable(root, key) if reuse else None
        if reuse and kept is None:  # another build's store would be built upon
            shutil.rmtree(root / "store", ignore_errors=True)
        old = write_jsonl(records[:episodes], root / "input" / "old" / "episodes.jsonl")
        fresh = write_jsonl(records[episodes:], root / "input" / "new" / "episodes.jsonl")
        del records
        init_ray(config)
        if kept is None:
            started = time.perf_counter()
            with PeakMemory() as full_memory:
                full = build(config, [str(old)], root / "store")
            kept = {"key": key, "run_id": full.summary["run_id"],
                    "seconds": round(time.perf_counter() - started, 2),
                    "stage_seconds": full.summary["seconds"],
                    "peak_driver_rss_mb": full_memory.figures()["peak_driver_rss_mb"]}
            if workdir is not None:
                (root / FULL).write_text(json.dumps(kept))
        full_seconds = kept["seconds"]
        night_start = _release_memory()
        started = time.perf_counter()
        with PeakMemory() as night_memory:
            incremental = build(config, [str(fresh)], root / "store")
            ended = time.perf_counter()
        incremental_seconds = ended - started
        rows = _run_rows(root / "store" / "work" / incremental.summary["run_id"])
        indexes = _retrieval_seconds(incremental.summary["snapshot"])
    summary = incremental.summary
    night = night_memory.figures()
    return {
        "episodes": episodes, "new": new, "groups": groups, "embed": embed,
        "extract": extract,
        "full_seconds": round(full_seconds, 2),
        "incremental_seconds": round(incremental_seconds, 2),
        "ratio": round(incremental_seconds / full_seconds, 3) if full_seconds else None,
        "seconds": summary["seconds"],
        "full_stage_seconds": kept["stage_seconds"],
        **rows,
        "entities": summary["entities"], "facts": summary["facts"],
        "facts_current": summary["facts_current"],
        "full_peak_driver_rss_mb": kept["peak_driver_rss_mb"],
        "night_start_driver_rss_mb": round(night_start / MB, 1),
        "night_peak_driver_rss_mb": night["peak_driver_rss_mb"],
        "night_driver_rss_growth_mb": round(night["peak_driver_rss_mb"] - night_start / MB, 1),
        "night_peak_worker_rss_mb": night["peak_worker_rss_mb"],
        # where the night's driver grows with the store (issue 26: a 200-episode night's
        # peak went 1,221 / 2,019 / 3,267 MB on 10,000 / 40,000 / 160,000 episodes)
        "night_stage_peak_driver_rss_mb": night_memory.stage_peaks(summary["seconds"], ended),
        # where the night's publish goes on the retrieval tables (the 160,000 store's night:
        # the episodes' open arrays 1.7 s, its facts' 0.7, LanceDB's import about 1.5)
        "night_retrieval_seconds": indexes,
    }


def _retrieval_seconds(snapshot: str) -> dict[str, Any]:
    """Of a snapshot's retrieval tables (its manifest's `retrieval` figures): the seconds
    each took to build or extend (`table_s`) and to write its open arrays (`arrays_s`),
    whether it was extended, and all of it with LanceDB's import (`seconds`)."""
    from tkg.pipeline import store

    figures = store.read_manifest(snapshot).get("retrieval") or {}
    tables = {name: {"table_s": f.get("seconds"), "arrays_s": f.get("arrays_s"),
                     "extended": f.get("extended")}
              for name, f in figures.items() if isinstance(f, dict)}
    return {"seconds": figures.get("seconds"), "tables": tables}


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("incremental", help="a full build of N synthetic episodes, "
                               "then M newer ones into the same store; seconds and rows")
    bench.add_argument("--episodes", type=int, default=20_000)
    bench.add_argument("--new", type=int, default=200)
    bench.add_argument("--groups", type=int, default=3)
    bench.add_argument("--seed", type=int, default=7)
    bench.add_argument("--config", default=None)
    bench.add_argument("--embed", choices=("synthetic", "model"), default="model",
                       help="synthetic: seeded vectors, no model (the configured one: model)")
    bench.add_argument("--extract", choices=("synthetic", "model"), default="model",
                       help="synthetic: a regex extractor, no model")
    bench.add_argument("--workdir", default=None, help="keep inputs and store here")
    bench.add_argument("--reuse", action="store_true",
                       help="with --workdir: reuse the full build an earlier call kept there "
                       "(same episodes, seed, groups, models): only the night runs")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    return report_ray_bench(
        lambda: bench_incremental(args.episodes, args.new, config_path=args.config,
                                  seed=args.seed, groups=args.groups, workdir=args.workdir,
                                  embed=args.embed, extract=args.extract,
                                  reuse=args.reuse),
        args.json,
        lambda figures: print_figures(f"tkg bench incremental: {figures['episodes']:,} + "
                                      f"{figures['new']:,} episodes", figures))
