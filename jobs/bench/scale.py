"""`tkg bench scale --episodes N`: a build of N synthetic episodes on both execution paths,
with what each stage cost: seconds, rows in and out, and the build's peak driver RSS, peak
worker RSS and object-store spill. Figures only, never a gate.

The paths: `driver` is the configured size policy (`ray.driver_mb`, `ray.driver_rows`: the
driver takes what fits), `ray_data` sets both to 0, so every shuffle, join and map runs on
Ray Data and every model on an actor pool. `--embed synthetic` (`pipeline/synthetic_embed.py`)
and `--extract synthetic` (`pipeline/synthetic_extract.py`) take the models out, so that a
2-core machine can measure every other stage at a million episodes; the README's sizing
section turns these figures and the model stages' rates into a plan for a cluster.

Memory is sampled (every `SAMPLE_SECONDS`) by psutil: the driver's RSS, and the largest RSS
of any Ray worker process (`ray::...`) on this machine. RSS counts the object-store pages a
process has mapped, so a worker's figure includes the blocks it reads zero-copy.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tkg.jobs.bench.figures import report_ray_bench

PATHS = ("driver", "ray_data")
SAMPLE_SECONDS = 0.5
MB = 2**20


class PeakMemory:
    """A thread sampling the driver's RSS and every Ray worker's until stopped; peaks in MB."""

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        self.driver = self.worker = 0
        self.samples: list[tuple[float, int]] = []  # (perf_counter, driver RSS)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="peak-memory")

    def __enter__(self) -> PeakMemory:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self._sample()

    def _run(self) -> None:
        while not self.stopped.wait(SAMPLE_SECONDS):
            self._sample()

    def _sample(self) -> None:
        import psutil

        rss = self.me.memory_info().rss
        self.samples.append((time.perf_counter(), rss))
        self.driver = max(self.driver, rss)
        for process in psutil.process_iter(["cmdline", "memory_info"]):
            cmdline = process.info.get("cmdline") or []
            memory = process.info.get("memory_info")
            if memory is not None and cmdline and cmdline[0].startswith("ray::"):
                self.worker = max(self.worker, memory.rss)

    def figures(self) -> dict[str, float]:
        return {"peak_driver_rss_mb": round(self.driver / MB, 1),
                "peak_worker_rss_mb": round(self.worker / MB, 1)}

    def stage_peaks(self, seconds: dict[str, float], ended: float) -> dict[str, float]:
        """The driver's peak RSS (MB) during each stage, the stages laid end to end back
        from `ended` (the build's end: what comes before the first stage, Ray's start and
        the config, is not a stage's). A stage shorter than the sampling interval gets the
        first sample after it began."""
        peaks: dict[str, float] = {}
        stop = ended
        for name, spent in reversed(list(seconds.items())):
            start = stop - spent
            inside = [rss for at, rss in self.samples if start <= at <= stop]
            after = [rss for at, rss in self.samples if at >= start][:1]
            peaks[name] = round(max(inside or after or [0]) / MB, 1)
            stop = start
        return peaks


def spilled_bytes() -> int:
    """Bytes the object store has spilled to disk since Ray started (all nodes), of the Ray
    this process is connected to (another local Ray may run beside it)."""
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    address = ray.get_runtime_context().gcs_address
    return int(get_memory_info_reply(get_state_from_address(address)).store_stats
               .spilled_bytes_total)


def bench_config(config: Any, path: str, embed: str, extract: str) -> Any:
    """`config` for one path, with the synthetic models where asked."""
    update: dict[str, Any] = {}
    if embed == "synthetic":
        from tkg.pipeline.synthetic_embed import model_name

        update["embed"] = config.embed.model_copy(update={"backend": "synthetic",
                                                          "model": model_name(384, 0)})
    if extract == "synthetic":
        update["extract"] = config.extract.model_copy(update={"backend": "synthetic"})
    if path == "ray_data":
        update["ray"] = config.ray.model_copy(update={"driver_mb": 0, "driver_rows": 0})
    return config.model_copy(update=update)


def stage_rows(work: Path) -> dict[str, dict[str, int]]:
    """Rows in (the stage's inputs, as the stages before wrote them) and out (its outputs)
    per stage, from the markers the runner leaves in the work dir."""
    from tkg.pipeline.stages import STAGES

    written: dict[str, int] = {}
    out: dict[str, int] = {}
    for stage in STAGES:
        marker = work / stage.name / "_SUCCESS.json"
        if not marker.is_file():
            continue
        rows = json.loads(marker.read_text()).get("rows") or {}
        written.update(rows)
        out[stage.name] = sum(rows.values())
    return {stage.name: {"in": sum(written.get(name, 0) for name in stage.inputs),
                         "out": out[stage.name]} for stage in STAGES if stage.name in out}


def build_once(config: Any, inputs: Path, store: Path, episodes: int) -> dict[str, Any]:
    """One build with its memory sampled; the figures."""
    from tkg.pipeline.build import build

    spilled = spilled_bytes()
    started = time.perf_counter()
    with PeakMemory() as memory:
        result = build(config, [str(inputs)], store, run_id="scale")
        ended = time.perf_counter()
    wall = ended - started
    rows = stage_rows(store / "work" / "scale")
    seconds = result.summary["seconds"]
    peaks = memory.stage_peaks(seconds, ended)
    return {
        "wall_seconds": round(wall, 2),
        "episodes_per_second": round(episodes / wall, 1) if wall else None,
        **memory.figures(),
        "spilled_mb": round((spilled_bytes() - spilled) / MB, 1),
        "entities": result.summary["entities"], "facts": result.summary["facts"],
        "communities": result.summary["communities"],
        "stages": {name: {"seconds": spent, **rows.get(name, {}),
                          "peak_driver_rss_mb": peaks[name]}
                   for name, spent in seconds.items()},
    }


def bench_scale(episodes: int, *, paths: tuple[str, ...] = PATHS, embed: str = "synthetic",
                extract: str = "synthetic", config_path: str | None = None, seed: int = 0,
                groups: int = 3, workdir: str | None = None) -> dict[str, Any]:
    """Generate `episodes` records once, build them on each of `paths`; the figures."""
    from tkg.jobs.bench.synth import generate_episodes, write_jsonl
    from tkg.pipeline.build import init_ray
    from tkg.pipeline.config import load_config

    config = load_config(config_path)
    with tempfile.TemporaryDirectory(prefix="tkg-bench-scale-") as tmp:
        root = Path(workdir or tmp)
        started = time.perf_counter()
        inputs = write_jsonl(generate_episodes(episodes, seed=seed, groups=groups),
                             root / "input" / "episodes.jsonl")
        generated = time.perf_counter() - started
        cpus = init_ray(config)
        runs = {path: build_once(bench_config(config, path, embed, extract), inputs,
                                 root / f"store-{path}", episodes) for path in paths}
    return {"episodes": episodes, "groups": groups, "embed": embed, "extract": extract,
            "cpus": cpus, "generate_seconds": round(generated, 2), "paths": runs}


def print_bench(figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    runs = figures["paths"]
    table = Table(title=f"tkg bench scale: {figures['episodes']:,} episodes, embed "
                        f"{figures['embed']}, extract {figures['extract']}")
    table.add_column("figure")
    for path in runs:
        table.add_column(path, justify="right")
    for key in ("wall_seconds", "episodes_per_second", "peak_driver_rss_mb",
                "peak_worker_rss_mb", "spilled_mb", "entities", "facts", "communities"):
        table.add_row(key, *(str(run[key]) for run in runs.values()))
    stages = dict.fromkeys(name for run in runs.values() for name in run["stages"])
    for stage in stages:
        cells = []
        for run in runs.values():
            s = run["stages"].get(stage, {})
            rows = f" ({s['in']:,} -> {s['out']:,})" if "in" in s else ""
            rss = f", {s['peak_driver_rss_mb']:,.0f} MB" if "peak_driver_rss_mb" in s else ""
            cells.append(f"{s.get('seconds', 0):.2f} s{rows}{rss}")
        table.add_row(f"stage {stage}", *cells)
    Console(width=140).print(table)


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("scale", help="synthetic episodes on both paths: per-stage "
                               "seconds and rows, peak driver and worker RSS, spill")
    bench.add_argument("--episodes", type=int, default=20_000)
    bench.add_argument("--path", choices=(*PATHS, "both"), default="both")
    bench.add_argument("--embed", choices=("synthetic", "model"), default="synthetic",
                       help="synthetic: seeded vectors, no model (the configured one: model)")
    bench.add_argument("--extract", choices=("synthetic", "model"), default="synthetic",
                       help="synthetic: a regex extractor, no model")
    bench.add_argument("--groups", type=int, default=3)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--config", default=None)
    bench.add_argument("--workdir", default=None, help="keep inputs and stores here")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    paths = PATHS if args.path == "both" else (args.path,)
    return report_ray_bench(
        lambda: bench_scale(args.episodes, paths=paths, embed=args.embed,
                            extract=args.extract, config_path=args.config, seed=args.seed,
                            groups=args.groups, workdir=args.workdir),
        args.json, print_bench)
