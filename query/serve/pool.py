"""Where searches run: on this process's threads, or (`serve.processes` > 1) on that many
retrieval processes behind this one, each with its own snapshot, which also encode the JSON,
and a spare that opens a newly published snapshot while they answer (`Retrievers`). Either
way a request is bounded in queue length and in time. Each retrieval process is a plain loop
on a pipe that this process's event loop reads: handing a search over costs no thread
switch (the process pool's manager and feeder threads were 28 % of this process's py-spy
samples under the bench's load)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from tkg.pipeline.config import QueryConfig, ServeConfig
from tkg.query.api import Retriever
from tkg.query.serve.metrics import Metrics
from tkg.query.snapshot import SnapshotHolder, open_snapshot

log = logging.getLogger("tkg.serve")
STOP_WAIT_S = 10.0  # longest a retrieval process is given to exit before it is terminated
REAP_WAIT_S = 0.5  # longest a process whose pipe closed is waited for (not left a zombie)
# The niceness of the thread that opens a published snapshot in the spare: it takes less of
# the cores from the processes answering, and more time when they are busy (100,000 facts,
# 16 clients on 2 cores: nice 0 opened in 4.1 + 3.6 s, p99 116 ms over the run and 310 ms in
# its worst second; nice 5 in 6.6 + 4.3 s, p99 87 / 105 ms; nice 10 had not opened after 15 s).
OPEN_NICE = 5


def answer(retriever: Retriever, method: str, text: str, group_ids: list[str],
           options: dict[str, Any]) -> tuple[str, bytes, dict[str, float]]:
    """One search or context: the run id of the snapshot that answered, the JSON body and
    the seconds of its two stages (`search`, `json`: the context string or the JSON
    encoding). `options` are `Retriever.search`'s, plus `bfs_hops` (a variant of the
    recipe) and, for context, `max_tokens`."""
    started = time.perf_counter()
    options = dict(options)
    hops, max_tokens = options.pop("bfs_hops", None), options.pop("max_tokens", None)
    recipe = retriever.recipe(options.pop("recipe", None))
    if hops is not None:
        recipe = dataclasses.replace(recipe, bfs_hops=hops)
    result = retriever.search(text, group_ids, recipe=recipe, **options)
    searched = time.perf_counter()
    content = (result.to_dict() if method == "search"
               else {"context": retriever.context_of(result, max_tokens)})
    assert result.run_id is not None
    body = json.dumps(content, ensure_ascii=False).encode()
    return result.run_id, body, {"search": searched - started,
                                 "json": time.perf_counter() - searched}


def _exit_with_parent(parent: int) -> None:
    """A killed server must not leave its retrieval processes behind."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="tkg-parent-watch", daemon=True).start()


def _open_gently(holder: SnapshotHolder[Any]) -> None:
    """Open the published snapshot on a thread of lower priority (`OPEN_NICE`; the thread
    ends with the open, so the process answers at its own priority afterwards)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), OPEN_NICE)
    try:
        holder.refresh()
    except Exception:
        logging.getLogger("tkg.snapshot").exception(
            "the published snapshot could not be opened; still serving %s",
            holder.get().run_id)


def _retrieval_process(conn: Connection, store_dir: str, config: QueryConfig | None,
                       parent: int) -> None:
    """A retrieval process: open the snapshot CURRENT names, say `ready`, then answer each
    message in turn: `answer` (a search or context), `refresh` (open a newly published
    snapshot; `ready` again, with the run it now answers from), `stop`."""
    _exit_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C stops the server, which stops us)
    try:
        holder = SnapshotHolder(store_dir, lambda path: open_snapshot(path, config),
                                follow=False)
        retriever = Retriever(store_dir, config=config, snapshots=holder)
        retriever.load_models()
    except Exception as exc:  # (reported to the server, which refuses to start)
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", holder.get().run_id))
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the server closed its end
            return
        if message[0] == "stop":
            return
        if message[0] == "refresh":
            opener = threading.Thread(target=_open_gently, args=(holder,), name="tkg-open")
            opener.start()
            opener.join()
            conn.send(("ready", holder.get().run_id))
            continue
        try:
            reply: tuple[Any, ...] = ("answer", answer(retriever, *message[1:]))
        except Exception as exc:
            reply = ("error", exc)
        try:
            conn.send(reply)
        except Exception as exc:  # an exception that does not pickle
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))


SENT_AHEAD = 1  # searches a busy process is sent beyond the one it is answering


def _fresh(found: _Process, current: str) -> bool:
    """Whether a process answers from `current`, or was asked to open it (and failed:
    logged there, and not asked again until another is published)."""
    return current in (found.run_id, found.asked)


@dataclasses.dataclass(eq=False)
class _Process:
    """A retrieval process as the server sees it."""

    process: BaseProcess
    conn: Connection
    run_id: str | None = None  # the snapshot it answers from (None: still starting)
    asked: str | None = None  # the run it was last asked to switch to
    serving: bool = True  # takes searches (not: the spare, or leaving the rotation)
    replies: collections.deque[asyncio.Future[Any]] = dataclasses.field(
        default_factory=collections.deque)  # the answers awaited from it, in order


class Retrievers:
    """The retrieval processes, the queue of searches waiting for one, and the switch of
    each to a newly published snapshot (`current`: the run id the server serves).

    A search goes to an idle process, else to a busy one with at most `SENT_AHEAD`
    searches waiting in its pipe, else waits here for the first that has room, in order.
    (With none sent ahead, a process that answered waited for this one to hear it and send
    the next: 1.89 of the 2 cores busy under the bench's load instead of 1.97, 250 against
    280 requests/s.)

    `count` processes answer searches and one more, the spare, waits out of the rotation.
    At a publish the spare opens the new snapshot while the others answer, then takes the
    place of one still on the old snapshot, which leaves the rotation, answers what it was
    sent, becomes the spare and opens it in turn, until every process in the rotation has
    switched: one process opens at a time and the rotation never shrinks. (A process of
    the rotation opening it on a thread beside its searches, as before, made them wait on
    the interpreter lock: p99 376 ms around the switch at 100,000 facts under 16 clients.)"""

    def __init__(self, store_dir: str | Path, config: QueryConfig | None, count: int,
                 current: Callable[[], str]) -> None:
        self.store_dir, self.config, self.count, self.current = store_dir, config, count, current
        self._processes: list[_Process] = []
        self._queue: collections.deque[tuple[tuple[Any, ...], asyncio.Future[Any]]] = (
            collections.deque())
        self._spare: _Process | None = None
        self._leaving: _Process | None = None  # to become the spare once it has answered
        self._switching: _Process | None = None  # opening a snapshot (one at a time)
        self._started: asyncio.Future[None] | None = None
        self._follow: asyncio.Task[None] | None = None

    async def start(self, poll_s: float) -> None:
        """Start every process (each opens the snapshot) and return once all are ready;
        then look for a newly published snapshot every `poll_s` too (besides each time a
        process answers)."""
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        spawn = multiprocessing.get_context("spawn")
        for _ in range(self.count + 1):
            ours, theirs = spawn.Pipe()
            process = spawn.Process(target=_retrieval_process, name="tkg-retrieval",
                                    args=(theirs, str(self.store_dir), self.config,
                                          os.getpid()), daemon=True)
            process.start()
            theirs.close()
            found = _Process(process, ours)
            self._processes.append(found)
            loop.add_reader(ours.fileno(), self._on_message, found)
        await self._started
        self._spare = self._processes[-1]
        self._spare.serving = False
        self._follow = loop.create_task(self._advance_every(poll_s))

    async def _advance_every(self, poll_s: float) -> None:
        while True:
            await asyncio.sleep(poll_s)
            self._advance()
            self._dispatch()

    def stop(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
        for found in self._processes:
            self._close(found)
            with contextlib.suppress(OSError):
                found.conn.send(("stop",))
        for found in self._processes:
            found.process.join(STOP_WAIT_S)
            if found.process.is_alive():
                found.process.terminate()
        self._processes.clear()

    async def ask(self, *message: Any) -> tuple[str, bytes, dict[str, float]]:
        """`answer(*message)` on the first process with room (see the class)."""
        if not self._processes:
            raise HTTPException(503, "no retrieval process is running; restart the server")
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((("answer", *message), reply))
        self._dispatch()
        return await reply

    def _dispatch(self) -> None:
        """Send waiting searches to the processes with room, the least busy first."""
        while self._queue:
            room = [p for p in self._processes
                    if p.serving and p.run_id is not None and len(p.replies) <= SENT_AHEAD]
            if not room:
                return
            found = min(room, key=lambda p: len(p.replies))
            message, reply = self._queue.popleft()
            if reply.done():  # (its caller timed out)
                continue
            try:
                found.conn.send(message)
            except OSError:  # (it exited: the search waits for another)
                self._queue.appendleft((message, reply))
                self._lost(found)
                continue
            found.replies.append(reply)

    def _advance(self) -> None:
        """The next step of a switch to a newly published snapshot, if one is due (see the
        class)."""
        if self._started is None or not self._started.done():
            return
        current = self.current()
        for _ in range(2 * len(self._processes) + 2):  # (each pass moves one step)
            if self._switching is not None:
                return
            if self._leaving is not None:
                if self._leaving.replies:
                    return
                self._spare, self._leaving = self._leaving, None
            spare = self._spare
            serving = [p for p in self._processes if p.serving]
            behind = [p for p in serving if not _fresh(p, current)]
            if spare is not None and not _fresh(spare, current) and (behind or not serving):
                self._open(spare, current)
                return
            if spare is not None and not serving:  # (the others exited)
                spare.serving, self._spare = True, None
                continue
            if not behind:
                return
            if spare is not None:
                spare.serving, self._spare = True, None
            leaving = min(behind, key=lambda p: len(p.replies))  # (without a spare: it
            leaving.serving, self._leaving = False, leaving  # becomes one, and opens)

    def _open(self, found: _Process, current: str) -> None:
        """Ask the spare to open the published snapshot."""
        found.asked, self._switching = current, found
        try:
            found.conn.send(("refresh",))
        except OSError:
            self._lost(found)

    def _on_message(self, found: _Process) -> None:
        """A message from a process (its event loop reader)."""
        try:
            message = found.conn.recv()
        except (EOFError, OSError):
            message = ("exited",)
        except Exception as exc:  # an answer that does not unpickle here
            message = ("error", RuntimeError(f"unreadable answer of a retrieval process: {exc}"))
        kind = message[0]
        if kind == "exited":
            self._lost(found)
        elif kind == "failed":
            self._lost(found, f"a retrieval process could not start: {message[1]}")
        elif kind == "ready":
            found.run_id = message[1]
            if self._switching is found:
                self._switching = None
            if self._started is not None and not self._started.done() and all(
                    p.run_id is not None for p in self._processes):
                self._started.set_result(None)
        elif found.replies:
            reply = found.replies.popleft()
            if not reply.done():  # (done: its caller timed out)
                if kind == "answer":
                    reply.set_result(message[1])
                else:
                    reply.set_exception(message[1])
        self._advance()
        self._dispatch()

    def _lost(self, found: _Process, why: str = "a retrieval process exited") -> None:
        """A process that died or could not start: its searches get 503, the others go on."""
        self._close(found)
        found.process.join(REAP_WAIT_S)  # (its pipe closed as it exited: reaped now)
        if found in self._processes:
            self._processes.remove(found)
        for role in ("_spare", "_leaving", "_switching"):
            if getattr(self, role) is found:
                setattr(self, role, None)
        log.error("%s (exit code %s); %d left", why, found.process.exitcode,
                  len(self._processes))
        failed = list(found.replies)
        if not self._processes:
            failed += [reply for _, reply in self._queue]
            self._queue.clear()
        for reply in failed:
            if not reply.done():
                reply.set_exception(HTTPException(503, f"{why}; retry"))
        found.replies.clear()
        if self._started is not None and not self._started.done():
            self._started.set_exception(RuntimeError(why))

    @staticmethod
    def _close(found: _Process) -> None:
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            asyncio.get_running_loop().remove_reader(found.conn.fileno())


class Workers:
    """The thread pool (catalog lookups; searches too with one process) and, with
    `processes` > 1, the retrieval processes; admits `workers + queue` requests at once."""

    def __init__(self, store_dir: str | Path, limits: ServeConfig, metrics: Metrics,
                 config: QueryConfig | None, snapshots: SnapshotHolder[Any]) -> None:
        self.limits, self.metrics = limits, metrics
        self.threads = ThreadPoolExecutor(max_workers=limits.workers,
                                          thread_name_prefix="tkg-query")
        self.processes = Retrievers(store_dir, config, limits.processes,
                                    lambda: snapshots.get().run_id
                                    ) if limits.processes > 1 else None
        self._admitted = asyncio.Semaphore(limits.workers + limits.queue)

    async def start(self) -> None:
        """Start every retrieval process (each opens the snapshot) before serving."""
        if self.processes is not None:
            await self.processes.start(self.limits.poll_s)

    def stop(self) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)
        if self.processes is not None:
            self.processes.stop()

    async def retrieve(self, retriever: Retriever | None, method: str, text: str,
                       group_ids: list[str], options: dict[str, Any]
                       ) -> tuple[str, bytes, dict[str, float]]:
        """`answer` on a retrieval process (see `Retrievers`), or on this process's
        threads with `retriever`; its stages' seconds gain `wait`: the time from here to
        the answer beyond them (the queue for a free process or thread, and the hand-over
        both ways)."""
        started = time.perf_counter()
        if self.processes is not None:
            processes = self.processes
            run_id, body, stages = await self.bounded(
                lambda: processes.ask(method, text, group_ids, options))
        else:
            assert retriever is not None
            run_id, body, stages = await self.run(answer, retriever, method, text, group_ids,
                                                  options)
        stages["wait"] = max(time.perf_counter() - started - sum(stages.values()), 0.0)
        return run_id, body, stages

    async def run(self, fn: Any, *args: Any, executor: Executor | None = None) -> Any:
        """`fn(*args)` on the threads (or `executor`), bounded in time and queue length."""
        loop = asyncio.get_running_loop()
        return await self.bounded(
            lambda: loop.run_in_executor(executor or self.threads, fn, *args))

    async def bounded(self, start: Callable[[], Awaitable[Any]]) -> Any:
        """Await what `start()` begins, bounded in time and queue length."""
        if self._admitted.locked():
            self.metrics.errors.labels("queue", "busy").inc()
            raise HTTPException(503, "server busy: too many requests waiting; retry shortly")
        async with self._admitted:
            try:
                return await asyncio.wait_for(start(), self.limits.timeout_s)
            except TimeoutError:
                raise HTTPException(503, f"request took over {self.limits.timeout_s:g} s; "
                                         "narrow it (fewer groups, lower limit) or retry"
                                    ) from None
