"""`tkg mcp`: the retriever as Model Context Protocol tools, for agents (official `mcp` SDK).

Tools: `search_memory`, `get_context`, `get_fact_history`, `get_entity`, over the retriever
and catalog that `tkg serve` answers from, and `add_memory`, which writes one episode to the
store's inbox (`pipeline/inbox.py`, like `POST /episodes`), with the same tenancy rule
(`keys.readable`; a key writes only the groups it reads):

- `--group G` pins the server: no call reads anything else.
- `--keys FILE`: over HTTP every request carries a key (`Authorization: Bearer KEY` or
  `X-API-Key`); over stdio the key is the server process's `TKG_API_KEY` (the client's
  config sets it). A call reads the key's groups (within the pinned ones, if any).
- Neither: each call names its groups, and HTTP binds loopback only.

A call naming a group it may not read gets the same refusal whether or not that group has
data, and a fact or entity outside the readable groups is "not found" like one that never
existed. The transports are the SDK's: stdio (it points fd 1 at stderr while serving, so
stray prints cannot corrupt the protocol) and streamable HTTP at `/mcp`.
"""

# (no `from __future__ import annotations`: the SDK reads the tools' annotations at run time,
# and they name bounds local to create_server)
import os
import threading
import uuid
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field
from tkg.pipeline import inbox, storage
from tkg.pipeline.config import GROUP_ID_PATTERN, QueryConfig, ServeConfig
from tkg.query import catalog
from tkg.query import keys as api_keys
from tkg.query.api import Retriever
from tkg.query.snapshot import QueryError, log_switches

KEY_ENV = "TKG_API_KEY"
# GROUP_ID_PATTERN as a tool's JSON schema must spell it: clients check arguments with
# JavaScript regexes, which read Python's `\Z` as a literal Z; `$` is the end for pydantic's
# regex engine and JavaScript alike
GroupId = Annotated[str, Field(pattern=GROUP_ID_PATTERN.pattern.replace("\\Z", "$"))]
ItemId = Annotated[str, Field(pattern=catalog.ID_PATTERN)]
INSTRUCTIONS = (
    "Long-term memory as a bi-temporal knowledge graph. search_memory finds facts, entities, "
    "communities and source episodes for a question; get_context returns them as one text "
    "block for a prompt. Facts carry valid_at/invalid_at (when true in the world); pass "
    "as_of to ask about a past moment. get_fact_history lists every version of a fact, "
    "get_entity one entity with its aliases. add_memory remembers a new message or text; it "
    "is searchable after the store's next build. group_ids: the memory spaces to read "
    "(default: all this connection may read).")


@dataclass(frozen=True)
class Access:
    """Who may read what: the keys (None: no keys), the pinned groups (None: not pinned) and,
    over stdio, the one key the process was started with."""

    keys: api_keys.KeyFile | None = None
    pinned: frozenset[str] | None = None
    process_key: str | None = None

    def may_read(self, headers: Mapping[str, str] | None) -> frozenset[str] | None:
        """The groups a call may read (None: any it names)."""
        groups = self.pinned
        if self.keys is not None:
            presented = {"x-api-key": self.process_key or ""} if headers is None else headers
            key_groups = api_keys.caller_groups(self.keys, presented)
            groups = key_groups if groups is None else groups & key_groups
        return groups

    def writable(self, headers: Mapping[str, str] | None, group_id: str | None) -> str:
        """The group a write goes to: the one named (which the call must be allowed to read:
        a key writes its own groups only), or the only one the call may read."""
        groups = self.groups(headers, [group_id] if group_id else None)
        if len(groups) != 1:
            raise ToolError(f"name the group_id to write (one of {groups})")
        return groups[0]

    def groups(self, headers: Mapping[str, str] | None, asked: list[str] | None) -> list[str]:
        try:
            return api_keys.readable(asked, self.may_read(headers))
        except (PermissionError, ValueError) as exc:
            raise ToolError(str(exc)) from None


class Catalogs:
    """The catalog of the snapshot the retriever is on (reopened when it moves)."""

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever
        self._held: tuple[Path, catalog.Catalog] | None = None
        self._lock = threading.Lock()

    def current(self) -> catalog.Catalog:
        path = self.retriever.snapshot().path
        with self._lock:
            if self._held is None or self._held[0] != path:
                self._held = (path, catalog.Catalog(path))
            return self._held[1]


def create_server(store_dir: str | Path, access: Access, limits: ServeConfig | None = None,
                  query: QueryConfig | None = None) -> MCPServer:
    """The MCP server over `store_dir` (tools as in the module docstring); `query` overrides
    the snapshot's own query section, as in `tkg serve`."""
    limits = limits or ServeConfig()
    retriever = Retriever(store_dir, config=query)
    catalogs = Catalogs(retriever)

    @asynccontextmanager
    async def warm(_: MCPServer):
        # the models load before the handshake is answered, not in the first search, whose
        # time they would eat (a cold load took most of the 10 s bound on a busy machine)
        await anyio.to_thread.run_sync(retriever.load_models)
        yield {}

    server = MCPServer("tkg", instructions=INSTRUCTIONS, lifespan=warm, log_level="WARNING")

    async def run(fn: Any, *args: Any) -> Any:
        """`fn` on a worker thread, bounded by the serve timeout."""
        try:
            with anyio.fail_after(limits.timeout_s):
                return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
        except TimeoutError:
            raise ToolError(f"took over {limits.timeout_s:g} s; narrow it (fewer groups, "
                            "lower limit) or retry") from None
        except (QueryError, ValueError, catalog.NoCatalog) as exc:
            raise ToolError(str(exc)) from None

    Query = Annotated[str, Field(min_length=1, max_length=limits.max_query_chars,
                                 description="the question or keywords")]
    Groups = Annotated[list[GroupId] | None, Field(
        max_length=limits.max_groups,
        description="group ids to read; default: every group this connection may read")]
    Moment = Annotated[str | None, Field(max_length=40, description=(
        "ISO-8601; as_of: the world at that moment (valid time), known_at: what memory held "
        "then (transaction time); default now"))]

    # the HTTP bodies' bounds (query/serve/routes.py: request_models)
    Conversation = Annotated[str | None, Field(max_length=512, description=(
        "a conversation id: search from the entities of its latest episodes"))]
    RecipeName = Annotated[str | None, Field(max_length=64, description=(
        "search recipe (default: the store's query.recipe)"))]

    @server.tool(description="Search memory: facts (with validity dates), entities, "
                             "communities and source episodes for a query.")
    async def search_memory(query: Query, ctx: Context, group_ids: Groups = None,
                            limit: Annotated[int, Field(ge=1, le=limits.max_limit)] = 10,
                            as_of: Moment = None, known_at: Moment = None,
                            conversation_id: Conversation = None,
                            recipe: RecipeName = None) -> dict[str, Any]:
        groups = access.groups(ctx.headers, group_ids)
        found = await run(lambda: retriever.search(
            query, groups, limit=limit, as_of=as_of, known_at=known_at,
            conversation_id=conversation_id, recipe=recipe))
        return found.to_dict()

    @server.tool(description="The memory relevant to a query as one text block for a "
                             "prompt: facts with date ranges, entities, cited episodes.")
    async def get_context(query: Query, ctx: Context, group_ids: Groups = None,
                          max_tokens: Annotated[int, Field(ge=50, le=limits.max_tokens)] = 2000,
                          as_of: Moment = None, known_at: Moment = None,
                          conversation_id: Conversation = None,
                          recipe: RecipeName = None) -> str:
        groups = access.groups(ctx.headers, group_ids)
        return await run(lambda: retriever.context(
            query, groups, max_tokens=max_tokens, as_of=as_of, known_at=known_at,
            conversation_id=conversation_id, recipe=recipe))

    @server.tool(description="Every version of one fact (edge_id from search_memory) on "
                             "both timelines: when it held, when memory learned and "
                             "retracted it.")
    async def get_fact_history(edge_id: ItemId, ctx: Context,
                               group_ids: Groups = None) -> dict[str, Any]:
        groups = access.groups(ctx.headers, group_ids)
        versions = await run(lambda: catalog.history(catalogs.current(), edge_id, groups))
        if not versions:
            raise ToolError(f"no fact {edge_id} in group(s) {groups}")
        return {"edge_id": edge_id, "versions": versions}

    @server.tool(description="One entity (entity_id from search_memory) with its summary, "
                             "labels, first/last seen and aliases.")
    async def get_entity(entity_id: ItemId, ctx: Context,
                         group_ids: Groups = None) -> dict[str, Any]:
        groups = access.groups(ctx.headers, group_ids)
        found = await run(lambda: catalog.entity(catalogs.current(), entity_id, groups))
        if found is None:
            raise ToolError(f"no entity {entity_id} in group(s) {groups}")
        return found

    Text = Annotated[str | None, Field(max_length=512)]

    @server.tool(description="Remember something: one episode (a message of a conversation "
                             "when conversation_id and speaker are given, else a text) goes to "
                             "the store's inbox and is searchable after its next build. "
                             "Answers its episode_id, or why it was rejected.")
    async def add_memory(content: Annotated[str, Field(min_length=1)], ctx: Context,
                         group_id: GroupId | None = None, conversation_id: Text = None,
                         speaker: Text = None, role: Text = None, title: Text = None,
                         timestamp: Moment = None, id: Text = None,
                         source_description: Text = None) -> dict[str, Any]:
        record = memory_record(access.writable(ctx.headers, group_id), content, {
            "conversation_id": conversation_id, "speaker": speaker, "role": role,
            "title": title, "timestamp": timestamp, "id": id,
            "source_description": source_description})
        added = await run(lambda: inbox.add(retriever.store, [record],
                                            config=storage.configured()))
        if not added.accepted:
            raise ToolError(f"rejected: {added.results[0]['reason']}")
        return added.results[0]

    return server


def memory_record(group_id: str, content: str, fields: dict[str, str | None]) -> dict[str, Any]:
    """An input-contract record of `add_memory`'s arguments: a message where it names a
    conversation or a speaker, else a text; a fresh id and the current time where none given
    (the contract then checks it as a build would)."""
    given = {k: v for k, v in fields.items() if v is not None}
    message = "conversation_id" in given or "speaker" in given
    return {"group_id": group_id, "kind": "message" if message else "text",
            "id": given.pop("id", None) or uuid.uuid4().hex,
            "timestamp": given.pop("timestamp", None) or datetime.now(UTC).isoformat(),
            "content": content, **given}


class RequireKey:
    """ASGI: over HTTP with keys, a request without a known key gets 401 before it reaches
    the MCP session (the tools check the key again for its groups)."""

    def __init__(self, app: Any, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.access.keys is not None:
            from starlette.datastructures import Headers
            from starlette.responses import JSONResponse

            try:
                api_keys.caller_groups(self.access.keys, Headers(scope=scope))
            except api_keys.Unauthorized as exc:
                await JSONResponse({"detail": str(exc)}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def startup_access(keys_file: str | None, pinned: list[str] | None, stdio: bool) -> Access:
    """The access rule from the command line (and, over stdio, `TKG_API_KEY`); a key that
    is missing or reads none of the pinned groups stops the server before it starts."""
    keys = api_keys.KeyFile(keys_file) if keys_file else None
    access = Access(keys, frozenset(pinned) if pinned else None,
                    os.environ.get(KEY_ENV) if stdio else None)
    if keys is not None and stdio:
        try:
            groups = access.may_read(None)
        except api_keys.Unauthorized:
            if access.process_key:
                raise api_keys.KeysError(
                    f"the key in ${KEY_ENV} is not one of {keys_file} (a wrong or revoked "
                    f"key; `tkg keys list --keys {keys_file}` shows the keys there, `tkg "
                    "keys add` makes one)") from None
            raise api_keys.KeysError(f"--keys over stdio needs the key in ${KEY_ENV} (set it "
                                     "in the MCP client's env for this server)") from None
        if not groups:
            raise api_keys.KeysError(f"the key in ${KEY_ENV} reads none of the groups "
                                     f"{sorted(pinned or [])}")
    return access


def serve_mcp(store_dir: str, transport: str = "stdio", host: str = "127.0.0.1",
              port: int = 8765, keys_file: str | None = None,
              groups: list[str] | None = None, limits: ServeConfig | None = None,
              query: QueryConfig | None = None) -> None:
    """Serve until the client disconnects (stdio) or until interrupted (HTTP)."""
    import sys

    access = startup_access(keys_file, groups, stdio=transport == "stdio")
    log_switches("tkg mcp")  # on stderr: over stdio, stdout is the protocol's
    if transport == "stdio":
        create_server(store_dir, access, limits, query).run("stdio")
        return
    import uvicorn
    from tkg.query.serve import check_bind

    check_bind(host, keys_file)
    server = create_server(store_dir, access, limits, query)
    app = RequireKey(server.streamable_http_app(host=host), access)
    print(f"tkg mcp: {store_dir} on http://{host}:{port}/mcp (streamable HTTP)",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
