"""`tkg build --inbox`: build what agents added to the store's inbox (`pipeline/inbox.py`),
and `tkg serve --build-every N`, which runs that every N minutes for a small store."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("tkg.inbox")


def build_inbox(args: argparse.Namespace, build: Callable[[argparse.Namespace], int]) -> int:
    """Run `build` (`tkg build`) with the inbox's waiting parts added to `--input`; once it
    has published, move them to `inbox/done/<run_id>/`. A resumed run (`--run-id`) reads the
    parts its first attempt claimed."""
    from tkg.pipeline import inbox, sources, storage, store
    from tkg.pipeline.config import load_config

    config = load_config(args.config)
    store_dir = storage.location(args.store)
    parts = (inbox.claim(store_dir, store.work_dir(store_dir, args.run_id), config.storage)
             if args.run_id else inbox.waiting(store_dir, config.storage))
    if not parts and not args.input:
        print(f"tkg build: nothing waits in the inbox of {args.store}; nothing to build",
              file=sys.stderr if args.json else sys.stdout)
        return 0
    inputs = [*(args.input or []), *parts]
    if args.run_id is None:
        args.run_id = store.new_run_id(store.now(), sources.discover(inputs, config.storage))
        inbox.claim(store_dir, store.work_dir(store_dir, args.run_id), config.storage, parts)
    code = build(argparse.Namespace(**{**vars(args), "input": inputs}))
    if code == 0 and parts:
        moved = inbox.mark_ingested(store_dir, parts, args.run_id, config.storage)
        print(f"tkg build: {moved} inbox part(s) built into {args.run_id}, moved to "
              f"inbox/done/{args.run_id}/", file=sys.stderr if args.json else sys.stdout)
    return code


class BuildEvery:
    """`tkg serve --build-every N`: every N minutes, when parts wait in the inbox, run
    `tkg build --inbox` on the store (a subprocess: a build's Ray and models stay out of
    the server). The server switches to the new snapshot by itself (`SnapshotHolder`)."""

    def __init__(self, store_dir: str, minutes: float, config: str | None) -> None:
        if not minutes > 0:
            raise ValueError(f"--build-every takes minutes above 0, got {minutes:g}")
        self.store_dir, self.seconds, self.config = store_dir, minutes * 60, config
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tkg-build-every", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds):
            self.once()

    def once(self) -> int | None:
        """One build if parts wait; its exit status (None: nothing waited)."""
        from tkg.pipeline import inbox, storage

        if not inbox.waiting(storage.location(self.store_dir)):
            return None
        command = [sys.executable, "-m", "tkg.jobs.cli", "build", "--inbox", "--store",
                   self.store_dir, *(["--config", self.config] if self.config else [])]
        print(f"tkg serve: building the inbox of {self.store_dir}", file=sys.stderr, flush=True)
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              check=False)
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        print(f"tkg serve: inbox build exited {done.returncode}: {tail[0]}", file=sys.stderr,
              flush=True)
        return done.returncode
