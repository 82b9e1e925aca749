"""Fault injection for the reliability tests: the one place that reads `TKG_FAULT`.

`TKG_FAULT` holds comma-separated specs; with it unset every hook is a no-op:

    after_stage:<stage>    the driver "dies" right after <stage>'s output is finished
    extract_batch:<n>      the driver "dies" when extraction reaches chunk n (n chunks kept)
    publish:<step>         the driver "dies" while publishing, after <step> (tables, catalog,
                           indexes) is written
    before_switch          the driver "dies" after the snapshot is written, before CURRENT
    forget:<step>          a forget "dies" after <step>: published (its snapshot is CURRENT,
                           the purge not begun), retired (one snapshot's manifest removed)
    stage_error:<stage>    <stage> raises on every attempt (a stage that keeps failing)
    worker_exit:<stage>    one Ray worker of <stage> exits hard, once (Ray retries it)
    actor_exit:<stage>     every model actor of <stage> exits hard on every batch
    enospc:<point>         the disk is "full" at <point> (e.g. before_switch)

A "death" is `InjectedCrash`, a BaseException: it escapes every `except Exception` the way a
killed process escapes all cleanup, so what is left on disk is what a real crash leaves.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

ENV = "TKG_FAULT"
CRASHES = frozenset({"after_stage", "extract_batch", "publish", "before_switch",
                     "forget"})


class InjectedCrash(BaseException):
    """The simulated death of the driver at a fault point."""


class InjectedError(RuntimeError):
    """A stage failure injected by `stage_error:<stage>`."""


def specs() -> list[tuple[str, str]]:
    """(kind, target) pairs of `TKG_FAULT`, read at each call so tests can change it."""
    raw = os.environ.get(ENV, "")
    pairs = []
    for item in filter(None, (s.strip() for s in raw.split(","))):
        kind, _, target = item.partition(":")
        pairs.append((kind, target))
    return pairs


def hit(point: str, arg: str = "") -> None:
    """A fault point: raises when a spec names it (and its argument, when the spec has one)."""
    for kind, target in specs():
        if kind == "enospc" and target == point:
            raise OSError(errno.ENOSPC, f"No space left on device (injected at {point})")
        if kind == point and target in ("", arg):
            if kind in CRASHES:
                raise InjectedCrash(f"{ENV}={kind}:{target}")
            raise InjectedError(f"injected failure ({ENV}={kind}:{target})")


def actor_exit(stage: str) -> bool:
    """Whether the model actors of `stage` must die on every batch (read on the driver and
    handed to the actors, whose environment is the cluster's, not the test's)."""
    return ("actor_exit", stage) in specs()


def die() -> None:
    os._exit(1)  # a process lost mid-batch: no exception, no cleanup


def worker_inputs(stage: str, inputs: dict, marker_dir: Path | str) -> dict:
    """With `worker_exit:<stage>`, route the stage's inputs through a Ray task that kills its
    own worker process the first time it runs; Ray reruns the task on a new worker. The
    once-only marker is a local file (an exclusive create), beside a local work dir, else
    in the temp folder (a work dir in object storage; the tests' workers share a machine)."""
    if ("worker_exit", stage) not in specs():
        return inputs
    folder = Path(marker_dir) if "://" not in str(marker_dir) else Path(
        tempfile.gettempdir(), "tkg-faults", hashlib.sha256(str(marker_dir).encode()).hexdigest())
    folder.mkdir(parents=True, exist_ok=True)
    marker = str(folder / f"_worker_exit.{stage}")
    from tkg.pipeline import engine

    return {name: engine.map_on_workers(ds, _exit_once(marker)) for name, ds in inputs.items()}


def _exit_once(marker: str) -> Callable[[pa.Table], pa.Table]:
    def maybe_exit(batch: pa.Table) -> pa.Table:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return batch
        os.close(fd)
        os._exit(1)  # a worker lost mid-task, as on a preempted node

    return maybe_exit
