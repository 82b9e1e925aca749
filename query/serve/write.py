"""`POST /episodes`: agents add memory, the batch way (`pipeline/inbox.py`).

The request's episodes are checked against the input contract, the accepted ones written to
the store's inbox as one part, on disk before the answer; the next `tkg build --inbox` (or
`tkg serve --build-every N`) builds them. A key writes only its groups: a request naming any
other group is refused whole (403) and writes nothing. A record without `group_id` goes to
the caller's group when its key has exactly one."""

# (no `from __future__ import annotations`: FastAPI reads the request model from the
# endpoint's annotations)
from collections.abc import Mapping
from typing import Any

import anyio
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from tkg.pipeline import inbox, storage
from tkg.query import keys as api_keys
from tkg.query.serve.routes import Caller, service


class EpisodesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    episodes: list[dict[str, Any]] = Field(
        min_length=1, description="input-contract records (README: input): group_id, id, "
        "timestamp, kind and its fields; the request body's size bounds how many",
        examples=[[{"group_id": "acme", "id": "m-1", "kind": "message",
                    "conversation_id": "c-1", "speaker": "Alice",
                    "timestamp": "2026-11-25T09:00:00Z",
                    "content": "I moved to the Lisbon office."}]])


def writable(records: list[Any], may_write: frozenset[str] | None) -> list[Any]:
    """The records as written: a missing group_id filled where the key has one group; any
    named group outside `may_write` refuses the whole request (Forbidden)."""
    if may_write is not None and len(may_write) == 1:
        (only,) = may_write
        records = [{"group_id": only, **r} if isinstance(r, Mapping) and "group_id" not in r
                   else r for r in records]
    named = sorted({r["group_id"] for r in records
                    if isinstance(r, Mapping) and isinstance(r.get("group_id"), str)})
    if named:
        api_keys.readable(named, may_write)  # the read rule: a key's groups are its own
    return records


async def add_episodes(request: Request, body: EpisodesRequest, may_write: Caller
                       ) -> JSONResponse:
    svc = service(request)
    try:
        records = writable(body.episodes, may_write)
    except api_keys.Forbidden as exc:
        raise HTTPException(403, str(exc).replace("read", "written")) from None
    store_dir = svc.snapshots.store
    added = await anyio.to_thread.run_sync(
        lambda: inbox.add(store_dir, records, config=storage.configured()))
    return JSONResponse(added.to_dict(), status_code=200 if added.accepted else 422)


def add_write_routes(app: FastAPI) -> None:
    app.add_api_route(
        "/episodes", add_episodes, methods=["POST"],
        summary="add episodes to the store's inbox; the next `tkg build --inbox` builds them",
        description="Answers per record (in order) its episode_id, or the reason it was "
                    "rejected; 422 when none was accepted, 403 (nothing written) when a "
                    "record names a group the key may not write.")
