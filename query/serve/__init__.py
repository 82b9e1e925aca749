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
before switching to it (`query.snapshot.SnapshotHolder`, the one `tkg.query.open` uses), so
no request waits for the load; a request keeps the snapshot it started on to the end
(`X-Tkg-Snapshot` names it).

A query holds the interpreter lock, so threads alone use one core. With `serve.processes`
> 1 this process only speaks HTTP (and answers history and entity lookups from the catalog)
and sends each search to a free one of that many retrieval processes (or queues it for the
first that frees), each with its own snapshot, which also encode the JSON; a newly published
snapshot reaches them one at a time, each opening it between two searches (`pool`).

Modules: `app` (the app and `serve`), `routes` (HTTP, tenancy, bounds), `pool` (where
searches run), `metrics` (Prometheus, middleware); the catalog lookups are
`tkg.query.catalog`.
"""

from tkg.query.serve.app import check_bind, create_app, serve

__all__ = ["check_bind", "create_app", "serve"]
