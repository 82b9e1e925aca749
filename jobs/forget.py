"""`tkg forget`: erase episodes, a source, an entity or a group from a store (registered by
jobs/cli.py). What goes and what stays follows one rule, README: forgetting."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

COUNT_LABELS = {
    "episodes": "episodes", "mentions": "mentions", "facts_deleted": "facts deleted",
    "facts_fewer_sources": "facts kept with fewer sources", "entities": "entities",
    "communities_touched": "communities touched", "groups_dropped": "groups dropped",
}


def selector_of(args: argparse.Namespace) -> Any:
    from tkg.pipeline import forget as fg

    episodes = [fg.parse_pair(e, "episode") for e in args.episode or []]
    for path in args.episodes_file or []:
        episodes += fg.read_selection_file(path)
    return fg.Selector(
        episodes=tuple(episodes), sources=tuple(args.source or ()),
        groups=tuple(args.group or ()),
        before=fg.parse_date(args.before) if args.before else None,
        entities=tuple(fg.parse_pair(e, "entity") for e in args.entity or []),
        with_episodes=args.with_episodes)


def cmd_forget(args: argparse.Namespace) -> int:
    from tkg.pipeline import forget as fg
    from tkg.pipeline.config import load_config
    from tkg.pipeline.lock import StoreLocked

    config = load_config(args.config)
    try:
        selector = selector_of(args)
        result = fg.forget(config, args.store, selector, by=args.by or "", dry_run=args.dry_run,
                           purge=args.purge)
    except (fg.ForgetError, StoreLocked) as exc:
        print(f"tkg: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.summary(), default=str))
        return 0
    _print(result)
    return 0


def _print(result: Any) -> None:
    if result.nothing:
        print("nothing in the current snapshot matches; nothing was removed"
              + (f" (purged: {len(result.retired)} snapshots retired, {result.work_dirs_removed}"
                 " work dirs removed)" if result.retired or result.work_dirs_removed else ""))
        return
    title = "would go (dry run, nothing changed)" if result.dry_run else "removed rows"
    print(f"tkg forget {result.request_id}: {title}")
    for key, value in result.counts.items():
        print(f"  {COUNT_LABELS.get(key, key):<32} {value:>10,}")
    if result.snapshot:
        print(f"snapshot: {result.snapshot} (the previous one is kept for `tkg gc` or --purge)")
    if result.retired or result.work_dirs_removed:
        print(f"purged: {len(result.retired)} earlier snapshots retired "
              f"({', '.join(result.retired) or '-'}), {result.work_dirs_removed} work dirs "
              "removed")
    elif not result.dry_run:
        print("earlier snapshots still hold it: run again with --purge to remove it from the "
              "history")
    print(f"seconds: {result.seconds:.1f}")


def add_command(commands: Any) -> None:
    forget = commands.add_parser(
        "forget", help="erase episodes, a source, an entity or a group (as if never built)",
        description="Remove what the selectors find from the current snapshot: a new "
        "snapshot equal to a build without it. Each selector adds to what goes.")
    forget.add_argument("--store", required=True)
    forget.add_argument("--config", default=None, help="YAML config (default: embedded)")
    forget.add_argument("--episode", action="append", metavar="GROUP:ID",
                        help="an episode by its id (or episode_id); repeatable")
    forget.add_argument("--episodes-file", action="append", metavar="PATH",
                        help="a file of GROUP:ID lines")
    forget.add_argument("--source", action="append", help="every record of a source "
                        "(crm.contacts); repeatable")
    forget.add_argument("--group", action="append", help="a whole group; repeatable")
    forget.add_argument("--before", metavar="DATE", help="episodes whose time is earlier")
    forget.add_argument("--entity", action="append", metavar="GROUP:NAME",
                        help="an entity (name, alias or id): it, its aliases, mentions, "
                        "summary and every fact it is an endpoint of; repeatable")
    forget.add_argument("--with-episodes", action="store_true",
                        help="with --entity: also every episode that mentions it")
    forget.add_argument("--by", default=None, help="who asks (kept in the erasure log)")
    forget.add_argument("--dry-run", action="store_true", help="print what would go")
    forget.add_argument("--purge", action="store_true",
                        help="also remove it from the store's history: earlier snapshots "
                        "that hold it are retired and work dirs removed")
    forget.add_argument("--json", action="store_true")
    forget.set_defaults(fn=cmd_forget)
