"""The FastAPI app over a store, and `serve` (uvicorn) with its refusal to serve every
group on a reachable address without keys."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from tkg.pipeline import store
from tkg.pipeline.config import QueryConfig, ServeConfig
from tkg.query import keys as api_keys
from tkg.query.api import Retriever
from tkg.query.catalog import Catalog
from tkg.query.serve import docs
from tkg.query.serve.metrics import BoundedAndMeasured, Metrics
from tkg.query.serve.pool import Workers
from tkg.query.serve.routes import Service, add_routes
from tkg.query.serve.write import add_write_routes
from tkg.query.snapshot import SnapshotHolder, log_switches

LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass
class CatalogOnly:
    """What the HTTP process holds when retrieval runs in other processes: the snapshot's
    run id and catalog, not its search tables."""

    run_id: str
    catalog: Catalog

    @classmethod
    def open(cls, snapshot: Path) -> CatalogOnly:
        return cls(store.read_manifest(snapshot)["run_id"], Catalog(snapshot))


def open_service(store_dir: str | Path, keys_file: str | Path | None, limits: ServeConfig,
                 query: QueryConfig | None, cross_encoder: Any = None) -> Service:
    """The snapshot holder (whole snapshots, or with processes > 1 only the catalog: the
    retrieval processes open their own) and the workers."""
    metrics = Metrics()
    retriever = None
    if limits.processes > 1:
        snapshots: SnapshotHolder[Any] = SnapshotHolder(store_dir, CatalogOnly.open)
    else:
        retriever = Retriever(store_dir, config=query, cross_encoder=cross_encoder)
        snapshots = retriever.snapshots
        retriever.load_models()
    metrics.serving(snapshots.get().run_id, 0)
    return Service(limits=limits, keys=api_keys.KeyFile(keys_file) if keys_file else None,
                   snapshots=snapshots, retriever=retriever,
                   workers=Workers(store_dir, limits, metrics, query, snapshots), metrics=metrics)


def create_app(store_dir: str | Path, keys_file: str | Path | None = None,
               limits: ServeConfig | None = None, watch: bool = True,
               query: QueryConfig | None = None, cross_encoder: Any = None) -> FastAPI:
    """The FastAPI app over `store_dir`. `query` overrides the snapshot's own query section
    (recipe, limit, budgets); `cross_encoder` is the `tkg.query.open` option of that name
    (one process only). Its lifespan starts the snapshot watcher (`watch`; without it
    each request checks CURRENT itself) and the retrieval processes."""
    limits = limits or ServeConfig()
    service = open_service(store_dir, keys_file, limits, query, cross_encoder)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if watch:
            service.snapshots.watch(limits.poll_s)
        await service.workers.start()
        yield
        service.snapshots.stop()
        service.workers.stop()

    app = FastAPI(title="tkg", version="1", lifespan=lifespan, description=docs.DESCRIPTION,
                  docs_url=None, redoc_url=None)
    app.state.service = service
    app.add_middleware(BoundedAndMeasured, limits=limits, metrics=service.metrics)
    add_routes(app, limits)
    add_write_routes(app)
    docs.add_docs(app)
    return app


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
          query: QueryConfig | None = None) -> None:
    """Serve until interrupted (see the package docstring)."""
    import uvicorn

    limits = limits or ServeConfig()
    check_bind(host, keys_file)
    log_switches("tkg serve")
    if not keys_file:
        print(f"tkg serve: no --keys, so serving on {host} (loopback) only; every group is "
              "readable by local callers")
    app = create_app(store_dir, keys_file, limits, query=query)
    run_id = app.state.service.snapshots.get().run_id
    many = limits.processes > 1
    processes = (f"{limits.processes} retrieval processes and a spare that opens a new "
                 "snapshot" if many else "1 retrieval process")
    print(f"tkg serve: snapshot {run_id} of {store_dir} on http://{host}:{port} "
          f"({processes}; docs at /docs)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
