"""Where searches run: on this process's threads, or (`serve.processes` > 1) on the next
free of that many retrieval processes, each with its own snapshot holder and watcher, which
also encode the JSON. Either way a request is bounded in queue length and in time."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import threading
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from tkg.pipeline.config import QueryConfig, ServeConfig
from tkg.query.api import Retriever
from tkg.query.serve.metrics import Metrics
from tkg.query.snapshot import Snapshot, SnapshotHolder, open_snapshot

_PROCESS_RETRIEVER: Retriever | None = None  # what a retrieval process searches with
REOPEN_WAIT_S = 60.0  # longest a retrieval process waits for another's reopen to finish


def _start_process(store_dir: str, config: QueryConfig | None, poll_s: float,
                   reopening: Any) -> None:
    """Initializer of a retrieval process: open the snapshot and watch CURRENT; exit when
    the server process is gone (a killed server must not leave its processes behind).
    A newly published snapshot is opened by one retrieval process at a time (`reopening`,
    a lock they share): the others keep answering on their cores meanwhile."""
    global _PROCESS_RETRIEVER
    parent = os.getppid()

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphaned, name="tkg-parent-watch", daemon=True).start()
    holder: list[SnapshotHolder[Snapshot]] = []

    def open_run(path: Any) -> Snapshot:
        if not holder:  # the first open, at start: all at once
            return open_snapshot(path, config)
        turn = reopening.acquire(timeout=REOPEN_WAIT_S)  # (bounded: a holder may have died)
        try:
            return open_snapshot(path, config)
        finally:
            if turn:
                reopening.release()

    holder.append(SnapshotHolder(store_dir, open_run))
    _PROCESS_RETRIEVER = Retriever(store_dir, config=config, snapshots=holder[0])
    _PROCESS_RETRIEVER.load_models()
    _PROCESS_RETRIEVER.snapshots.watch(poll_s)


def _ready() -> str:
    time.sleep(0.2)  # (held a moment, so the start-up calls spread over the processes)
    assert _PROCESS_RETRIEVER is not None, "not a retrieval process"
    return _PROCESS_RETRIEVER.snapshot().run_id


def answer(retriever: Retriever | None, method: str, text: str, group_ids: list[str],
           options: dict[str, Any]) -> tuple[str, bytes, dict[str, float]]:
    """One search or context (None: this retrieval process's retriever): the run id of the
    snapshot that answered, the JSON body and the seconds of its two stages (`search`,
    `json`: the context string or the JSON encoding). `options` are `Retriever.search`'s,
    plus `bfs_hops` (a variant of the recipe) and, for context, `max_tokens`."""
    started = time.perf_counter()
    retriever = retriever or _PROCESS_RETRIEVER
    assert retriever is not None, "not a retrieval process"
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


class Workers:
    """The thread pool (catalog lookups; searches too with one process) and, with
    `processes` > 1, the retrieval processes; admits `workers + queue` requests at once."""

    def __init__(self, store_dir: str | Path, limits: ServeConfig, metrics: Metrics,
                 config: QueryConfig | None) -> None:
        self.limits, self.metrics = limits, metrics
        self.threads = ThreadPoolExecutor(max_workers=limits.workers,
                                          thread_name_prefix="tkg-query")
        spawn = multiprocessing.get_context("spawn")
        self.processes = ProcessPoolExecutor(
            max_workers=limits.processes, mp_context=spawn, initializer=_start_process,
            initargs=(str(store_dir), config, limits.poll_s, spawn.Lock()),
        ) if limits.processes > 1 else None
        self._admitted = asyncio.Semaphore(limits.workers + limits.queue)

    async def start(self) -> None:
        """Start every retrieval process (each opens the snapshot) before serving."""
        if self.processes is not None:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(self.processes, _ready)
                                   for _ in range(self.limits.processes)))

    def stop(self) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)
        if self.processes is not None:
            self.processes.shutdown(wait=True, cancel_futures=True)

    async def retrieve(self, retriever: Retriever | None, method: str, text: str,
                       group_ids: list[str], options: dict[str, Any]
                       ) -> tuple[str, bytes, dict[str, float]]:
        """`answer` on a retrieval process (the next free one, so a slow request never
        queues others), or on this process's threads with `retriever`; its stages' seconds
        gain `wait`: the time from here to the answer beyond them (the queue for a free
        process or thread, and the hand-over both ways)."""
        started = time.perf_counter()
        if self.processes is not None:
            run_id, body, stages = await self.run(answer, None, method, text, group_ids,
                                                  options, executor=self.processes)
        else:
            run_id, body, stages = await self.run(answer, retriever, method, text, group_ids,
                                                  options)
        stages["wait"] = max(time.perf_counter() - started - sum(stages.values()), 0.0)
        return run_id, body, stages

    async def run(self, fn: Any, *args: Any, executor: Executor | None = None) -> Any:
        """`fn(*args)` on the threads (or `executor`), bounded in time and queue length."""
        if self._admitted.locked():
            self.metrics.errors.labels("queue", "busy").inc()
            raise HTTPException(503, "server busy: too many requests waiting; retry shortly")
        async with self._admitted:
            loop = asyncio.get_running_loop()
            try:
                return await asyncio.wait_for(
                    loop.run_in_executor(executor or self.threads, fn, *args),
                    self.limits.timeout_s)
            except TimeoutError:
                raise HTTPException(503, f"request took over {self.limits.timeout_s:g} s; "
                                         "narrow it (fewer groups, lower limit) or retry"
                                    ) from None
