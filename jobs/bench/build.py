"""`tkg bench build`: synthetic episodes through the embedded default; prints figures only.

With `--store s3://bucket/prefix` the same input is built twice in one run, into a local
folder and into the object store (work dir and snapshot there), and both figures are printed
with their ratio; `--s3-server` starts moto's S3 server on 127.0.0.1 for it (the `dev` extra),
in a process of its own, as a remote store would be (the tests' S3 server is the same one).
Imports stay inside the functions: the tests import `local_s3` before anything starts Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# moto accepts any key; a bench against its own server sets these when they are unset.
TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def local_s3(buckets: tuple[str, ...] = ()) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 in a child process, with `buckets` created; yields its
    endpoint (http://127.0.0.1:PORT) and stops that process on exit."""
    import pyarrow.fs as pafs

    for name, value in TEST_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port, server)
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http",
                               region="us-east-1", allow_bucket_creation=True)
        for bucket in buckets:
            fs.create_dir(bucket)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode} "
                               "(is the `dev` extra, moto[server], installed?)")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"moto server not listening on 127.0.0.1:{port} after {timeout} s")


def bench_build(episodes: int, *, config_path: str | None = None, seed: int = 0,
                groups: int = 3, workdir: str | None = None, store: str | None = None,
                s3_server: bool = False) -> dict[str, Any]:
    """Generate `episodes` records, build them, and return throughput and stage timings. With
    an object-store `store`: the figures of that build, under `local` those of the same input
    built into a local folder first, and `store_over_local`, the ratio of their wall times."""
    from tkg.jobs.bench.synth import generate_episodes, write_jsonl
    from tkg.pipeline import storage
    from tkg.pipeline.build import init_ray
    from tkg.pipeline.config import load_config

    config = load_config(config_path)
    remote = store is not None and storage.is_url(store)
    with tempfile.TemporaryDirectory(prefix="tkg-bench-") as tmp:
        root = Path(workdir or tmp)
        started = time.perf_counter()
        records = generate_episodes(episodes, seed=seed, groups=groups)
        inputs = write_jsonl(records, root / "input" / "episodes.jsonl")
        generate_seconds = time.perf_counter() - started
        with _server(store if remote and s3_server else None) as endpoint:
            started = time.perf_counter()
            init_ray(config)  # after the server's credentials are set: workers inherit them
            ray_seconds = time.perf_counter() - started
            common = {"episodes": episodes, "groups": groups,
                      "generate_seconds": round(generate_seconds, 2),
                      "ray_start_seconds": round(ray_seconds, 2)}
            if not remote:
                return {**_timed_build(config, inputs, store or root / "store"), **common}
            local = _timed_build(config, inputs, root / "store")
            if endpoint:
                config = config.model_copy(update={"storage": config.storage.model_copy(
                    update={"endpoint": endpoint, "region": "us-east-1", "path_style": True})})
            figures = _timed_build(config, inputs, store)
    return {**figures, **common, "store": store, "local": local,
            "store_over_local": round(figures["wall_seconds"] / local["wall_seconds"], 3)}


@contextmanager
def _server(store: str | None) -> Iterator[str | None]:
    """A local S3 server holding the store's bucket, or nothing."""
    if store is None:
        yield None
        return
    with local_s3((store.split("://", 1)[1].split("/", 1)[0],)) as endpoint:
        yield endpoint


def _timed_build(config: Any, inputs: Path, store: Path | str) -> dict[str, Any]:
    from tkg.pipeline.build import build
    from tkg.pipeline.stages import REGISTRY

    started = time.perf_counter()
    result = build(config, [str(inputs)], store)
    wall = time.perf_counter() - started
    stages = result.summary["seconds"]
    model = sum(v for k, v in stages.items() if k in REGISTRY and REGISTRY[k].model)
    other = wall - model
    return {
        "wall_seconds": round(wall, 2),
        "episodes_per_second": round(result.summary["episodes_in"] / wall, 1) if wall else None,
        "model_seconds": round(model, 2),
        "non_model_seconds": round(other, 2),
        "non_model_share": round(other / wall, 3) if wall else None,
        "seconds": stages,
        "entities": result.summary["entities"],
        "facts": result.summary["facts"],
        "rejected": result.summary["rejected"],
    }


FIGURES = ("wall_seconds", "episodes_per_second", "model_seconds", "non_model_seconds",
           "non_model_share", "entities", "facts", "rejected")


def print_bench(figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from tkg.pipeline.stages import REGISTRY

    runs = {"value": figures}
    if "local" in figures:
        runs = {"local folder": figures["local"], figures["store"]: figures}
    table = Table(title=f"tkg bench build: {figures['episodes']:,} episodes")
    table.add_column("figure")
    for name in runs:
        table.add_column(name, justify="right")
    for key in FIGURES:
        table.add_row(key, *(str(run[key]) for run in runs.values()))
    table.add_row("ray_start_seconds", str(figures["ray_start_seconds"]))
    for stage in figures["seconds"]:
        kind = "model" if stage in REGISTRY and REGISTRY[stage].model else "other"
        table.add_row(f"stage {stage} ({kind})",
                      *(f"{run['seconds'].get(stage, 0):.2f}" for run in runs.values()))
    if "store_over_local" in figures:
        table.add_row("wall, store / local", "", str(figures["store_over_local"]))
    Console().print(table)


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("build", help="synthetic episodes, embedded default")
    bench.add_argument("--episodes", type=int, default=20_000)
    bench.add_argument("--groups", type=int, default=3)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--config", default=None)
    bench.add_argument("--workdir", default=None, help="keep inputs and store here")
    bench.add_argument(
        "--store", default=None, help="build into this store; an s3:// URL also builds the "
        "same input into a local folder first and prints both wall times and their ratio")
    bench.add_argument("--s3-server", action="store_true",
                       help="start moto's S3 server on 127.0.0.1 for --store s3://...")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    from tkg.jobs.build_output import terminal

    # Under --json the one object is stdout's alone (Ray's raylet warnings go to stderr).
    with terminal(None, args.json) as (out, _):
        figures = bench_build(args.episodes, config_path=args.config, seed=args.seed,
                              groups=args.groups, workdir=args.workdir, store=args.store,
                              s3_server=args.s3_server)
        if args.json:
            print(json.dumps(figures, default=str), file=out)
    if not args.json:
        print_bench(figures)
    return 0
