"""What keeps a build boring when things go wrong: a disk check before any work, OS errors
reported as what they are, bounded stage retries with a clear final message, a publish that
leaves nothing half-written, and `gc` of old snapshots and finished work dirs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from tkg.pipeline import schema, storage, store
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.faults import InjectedCrash
from tkg.pipeline.storage import Location

log = logging.getLogger("tkg.reliability")
T = TypeVar("T")

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
NO_PERMISSION = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
ADVICE = {
    "disk": "the disk is full: free space (`tkg gc --store {store} --keep 1` removes old "
            "snapshots) or use a store on a bigger disk",
    "permission": "permission denied: make {store} writable by this user, or pass another "
                  "--store",
}


class StageFailed(RuntimeError):
    """A stage failed on every attempt; the message says which, why and how to resume."""


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind `exc`, also when Ray wrapped it in a task error."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        exc = getattr(exc, "cause", None) or exc.__cause__
        seen += 1
    return None


def classify(exc: BaseException) -> str | None:
    """'disk', 'permission' or None (not a storage problem)."""
    error = _os_error(exc)
    if error is None:
        return None
    if error.errno in DISK_FULL:
        return "disk"
    if error.errno in NO_PERMISSION:
        return "permission"
    return None


def store_error(exc: BaseException, store_dir: Location, doing: str) -> store.StoreError | None:
    """A StoreError with advice for a disk-full or permission error, else None."""
    kind = classify(exc)
    if kind is None:
        return None
    current = store.current_run(store_dir) if _readable(store_dir) else None
    kept = f"CURRENT still points at {current}" if current else "nothing was published"
    return store.StoreError(
        f"{doing} failed: {_os_error(exc)}. {ADVICE[kind].format(store=store_dir)}; "
        f"{kept}. Rerun the same command with the same --run-id to resume."
    )


def _readable(path: Location) -> bool:
    try:
        return storage.exists(path)
    except OSError:
        return False


def preflight(store_dir: Location, files: list[Path | str], config: TkgConfig) -> None:
    """Fail before any work when the store cannot be written or the disk is nearly full (an
    object store has no free space to check; its bucket and credentials are)."""
    limits = config.limits
    try:
        probe = storage.join(store_dir, f".tkg-write-test.{uuid.uuid4().hex}")
        storage.write_bytes(probe, b"tkg")
        storage.delete_file(probe)
    except OSError as exc:
        raise store_error(exc, store_dir, f"writing to {store_dir}") or store.StoreError(
            f"cannot write to {store_dir}: {exc}; check the path (for object storage: the "
            "bucket, the storage endpoint and credentials, README: storage)") from exc
    if storage.is_url(store_dir):
        return
    free = shutil.disk_usage(store_dir).free
    read = storage.total_size(files, config.storage)
    needed = int(limits.min_free_mb * 2**20 + limits.free_space_per_input_byte * read)
    if free < needed:
        raise store.StoreError(
            f"only {free / 2**20:,.0f} MB free under {store_dir}, and this build needs about "
            f"{needed / 2**20:,.0f} MB ({limits.free_space_per_input_byte:g} x the "
            f"{read / 2**20:,.1f} MB of input + {limits.min_free_mb} MB): "
            f"free space (`tkg gc --store {store_dir} --keep 1`) or use a bigger disk"
        )


def run_stage(name: str, ctx, attempt: Callable[[], T]) -> T:
    """Run one stage, again on failure up to `ray.stage_attempts` times (Ray already retried
    lost workers and tasks inside it). Counters of a failed attempt are rolled back; disk and
    permission errors are not retried; the last failure names the stage and how to resume."""
    attempts = max(1, ctx.config.ray.stage_attempts)
    store_dir = storage.join(ctx.work_dir, "..", "..")
    for number in range(1, attempts + 1):
        counters = dict(ctx.counters)
        try:
            return attempt()
        except Exception as exc:
            ctx.counters.clear()
            ctx.counters.update(counters)
            problem = store_error(exc, store_dir, f"stage {name}")
            if problem is not None:
                raise problem from exc
            if number == attempts:
                current = store.current_run(store_dir)
                raise StageFailed(
                    f"stage {name!r} failed {attempts} time(s); last error: "
                    f"{type(exc).__name__}: {str(exc)[:500]}. CURRENT "
                    + (f"still points at {current}" if current else "was not written")
                    + f". Fix the cause, then rerun with --run-id {ctx.run_id} to resume from "
                    f"stage {name!r} (finished stages are kept under {ctx.work_dir})."
                ) from exc
            log.warning("stage %s failed (attempt %d of %d): %s; retrying", name, number,
                        attempts, exc)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def publishing(store_dir: Location, run_id: str) -> Iterator[None]:
    """A failed publish removes its half-written snapshot (CURRENT was never switched) and
    reports disk or permission errors as such. A crash leaves the folder; the next publish
    of the run replaces it (see store.prepare_snapshot)."""
    try:
        yield
    except InjectedCrash:
        raise
    except Exception as exc:
        if store.current_run(store_dir) != run_id:
            with contextlib.suppress(OSError):
                storage.delete_dir(store.snapshot_dir(store_dir, run_id))
        problem = store_error(exc, store_dir, f"publishing snapshot {run_id}")
        if problem is not None:
            raise problem from exc
        raise


# --- gc -----------------------------------------------------------------------------------


@dataclass
class GcReport:
    kept: list[str] = field(default_factory=list)
    removed_snapshots: list[str] = field(default_factory=list)
    removed_work: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    resumable: list[str] = field(default_factory=list)  # failed runs left to `--run-id`


RUN_LOG = "tkg.log"  # a build's log, in its work dir (`tkg build` writes it)
# A work dir with no finished stage, no live build holding its log and nothing written for
# this long is a failed start (Ray that never came up): nothing in it to resume. (A build
# without a log, `--verbose` or the Python API, writes `previous` when it starts and its first
# stage's marker when that ends; no stage of the test corpora takes minutes, one of a big
# input can take an hour.)
STALE_S = 24 * 3600


def hold_run_log(log_file: IO[str]) -> None:
    """Mark a build as running for as long as its process (and the Ray processes that
    inherit the log as stdout) keeps `log_file` open: gc leaves that work dir alone."""
    with contextlib.suppress(OSError):
        fcntl.flock(log_file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)


def _running(work: Location) -> bool:
    """Whether a build may be using a work dir: its log is held (`hold_run_log`), or,
    without a log to ask (object stores keep it on the build's machine), something in it
    changed within STALE_S."""
    log_file = storage.join(work, RUN_LOG)
    if not storage.is_url(work) and Path(log_file).is_file():
        with open(log_file, "rb") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return False
    stamps = [storage.stamp(f) for f in storage.list_files(work)]
    newest = max((s[0] for s in stamps if s is not None), default=0)
    return time.time() - newest / 1e9 < STALE_S


def _stage_finished(work: Location) -> bool:
    """Whether any stage of a run finished (it can be resumed with `--run-id`)."""
    from tkg.pipeline.outputs import SUCCESS  # (imports Ray Data: not for every command)

    return any(storage.name(f) == SUCCESS for f in storage.list_files(work))


def _finished_runs(store_dir: Location) -> set[str]:
    """Runs recorded as succeeded in the current snapshot's `runs` table."""
    run_id = store.current_run(store_dir)
    if run_id is None:
        return set()
    table = store.read_table(store.snapshot_dir(store_dir, run_id), "runs", schema.RUNS,
                             ["run_id", "status"])
    return {r for r, s in zip(table["run_id"].to_pylist(), table["status"].to_pylist(),
                              strict=True) if s == "succeeded"} | {run_id}


def _published(store_dir: Location) -> list[Location]:
    """Snapshots with a manifest, newest first (by the manifest's time)."""
    stamps = {s: storage.stamp(storage.join(s, store.MANIFEST))
              for s in storage.list_dirs(storage.join(store_dir, "snapshots"))}
    return sorted((s for s, t in stamps.items() if t is not None),
                  key=lambda s: stamps[s][0], reverse=True)


def referenced_files(snapshots: list[Location]) -> tuple[set[str], tuple[str, ...]]:
    """What kept snapshots use: their files (as storage keys) and their LanceDB and
    `table_arrays` folders (as key prefixes), wherever they lie. A LanceDB folder holds
    every version of its tables, the ones later snapshots extended it to included."""
    files: set[str] = set()
    folders: set[str] = set()
    for snapshot in snapshots:
        manifest = store.read_manifest(snapshot)
        files.update(storage.key(f) for listed in store.snapshot_files(snapshot, manifest).values()
                     for f in listed)
        files.update(storage.key(storage.join(snapshot, n)) for n in (store.MANIFEST,
                                                                       store.CATALOG))
        folders.update(storage.key(d) + "/" for d in (
            *store.lance_dirs(snapshot, manifest).values(),
            *store.arrays_dirs(snapshot, manifest).values()))
    return files, tuple(folders)


def _collect(snapshot: Location, files: set[str], folders: tuple[str, ...],
             dry_run: bool) -> int:
    """Remove a snapshot's files that no kept manifest lists; returns the bytes freed."""
    sized = storage.file_sizes(snapshot)
    unused = [(f, n) for f, n in sized
              if storage.key(f) not in files and not storage.key(f).startswith(folders)]
    if not dry_run:
        if len(unused) == len(sized):
            storage.delete_dir(snapshot)
        else:
            storage.delete_files([f for f, _ in unused])
    return sum(n for _, n in unused)


def gc(store_dir: Location, keep: int, dry_run: bool = False) -> GcReport:
    """Remove published snapshots except CURRENT and the `keep` newest others (`--keep 0`:
    CURRENT alone), and work dirs: a finished run's, except the log of a run whose snapshot
    stays; a failed start's (no stage finished, no build running it: `_running`). A failed
    run with finished stages is left to resume (`resumable`). A removed snapshot's files
    that a kept manifest lists (a table carried into a later snapshot) stay. Snapshots that
    an unfinished run builds on, and unpublished folders (a build may be writing them), are
    left alone."""
    store_dir = storage.location(store_dir)
    current = store.current_run(store_dir)
    if current is None:
        raise store.StoreError(f"{store_dir} has no CURRENT snapshot; nothing to collect")
    finished = _finished_runs(store_dir)
    report = GcReport()
    doomed: list[Location] = []  # failed starts
    needed = set()
    for work in storage.list_dirs(storage.join(store_dir, "work")):
        if storage.name(work) in finished:
            continue
        if not _stage_finished(work) and not _running(work):
            doomed.append(work)
            continue
        if not _running(work):
            report.resumable.append(storage.name(work))
        with contextlib.suppress(FileNotFoundError):
            needed.add(storage.read_text(storage.join(work, "previous")).strip())
    published = _published(store_dir)
    others = [storage.name(p) for p in published if storage.name(p) != current]
    kept = [p for p in published
            if storage.name(p) in {*others[:max(keep, 0)], current, *needed}]
    files, folders = referenced_files(kept)
    report.kept = [storage.name(p) for p in kept]
    for snapshot in published:
        if snapshot not in kept:
            report.removed_snapshots.append(storage.name(snapshot))
            report.freed_bytes += _collect(snapshot, files, folders, dry_run)
    logs = set(report.kept)  # runs whose log stays: their snapshot does
    for work in storage.list_dirs(storage.join(store_dir, "work")):
        name = storage.name(work)
        if name in finished or work in doomed:
            freed = _clear_work(work, RUN_LOG if name in logs else None, dry_run)
            if freed is not None:
                report.removed_work.append(name)
                report.freed_bytes += freed
    return report


def _clear_work(work: Location, keep_file: str | None, dry_run: bool) -> int | None:
    """Remove a work dir, or all of it but `keep_file`; the bytes freed (None: nothing to
    remove)."""
    sized = storage.file_sizes(work)
    gone = [(f, n) for f, n in sized if storage.relative(f, work) != keep_file]
    if not gone:
        return None
    if not dry_run:
        if len(gone) == len(sized):
            storage.delete_dir(work)
        else:
            for folder in storage.list_dirs(work):
                storage.delete_dir(folder)
            storage.delete_files([f for f, _ in gone if storage.exists(f)])
    return sum(n for _, n in gone)
