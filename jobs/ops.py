"""`tkg serve`, `tkg keys add|list|revoke` and `tkg gc` (registered by jobs/cli.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_serve(args: argparse.Namespace) -> int:
    from tkg.jobs.query_commands import configured_query
    from tkg.pipeline.config import load_config
    from tkg.query.serve import serve

    limits = load_config(args.config).serve
    if args.processes is not None:
        limits = limits.model_copy(update={"processes": args.processes})
    if args.build_every:
        from tkg.jobs.inbox import BuildEvery

        BuildEvery(args.store, args.build_every, args.config).start()
    serve(args.store, host=args.host, port=args.port, keys_file=args.keys, limits=limits,
          query=configured_query(args.config))
    return 0


def cmd_keys_add(args: argparse.Namespace) -> int:
    """The key alone on stdout (`KEY=$(tkg keys add ...)` captures just it), what it is on
    stderr."""
    import sys

    from tkg.query.keys import add

    key = add(args.keys, args.name, args.group)
    print(f"tkg keys: key for {args.name} (groups {', '.join(sorted(set(args.group)))}); "
          f"shown once, only its hash is kept in {args.keys}", file=sys.stderr)
    print(key)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from tkg.query.keys import listed

    keys = listed(args.keys)
    if args.json:
        print(json.dumps(keys))
        return 0
    width = max([len(str(k["name"])) for k in keys] + [4])
    print(f"{'name':<{width}}  id            groups")
    for key in keys:
        print(f"{key['name']:<{width}}  {key['id']}  {', '.join(key['groups'])}")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from tkg.query.keys import revoke

    gone = revoke(args.keys, name=args.name, key_id=args.id)
    print(f"revoked {len(gone)} key{'s' if len(gone) > 1 else ''} ({', '.join(gone)}); a "
          "server with this keys file refuses them from its next request")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from tkg.pipeline import storage
    from tkg.pipeline.reliability import gc

    report = gc(storage.location(args.store), args.keep, dry_run=args.dry_run)
    figures = {"kept": report.kept, "removed_snapshots": report.removed_snapshots,
               "removed_work": report.removed_work, "resumable": report.resumable,
               "freed_bytes": report.freed_bytes, "dry_run": args.dry_run}
    if args.json:
        print(json.dumps(figures))
    else:
        verb = "would remove" if args.dry_run else "removed"
        print(f"kept snapshots: {', '.join(report.kept) or '-'}\n"
              f"{verb} snapshots: {', '.join(report.removed_snapshots) or '-'}\n"
              f"{verb} work dirs: {', '.join(report.removed_work) or '-'}\n"
              f"freed: {report.freed_bytes / 2**20:,.1f} MB")
        if report.resumable:
            print(f"left to resume (tkg build --run-id ID): {', '.join(report.resumable)}")
    return 0


def add_commands(commands: Any) -> None:
    serve = commands.add_parser("serve", help="the retrieval API over HTTP")
    serve.add_argument("--store", required=True)
    serve.add_argument("--host", default="127.0.0.1",
                       help="bind address; anything but loopback needs --keys")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--keys", default=None, help="API keys file (see `tkg keys add`)")
    serve.add_argument("--config", default=None,
                       help="YAML config: its `serve` bounds, and its `query` section "
                            "(recipe, limit, budgets) when it has one")
    serve.add_argument("--processes", type=int, default=None,
                       help="retrieval processes (default: serve.processes, 1); one per CPU "
                            "for throughput")
    serve.add_argument("--build-every", type=float, default=None, metavar="MINUTES",
                       help="every MINUTES, build what waits in the store's inbox (POST "
                       "/episodes) with `tkg build --inbox`: for small stores")
    serve.set_defaults(fn=cmd_serve)

    keys = commands.add_parser("keys", help="API keys of tkg serve")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    add = key_commands.add_parser("add", help="create a key bound to groups (printed once, "
                                  "alone on stdout)")
    add.add_argument("--keys", required=True, help="keys file (created 0600)")
    add.add_argument("--name", required=True, help="who the key is for")
    add.add_argument("--group", action="append", required=True, help="readable group; repeat")
    add.set_defaults(fn=cmd_keys_add)
    listing = key_commands.add_parser("list", help="names, ids and groups (never the keys)")
    listing.add_argument("--keys", required=True, help="keys file")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(fn=cmd_keys_list)
    revoke = key_commands.add_parser("revoke", help="remove keys; a running server refuses "
                                     "them from its next request")
    revoke.add_argument("--keys", required=True, help="keys file")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--name", help="every key of this name")
    which.add_argument("--id", help="the key of this id (`tkg keys list`), or its start")
    revoke.set_defaults(fn=cmd_keys_revoke)

    gc = commands.add_parser(
        "gc", help="remove old snapshots and finished work dirs",
        description="Remove snapshots but CURRENT and the --keep newest others, and work dirs: "
                    "of finished runs (a kept snapshot's run keeps its tkg.log) and of failed "
                    "starts (no stage finished, no build running). A failed run with finished "
                    "stages stays, to resume with --run-id.")
    gc.add_argument("--store", required=True)
    gc.add_argument("--keep", type=int, default=2,
                    help="newest snapshots kept besides CURRENT (default 2; 0: CURRENT only)")
    gc.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(fn=cmd_gc)

