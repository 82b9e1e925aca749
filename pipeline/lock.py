"""The store lock: one writer of a store at a time (a build, a forget, a community refresh).

A build and a forget on the same store must not interleave: the forget would publish a
snapshot built on one the build is about to replace, and the build would bring the erased
episodes back from the snapshot it started on. On a local disk the lock is an `flock` on
`STORE/.lock`, which the kernel releases when its process dies however it dies. An object
store has no such lock: there it is a lease object (`STORE/.lock`, owner and expiry) that a
writer takes when none is live and a thread of its process renews every third of `LEASE_S`
while it works; a crashed writer's lease runs out after `LEASE_S`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tkg.pipeline import storage
from tkg.pipeline.storage import Location

log = logging.getLogger("tkg.lock")
LOCK = ".lock"
# How long an object-store lease lives without being renewed: its holder renews it every
# third of that (one small PUT), so it outlives a slow request or two to the store, and a
# crashed run blocks the next one for at most this long.
LEASE_S = 15 * 60


class StoreLocked(RuntimeError):
    """Another run holds the store; the message says which and what to do."""


def _holder(text: str) -> str:
    try:
        owner = json.loads(text)
    except ValueError:
        return "another run"
    return (f"{owner.get('what', 'a run')} {owner.get('run_id', '')} (pid {owner.get('pid')} on "
            f"{owner.get('host')}, since {owner.get('since')})")


def _message(store_dir: Location, holder: str, what: str) -> str:
    return (f"{store_dir} is locked by {holder}: a build and a forget on the same store "
            f"cannot run at once. Wait for it to finish and run the {what} again (a lock "
            "of a crashed run is released with its process)")


@contextlib.contextmanager
def held(store_dir: Location, what: str, run_id: str = "") -> Iterator[None]:
    """Hold the store's lock while the block runs; `StoreLocked` at once if another run
    holds it (never waits: a nightly job should fail loudly, not queue behind a forget)."""
    owner = json.dumps({"what": what, "run_id": run_id, "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "token": uuid.uuid4().hex})
    if storage.is_url(store_dir):
        with _lease(store_dir, owner, what):
            yield
        return
    import fcntl

    Path(store_dir).mkdir(parents=True, exist_ok=True)
    path = Path(store_dir) / LOCK
    handle = open(path, "a+")  # noqa: SIM115 -- held for the block, closed below
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise StoreLocked(_message(store_dir, _holder(handle.read()), what)) from None
        handle.seek(0)
        handle.truncate()
        handle.write(owner)
        handle.flush()
        yield
    finally:
        handle.close()  # closing the file releases the flock


@contextlib.contextmanager
def _lease(store_dir: Location, owner: str, what: str) -> Iterator[None]:
    """An object-store lease: taken when absent or expired, checked after writing (the last
    writer of the object wins; the loser sees another token and backs off)."""
    path = storage.join(store_dir, LOCK)
    with contextlib.suppress(FileNotFoundError):
        current = json.loads(storage.read_text(path))
        if current.get("expires", 0) > time.time():
            raise StoreLocked(_message(store_dir, _holder(json.dumps(current)), what))
    mine = {**json.loads(owner), "expires": time.time() + LEASE_S}
    storage.write_text(path, json.dumps(mine))
    if json.loads(storage.read_text(path)).get("token") != mine["token"]:
        raise StoreLocked(_message(store_dir, "another run that took it at the same moment",
                                   what))
    stop = threading.Event()
    renewing = threading.Thread(target=_renew, args=(path, mine, stop), daemon=True,
                                name="tkg-store-lease")
    renewing.start()
    try:
        yield
    finally:
        stop.set()
        renewing.join(timeout=60)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(storage.read_text(path)).get("token") == mine["token"]:
                storage.delete_file(path)


def _renew(path: Location, mine: dict, stop: threading.Event) -> None:
    """Push the lease's expiry on every third of `LEASE_S` until `stop`; a lease found in
    another run's hands (this process stalled past its expiry) is left to it, loudly."""
    while not stop.wait(LEASE_S / 3):
        try:
            if json.loads(storage.read_text(path)).get("token") != mine["token"]:
                log.error("the store lease %s was taken over by another run; this run no "
                          "longer holds the store", path)
                return
            storage.write_text(path, json.dumps({**mine, "expires": time.time() + LEASE_S}))
        except (OSError, ValueError):  # the next turn tries again, before the lease ends
            log.warning("could not renew the store lease %s", path, exc_info=True)
