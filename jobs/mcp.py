"""`tkg mcp`: memory as MCP tools for agents (registered by jobs/cli.py; server in
query/mcp.py)."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_mcp(args: argparse.Namespace) -> int:
    from tkg.jobs.query_commands import configured_query
    from tkg.pipeline.config import load_config
    from tkg.query.mcp import serve_mcp

    serve_mcp(args.store, transport=args.transport, host=args.host, port=args.port,
              keys_file=args.keys, groups=args.group, limits=load_config(args.config).serve,
              query=configured_query(args.config))
    return 0


def add_command(commands: Any) -> None:
    mcp = commands.add_parser(
        "mcp", help="memory as MCP tools for agents (stdio or streamable HTTP)",
        description="Serve search_memory, get_context, get_fact_history, get_entity and "
                    "add_memory over the Model Context Protocol. Over stdio with --keys, the "
                    "key is read from $TKG_API_KEY.")
    mcp.add_argument("--store", required=True, help="store folder")
    mcp.add_argument("--group", action="append", default=None,
                     help="pin the server to this group (repeatable); nothing else is read")
    mcp.add_argument("--keys", default=None, help="API keys file (see `tkg keys add`)")
    mcp.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                     help="stdio (a client spawns `tkg mcp`) or streamable HTTP at /mcp")
    mcp.add_argument("--host", default="127.0.0.1",
                     help="HTTP bind address; other than loopback only with --keys")
    mcp.add_argument("--port", type=int, default=8765, help="HTTP port")
    mcp.add_argument("--config", default=None,
                     help="YAML config (its `serve` bounds and `query` section)")
    mcp.set_defaults(fn=cmd_mcp)
