"""`tkg`: build, stats and benchmarks from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tkg.pipeline.build import BuildResult
    from tkg.pipeline.config import TkgConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# No "Loading weights" bar (transformers and huggingface_hub read this) on queries and in
# build logs: a model packaged with tkg loads in a second or two, the bar only adds lines.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

COUNT_ROWS = (
    ("episodes_in", "records read"),
    ("episodes_ok", "records accepted"),
    ("rejected", "records rejected"),
    ("duplicates", "re-delivered duplicates"),
    ("missing_timezone", "timestamps without zone (UTC)"),
    ("extract_failed", "episodes with failed extraction"),
    ("episodes", "episodes"),
    ("entities", "entities"),
    ("mentions", "mentions"),
    ("facts", "facts (edges)"),
    ("facts_current", "facts, current versions"),
    ("facts_invalidated", "facts invalidated"),
    ("communities", "communities"),
    ("communities_extended", "entities placed in communities by extension"),
    ("llm_calls", "LLM calls"),
    ("llm_tokens", "LLM tokens (prompt + completion)"),
    ("llm_retries", "LLM retries (429, 5xx, timeouts)"),
)


def print_summary(summary: dict[str, Any], title: str, stage_seconds: bool = True,
                  first: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if first:
        console.print(first)
    counts = Table(title=title, show_header=True, header_style="bold")
    counts.add_column("what")
    counts.add_column("count", justify="right")
    for key, label in COUNT_ROWS:
        if key in summary:
            counts.add_row(label, f"{summary[key]:,}")
    console.print(counts)
    seconds = summary.get("seconds") or {}
    if seconds and stage_seconds:
        stages = Table(title="seconds per stage", show_header=True, header_style="bold")
        stages.add_column("stage")
        stages.add_column("seconds", justify="right")
        for stage, value in seconds.items():
            stages.add_row(stage, f"{value:.2f}")
        stages.add_row("total", f"{sum(seconds.values()):.2f}", style="bold")
        console.print(stages)
    console.print(f"snapshot: {summary.get('snapshot')}")


def _build_and_retain(config: TkgConfig, inputs: list[str], store_dir: str,
                      run_id: str) -> BuildResult:
    """A build, then the `retention` section's forget when it is set (the nightly policy).
    Here and not in pipeline.build: forget runs the build's stages, so build cannot call it."""
    from tkg.pipeline.build import build
    from tkg.pipeline.forget import apply_retention

    result = build(config, inputs, store_dir, run_id=run_id)
    if config.retention.max_age_days is not None:
        retained = apply_retention(config, store_dir)
        result.summary["retention"] = retained.summary() if retained else None
    return result


def cmd_build(args: argparse.Namespace) -> int:
    """Inputs are checked before Ray starts; while it runs, the terminal gets one line per
    stage and everything else goes to the run's log (see jobs/build_output.py)."""
    from tkg.jobs import build_output
    from tkg.pipeline import sources, storage, store
    from tkg.pipeline.config import load_config

    config = load_config(args.config)
    files = sources.discover(args.input, config.storage)  # refuses odd inputs, Ray not started
    run_id = args.run_id or store.new_run_id(store.now(), files)
    work = store.work_dir(storage.location(args.store), run_id)
    log_path = None if args.verbose else build_output.log_path(args.store, work)
    print(build_output.start_line(run_id, files, args.store, log_path), flush=True,
          file=sys.stderr if args.json else sys.stdout)
    skipped = sources.skipped(args.input, config.storage)
    from tkg.pipeline.stages import STAGES

    with build_output.terminal(log_path, args.json) as (out, err):
        try:
            if args.json:
                result = _build_and_retain(config, args.input, args.store, run_id)
            else:
                with build_output.StageProgress(out, work, [s.name for s in STAGES]) as shown:
                    result = _build_and_retain(config, args.input, args.store, run_id)
                shown.finish("publish", result.summary["seconds"].get("publish", 0.0))
        except (sources.InputError, store.StoreError):
            raise  # the user's to fix: main() prints them
        except Exception as exc:  # the traceback goes to the log, one line to the terminal
            import traceback

            traceback.print_exc()
            print(f"tkg: error: {build_output.failure_line(exc, run_id)}", file=err)
            if log_path is not None:
                print(f"tkg: log: {log_path}", file=err)
            return 1
        for warning in build_output.input_warnings(result.summary, skipped):
            print(f"tkg build: warning: {warning}", file=err)
        if args.json:  # on the terminal's stdout, which carries nothing else
            print(json.dumps(result.summary, default=str), file=out)
            return 0
    reasons = build_output.reject_reasons(result.snapshot, run_id)
    print_summary(result.summary, f"tkg build {run_id}", stage_seconds=False,
                  first=build_output.accepted_line(result.summary, reasons))
    if log_path is not None:
        print(f"log: {log_path}")
    return 0


def cmd_build_command(args: argparse.Namespace) -> int:
    """`tkg build`: its `--input`, and with `--inbox` what waits in the store's inbox."""
    if args.ray_address:
        os.environ["RAY_ADDRESS"] = args.ray_address  # what ray.init and joins_cluster read
    if args.inbox:
        from tkg.jobs.inbox import build_inbox

        return build_inbox(args, cmd_build)
    if not args.input:
        raise ValueError("give --input FILE|FOLDER|GLOB (repeatable), or --inbox to build what "
                         "waits in the store's inbox")
    return cmd_build(args)


def store_stats(store_dir: Path) -> dict[str, Any]:
    """Counts read from the current snapshot's catalog, plus its run's timings."""
    from tkg.pipeline import store

    snapshot = store.current_snapshot(store_dir)
    manifest = store.read_manifest(snapshot)
    with store.connect(store_dir) as con:
        def one(sql: str) -> int:
            return int(con.execute(sql).fetchone()[0])

        stats = {
            "run_id": manifest["run_id"],
            "store": str(store_dir),
            "snapshot": str(snapshot),
            **{k: manifest["summary"].get(k, 0) for k in
               ("episodes_in", "episodes_ok", "rejected", "duplicates", "missing_timezone",
                "extract_failed", "llm_calls", "llm_tokens")},
            "episodes": one("SELECT count(*) FROM episodes"),
            "entities": one("SELECT count(*) FROM entities"),
            "mentions": one("SELECT count(*) FROM mentions"),
            "facts": one("SELECT count(DISTINCT edge_id) FROM facts"),
            "facts_current": one("SELECT count(*) FROM facts_current"),
            "facts_invalidated": one(
                "SELECT count(*) FROM facts_current WHERE invalid_at IS NOT NULL"),
            "communities": one("SELECT count(*) FROM communities"),
            "rejects": one("SELECT count(*) FROM rejects"),
            "groups": one("SELECT count(DISTINCT group_id) FROM episodes"),
            "seconds": manifest["summary"].get("seconds", {}),
        }
    stats["erasures"] = last_erasures(store_dir)
    return stats


def last_erasures(store_dir: Path, last: int = 5) -> list[dict[str, Any]]:
    """The erasure log's newest rows (`tkg forget`): when, who, what kind, rows removed."""
    from tkg.pipeline.forget import erasure_log

    rows = erasure_log(store_dir, last).to_pylist()
    return [{"request_id": r["request_id"], "requested_at": r["requested_at"],
             "requested_by": r["requested_by"], "selector": json.loads(r["selector"]),
             "removed": dict(r["counts"] or []), "snapshot": r["snapshot"],
             "snapshots_retired": r["snapshots_retired"]} for r in rows]


def cmd_stats(args: argparse.Namespace) -> int:
    from tkg.pipeline import storage

    stats = store_stats(storage.location(args.store))
    if args.json:
        print(json.dumps(stats, default=str))
    else:
        print_summary(stats, f"tkg store {args.store} (snapshot {stats['run_id']})")
        for erasure in stats["erasures"]:
            kinds = [k for k, v in erasure["selector"].items() if v and k != "with_episodes"]
            print(f"erasure {erasure['request_id']} at {erasure['requested_at']:%Y-%m-%d %H:%M} "
                  f"by {erasure['requested_by'] or '-'} ({', '.join(kinds)}): "
                  f"{erasure['removed'].get('episodes', 0)} episodes, "
                  f"{erasure['removed'].get('facts', 0)} fact rows removed")
    return 0


def _register(module: str, commands: Any) -> None:
    """Let one jobs module add its commands to the parser."""
    from importlib import import_module

    imported = import_module(f"tkg.jobs.{module}")
    if module == "query_commands":
        imported.add_query_commands(commands)
    elif module in ("refresh_communities", "ops"):
        imported.add_commands(commands)
    else:
        imported.add_command(commands)


# Commands that other jobs modules register: a module is imported only when one of its
# commands runs. Importing all of them to build the parser (igraph, Ray Data, duckdb, the
# query stack) made `tkg --help` and every argument error take 2.7 s on an idle machine.
# name -> (module, one-line help for `tkg --help`); tests check the table against the modules.
COMMANDS = {
    "search": ("query_commands", "search the current snapshot"),
    "context": ("query_commands", "the context string for an agent"),
    "eval": ("query_commands", "retrieval quality on labelled questions"),
    "communities": ("refresh_communities", "community subgraph jobs"),
    "docs": ("docs", "generated documentation"),
    "report": ("report", "one-page HTML report of the current snapshot"),
    "serve": ("ops", "the retrieval API over HTTP"),
    "keys": ("ops", "API keys of tkg serve"),
    "gc": ("ops", "remove old snapshots and finished work dirs"),
    "mcp": ("mcp", "memory as MCP tools for agents (stdio or streamable HTTP)"),
    "forget": ("forget", "erase episodes, a source, an entity or a group (--purge: from the "
               "history too)"),
}


def _add_lazy_commands(commands: Any, argv: list[str] | None) -> None:
    """The module of the command being run registers for real; every other command gets a
    stand-in with its help line, enough for `tkg --help`. The benchmarks register from their
    own package (jobs/bench), imported only when `tkg bench ...` runs."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    if words[:1] == ["bench"]:
        from tkg.jobs.bench import add_benches

        benches = commands.choices["bench"].add_subparsers(dest="bench", required=True)
        add_benches(benches, words[1] if len(words) > 1 else None)
    elif words and words[0] in COMMANDS:
        _register(COMMANDS[words[0]][0], commands)
    for name, (_, text) in COMMANDS.items():
        if name not in commands.choices:
            commands.add_parser(name, help=text)


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `tkg` parser, with real subparsers for the command named in `argv` (default:
    sys.argv) and stand-ins for the others."""
    root = argparse.ArgumentParser(prog="tkg", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="build a snapshot from input files")
    build.add_argument("--config", default=None, help="YAML config (default: embedded default)")
    build.add_argument("--input", action="append", default=None,
                       help="a .jsonl/.parquet file, a folder or a glob; repeatable")
    build.add_argument("--inbox", action="store_true",
                       help="also build what agents added to the store's inbox (POST "
                       "/episodes, add_memory, tkg.query.add_episodes); it is built once")
    build.add_argument("--store", required=True, help="store folder")
    build.add_argument("--run-id", default=None, help="resume or name a run")
    build.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                       help="use this running Ray (as RAY_ADDRESS) instead of starting a "
                       "local one")
    build.add_argument("--json", action="store_true",
                       help="print one JSON object on stdout and nothing else")
    build.add_argument("--verbose", action="store_true",
                       help="show Ray's and the libraries' logs instead of writing them to "
                       "the run's log file")
    build.set_defaults(fn=cmd_build_command)

    stats = commands.add_parser("stats", help="counts of the current snapshot")
    stats.add_argument("--store", required=True)
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(fn=cmd_stats)

    commands.add_parser("bench", help="benchmarks (print figures, never gate)")
    _add_lazy_commands(commands, argv)
    return root


def _configure_storage(args: argparse.Namespace) -> None:
    """Every command that names a config reads and writes object storage with its `storage`
    section (endpoint, region, addressing); without one, the AWS_* environment decides."""
    if getattr(args, "config", None):
        from tkg.pipeline import storage
        from tkg.pipeline.config import load_config

        storage.configure(load_config(args.config).storage)


def main(argv: list[str] | None = None) -> int:
    args = parser(argv).parse_args(argv)
    from tkg.pipeline.reliability import StageFailed
    from tkg.pipeline.sources import InputError
    from tkg.pipeline.store import StoreError

    try:
        _configure_storage(args)
        code = args.fn(args)
        sys.stdout.flush()  # here, not at exit, where a closed pipe is a traceback
        return code
    except BrokenPipeError:
        return _reader_gone()
    except (InputError, StoreError, StageFailed, FileNotFoundError, ValueError) as exc:
        print(f"tkg: error: {exc}", file=sys.stderr)
        return 2


def _reader_gone() -> int:
    """The reader of stdout went away (`tkg context ... | head`): not an error of tkg's.
    What is still buffered goes nowhere, so the exit's flush raises nothing; the exit status
    is a shell's for a command ended by SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13


if __name__ == "__main__":
    sys.exit(main())
