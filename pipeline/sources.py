"""Readers and validation: input files -> episodes, bad records -> rejects.

A record is either an episode or a reject with its file, line and reason: nothing read is
lost and one bad record never stops a run. Reading is streamed line by line with a bounded
line length, so a hostile file cannot blow up a worker's memory.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from tkg.pipeline import schema, storage
from tkg.pipeline.config import GROUP_ID_PATTERN, LimitsConfig, StorageConfig, TkgConfig
from tkg.pipeline.datasets import block_metadata
from tkg.pipeline.episode_kinds import (
    DEFAULT_KIND,
    MAX_ID_CHARS,
    RecordError,
    context_line,
    episode_kind,
    text_field,
)

JSONL_SUFFIXES = {".jsonl", ".ndjson"}
PARQUET_SUFFIXES = {".parquet", ".pq"}


class InputError(ValueError):
    """A problem with the inputs as a whole (nothing to read), as opposed to one bad record."""


@dataclass
class ReadStats:
    episodes_in: int = 0
    episodes_ok: int = 0
    rejected: int = 0
    missing_timezone: int = 0
    files: list[str] = field(default_factory=list)

    def add(self, other: ReadStats) -> None:
        self.episodes_in += other.episodes_in
        self.episodes_ok += other.episodes_ok
        self.rejected += other.rejected
        self.missing_timezone += other.missing_timezone
        self.files += other.files


def discover(inputs: list[str], storage_config: StorageConfig | None = None
             ) -> list[Path | str]:
    """Files named by `inputs`: files, folders (searched recursively) or glob patterns, local
    (absolute Paths) or in object storage (`s3://bucket/prefix`, kept as URL strings)."""
    found: set[Path | str] = set()
    for item in inputs:
        if storage.is_url(item):
            found.update(_discover_url(item, storage_config))
            continue
        path = Path(item)
        if path.is_file():
            found.add(_supported(path).resolve())
        elif path.is_dir():
            found.update(
                p.resolve()
                for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in JSONL_SUFFIXES | PARQUET_SUFFIXES
            )
        else:
            matches = [Path(m) for m in glob.glob(item, recursive=True)]
            files = [m.resolve() for m in matches if m.is_file()]
            if not files:
                raise InputError(
                    f"input {item!r} matches no file; pass a .jsonl/.parquet file, a folder "
                    "or a glob such as 'data/**/*.jsonl'"
                )
            readable = [f for f in files if f.suffix.lower() in JSONL_SUFFIXES | PARQUET_SUFFIXES]
            found.update(readable or [_supported(files[0])])  # none readable: say why
    if not found:
        raise InputError(f"no input files under {', '.join(inputs)}: {SUPPORTED}")
    return sorted(found, key=str)


SUPPORTED = ("tkg reads JSON Lines (.jsonl, .ndjson) and Parquet (.parquet, .pq), "
             "one episode per record")


def skipped(inputs: list[str], storage_config: StorageConfig | None = None
            ) -> list[Path | str]:
    """Files inside input folders (or object-store prefixes) that a build does not read: the
    rule is that a folder gives its JSON Lines and Parquet files and nothing else, and `tkg
    build` names the rest in a warning (a `records.json` beside them was skipped silently).
    Hidden files (`.DS_Store`, `.gitkeep`) are not named."""
    readable = JSONL_SUFFIXES | PARQUET_SUFFIXES
    found: list[Path | str] = []
    for item in inputs:
        if storage.is_url(item):
            if any(c in item for c in "*?[") or storage.is_file(item, storage_config):
                continue
            with contextlib.suppress(OSError):
                listed = storage.list_files(item, storage_config)
                found += [f for f in listed
                          if PurePosixPath(f).suffix.lower() not in readable
                          and not PurePosixPath(f).name.startswith(".")]
        elif Path(item).is_dir():
            found += sorted(p for p in Path(item).rglob("*")
                            if p.is_file() and p.suffix.lower() not in readable
                            and not p.name.startswith("."))
    return found


def _supported(path: Path) -> Path:
    """A named input file of a format tkg reads; anything else (CSV, TSV, XLSX, ...) is
    refused here, before any work starts, instead of becoming one reject per line."""
    if path.suffix.lower() not in JSONL_SUFFIXES | PARQUET_SUFFIXES:
        raise InputError(f"input {str(path)!r} is not a supported file type; {SUPPORTED}")
    return path


def _discover_url(item: str, storage_config: StorageConfig | None) -> list[str]:
    """An object, a prefix (searched recursively) or a glob under a prefix."""
    wildcard = min((item.find(c) for c in "*?[" if c in item), default=-1)
    try:
        if wildcard < 0:
            if storage.is_file(item, storage_config):
                return [item]
            files = storage.list_files(item, storage_config, JSONL_SUFFIXES | PARQUET_SUFFIXES)
        else:
            prefix = item[:item.rfind("/", 0, wildcard)]
            files = [f for f in storage.list_files(prefix, storage_config)
                     if fnmatch.fnmatchcase(f, item)]
    except OSError as exc:
        raise InputError(f"cannot list input {item!r}: {exc}; check the bucket, the storage "
                         "endpoint and the AWS_* credentials") from exc
    if not files:
        raise InputError(f"input {item!r} matches no .jsonl or .parquet object; check the "
                         "URL and the storage endpoint and credentials (README: storage)")
    return files


def parse_timestamp(value: Any) -> tuple[datetime, bool]:
    """ISO-8601 -> aware UTC datetime; the flag says the input had no zone (taken as UTC)."""
    if not isinstance(value, str) or not value.strip():
        raise RecordError("missing or non-string 'timestamp' (ISO-8601 expected)")
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise RecordError(f"timestamp {value[:64]!r} is not ISO-8601") from exc
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC), True
    return parsed.astimezone(UTC), False


def to_episode(record: Any, limits: LimitsConfig, now: datetime | None = None
               ) -> tuple[dict, bool]:
    """Validate one input record and map it to an episode row (without run columns); `now`
    (the run's start; default: the clock) bounds its timestamp (`limits.future_days`)."""
    if not isinstance(record, dict):
        raise RecordError(f"record must be a JSON object, got {type(record).__name__}")
    group_id = record.get("group_id")
    if not isinstance(group_id, str) or not GROUP_ID_PATTERN.match(group_id):
        raise RecordError(
            f"invalid group_id {str(group_id)[:64]!r}: must match [A-Za-z0-9_-]{{1,128}}"
        )
    source_id = text_field(record, "id", required=True, limit=MAX_ID_CHARS)
    kind = episode_kind(record.get("kind") or DEFAULT_KIND)
    valid_at, missing_zone = parse_timestamp(record.get("timestamp"))
    latest = (now or datetime.now(UTC)) + timedelta(days=limits.future_days)
    if valid_at > latest:
        raise RecordError(f"timestamp more than {limits.future_days:g} days after the run's "
                          f"start (limits.future_days): {valid_at.isoformat()}")
    row: dict[str, Any] = {
        "group_id": group_id,
        "source_id": source_id,
        "kind": kind.name,
        "valid_at": valid_at,
        "source_description": text_field(record, "source_description", required=False,
                                         limit=limits.max_content_chars),
        **kind.read(record, limits),
    }
    row["episode_id"] = schema.stable_id(group_id, source_id)
    fingerprint = json.dumps(
        [row.get(k) for k in ("kind", "conversation_id", "speaker", "role", "title", "source",
                              "content", "source_description")]
        + [valid_at.isoformat()],
        ensure_ascii=False,
    )
    row["content_hash"] = hashlib.sha256(fingerprint.encode()).hexdigest()
    return row, missing_zone


# A JSON Lines file bigger than this is read by several tasks, one per span of this many
# bytes (a line belongs to the span it starts in). One task per file read a 1,000,000-episode
# file (302 MiB) in 29 s on one core of two; Python's validation of each record is the cost.
SPAN_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Span:
    """The lines of `path` that start in bytes [start, end), numbered from `first_line`
    (the lines that start before `start`, plus one)."""

    path: Path | str
    start: int = 0
    end: int | None = None  # None: to the end of the file
    first_line: int = 1


def _open(path: Path | str, storage_config: StorageConfig | None, start: int = 0) -> BinaryIO:
    """A buffered binary reader of a local file or an object (streamed, not downloaded), from
    byte `start` (an object store reads from there by a ranged request)."""
    fs, inner = storage.resolve(path, storage_config)
    raw = fs.open_input_file(inner) if start else fs.open_input_stream(inner)
    if start:
        raw.seek(start)
    return io.BufferedReader(raw, 1 << 20)


def spans(path: Path | str, storage_config: StorageConfig | None = None,
          span_bytes: int | None = None) -> list[tuple[int, int]]:
    """The byte spans a JSON Lines file is read in: the whole file (one span) unless it is
    bigger than `span_bytes` (`SPAN_BYTES`); Parquet is read whole."""
    if PurePosixPath(str(path)).suffix.lower() in PARQUET_SUFFIXES:
        return [(0, 0)]
    span_bytes = span_bytes or SPAN_BYTES
    size = storage.size(path, storage_config)
    if size <= span_bytes:
        return [(0, size)]
    return [(start, min(start + span_bytes, size)) for start in range(0, size, span_bytes)]


def lines_starting(path: Path | str, start: int, end: int,
                   storage_config: StorageConfig | None = None) -> int:
    """How many lines start in bytes [start, end) of a file of at least `end` bytes: one
    after each newline in [start - 1, end - 1), and the file's first line when start is 0."""
    count = int(start == 0 and end > 0)
    begin = max(start - 1, 0)
    with _open(path, storage_config, begin) as handle:
        left = end - 1 - begin
        while left > 0:
            chunk = handle.read(min(left, 1 << 22))
            if not chunk:
                break
            count += chunk.count(b"\n")
            left -= len(chunk)
    return count


def _first_line_start(handle: BinaryIO, start: int) -> int:
    """Move `handle` (at byte start - 1) to the first line that starts at or after `start`;
    returns that line's offset."""
    if handle.read(1) == b"\n":
        return start
    skipped = start
    while chunk := handle.readline(1 << 20):  # the rest of a line begun before the span
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _jsonl_lines(span: Span, max_bytes: int, storage_config: StorageConfig | None = None
                 ) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number, bytes or None when over-long, length) for each non-blank line of the
    span."""
    begin = max(span.start - 1, 0)
    with _open(span.path, storage_config, begin) as handle:
        offset = _first_line_start(handle, span.start) if span.start else 0
        number = span.first_line - 1
        while span.end is None or offset < span.end:
            chunk = handle.readline(max_bytes + 1)
            if not chunk:
                return
            number += 1
            offset += len(chunk)
            if len(chunk) > max_bytes and not chunk.endswith(b"\n"):
                length = len(chunk)
                head = chunk
                while chunk and not chunk.endswith(b"\n"):  # skip the rest of the long line
                    chunk = handle.readline(1 << 20)
                    length += len(chunk)
                offset += length - len(head)
                yield number, None, length
                del head
                continue
            if chunk.strip():
                yield number, chunk, len(chunk)


def _jsonl_records(span: Span, limits: LimitsConfig,
                   storage_config: StorageConfig | None = None
                   ) -> Iterator[tuple[int, Any, bytes | None]]:
    """(line, parsed record or RecordError, raw bytes) per line of the span."""
    for number, raw, length in _jsonl_lines(span, limits.max_line_bytes, storage_config):
        if raw is None:
            yield number, RecordError(
                f"line is {length} bytes, over the limit of {limits.max_line_bytes}"
            ), None
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, RecordError(f"invalid UTF-8 at byte {exc.start}"), raw
            continue
        try:
            yield number, json.loads(text), raw
        except RecursionError:
            yield number, RecordError("JSON nested too deeply"), raw
        except ValueError as exc:
            yield number, RecordError(f"malformed JSON: {exc}"), raw


def _parquet_records(path: Path | str, storage_config: StorageConfig | None = None
                     ) -> Iterator[tuple[int, Any, bytes | None]]:
    try:
        fs, inner = storage.resolve(path, storage_config)
        parquet = pq.ParquetFile(fs.open_input_file(inner))
    except Exception as exc:
        yield 0, RecordError(f"unreadable Parquet file: {exc}"), None
        return
    number = 0
    for batch in parquet.iter_batches(batch_size=4096):
        for record in batch.to_pylist():
            number += 1
            yield number, record, None


def read_file(
    path: Path | str | Span, *, run_id: str, limits: LimitsConfig, created_at: datetime,
    storage_config: StorageConfig | None = None,
) -> tuple[pa.Table, pa.Table, ReadStats]:
    """Read one input file (local or an object-store URL), or one `Span` of a JSON Lines
    file, into (raw episodes, rejects, stats)."""
    span = path if isinstance(path, Span) else Span(path)
    path = span.path
    stats = ReadStats(files=[str(path)] if span.start == 0 else [])
    episodes: list[dict] = []
    rejects: list[dict] = []
    is_parquet = PurePosixPath(str(path)).suffix.lower() in PARQUET_SUFFIXES
    records = (_parquet_records(path, storage_config) if is_parquet
               else _jsonl_records(span, limits, storage_config))
    for number, record, raw in records:
        stats.episodes_in += 1
        try:
            if isinstance(record, RecordError):
                raise record
            row, missing_zone = to_episode(record, limits, created_at)
        except RecordError as exc:
            stats.rejected += 1
            rejects.append(
                reject_row(
                    run_id=run_id, stage="read", file=str(path), line=number, reason=str(exc),
                    payload=_payload(record, raw, limits.reject_payload_chars),
                    group_id=_group_of(record), created_at=created_at,
                )
            )
            continue
        stats.episodes_ok += 1
        stats.missing_timezone += missing_zone
        row.update(file=str(path), line=number, created_at=created_at, run_id=run_id)
        episodes.append(row)
    return (
        schema.from_rows(episodes, schema.RAW_EPISODES),
        schema.from_rows(rejects, schema.REJECTS),
        stats,
    )


def reject_row(
    *, run_id: str, stage: str, reason: str, payload: str | None, created_at: datetime,
    file: str | None = None, line: int | None = None, group_id: str | None = None,
    episode_id: str | None = None,
) -> dict:
    return {
        "run_id": run_id, "stage": stage, "group_id": group_id, "file": file, "line": line,
        "episode_id": episode_id, "reason": reason, "payload": payload, "created_at": created_at,
    }


def _group_of(record: Any) -> str | None:
    if isinstance(record, dict):
        group = record.get("group_id")
        if isinstance(group, str) and GROUP_ID_PATTERN.match(group):
            return group
    return None


def _payload(record: Any, raw: bytes | None, limit: int) -> str | None:
    if raw is not None:
        text = raw.decode("utf-8", errors="backslashreplace").rstrip("\n")
    elif isinstance(record, dict):
        text = json.dumps(record, ensure_ascii=False, default=str)
    else:
        return None
    return text if len(text) <= limit else text[:limit] + "…"


def window_episodes(rows: pa.Table, context_messages: int, *, run_id: str,
                    created_at: datetime, payload_chars: int) -> tuple[pa.Table, list[dict]]:
    """Raw episodes of any number of window keys -> windowed episodes and rejects."""
    by_key: dict[str, list[dict]] = {}
    for row in rows.to_pylist():
        key = window_key(row["group_id"], row["kind"], row["conversation_id"], row["episode_id"])
        by_key.setdefault(key, []).append(row)
    episodes: list[dict] = []
    rejects: list[dict] = []
    for _, records in sorted(by_key.items()):
        kept, rejected = window_conversation(records, context_messages, run_id=run_id,
                                             created_at=created_at, payload_chars=payload_chars)
        episodes += kept
        rejects += rejected
    return schema.from_rows(episodes, schema.WINDOWED_EPISODES), rejects


def window_conversation(records: list[dict], context_messages: int, *, run_id: str,
                        created_at: datetime, payload_chars: int) -> tuple[list[dict], list[dict]]:
    """One window key's rows (a conversation, or one non-message episode id) -> deduplicated
    episodes with the previous `context_messages` messages as `context`, plus rejects.

    A record whose id was already seen with identical content is a re-delivery: dropped, as
    re-ingesting is a no-op. The same id with different content is a conflict: the first
    occurrence (by file and line) is kept and the other goes to rejects.
    """
    records = sorted(records, key=lambda r: (r["episode_id"], r["file"], r["line"]))
    kept: dict[str, dict] = {}
    rejects: list[dict] = []
    for record in records:
        first = kept.get(record["episode_id"])
        if first is None:
            kept[record["episode_id"]] = record
        elif first["content_hash"] != record["content_hash"]:
            rejects.append(reject_row(
                run_id=run_id, stage="window", file=record["file"], line=record["line"],
                group_id=record["group_id"], episode_id=record["episode_id"],
                reason=(f"duplicate id {record['source_id']!r} with different content; "
                        f"kept {first['file']}:{first['line']}"),
                payload=(record["content"] or "")[:payload_chars], created_at=created_at,
            ))
    ordered = sorted(kept.values(), key=lambda r: (r["valid_at"], r["source_id"]))
    history: list[str] = []
    for record in ordered:
        if episode_kind(record["kind"]).windowed and context_messages:
            record["context"] = history[-context_messages:]
            history.append(context_line(record))
        else:
            record["context"] = []
    return ordered, rejects


def window_key(group_id: str, kind: str, conversation_id: str | None, episode_id: str) -> str:
    """Turns of a windowed kind (messages) are windowed per conversation; other episodes
    only deduplicated by id."""
    if episode_kind(kind).windowed:
        return f"{group_id}\x1fc\x1f{conversation_id}"
    return f"{group_id}\x1fe\x1f{episode_id}"


# The read stage's Ray tasks live here, not in its module: a worker imports the module of
# the function it runs, and a stage's module imports the stages package, every stage with
# it (igraph among them): 1.51 s after `import ray`, against 0.3 s for this module.


def read_span(path: Path | str | Span, run_id: str, config: TkgConfig, created_at: datetime
              ) -> tuple[pa.Table, pa.Table, ReadStats]:
    """`read_file` under a build's config: what a read task does, or the driver for an
    input one task would read alone (`engine.task_blocks`)."""
    return read_file(path, run_id=run_id, limits=config.limits, created_at=created_at,
                     storage_config=config.storage)


@ray.remote(num_returns=3)
def read_task(path: Path | str | Span, run_id: str, config: TkgConfig, created_at: datetime
              ) -> tuple[pa.Table, pa.Table, tuple[ReadStats, list[Any]]]:
    """`read_span` as a task: the episodes and rejects, then the stats and both tables'
    `block_metadata` (`engine.task_blocks`)."""
    episodes, rejects, stats = read_span(path, run_id, config, created_at)
    return episodes, rejects, (stats, [block_metadata(t) for t in (episodes, rejects)])


lines_task = ray.remote(lines_starting)
