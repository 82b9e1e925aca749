"""What `tkg build` shows: one line per stage while it runs, then the summary. Everything else
(Ray's and Ray Data's logs, LanceDB's, model loading bars, warnings of the processes Ray
starts) goes to a log file under the run's work dir, unless --verbose.

The redirection is of file descriptors 1 and 2, not of Python's sys.stdout: Ray's raylet
and workers, and C++ libraries, write to the descriptors they inherit, so only that keeps
them off the terminal (and off stdout under --json).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tkg.pipeline import reliability, storage

LOG_NAME = reliability.RUN_LOG


def log_path(store_dir: str, work: Path | str) -> Path:
    """Where a build's log goes: its work dir, or for a store in object storage (a log is
    appended to while it runs) a local folder named after the run."""
    if storage.is_url(store_dir):
        return Path(tempfile.gettempdir(), "tkg-logs", storage.name(work), LOG_NAME)
    return Path(work) / LOG_NAME
SUCCESS = "_SUCCESS.json"  # the runner's marker of a finished stage


def start_line(run_id: str, files: list[Any], store_dir: str, log: Path | None) -> str:
    """The build's first line, printed before Ray starts (a second after the command, where
    the first line used to come after Ray's start, ~26 s on a busy machine): the run id, so
    a stopped build is resumed without guessing which work folder is its."""
    count = f"{len(files):,} input file{'' if len(files) == 1 else 's'}"
    line = (f"tkg build: run {run_id}, {count} into {store_dir} (resume it with --run-id "
            f"{run_id})")
    return line + (f"; log {log}" if log is not None else "")


def input_warnings(summary: dict[str, Any], skipped: list[Any]) -> list[str]:
    """What the user should know about the input besides the counts: files of folders that
    were not read, an input with no record, one whose every record was rejected."""
    warnings = []
    if skipped:
        names = ", ".join(str(f) for f in skipped[:5]) + (
            f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        warnings.append(f"{len(skipped)} file{'s' if len(skipped) > 1 else ''} in the input "
                        f"folders not read (a folder gives its .jsonl, .ndjson, .parquet and "
                        f".pq files; name another file with --input to be told why): {names}")
    if not summary.get("episodes_in"):
        warnings.append("the input holds no record: the snapshot published adds nothing "
                        "(check --input: empty files, or the wrong folder)")
    elif not summary.get("episodes_ok"):
        warnings.append(f"every record was rejected ({summary.get('rejected', 0):,}); "
                        "their reasons are in the store's rejects table")
    return warnings


@contextlib.contextmanager
def terminal(log_path: Path | None, json_mode: bool) -> Iterator[tuple[IO[str], IO[str]]]:
    """(stdout, stderr) of the terminal for tkg's own lines. Inside the block, fds 1 and 2
    write to `log_path` when given; else, under --json, fd 1 writes to stderr. Under
    --json, stdout is the yielded stream's alone until the process exits: after the block
    fd 1 and sys.stdout stay on stderr, since Ray's driver prints raylet warnings ("N
    PYTHON worker processes have been started ...") on sys.stdout from a thread of its
    own, whatever log_to_driver says, until Ray shuts down at exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    out = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    err = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    log = None
    try:
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(log_path, "a", buffering=1)  # noqa: SIM115 - closed below
            reliability.hold_run_log(log)  # `tkg gc` leaves a running build's work dir
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        elif json_mode:
            os.dup2(saved[1], 1)
        # Python's own streams too: they need not write through fds 1 and 2 (pytest's don't)
        python_out = log if log is not None else (sys.stderr if json_mode else sys.stdout)
        python_err = log if log is not None else sys.stderr
        with contextlib.redirect_stdout(python_out), contextlib.redirect_stderr(python_err):
            yield out, err
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[1] if json_mode else saved[0], 1)
        os.dup2(saved[1], 2)
        if json_mode:
            sys.stdout = sys.stderr
        for stream in (out, err, log):
            if stream is not None:
                stream.close()
        for fd in saved:
            os.close(fd)


class StageProgress:
    """A line per finished stage and a live line for the running one, read from the stage
    markers the runner writes in the work dir (so a resumed run shows its skipped stages
    too, and the runner knows nothing of the terminal)."""

    def __init__(self, stream: IO[str], work_dir: Path | str, stages: list[str]) -> None:
        from rich.console import Console

        self.console = Console(file=stream)
        self.work_dir = work_dir
        self.stages = stages
        self.shown: set[str] = set()
        self._done: list[tuple[str, float]] = []  # markers read (each once: a store request)
        self.resumed: set[str] = set()  # finished before this run began: their old seconds
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StageProgress:
        self.resumed = {name for name, _ in self._finished()}  # before the runner starts
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def finish(self, name: str, seconds: float) -> None:
        """The line of a step that has no marker (publish)."""
        self.console.print(self._line(name, seconds))

    def _finished(self) -> list[tuple[str, float]]:
        from tkg.pipeline import outputs

        for name in self.stages[len(self._done):]:
            try:
                record = outputs.finished(storage.join(self.work_dir, name))
                if record is None:
                    break
                self._done.append((name, float(record["seconds"])))
            except (ValueError, KeyError, OSError):  # being written: next poll
                break
        return self._done

    def _line(self, name: str, seconds: float) -> str:
        reused = " (resumed)" if name in self.resumed else ""
        return f"  [green]✓[/green] {name:<12} {seconds:7.1f} s{reused}"

    def _running(self) -> str:
        done = len(self.shown)
        name = self.stages[done] if done < len(self.stages) else "publish"
        return f"  [cyan]…[/cyan] {name:<12} {time.monotonic() - self.started:7.1f} s"

    def _run(self) -> None:
        from rich.live import Live

        live = Live(self._running(), console=self.console, transient=True,
                    refresh_per_second=4) if self.console.is_terminal else None
        with live or contextlib.nullcontext():
            while not self._stop.wait(0.25):
                self._show_finished(live)
            self._show_finished(live)

    def _show_finished(self, live: Any) -> None:
        for name, seconds in self._finished():
            if name not in self.shown:
                self.shown.add(name)
                self.started = time.monotonic()
                (live.console if live else self.console).print(self._line(name, seconds))
        if live:
            live.update(self._running())


def reject_reasons(snapshot: Path | str, run_id: str) -> dict[str, int]:
    """Records this run left out of the graph, by kind of reason ("malformed JSON")."""
    import pyarrow.compute as pc
    from tkg.pipeline import schema, store

    table = store.read_table(snapshot, "rejects", schema.REJECTS, ["run_id", "stage", "reason"])
    mine = table.filter(pc.and_(pc.equal(table["run_id"], run_id),
                                pc.is_in(table["stage"], pa_strings(["read", "window"]))))
    counts: dict[str, int] = {}
    for reason in mine["reason"].to_pylist():
        kind = reason_kind(reason)
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


KIND_CHARS = 160  # a reason's kind is cut here, at a word: a line of the console summary


def reason_kind(reason: str | None) -> str:
    """A reject reason without what is particular to the record: the text before its first
    ': ' (the detail), with a record's own numbers as N and a limit's kept ("field 'content'
    is N characters, over the limit of 100000"); cut at a word only past KIND_CHARS (cut at
    60 characters, "over the limit of 100000" read "over the limit of 1000")."""
    kind = re.sub(r"\s+", " ", (reason or "unknown").split(": ", 1)[0]).strip()
    kind = re.sub(r"(?<!limit of )(?<!than )(?<![\w.-])\d+(?![\w.])", "N", kind)
    if len(kind) > KIND_CHARS:
        kind = kind[:KIND_CHARS].rsplit(" ", 1)[0] + " …"
    return kind


def pa_strings(values: list[str]):
    import pyarrow as pa

    return pa.array(values, pa.string())


def accepted_line(summary: dict[str, Any], reasons: dict[str, int]) -> str:
    """'3 accepted, 2 rejected: malformed JSON (1), missing field 'content' (1)'."""
    line = f"{summary.get('episodes_ok', 0):,} accepted, {summary.get('rejected', 0):,} rejected"
    if reasons:
        shown = [f"{kind} ({count:,})" for kind, count in list(reasons.items())[:3]]
        rest = len(reasons) - len(shown)
        line += ": " + ", ".join(shown) + (f" and {rest} more kinds" if rest else "")
    return line


TRANSIENT = ("RayActorError", "WorkerCrashedError", "OutOfMemoryError", "ObjectLostError",
             "NodeDiedError", "OwnerDiedError", "RaySystemError", "OSError", "TimeoutError",
             "ConnectionError")


def root_cause(exc: BaseException) -> BaseException:
    """The exception behind Ray's and tkg's wrappers."""
    seen = 0
    while seen < 10:
        inner = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(inner, BaseException) or inner is exc:
            return exc
        exc, seen = inner, seen + 1
    return exc


def first_line(text: str) -> str:
    """The first line that says something (Ray prefixes its task name and a blank line)."""
    for line in str(text).splitlines():
        line = line.strip()
        if line and not line.startswith(("ray::", "Traceback", "---> ")):
            return line[:300]
    return ""


def failure_line(exc: BaseException, run_id: str | None) -> str:
    """One line for a failed build: where, what, and whether resuming can help."""
    from tkg.pipeline.reliability import StageFailed

    if not isinstance(exc, StageFailed):
        return first_line(str(exc)) or type(exc).__name__
    stage = re.search(r"stage '([^']+)'", str(exc))
    where = f"stage {stage.group(1)}" if stage else "a stage"
    cause = root_cause(exc)
    names = {cls.__name__ for cls in type(cause).__mro__}
    what = f"{type(cause).__name__}: {first_line(str(cause))}"
    if names & set(TRANSIENT):
        return (f"{where} failed: {what}; rerun with --run-id {run_id} to resume from it "
                "(finished stages are kept)")
    return f"{where} failed: {what} (a bug in tkg, not in your input: please report it)"
