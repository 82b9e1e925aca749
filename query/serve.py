"""`tkg serve`: the retrieval API over HTTP (FastAPI + uvicorn).

- `POST /search`, `POST /context`: the parameters and JSON of `tkg search` / `tkg context`.
- `GET /facts/{edge_id}/history`, `GET /entities/{entity_id}`: from the snapshot's DuckDB
  catalog, parameterized, scoped to the caller's groups.
- `GET /healthz`, `GET /metrics` (Prometheus), OpenAPI docs at `/docs`.

Tenancy: with `--keys`, every request carries a key (`Authorization: Bearer ...` or
`X-API-Key`) bound to group ids; asking for any other group is 403 with no data. Without keys
the server binds to loopback only. Bounds (body size, query length, limit, BFS depth, groups,
token budget) come from `ServeConfig`; a request past `timeout_s`, or beyond the queue, gets
503. A background thread watches `STORE/CURRENT` and opens a newly published snapshot
before switching to it, so no request waits for the load; a request keeps the snapshot it
started on to the end (`X-Tkg-Snapshot` names it).

A query holds the interpreter lock, so threads alone use one core. With `serve.processes`
> 1 this process only speaks HTTP (and answers history and entity lookups from the catalog)
and sends each search to the next free one of that many retrieval processes, each with its
own snapshot and watcher, which also encode the JSON.
"""

import asyncio
import contextlib
import dataclasses
import importlib
import ipaddress
import json
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any

import duckdb
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field
from tkg.pipeline import store
from tkg.pipeline.config import ServeConfig
from tkg.query import keys as api_keys
from tkg.query.api import Retriever
from tkg.query.recipes import get_recipe
from tkg.query.snapshot import QueryError, open_snapshot

log = logging.getLogger("tkg.serve")
ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


# --- snapshots ------------------------------------------------------------------------------


class PinnedRetriever(Retriever):
    """A retriever that stays on one snapshot: the server decides when to switch."""

    def __init__(self, store_dir: Path, snapshot: Any, embedder: Any = None) -> None:
        self._pinned = snapshot
        super().__init__(store_dir, embedder=embedder)

    def snapshot(self) -> Any:
        return self._pinned


@dataclass
class Served:
    """One open snapshot: its retriever and (for history and entities) its catalog."""

    run_id: str
    retriever: PinnedRetriever | None  # None in a front process (retrieval runs elsewhere)
    catalog: duckdb.DuckDBPyConnection | None


class Snapshots:
    """The snapshot being served; `refresh` opens a newly published one, then swaps."""

    def __init__(self, store_dir: Path, embedder: Any = None, retrieval: bool = True) -> None:
        self.store = Path(store_dir)
        self.embedder = embedder
        self.retrieval = retrieval  # False: the catalog only (retrieval runs in processes)
        self.switches = 0
        self.current = self._open(store.current_run(self.store))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open(self, run_id: str | None) -> Served:
        if run_id is None:
            raise store.StoreError(f"{self.store} has no published snapshot; build one first")
        path = store.snapshot_dir(self.store, run_id)
        retriever = None
        if self.retrieval:
            retriever = PinnedRetriever(self.store, open_snapshot(path), self.embedder)
            if self.embedder is None:  # load the model now, not in the first request
                self.embedder = retriever.embedder
        catalog = path / store.CATALOG
        con = duckdb.connect(str(catalog), read_only=True) if catalog.is_file() else None
        return Served(run_id, retriever, con)

    def refresh(self) -> bool:
        """Switch to the published snapshot if CURRENT moved; False when nothing changed or
        the new one cannot be opened (the old one keeps serving)."""
        run_id = store.current_run(self.store)
        if run_id is None or run_id == self.current.run_id:
            return False
        try:
            served = self._open(run_id)
        except Exception:
            log.exception("snapshot %s could not be opened; still serving %s", run_id,
                          self.current.run_id)
            return False
        self.current = served  # one reference swap: requests hold the one they started with
        self.switches += 1
        log.info("now serving snapshot %s", run_id)
        return True

    def watch(self, every: float) -> None:
        def loop() -> None:
            while not self._stop.wait(every):
                self.refresh()

        self._thread = threading.Thread(target=loop, name="tkg-snapshot-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


# --- retrieval processes --------------------------------------------------------------------

_PROCESS_SNAPSHOTS: Snapshots | None = None  # what a retrieval process serves from


def load_embedder(name: str | None, store_dir: str | Path) -> Any:
    """`module:function` called with the store folder (benchmarks' synthetic embedder), or
    None: the snapshot's own model."""
    if not name:
        return None
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)(store_dir)


def _start_process(store_dir: str, embedder: str | None, poll_s: float) -> None:
    """Initializer of a retrieval process: open the snapshot and watch CURRENT; exit when
    the server process is gone (a killed server must not leave its processes behind)."""
    global _PROCESS_SNAPSHOTS
    parent = os.getppid()

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphaned, name="tkg-parent-watch", daemon=True).start()
    _PROCESS_SNAPSHOTS = Snapshots(Path(store_dir), load_embedder(embedder, store_dir))
    _PROCESS_SNAPSHOTS.watch(poll_s)


def _ready() -> str:
    time.sleep(0.2)  # (held a moment, so the start-up calls spread over the processes)
    assert _PROCESS_SNAPSHOTS is not None, "not a retrieval process"
    return _PROCESS_SNAPSHOTS.current.run_id


def _retrieve(served: Served | None, method: str, query: str, group_ids: list[str],
              args: dict[str, Any], extra: dict[str, Any]) -> tuple[str, bytes]:
    """One search or context on `served` (None: this retrieval process's snapshot): the
    run id and the response body, JSON encoded where the search ran."""
    if served is None:
        assert _PROCESS_SNAPSHOTS is not None, "not a retrieval process"
        served = _PROCESS_SNAPSHOTS.current
    assert served.retriever is not None
    found = getattr(served.retriever, method)(query, group_ids, **args, **extra)
    content = found.to_dict() if method == "search" else {"context": found}
    return served.run_id, json.dumps(content, ensure_ascii=False).encode()


# --- requests -------------------------------------------------------------------------------


def _request_models(limits: ServeConfig) -> tuple[type[BaseModel], type[BaseModel]]:
    """Request bodies with the configured bounds (pydantic rejects the rest with 422)."""

    class SearchRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        query: str = Field(min_length=1, max_length=limits.max_query_chars)
        group_ids: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]] = Field(
            min_length=1, max_length=limits.max_groups)
        recipe: str | None = Field(None, max_length=64)
        limit: int | None = Field(None, ge=1, le=limits.max_limit)
        as_of: str | None = Field(None, max_length=40)
        known_at: str | None = Field(None, max_length=40)
        center: str | None = Field(None, pattern=ID_PATTERN)
        origins: list[Annotated[str, Field(pattern=ID_PATTERN)]] | None = Field(
            None, max_length=limits.max_groups)
        conversation_id: str | None = Field(None, max_length=512)
        bfs_hops: int | None = Field(None, ge=0, le=limits.max_bfs_hops)

    class ContextRequest(SearchRequest):
        max_tokens: int | None = Field(None, ge=50, le=limits.max_tokens)

    return SearchRequest, ContextRequest


def _search_args(body: BaseModel) -> dict[str, Any]:
    recipe = get_recipe(body.recipe) if body.recipe else None
    if body.bfs_hops is not None:
        recipe = dataclasses.replace(recipe or get_recipe_default(), bfs_hops=body.bfs_hops)
    return {"recipe": recipe, "limit": body.limit, "as_of": body.as_of,
            "known_at": body.known_at, "center": body.center, "origins": body.origins,
            "conversation_id": body.conversation_id}


def get_recipe_default() -> Any:
    from tkg.query.recipes import DEFAULT

    return get_recipe(DEFAULT)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def _rows(cursor: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    columns = [d[0] for d in cursor.description]
    return [{c: _json_value(v) for c, v in zip(columns, row, strict=True)}
            for row in cursor.fetchall()]


HISTORY_SQL = """
    SELECT f.edge_id, f.version, f.group_id, f.relation, f.fact, s.name AS source,
           t.name AS target, f.valid_at, f.invalid_at, f.created_at, f.expired_at,
           f.invalidated_by, f.episode_ids
    FROM facts f
    LEFT JOIN entities s ON s.entity_id = f.source_entity_id AND s.group_id = f.group_id
    LEFT JOIN entities t ON t.entity_id = f.target_entity_id AND t.group_id = f.group_id
    WHERE f.edge_id = ? AND list_contains(?, f.group_id)
    ORDER BY f.version"""
ENTITY_SQL = """
    SELECT entity_id, group_id, name, labels, summary, attributes, first_seen, last_seen,
           mention_count
    FROM entities WHERE entity_id = ? AND list_contains(?, group_id)"""
ALIASES_SQL = """
    SELECT DISTINCT alias, evidence FROM entity_aliases
    WHERE entity_id = ? AND list_contains(?, group_id) ORDER BY alias"""


# --- metrics --------------------------------------------------------------------------------


class Metrics:
    """The server's Prometheus metrics (kept by the one process that speaks HTTP)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("tkg_requests", "HTTP requests", ["endpoint", "status"],
                                registry=self.registry)
        self.latency = Histogram(
            "tkg_request_seconds", "request latency", ["endpoint"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10))
        self.errors = Counter("tkg_errors", "requests answered 5xx, or refused",
                              ["endpoint", "reason"], registry=self.registry)
        self.inflight = Gauge("tkg_inflight_requests", "requests being served",
                              registry=self.registry)
        self.snapshot = Gauge("tkg_snapshot_info", "the snapshot being served (value 1)",
                              ["run_id"], registry=self.registry)
        self.switches = Gauge("tkg_snapshot_switches", "snapshots switched to without restart",
                              registry=self.registry)

    def serving(self, run_id: str, switches: int) -> None:
        self.snapshot.clear()
        self.snapshot.labels(run_id).set(1)
        self.switches.set(switches)


# --- the app --------------------------------------------------------------------------------


def create_app(store_dir: str | Path, keys_file: str | Path | None = None,
               limits: ServeConfig | None = None, embedder: Any = None,
               watch: bool = True, embedder_name: str | None = None) -> FastAPI:
    """The FastAPI app over `store_dir` (its lifespan starts the snapshot watcher)."""
    limits = limits or ServeConfig()
    keys = api_keys.load(keys_file) if keys_file else None
    remote = limits.processes > 1  # retrieval in processes, this one only speaks HTTP
    snapshots = Snapshots(Path(store_dir), embedder, retrieval=not remote)
    metrics = Metrics()
    metrics.serving(snapshots.current.run_id, 0)
    pool = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="tkg-query")
    processes = ProcessPoolExecutor(
        max_workers=limits.processes, mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_process, initargs=(str(store_dir), embedder_name, limits.poll_s),
    ) if remote else None
    admitted = asyncio.Semaphore(limits.workers + limits.queue)
    search_model, context_model = _request_models(limits)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if watch:
            snapshots.watch(limits.poll_s)
        if processes is not None:  # start them all (each opens the snapshot) before serving
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(processes, _ready)
                                   for _ in range(limits.processes)))
        yield
        snapshots.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        if processes is not None:
            processes.shutdown(wait=True, cancel_futures=True)

    app = FastAPI(title="tkg", version="1", lifespan=lifespan,
                  description="Retrieval over a tkg store (search, context, fact history).")
    app.state.snapshots = snapshots
    app.state.metrics = metrics
    app.state.keys_required = keys is not None

    app.add_middleware(BoundedAndMeasured, limits=limits, metrics=metrics)

    def caller_groups(request: Request) -> frozenset[str] | None:
        """The groups the caller's key may read; None when the server runs without keys."""
        if keys is None:
            return None
        header = request.headers.get("authorization", "")
        presented = header[7:].strip() if header.lower().startswith("bearer ") else (
            request.headers.get("x-api-key"))
        key = api_keys.lookup(keys, presented)
        if key is None:
            raise HTTPException(401, "missing or unknown API key (Authorization: Bearer KEY)")
        return key.groups

    def allowed(groups: list[str] | None, may_read: frozenset[str] | None) -> list[str]:
        if not groups:
            if may_read is None:
                raise HTTPException(400, "give the group ids to read (group_id=G)")
            return sorted(may_read)
        if may_read is not None and not set(groups) <= may_read:
            raise HTTPException(403, "this key may not read group(s) "
                                     f"{sorted(set(groups) - may_read)}")
        return groups

    async def run(fn, *args: Any, executor: Any = None) -> Any:
        """`fn` on the worker pool (or `executor`), bounded in time and in queue length."""
        if admitted.locked():
            metrics.errors.labels("queue", "busy").inc()
            raise HTTPException(503, "server busy: too many requests waiting; retry shortly")
        async with admitted:
            loop = asyncio.get_running_loop()
            try:
                return await asyncio.wait_for(
                    loop.run_in_executor(executor or pool, fn, *args), limits.timeout_s)
            except TimeoutError:
                raise HTTPException(503, f"request took over {limits.timeout_s:g} s; "
                                         "narrow it (fewer groups, lower limit) or retry"
                                    ) from None

    def answer(served: Served, content: dict[str, Any]) -> JSONResponse:
        return JSONResponse(content, headers={"X-Tkg-Snapshot": served.run_id})

    async def retrieve(method: str, body: BaseModel, may_read: frozenset[str] | None,
                       extra: dict[str, Any]) -> Response:
        """Search or context on this process's threads, or on a retrieval process (each
        request goes to the next free one, so a slow request never queues others)."""
        allowed(body.group_ids, may_read)
        served = None if processes is not None else snapshots.current
        try:
            run_id, content = await run(_retrieve, served, method, body.query, body.group_ids,
                                        _search_args(body), extra, executor=processes)
        except (QueryError, ValueError) as exc:
            raise HTTPException(400, str(exc)) from None
        return Response(content, media_type="application/json",
                        headers={"X-Tkg-Snapshot": run_id})

    @app.post("/search", summary="facts, entities, communities and episodes for a query")
    async def search(body: search_model,
                     may_read: frozenset[str] | None = Depends(caller_groups)):
        return await retrieve("search", body, may_read, {})

    @app.post("/context", summary="the context string for an agent")
    async def context(body: context_model,
                      may_read: frozenset[str] | None = Depends(caller_groups)):
        return await retrieve("context", body, may_read, {"max_tokens": body.max_tokens})

    def catalog_query(served: Served, sql: str, params: list[Any]) -> list[dict[str, Any]]:
        if served.catalog is None:
            raise HTTPException(404, f"snapshot {served.run_id} has no catalog")
        cursor = served.catalog.cursor()
        try:
            return _rows(cursor.execute(sql, params))
        finally:
            cursor.close()

    @app.get("/facts/{edge_id}/history", summary="every version of a fact, both timelines")
    async def history(edge_id: Annotated[str, PathParam(pattern=ID_PATTERN)],
                      group_id: Annotated[list[str] | None, Query(max_length=32)] = None,
                      may_read: frozenset[str] | None = Depends(caller_groups)):
        groups = allowed(group_id, may_read)
        served = snapshots.current
        versions = await run(catalog_query, served, HISTORY_SQL, [edge_id, groups])
        if not versions:
            raise HTTPException(404, f"no fact {edge_id} in group(s) {groups}")
        return answer(served, {"edge_id": edge_id, "versions": versions})

    def entity_rows(served: Served, entity_id: str, groups: list[str]) -> dict[str, Any] | None:
        rows = catalog_query(served, ENTITY_SQL, [entity_id, groups])
        if not rows:
            return None
        entity = rows[0]
        entity["aliases"] = catalog_query(served, ALIASES_SQL, [entity_id, [entity["group_id"]]])
        return entity

    @app.get("/entities/{entity_id}", summary="one entity with its aliases")
    async def entity(entity_id: Annotated[str, PathParam(pattern=ID_PATTERN)],
                     group_id: Annotated[list[str] | None, Query(max_length=32)] = None,
                     may_read: frozenset[str] | None = Depends(caller_groups)):
        groups = allowed(group_id, may_read)
        served = snapshots.current
        found = await run(entity_rows, served, entity_id, groups)
        if found is None:
            raise HTTPException(404, f"no entity {entity_id} in group(s) {groups}")
        return answer(served, found)

    @app.get("/healthz", summary="liveness and the snapshot served")
    async def healthz():
        return {"status": "ok", "snapshot": snapshots.current.run_id,
                "switches": snapshots.switches, "keys_required": keys is not None}

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus():
        metrics.serving(snapshots.current.run_id, snapshots.switches)
        return PlainTextResponse(generate_latest(metrics.registry).decode(),
                                 media_type=CONTENT_TYPE_LATEST)

    return app


class BoundedAndMeasured:
    """ASGI middleware: refuse bodies without a length or over the limit (411, 413) before
    they are read, and count and time every request. (A plain ASGI class: Starlette's
    `BaseHTTPMiddleware` cost a twelfth of a served request's CPU.)"""

    def __init__(self, app: Any, limits: ServeConfig, metrics: Metrics) -> None:
        self.app, self.limits, self.metrics = app, limits, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = scope["path"]
        endpoint = path if path in _FIXED else _template(path)
        length = dict(scope["headers"]).get(b"content-length")
        status = 500

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        limit = self.limits.max_body_bytes
        try:
            if scope["method"] == "POST" and length is None:
                await JSONResponse({"detail": "send a Content-Length header"}, 411)(
                    scope, receive, sending)
            elif length is not None and (not length.isdigit() or int(length) > limit):
                await JSONResponse({"detail": f"request body over {limit} bytes"}, 413)(
                    scope, receive, sending)
            else:
                self.metrics.inflight.inc()
                try:
                    await self.app(scope, receive, sending)
                finally:
                    self.metrics.inflight.dec()
        finally:
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
            if status >= 500 or status in (411, 413):
                self.metrics.errors.labels(endpoint, str(status)).inc()


_FIXED = frozenset({"/search", "/context", "/healthz", "/metrics", "/docs", "/openapi.json"})


def _template(path: str) -> str:
    """A low-cardinality label for a path with ids in it."""
    if path.startswith("/facts/"):
        return "/facts/{edge_id}/history"
    if path.startswith("/entities/"):
        return "/entities/{entity_id}"
    return "other"


def check_bind(host: str, keys_file: str | None) -> None:
    """Without keys, only loopback: anyone who can reach the port could read every group."""
    if keys_file:
        return
    try:
        loopback = host in LOOPBACK or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise api_keys.KeysError(
            f"refusing to serve on {host} without --keys: anyone reaching the port could read "
            "every group. Create keys with `tkg keys add --keys FILE --name N --group G` "
            "and pass --keys FILE, or bind to 127.0.0.1")


def serve(store_dir: str, host: str = "127.0.0.1", port: int = 8080,
          keys_file: str | None = None, limits: ServeConfig | None = None,
          embedder: str | None = None) -> None:
    """Serve until interrupted (see the module docstring); `embedder` is for benchmarks
    (see `load_embedder`)."""
    import uvicorn

    limits = limits or ServeConfig()
    check_bind(host, keys_file)
    if not keys_file:
        print(f"tkg serve: no --keys, so serving on {host} (loopback) only; every group is "
              "readable by local callers")
    remote = limits.processes > 1
    app = create_app(store_dir, keys_file, limits,
                     embedder=None if remote else load_embedder(embedder, store_dir),
                     embedder_name=embedder)
    run_id = app.state.snapshots.current.run_id
    print(f"tkg serve: snapshot {run_id} of {store_dir} on http://{host}:{port} "
          f"({limits.processes} retrieval process{'es' if remote else ''}; docs at /docs)",
          flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
