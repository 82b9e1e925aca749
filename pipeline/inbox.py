"""The store's inbox: episodes that agents add between builds, waiting for the next one.

Writers (`tkg.query.add_episodes`, `POST /episodes` on `tkg serve`, the MCP tool
`add_memory`) check each record against the input contract (`sources.to_episode`, the rule
`tkg build` reads with) and write the accepted ones of one request as one JSON Lines part,
`STORE/inbox/waiting/<time>-<random>.jsonl`, whole and on disk before they answer
(`storage.write_durable`; on an object store, one upload). A build with `--inbox` reads the
waiting parts like any input and, once its snapshot is published, moves them to
`STORE/inbox/done/<run_id>/`: a part is built once. Should a build stop between publishing
and moving, the next one reads the parts again and drops their episodes as re-deliveries
(episode ids are stable: group + id), so the graph holds each episode once either way.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tkg.pipeline import storage
from tkg.pipeline import store as store_module
from tkg.pipeline.config import LimitsConfig, StorageConfig
from tkg.pipeline.episode_kinds import RecordError
from tkg.pipeline.sources import JSONL_SUFFIXES, to_episode
from tkg.pipeline.storage import Location

INBOX = "inbox"
WAITING = "waiting"
DONE = "done"
CLAIMED = "inbox.json"  # in a run's work dir: the parts it reads, kept for a resume


@dataclass
class Added:
    """What a write answered: per record (in order) its episode id or why it was rejected,
    and the part the accepted ones went to (None when none was accepted)."""

    results: list[dict[str, Any]] = field(default_factory=list)
    part: str | None = None

    @property
    def accepted(self) -> int:
        return sum("episode_id" in r for r in self.results)

    @property
    def rejected(self) -> int:
        return len(self.results) - self.accepted

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "rejected": self.rejected, "part": self.part,
                "results": self.results}


def waiting_dir(store: Location) -> Location:
    return storage.join(store, INBOX, WAITING)


def store_limits(store: Location) -> LimitsConfig:
    """The `limits` the store's current snapshot was built with (a writer checks records as
    the next build will), the defaults for a store with none."""
    run_id = store_module.current_run(store)
    if run_id is None:
        return LimitsConfig()
    try:
        config = store_module.read_manifest(store_module.snapshot_dir(store, run_id))["config"]
        return LimitsConfig.model_validate(config["limits"])
    except (store_module.StoreError, KeyError, TypeError, ValueError):
        return LimitsConfig()


def add(store: Location, records: Sequence[Any], limits: LimitsConfig | None = None,
        config: StorageConfig | None = None, now: datetime | None = None) -> Added:
    """Check each record against the input contract (with `limits`, default the store's:
    `store_limits`) and write the accepted ones as one new part of the inbox (see the module
    docstring). Nothing is written when none is accepted."""
    limits = limits or store_limits(store)
    now = now or datetime.now(UTC)
    added = Added()
    lines: list[str] = []
    for index, record in enumerate(records):
        try:
            row, _ = to_episode(record, limits, now)
            line = json.dumps(record, ensure_ascii=False, allow_nan=False)
        except (RecordError, TypeError, ValueError) as exc:  # ValueError: NaN, a cycle
            added.results.append({"index": index, "reason": str(exc)})
            continue
        if len(line.encode()) >= limits.max_line_bytes:
            added.results.append({"index": index, "reason": (
                f"record is {len(line.encode())} bytes as JSON, over the limit of "
                f"{limits.max_line_bytes} (limits.max_line_bytes)")})
            continue
        lines.append(line)
        added.results.append({"index": index, "episode_id": row["episode_id"],
                              "group_id": row["group_id"], "id": row["source_id"]})
    if lines:
        name = f"{now:%Y%m%dT%H%M%S%fZ}-{secrets.token_hex(6)}.jsonl"
        storage.write_durable(storage.join(waiting_dir(store), name),
                              ("\n".join(lines) + "\n").encode("utf-8"), config)
        added.part = name
    return added


def waiting(store: Location, config: StorageConfig | None = None) -> list[str]:
    """The parts waiting for a build, oldest first (a half-written local part is a hidden
    temporary file, never listed)."""
    return [part for part in storage.list_files(waiting_dir(store), config, JSONL_SUFFIXES)
            if not storage.name(part).startswith(".")]


def claim(store: Location, work_dir: Location, config: StorageConfig | None = None,
          parts: Sequence[str] | None = None) -> list[str]:
    """The parts run `work_dir` reads: those its first attempt recorded (a resumed run reads
    the same ones, whatever arrived since), else `parts` (default: those waiting now), now
    recorded. A run that started without the inbox takes none on resuming: its finished
    `read` would not read them, and they would be marked built unread."""
    record = storage.join(work_dir, CLAIMED)
    try:
        return list(json.loads(storage.read_text(record, config)))
    except FileNotFoundError:
        if storage.exists(work_dir, config):
            parts = []
        elif parts is None:
            parts = waiting(store, config)
        parts = list(parts)
        storage.write_text(record, json.dumps(parts), config)
        return parts


def mark_ingested(store: Location, parts: Sequence[str], run_id: str,
                  config: StorageConfig | None = None) -> int:
    """Move the parts a published run read to `inbox/done/<run_id>/`; returns how many moved
    (a part already moved, by an earlier attempt of the run, is not counted)."""
    done = storage.join(store, INBOX, DONE, run_id)
    moved = 0
    for part in parts:
        if storage.exists(part, config):
            storage.move(part, storage.join(done, storage.name(part)), config)
            moved += 1
    return moved
