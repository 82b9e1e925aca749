"""`tkg bench serve --facts N`: HTTP throughput and latency of `tkg serve` under load.

A synthetic store of N facts (the generator of `tkg bench query`: entities, episodes and
communities in proportion, synthetic vectors, a manifest naming the seeded synthetic query
embedder so the model is not what is timed) is served on loopback by `serve` in a child
process (with `processes` server processes, by default one per CPU); another process sends
`POST /search` requests of the default recipe from `concurrency` connections for `seconds`.
Halfway through, a new snapshot is published (a hard-linked copy of the first under a new
run id, then CURRENT is switched): the server opens it in the background and switches, and
the figures show whether any request failed or slowed. Prints throughput, p50/p95/p99 and
errors; never gates on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tkg.jobs.bench.figures import print_figures, report
from tkg.pipeline import store


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def publish_copy(root: Path, source: str, run_id: str) -> float:
    """Publish `run_id` as a hard-linked copy of snapshot `source`; returns seconds."""
    started = time.perf_counter()
    target = store.prepare_snapshot(root, run_id)
    target.rmdir()
    shutil.copytree(store.snapshot_dir(root, source), target, copy_function=os.link)
    manifest = store.read_manifest(target)
    store.write_manifest(target, {**manifest, "run_id": run_id})  # replaces the link
    store.switch_current(root, run_id)
    return time.perf_counter() - started


class _Connection:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: the load generator shares
    the server's CPUs, and httpx spent 2.7 ms of CPU a request (a fifth of a core at the
    rates measured), so a lean client lets the figures describe the server."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, timeout: float = 30.0
                   ) -> tuple[int, str, str]:
        """(status, X-Tkg-Snapshot, Server-Timing) of one request; the body is read and
        dropped."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                          b"\r\nContent-Length: %d\r\n\r\n%s" % (
                              path.encode(), self.host.encode(), len(body), body))
        try:
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout)
            lines = head.decode("latin-1").split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            headers = {k.lower(): v for k, v in headers.items()}
            await self.reader.readexactly(int(headers.get("content-length", 0)))
        except BaseException:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.close()
        return (int(lines[0].split()[1]), headers.get("x-tkg-snapshot", ""),
                headers.get("server-timing", ""))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _load(url: str, work: list[dict[str, Any]], seconds: float, concurrency: int
                ) -> dict[str, Any]:
    from urllib.parse import urlsplit

    address = urlsplit(url)
    bodies = [json.dumps(q).encode() for q in work]
    records: list[tuple[float, float, int, str]] = []
    stages: list[dict[str, float]] = []  # each answer's Server-Timing, ms
    errors: dict[str, int] = {}
    counter = iter(range(10**12))
    connections = [_Connection(address.hostname or "127.0.0.1", address.port or 80)
                   for _ in range(concurrency)]
    for i, body in enumerate(bodies[:32]):  # warm-up, not counted
        await connections[i % concurrency].post("/search", body)
    print("ready", flush=True)  # the parent publishes halfway from here
    start = time.perf_counter()
    deadline = start + seconds

    async def worker(connection: _Connection) -> None:
        while time.perf_counter() < deadline:
            body = bodies[next(counter) % len(bodies)]
            t0 = time.perf_counter()
            try:
                status, snapshot, timing = await connection.post("/search", body)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                status, snapshot, timing = 0, "", ""
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            took = (time.perf_counter() - t0) * 1000
            records.append((t0 - start, took, status, snapshot))
            if timing:
                stages.append(server_timing(timing, took))

    await asyncio.gather(*(worker(c) for c in connections))
    elapsed = time.perf_counter() - start
    for connection in connections:
        connection.close()
    ms = np.array([r[1] for r in records]) if records else np.zeros(1)
    statuses: dict[str, int] = {}
    per_snapshot: dict[str, int] = {}
    for _, _, status, snapshot in records:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        per_snapshot[snapshot] = per_snapshot.get(snapshot, 0) + 1
    failed = sum(n for s, n in statuses.items() if s != "200")
    return {
        "requests": len(records), "seconds": round(elapsed, 2),
        "throughput_rps": round(len(records) / elapsed, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p95_ms": round(float(np.percentile(ms, 95)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
        "errors": failed, "statuses": statuses, "client_errors": errors,
        "requests_per_snapshot": per_snapshot,
        "stages_ms": {name: {"p50": round(float(np.percentile(values, 50)), 2),
                             "p99": round(float(np.percentile(values, 99)), 2),
                             "mean": round(float(np.mean(values)), 2)}
                      for name in (stages[0] if stages else {})
                      if (values := [s[name] for s in stages if name in s])},
        "timeline": [(round(t, 3), round(m, 2), s, snap) for t, m, s, snap in records],
    }


def server_timing(header: str, total_ms: float) -> dict[str, float]:
    """An answer's Server-Timing (`wait;dur=1.2, search;dur=5.0, json;dur=0.3`) as ms per
    stage, and `http`: what the client waited beyond them (the HTTP process's parsing,
    validation and routing, both ways over loopback, and the client itself)."""
    found = {}
    for part in header.split(","):
        name, _, duration = part.strip().partition(";dur=")
        if name and duration:
            found[name] = float(duration)
    found["http"] = max(total_ms - sum(found.values()), 0.0)
    return found


def _window(timeline: list[list], start: float, end: float) -> dict[str, Any]:
    ms = np.array([m for t, m, _, _ in timeline if start <= t < end])
    if ms.size == 0:
        return {"requests": 0}
    return {"requests": int(ms.size), "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def _serving(url: str) -> str | None:
    """The snapshot a server answers from (None while it is not up)."""
    import httpx

    try:
        return httpx.get(f"{url}/healthz", timeout=2.0).json()["snapshot"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def start_server(root: Path, limits: Any, timeout_s: float = 300.0, query: Any = None
                 ) -> tuple[subprocess.Popen, str]:
    """`serve` on a bench store in a child process and its URL, once it answers; `limits`
    is a ServeConfig, `query` a QueryConfig or None (the snapshot's). (The store's manifest
    names its synthetic query embedder.)"""
    url = f"http://127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tkg.query.serve import serve; "
         "from tkg.pipeline.config import QueryConfig, ServeConfig; "
         "serve(sys.argv[1], port=int(sys.argv[2]), "
         "limits=ServeConfig.model_validate_json(sys.argv[3]), "
         "query=QueryConfig.model_validate_json(sys.argv[4]) if sys.argv[4] else None)",
         str(root), url.rsplit(":", 1)[1], limits.model_dump_json(),
         query.model_dump_json() if query is not None else ""], stdout=subprocess.DEVNULL)
    deadline = time.perf_counter() + timeout_s
    while _serving(url) is None:  # every retrieval process opens the snapshot first
        if server.poll() is not None or time.perf_counter() > deadline:
            server.terminate()
            raise RuntimeError(f"the server did not start (exit code {server.poll()})")
        time.sleep(0.2)
    return server, url


def bench_serve(facts: int, seconds: float = 30.0, concurrency: int = 16, dim: int = 384,
                groups: int = 10, workdir: str | None = None, publish: bool = True,
                queries: int = 2_000, seed: int = 0, processes: int | None = None
                ) -> dict[str, Any]:
    from tkg.jobs.bench.query import _workload, synth_tables, write_store
    from tkg.pipeline.config import QueryConfig, ServeConfig

    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="tkg-bench-serve-"))
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    started = time.perf_counter()
    tables, _ = synth_tables(facts, dim, groups, seed)
    index = write_store(root, tables, dim, QueryConfig(), seed)
    work = [{"query": q["text"], "group_ids": q["group_ids"],
             **({"as_of": q["as_of"]} if q.get("as_of") else {})}
            for q in _workload(tables, queries, seed)]
    del tables
    prepared = time.perf_counter() - started
    workload = root / "workload.json"
    workload.write_text(json.dumps(work))

    processes = processes or os.cpu_count() or 1
    server, url = start_server(root, ServeConfig(processes=processes))
    try:
        return _run(root, url, workload, seconds, concurrency, publish, {
            "facts": facts, "dim": dim, "groups": groups, "concurrency": concurrency,
            "processes": processes, "prepare_s": round(prepared, 1),
            "index_build_s": index.get("seconds")}, keep=bool(workdir))
    finally:
        server.terminate()
        server.wait(timeout=30)


def _run(root: Path, url: str, workload: Path, seconds: float, concurrency: int,
         publish: bool, figures: dict[str, Any], keep: bool) -> dict[str, Any]:
    load = subprocess.Popen(
        [sys.executable, "-m", "tkg.jobs.bench.serve", url, str(workload), str(seconds),
         str(concurrency)], stdout=subprocess.PIPE, text=True)
    publish_at = publish_s = switched_after = None
    assert load.stdout is not None
    load.stdout.readline()  # "ready": the client is warm and its clock starts
    if publish:
        time.sleep(seconds / 2)
        publish_at = time.perf_counter()
        publish_s = publish_copy(root, "bench-1", "bench-2")
        while _serving(url) != "bench-2" and time.perf_counter() - publish_at < seconds:
            time.sleep(0.05)  # (one process switched; each switches on its own)
        switched_after = time.perf_counter() - publish_at
    out, _ = load.communicate()
    result = json.loads(out)
    timeline = result.pop("timeline")
    figures = {
        **figures,
        **result,
        "published_mid_run": publish,
        "publish_s": round(publish_s, 3) if publish_s is not None else None,
        "switch_after_publish_s": (round(switched_after, 2) if switched_after is not None
                                   else None),
        "cpus": os.cpu_count(),
    }
    switch = min((t for t, _, _, snap in timeline if snap == "bench-2"), default=None)
    if switch is not None:  # latency while the new snapshot was being opened and switched to
        figures["first_request_on_new_snapshot_s"] = switch
        figures["around_switch_4s"] = _window(timeline, switch - 2.0, switch + 2.0)
        figures["before_switch"] = _window(timeline, 0.0, switch - 2.0)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return figures


def print_bench(figures: dict[str, Any]) -> None:
    print_figures(f"tkg bench serve: {figures['facts']:,} facts, "
                  f"{figures['concurrency']} connections", figures)



def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("serve", help="HTTP load on a synthetic store, publish mid-run")
    bench.add_argument("--facts", type=int, default=100_000)
    bench.add_argument("--seconds", type=float, default=30.0)
    bench.add_argument("--concurrency", type=int, default=16)
    bench.add_argument("--dim", type=int, default=384)
    bench.add_argument("--groups", type=int, default=10)
    bench.add_argument("--workdir", default=None, help="keep the synthetic store here")
    bench.add_argument("--processes", type=int, default=None,
                       help="retrieval processes (default: one per CPU)")
    bench.add_argument("--no-publish", action="store_true",
                       help="do not publish a new snapshot during the run")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    figures = bench_serve(args.facts, seconds=args.seconds, concurrency=args.concurrency,
                          dim=args.dim, groups=args.groups, workdir=args.workdir,
                          publish=not args.no_publish, processes=args.processes)
    return report(figures, args.json, print_bench)

if __name__ == "__main__":  # the load process: URL WORKLOAD SECONDS CONCURRENCY
    url, path, secs, conc = sys.argv[1:5]
    print(json.dumps(asyncio.run(_load(url, json.loads(Path(path).read_text()), float(secs),
                                       int(conc)))))
