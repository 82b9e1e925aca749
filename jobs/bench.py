"""`tkg bench build`: synthetic episodes through the embedded default; prints figures only."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from tkg.jobs.synth import generate_episodes, write_jsonl
from tkg.pipeline.stages import REGISTRY


def bench_build(episodes: int, *, config_path: str | None = None, seed: int = 0,
                groups: int = 3, workdir: str | None = None) -> dict[str, Any]:
    """Generate `episodes` records, build them, and return throughput and stage timings."""
    from tkg.pipeline.build import build, init_ray
    from tkg.pipeline.config import load_config

    config = load_config(config_path)
    with tempfile.TemporaryDirectory(prefix="tkg-bench-") as tmp:
        root = Path(workdir or tmp)
        started = time.perf_counter()
        records = generate_episodes(episodes, seed=seed, groups=groups)
        inputs = write_jsonl(records, root / "input" / "episodes.jsonl")
        generate_seconds = time.perf_counter() - started

        started = time.perf_counter()
        init_ray(config)
        ray_seconds = time.perf_counter() - started

        started = time.perf_counter()
        result = build(config, [str(inputs)], root / "store")
        wall = time.perf_counter() - started
    stages = result.summary["seconds"]
    model = sum(v for k, v in stages.items() if k in REGISTRY and REGISTRY[k].model)
    other = wall - model
    return {
        "episodes": episodes,
        "groups": groups,
        "wall_seconds": round(wall, 2),
        "episodes_per_second": round(episodes / wall, 1) if wall else None,
        "model_seconds": round(model, 2),
        "non_model_seconds": round(other, 2),
        "non_model_share": round(other / wall, 3) if wall else None,
        "seconds": stages,
        "generate_seconds": round(generate_seconds, 2),
        "ray_start_seconds": round(ray_seconds, 2),
        "entities": result.summary["entities"],
        "facts": result.summary["facts"],
        "rejected": result.summary["rejected"],
    }


def print_bench(figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"tkg bench build: {figures['episodes']:,} episodes")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("wall_seconds", "episodes_per_second", "model_seconds", "non_model_seconds",
                "non_model_share", "ray_start_seconds", "entities", "facts", "rejected"):
        table.add_row(key, str(figures[key]))
    for stage, seconds in figures["seconds"].items():
        kind = "model" if stage in REGISTRY and REGISTRY[stage].model else "other"
        table.add_row(f"stage {stage} ({kind})", f"{seconds:.2f}")
    Console().print(table)
