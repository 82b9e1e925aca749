"""`tkg mcp` over the sample corpus (the session's `corpus_build`), driven by the official MCP
SDK's client: `tkg mcp` runs as a subprocess over stdio (and once over streamable HTTP).
Each tool answers; a key reads only its groups, and a refusal or a "not found" reads the
same whether or not the other tenant's group, fact or entity exists."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from tkg.query import keys as api_keys

TOOLS = {"search_memory", "get_context", "get_fact_history", "get_entity",
         "add_memory"}
TKG = [sys.executable, "-m", "tkg.jobs.cli", "mcp"]


@pytest.fixture(scope="module")
def setup(corpus_build, tmp_path_factory) -> dict[str, Any]:
    keys_file = tmp_path_factory.mktemp("mcp") / "keys.json"
    keys = {"acme": api_keys.add(keys_file, "acme-agent", ["acme"]),
            # (and a group with no data yet: its searches say so)
            "household": api_keys.add(keys_file, "home-agent", ["household", "ghost"]),
            "both": api_keys.add(keys_file, "admin", ["acme", "household"])}
    return {"store": corpus_build.snapshot.parent.parent, "keys_file": keys_file, "keys": keys}


def over_stdio(setup: dict[str, Any], *args: str, key: str | None = None
               ) -> StdioServerParameters:
    env = {"TKG_API_KEY": key} if key else {}
    return StdioServerParameters(command=TKG[0], args=[*TKG[1:], "--store",
                                                       str(setup["store"]), *args], env=env)


def text(result: Any) -> str:
    return result.content[0].text


def calls(server: Any, steps: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Connect to `server` once and make each tool call in order."""
    async def session() -> list[Any]:
        async with Client(server) as client:
            return [await client.call_tool(name, args) for name, args in steps]

    return asyncio.run(session())


def groups_of(corpus_db, table: str, column: str, ids: list[str]) -> set[str]:
    rows = corpus_db.execute(f"SELECT DISTINCT group_id FROM {table} "
                             f"WHERE list_contains(?, {column})", [ids]).fetchall()
    return {r[0] for r in rows}


def test_every_tool_answers_over_stdio(setup, corpus_db):
    async def session() -> list[Any]:
        async with Client(over_stdio(setup, "--keys", str(setup["keys_file"]),
                                     key=setup["keys"]["household"])) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            found = await client.call_tool("search_memory",
                                           {"query": "Where does Alice Walker work?"})
            context = await client.call_tool("get_context", {
                "query": "Where does Alice Walker work?", "max_tokens": 400})
            assert not found.is_error, text(found)
            fact, entity = (found.structured_content["facts"][0],
                            found.structured_content["entities"][0])
            history = await client.call_tool("get_fact_history", {"edge_id": fact["edge_id"]})
            named = await client.call_tool("get_entity", {"entity_id": entity["entity_id"],
                                                          "group_ids": ["household"]})
            return [listed, found.structured_content, context, fact, entity, history, named]

    listed, body, context, fact, entity, history, named = asyncio.run(session())
    assert listed == TOOLS
    assert body["facts"] and body["entities"] and body["episodes"]
    assert len(body["warnings"]) == 1 and "'ghost'" in body["warnings"][0]
    assert groups_of(corpus_db, "facts", "edge_id",
                     [f["edge_id"] for f in body["facts"]]) == {"household"}
    assert not context.is_error and "Alice Walker" in text(context)
    assert "<FACTS>" in text(context)
    versions = corpus_db.execute("SELECT count(*) FROM facts WHERE edge_id = ?",
                                 [fact["edge_id"]]).fetchone()[0]
    assert not history.is_error, text(history)
    assert len(history.structured_content["versions"]) == versions
    assert fact["fact"] in {v["fact"] for v in history.structured_content["versions"]}
    assert not named.is_error, text(named)
    assert named.structured_content["name"] == entity["name"]
    assert named.structured_content["group_id"] == "household"
    assert isinstance(named.structured_content["aliases"], list)


def test_a_key_reads_only_its_groups_and_learns_nothing_of_others(setup, corpus_db, expected):
    edge, entity = corpus_db.execute(
        "SELECT edge_id, source_entity_id FROM facts WHERE group_id = 'household' "
        "ORDER BY edge_id LIMIT 1").fetchone()
    nowhere = "00000000-0000-5000-8000-000000000000"
    name = expected["tenant_only_names"]["household"][0]
    steps = [("search_memory", {"query": name, "group_ids": ["household"]}),
             ("search_memory", {"query": name, "group_ids": ["no-such-group"]}),
             ("get_context", {"query": name, "group_ids": ["acme", "household"]}),
             ("get_fact_history", {"edge_id": edge}),
             ("get_fact_history", {"edge_id": nowhere}),
             ("get_entity", {"entity_id": entity}),
             ("get_entity", {"entity_id": nowhere}),
             ("get_entity", {"entity_id": entity, "group_ids": ["household"]}),
             ("search_memory", {"query": f"Where does {name} live and work?", "limit": 20})]
    (other, missing, mixed, history, no_history, got_entity, no_entity, asked_entity,
     own) = calls(over_stdio(setup, "--keys", str(setup["keys_file"]),
                             key=setup["keys"]["acme"]), steps)
    for refused in (other, missing, mixed, history, no_history, got_entity, no_entity,
                    asked_entity):
        assert refused.is_error and refused.structured_content is None
    # the same words for a group, fact or entity that exists elsewhere and one that does not
    assert text(other).replace("household", "G") == text(missing).replace("no-such-group", "G")
    assert text(history).replace(edge, "X") == text(no_history).replace(nowhere, "X")
    assert text(got_entity).replace(entity, "X") == text(no_entity).replace(nowhere, "X")
    assert name not in json.dumps(own.structured_content)
    facts = [f["edge_id"] for f in own.structured_content["facts"]]
    assert groups_of(corpus_db, "facts", "edge_id", facts) <= {"acme"}


def test_pinned_groups_narrow_a_key(setup, corpus_db):
    """`--group acme` with a key for both tenants: only acme is read."""
    found, refused = calls(over_stdio(setup, "--keys", str(setup["keys_file"]), "--group",
                                      "acme", key=setup["keys"]["both"]), [
        ("search_memory", {"query": "Alice", "limit": 20}),
        ("search_memory", {"query": "Alice", "group_ids": ["household"]})])
    facts = [f["edge_id"] for f in found.structured_content["facts"]]
    assert facts and groups_of(corpus_db, "facts", "edge_id", facts) == {"acme"}
    assert refused.is_error


def test_keys_over_stdio_need_the_key(setup):
    """Without $TKG_API_KEY, or with a key that reads none of the pinned groups, the server
    says so and exits before serving."""
    base = [*TKG, "--store", str(setup["store"]), "--keys", str(setup["keys_file"])]
    env = {k: v for k, v in os.environ.items() if k != "TKG_API_KEY"}
    for args, extra in ((base, {}), ([*base, "--group", "household"],
                                     {"TKG_API_KEY": setup["keys"]["acme"]})):
        done = subprocess.run(args, env={**env, **extra}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "TKG_API_KEY" in done.stderr and "Traceback" not in done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_streamable_http_with_keys(setup, corpus_db):
    import httpx
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    port = _free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server = subprocess.Popen([*TKG, "--store", str(setup["store"]), "--keys",
                               str(setup["keys_file"]), "--transport", "http", "--port",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300  # (a loaded CI machine)
        while True:
            try:
                anonymous = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                break
            except httpx.TransportError:
                assert server.poll() is None and time.monotonic() < deadline, (
                    server.stderr.read().decode() if server.poll() is not None else "slow")
                time.sleep(0.3)
        assert anonymous.status_code == 401

        async def session(key: str) -> list[Any]:
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
            async with http, Client(streamable_http_client(url, http_client=http)) as client:
                return [await client.call_tool("search_memory", {"query": "Alice"}),
                        await client.call_tool("search_memory", {
                            "query": "Alice", "group_ids": ["household"]})]

        own, other = asyncio.run(session(setup["keys"]["acme"]))
        facts = [f["edge_id"] for f in own.structured_content["facts"]]
        assert facts and groups_of(corpus_db, "facts", "edge_id", facts) == {"acme"}
        assert other.is_error and "household" in text(other)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_readme_shows_the_client_config():
    """The README's client config and tool list stay in step with the server."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert '"mcpServers"' in readme
    assert all(tool in readme for tool in TOOLS)
