"""The HTTP routes: request bodies bounded by `ServeConfig`, the caller's groups from its
key, and the answers (every one names the snapshot it came from in `X-Tkg-Snapshot`, and
says where its time went in `Server-Timing`)."""

# (no `from __future__ import annotations`: FastAPI reads the request models, built per app
# from its limits, from the endpoints' annotations)
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Security
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import APIKeyHeader, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from tkg.pipeline.config import GROUP_ID_PATTERN, ServeConfig
from tkg.query import catalog
from tkg.query import keys as api_keys
from tkg.query.api import Retriever
from tkg.query.serve.metrics import Metrics
from tkg.query.serve.pool import Workers
from tkg.query.snapshot import QueryError, SnapshotHolder

ID_PATTERN = catalog.ID_PATTERN
GroupId = Annotated[str, Field(pattern=GROUP_ID_PATTERN)]
ItemId = Annotated[str, Field(pattern=ID_PATTERN)]


@dataclass
class Service:
    """What the routes share: bounds, keys, the snapshot holder, where searches run."""

    limits: ServeConfig
    keys: api_keys.KeyFile | None  # None: no keys, every group readable
    snapshots: SnapshotHolder[Any]  # a Snapshot, or app.CatalogOnly with processes > 1
    retriever: Retriever | None  # None when retrieval runs in processes
    workers: Workers
    metrics: Metrics

    def allowed(self, groups: list[str] | None, may_read: frozenset[str] | None) -> list[str]:
        """The groups a request reads: those it names (each readable by its key), or with
        keys and none named, every group its key may read."""
        if groups and len(groups) > self.limits.max_groups:
            raise HTTPException(422, f"at most {self.limits.max_groups} group ids")
        try:
            return api_keys.readable(groups, may_read)
        except api_keys.NoGroups as exc:
            raise HTTPException(400, str(exc)) from None
        except api_keys.Forbidden as exc:
            raise HTTPException(403, str(exc)) from None


def service(request: Request) -> Service:
    return request.app.state.service


# The two ways to send a key, declared for the OpenAPI document (and the Authorize button of
# /docs); `keys.caller_groups` reads whichever the request carries.
BEARER = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="Authorization: Bearer tkg_... (servers started with --keys)")
API_KEY = APIKeyHeader(name="X-API-Key", auto_error=False, scheme_name="apiKey",
                       description="X-API-Key: tkg_..., the same key as the bearer token")


async def caller_groups(request: Request, _bearer: Annotated[Any, Security(BEARER)] = None,
                        _header: Annotated[Any, Security(API_KEY)] = None
                        ) -> frozenset[str] | None:
    """The groups the caller's key may read; None when the server runs without keys.
    (async: FastAPI runs a plain function dependency on a worker thread, a hand-over there
    and back in every request: 7 % of the HTTP process's samples under the bench's load.)"""
    keys = service(request).keys
    if keys is None:
        return None
    try:
        return api_keys.caller_groups(keys, request.headers)
    except api_keys.Unauthorized as exc:
        raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from None


Caller = Annotated[frozenset[str] | None, Depends(caller_groups)]
GroupsParam = Annotated[list[str] | None, Query(  # at most serve.max_groups (`allowed`)
    description="a group to read, repeatable (`?group_id=a&group_id=b`). With an API key "
                "and none given: every group the key may read; without keys: required.",
    examples=[["acme"]])]


def request_models(limits: ServeConfig) -> tuple[type[BaseModel], type[BaseModel]]:
    """Request bodies with the configured bounds (pydantic rejects the rest with 422)."""

    class SearchRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        query: str = Field(min_length=1, max_length=limits.max_query_chars)
        group_ids: list[GroupId] | None = Field(  # none: the key's groups, as in lookups
            None, min_length=1, max_length=limits.max_groups,
            description="groups to read; with an API key and none given, every group the "
                        "key may read (as GET lookups and MCP tools); without keys, required")
        recipe: str | None = Field(None, max_length=64)
        limit: int | None = Field(None, ge=1, le=limits.max_limit)
        as_of: str | None = Field(None, max_length=40)
        known_at: str | None = Field(None, max_length=40)
        center: ItemId | None = None
        origins: list[ItemId] | None = Field(None, max_length=limits.max_groups)
        conversation_id: str | None = Field(None, max_length=512)
        bfs_hops: int | None = Field(None, ge=0, le=limits.max_bfs_hops)

    class ContextRequest(SearchRequest):
        max_tokens: int | None = Field(None, ge=50, le=limits.max_tokens)

    return SearchRequest, ContextRequest


async def retrieve(request: Request, method: str, body: BaseModel,
                   may_read: frozenset[str] | None) -> Response:
    """Search or context, wherever searches run (see `pool.Workers`)."""
    svc = service(request)
    groups = svc.allowed(body.group_ids, may_read)
    options = body.model_dump(exclude={"query", "group_ids"})
    try:
        run_id, content, stages = await svc.workers.retrieve(svc.retriever, method, body.query,
                                                             groups, options)
    except (QueryError, ValueError) as exc:
        raise HTTPException(400, str(exc)) from None
    # Server-Timing (the W3C header browsers and `tkg bench serve` read): where the time of
    # this answer went, in ms: wait (for a free retrieval process, and the hand-over), search,
    # json (encoding the body)
    timing = ", ".join(f"{name};dur={seconds * 1000:.2f}" for name, seconds in stages.items())
    return Response(content, media_type="application/json",
                    headers={"X-Tkg-Snapshot": run_id, "Server-Timing": timing})


def retrieval_endpoint(method: str, model: type[BaseModel]) -> Any:
    async def endpoint(request: Request, body: model, may_read: Caller) -> Response:  # type: ignore[valid-type]
        return await retrieve(request, method, body, may_read)

    return endpoint


async def lookup(request: Request, fn: Any, item: str, groups: list[str] | None,
                 may_read: frozenset[str] | None, what: str) -> JSONResponse:
    """A catalog lookup (`catalog.history` or `catalog.entity`) on the served snapshot."""
    svc = service(request)
    readable = svc.allowed(groups, may_read)
    served = svc.snapshots.get()
    try:
        found = await svc.workers.run(fn, served.catalog, item, readable)
    except catalog.NoCatalog:
        raise HTTPException(404, f"snapshot {served.run_id} has no catalog") from None
    if not found:
        raise HTTPException(404, f"no {what} {item} in group(s) {readable}")
    content = {"edge_id": item, "versions": found} if fn is catalog.history else found
    return JSONResponse(content, headers={"X-Tkg-Snapshot": served.run_id})


async def history(request: Request, edge_id: Annotated[str, PathParam(pattern=ID_PATTERN)],
                  may_read: Caller, group_id: GroupsParam = None) -> JSONResponse:
    return await lookup(request, catalog.history, edge_id, group_id, may_read, "fact")


async def entity(request: Request, entity_id: Annotated[str, PathParam(pattern=ID_PATTERN)],
                 may_read: Caller, group_id: GroupsParam = None) -> JSONResponse:
    return await lookup(request, catalog.entity, entity_id, group_id, may_read, "entity")


async def healthz(request: Request) -> dict[str, Any]:
    svc = service(request)
    return {"status": "ok", "snapshot": svc.snapshots.get().run_id,
            "switches": svc.snapshots.switches, "keys_required": svc.keys is not None}


async def prometheus(request: Request) -> PlainTextResponse:
    svc = service(request)
    svc.metrics.serving(svc.snapshots.get().run_id, svc.snapshots.switches)
    return PlainTextResponse(generate_latest(svc.metrics.registry).decode(),
                             media_type=CONTENT_TYPE_LATEST)


def add_routes(app: FastAPI, limits: ServeConfig) -> None:
    search_model, context_model = request_models(limits)
    app.add_api_route("/search", retrieval_endpoint("search", search_model), methods=["POST"],
                      summary="facts, entities, communities and episodes for a query")
    app.add_api_route("/context", retrieval_endpoint("context", context_model),
                      methods=["POST"], summary="the context string for an agent")
    app.add_api_route("/facts/{edge_id}/history", history, methods=["GET"],
                      summary="every version of a fact, both timelines")
    app.add_api_route("/entities/{entity_id}", entity, methods=["GET"],
                      summary="one entity with its aliases")
    app.add_api_route("/healthz", healthz, methods=["GET"],
                      summary="liveness and the snapshot served")
    app.add_api_route("/metrics", prometheus, methods=["GET"], summary="Prometheus metrics")
