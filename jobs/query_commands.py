"""`tkg search`, `tkg context` and `tkg eval` (registered by jobs/cli.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from tkg.query.rerank import CROSS_ENCODERS

if TYPE_CHECKING:
    from tkg.pipeline.config import QueryConfig
    from tkg.query.api import Retriever


def configured_query(path: str | None) -> QueryConfig | None:
    """The `query` section of a YAML config when it has one; None: the snapshot's own (the
    one it was built with)."""
    from tkg.pipeline.config import load_config

    config = load_config(path) if path else None
    return config.query if config is not None and "query" in config.model_fields_set else None


def _open(args: argparse.Namespace) -> Retriever:
    """The store's retriever with `--config`'s query section and `--cross-encoder`."""
    from tkg.pipeline import storage, store
    from tkg.query.snapshot import snapshot_query_config

    from tkg import query

    config = configured_query(args.config)
    if getattr(args, "cross_encoder", None):
        snapshot = store.current_snapshot(storage.location(args.store))
        config = (config or snapshot_query_config(store.read_manifest(snapshot))).model_copy(
            update={"cross_encoder": args.cross_encoder})
    return query.open(args.store, config=config)


def _add_query_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, help="store folder")
    parser.add_argument("--config", default=None,
                        help="YAML config whose `query` section (recipe, limit, budgets) "
                             "replaces the snapshot's")
    parser.add_argument("--group", action="append", required=True,
                        help="group id to search (repeatable); nothing else is visible")
    parser.add_argument("--query", required=True, help="the query text")
    parser.add_argument("--limit", type=int, default=None, help="results per kind (10)")
    parser.add_argument("--recipe", default=None, help="search recipe (default: query.recipe)")
    parser.add_argument("--as-of", default=None, help="valid time, ISO-8601 (default: now)")
    parser.add_argument("--known-at", default=None,
                        help="transaction time, ISO-8601: what the store believed then")
    parser.add_argument("--center", default=None, help="entity id for node-distance recipes")
    parser.add_argument("--cross-encoder", default=None, choices=CROSS_ENCODERS.names(),
                        help="the model of cross_encoder recipes (query.cross_encoder; bge "
                             "loads query.cross_encoder_model)")
    parser.add_argument("--origin", action="append", default=None,
                        help="entity id to expand from (BFS); repeatable")
    parser.add_argument("--conversation", default=None,
                        help="expand from the entities of this conversation's last episodes")


def _search_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"recipe": args.recipe, "limit": args.limit, "as_of": args.as_of,
            "known_at": args.known_at, "center": args.center, "origins": args.origin,
            "conversation_id": args.conversation}


def cmd_search(args: argparse.Namespace) -> int:
    from tkg.query.api import KINDS

    result = _open(args).search(args.query, args.group, **_search_kwargs(args))
    for warning in result.warnings:
        print(f"tkg search: warning: {warning}", file=sys.stderr)
    found = result.to_dict()
    if args.json:
        print(json.dumps(found, ensure_ascii=False))
        return 0
    for kind in KINDS:
        hits = found[kind]
        print(f"{kind}:")
        for hit in hits:
            text = hit.get("fact") or hit.get("name") or hit.get("content") or ""
            print(f"  {hit['score']:.4f}  {' '.join(str(text).split())[:100]}{_when(kind, hit)}")
    return 0


def _when(kind: str, hit: dict[str, Any]) -> str:
    """A fact's valid time ('  [2024-06-01 .. now]'), an episode's day and speaker."""
    if kind == "facts":
        start = (hit.get("valid_at") or "?")[:10]
        end = (hit.get("invalid_at") or "now")[:10]
        return f"  [{start} .. {end}]"
    if kind == "episodes":
        said = f", {hit['speaker']}" if hit.get("speaker") else ""
        return f"  [{(hit.get('valid_at') or '?')[:10]}{said}]"
    return ""


def cmd_context(args: argparse.Namespace) -> int:
    print(_open(args).context(args.query, args.group, max_tokens=args.max_tokens,
                                         **_search_kwargs(args)))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from tkg.query.eval import evaluate, load_questions, print_report

    retriever = _open(args)
    recipe = retriever.recipe(args.recipe).name
    report = evaluate(retriever, load_questions(args.questions), recipe,
                      k=args.k, context_tokens=args.max_tokens or retriever.config.context_tokens)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print_report(report)
    return 0


def add_query_commands(commands: Any) -> None:
    """Register the retrieval commands on the `tkg` parser."""
    search = commands.add_parser("search", help="search the current snapshot")
    _add_query_flags(search)
    search.add_argument("--json", action="store_true", help="print one JSON object")
    search.set_defaults(fn=cmd_search)

    context = commands.add_parser("context", help="the context string for an agent")
    _add_query_flags(context)
    context.add_argument("--max-tokens", type=int, default=None, help="token budget (2000)")
    context.add_argument("--json", action="store_true", help="(accepted; prints plain text)")
    context.set_defaults(fn=cmd_context)

    evaluation = commands.add_parser("eval", help="retrieval quality on labelled questions")
    evaluation.add_argument("--store", required=True)
    evaluation.add_argument("--config", default=None,
                            help="YAML config whose `query` section replaces the snapshot's")
    evaluation.add_argument("--questions", required=True, help="JSON Lines question file")
    evaluation.add_argument("--recipe", default=None, help="default: query.recipe")
    evaluation.add_argument("--cross-encoder", default=None, choices=CROSS_ENCODERS.names(),
                            help="the model of cross_encoder recipes (query.cross_encoder)")
    evaluation.add_argument("--k", type=int, default=10)
    evaluation.add_argument("--max-tokens", type=int, default=None,
                            help="context budget for answer-in-context (2000)")
    evaluation.add_argument("--json", action="store_true")
    evaluation.set_defaults(fn=cmd_eval)

