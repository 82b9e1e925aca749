"""What keeps a build boring when things go wrong: a disk check before any work, OS errors
reported as what they are, bounded stage retries with a clear final message, a publish that
leaves nothing half-written, and `gc` of old snapshots and finished work dirs.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tkg.pipeline import schema, storage, store
from tkg.pipeline.config import StorageConfig, TkgConfig
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


def input_bytes(files: list[Path | str], storage_config: StorageConfig | None = None) -> int:
    return sum(storage.size(f, storage_config) for f in files)


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
    read = input_bytes(files, config.storage)
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


def _referenced(snapshots: list[Location]) -> tuple[set[str], tuple[str, ...]]:
    """What kept snapshots use: their files (as storage keys) and their LanceDB folders (as
    key prefixes), wherever they lie."""
    files: set[str] = set()
    folders: set[str] = set()
    for snapshot in snapshots:
        manifest = store.read_manifest(snapshot)
        files.update(storage.key(f) for listed in store.snapshot_files(snapshot, manifest).values()
                     for f in listed)
        files.update(storage.key(storage.join(snapshot, n)) for n in (store.MANIFEST,
                                                                       store.CATALOG))
        folders.update(storage.key(d) + "/" for d in store.lance_dirs(snapshot, manifest).values())
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
    """Remove published snapshots except CURRENT and the newest `keep`, and the work dirs of
    finished runs. A removed snapshot's files that a kept manifest lists (a table carried
    into a later snapshot) stay. Snapshots that an unfinished run builds on, and unpublished
    folders (a build may be writing them), are left alone."""
    store_dir = storage.location(store_dir)
    current = store.current_run(store_dir)
    if current is None:
        raise store.StoreError(f"{store_dir} has no CURRENT snapshot; nothing to collect")
    finished = _finished_runs(store_dir)
    works = storage.list_dirs(storage.join(store_dir, "work"))
    needed = set()
    for work in works:
        if storage.name(work) not in finished:
            with contextlib.suppress(FileNotFoundError):
                needed.add(storage.read_text(storage.join(work, "previous")).strip())
    published = _published(store_dir)
    newest = {storage.name(p) for p in published[:max(keep, 0)]}
    kept = [p for p in published if storage.name(p) in newest | {current} | needed]
    files, folders = _referenced(kept)
    report = GcReport(kept=[storage.name(p) for p in kept])
    for snapshot in published:
        if snapshot not in kept:
            report.removed_snapshots.append(storage.name(snapshot))
            report.freed_bytes += _collect(snapshot, files, folders, dry_run)
    for work in works:
        if storage.name(work) in finished:
            report.removed_work.append(storage.name(work))
            report.freed_bytes += sum(n for _, n in storage.file_sizes(work))
            if not dry_run:
                storage.delete_dir(work)
    return report
