"""Ingestion and validation: every record read is an episode or a reject with a reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tkg.pipeline import schema, sources
from tkg.pipeline.config import LimitsConfig
from tkg.pipeline.sources import (
    InputError,
    RecordError,
    Span,
    discover,
    lines_starting,
    read_file,
    to_episode,
    window_episodes,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LIMITS = LimitsConfig()


def message(**overrides) -> dict:
    record = {"group_id": "g1", "id": "m1", "kind": "message", "timestamp": "2024-03-01T10:00:00Z",
              "conversation_id": "c1", "speaker": "Ana", "content": "I live in Porto."}
    record.update(overrides)
    return record


def read(path):
    return read_file(path, run_id="r", limits=LIMITS, created_at=NOW)


def test_message_becomes_episode_with_deterministic_id():
    row, missing = to_episode(message(), LIMITS)
    again, _ = to_episode(message(), LIMITS)
    assert row["episode_id"] == again["episode_id"]
    assert row["valid_at"] == datetime(2024, 3, 1, 10, tzinfo=UTC)
    assert not missing
    other_group, _ = to_episode(message(group_id="g2"), LIMITS)
    assert other_group["episode_id"] != row["episode_id"]


def test_timestamp_without_zone_is_utc_and_counted():
    row, missing = to_episode(message(timestamp="2024-03-01T10:00:00"), LIMITS)
    assert missing and row["valid_at"].tzinfo is not None
    row, _ = to_episode(message(timestamp="2024-03-01T12:00:00+02:00"), LIMITS)
    assert row["valid_at"] == datetime(2024, 3, 1, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (message(group_id="../etc"), "invalid group_id"),
        (message(group_id="x" * 129), "invalid group_id"),
        (message(timestamp=None), "timestamp"),
        (message(timestamp="yesterday"), "not ISO-8601"),
        (message(speaker=None), "missing field 'speaker'"),
        (message(content={"a": 1}), "must be a string"),
        (message(kind="audio"), "unknown kind"),
        (message(content="x" * (LIMITS.max_content_chars + 1)), "over the limit"),
        ({"group_id": "g", "id": "j", "kind": "json", "timestamp": "2024-01-01", "source": "s",
          "data": [1]}, "must be a JSON object"),
        ({"group_id": "g", "id": "t", "kind": "text", "timestamp": "2024-01-01"},
         "missing field 'content'"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_invalid_records_have_a_reason(record, reason):
    with pytest.raises(RecordError, match=reason):
        to_episode(record, LIMITS)


def test_json_record_data_may_be_a_string():
    record = {"group_id": "g", "id": "r1", "kind": "json", "timestamp": "2024-01-01T00:00:00Z",
              "source": "crm.customers", "data": json.dumps({"name": "Globex"})}
    row, _ = to_episode(record, LIMITS)
    assert json.loads(row["content"]) == {"name": "Globex"}


def test_deep_json_is_rejected_not_crashing():
    data: dict = {}
    node = data
    for _ in range(200):
        node["x"] = {}
        node = node["x"]
    record = {"group_id": "g", "id": "r", "kind": "json", "timestamp": "2024-01-01T00:00:00Z",
              "source": "s", "data": data}
    with pytest.raises(RecordError, match="nested deeper"):
        to_episode(record, LIMITS)


def test_bad_lines_go_to_rejects_with_file_line_and_reason(tmp_path):
    path = tmp_path / "mixed.jsonl"
    good = json.dumps(message()).encode()
    lines = [
        good,
        b"{not json",
        json.dumps(message(id="m2", timestamp=None)).encode(),
        json.dumps(message(id="m3", group_id="bad group!")).encode(),
        b'{"group_id": "g1", "id": "m4", "content": "caf\xe9"}',
        b"",
        json.dumps(message(id="m5", content="second good line")).encode(),
        b"[1, 2, 3]",
        b"[" * 100_000 + b"]" * 100_000,
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    episodes, rejects, stats = read(path)
    assert stats.episodes_in == 8  # the blank line is not a record
    assert stats.episodes_in == stats.episodes_ok + stats.rejected
    assert episodes["source_id"].to_pylist() == ["m1", "m5"]
    by_line = {r["line"]: r["reason"] for r in rejects.to_pylist()}
    assert set(by_line) == {2, 3, 4, 5, 8, 9}
    assert "malformed JSON" in by_line[2]
    assert "timestamp" in by_line[3]
    assert "group_id" in by_line[4]
    assert "UTF-8" in by_line[5]
    assert "JSON object" in by_line[8]
    assert "JSON" in by_line[9]
    assert all(r["file"] == str(path) for r in rejects.to_pylist())
    payload = {r["line"]: r["payload"] for r in rejects.to_pylist()}
    assert payload[2] == "{not json"
    assert len(payload[9]) <= LIMITS.reject_payload_chars + 1


def test_over_long_line_is_rejected_without_reading_it_whole(tmp_path):
    path = tmp_path / "long.jsonl"
    limits = LimitsConfig(max_line_bytes=1000)
    huge = json.dumps(message(content="y" * 5000))
    path.write_text(huge + "\n" + json.dumps(message(id="ok")) + "\n")
    episodes, rejects, _ = read_file(path, run_id="r", limits=limits, created_at=NOW)
    assert episodes["source_id"].to_pylist() == ["ok"]
    assert rejects["line"].to_pylist() == [1]
    assert "over the limit" in rejects["reason"][0].as_py()


def _awkward_lines() -> bytes:
    """Good records between blank lines, an over-long line, bad UTF-8, malformed JSON and
    a CRLF line, without a final newline: every kind of line a span boundary can cut."""
    lines = [json.dumps(message(id=f"m{i}", content=f"Line {i} " + "x" * (i % 7) * 9)).encode()
             for i in range(40)]
    lines[5] = b""
    lines[11] = json.dumps(message(id="long", content="z" * 3_000)).encode()
    lines[17] = b"\xff\xfe garbage"
    lines[23] = b"{not json"
    lines[24] = b"   "
    lines[29] = json.dumps(message(id="crlf")).encode() + b"\r"
    return b"\n".join(lines)


@pytest.mark.parametrize("span_bytes", [1, 7, 64, 333, 2_500, 10**6])
def test_a_file_read_in_spans_gives_what_one_read_gives(tmp_path, span_bytes):
    """Spans of any size (one byte, mid-line, mid over-long line, the whole file) give the
    same episodes and rejects, line numbers included, as one read of the file."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(_awkward_lines())
    limits = LimitsConfig(max_line_bytes=1_000)
    whole = read_file(path, run_id="r", limits=limits, created_at=NOW)
    parts, first_line = [], 1
    for start, end in sources.spans(path, span_bytes=span_bytes):
        parts.append(read_file(Span(path, start, end, first_line), run_id="r", limits=limits,
                               created_at=NOW))
        first_line += lines_starting(path, start, end)
    assert first_line == 41  # the 40 lines, blank ones included
    for index in (0, 1):
        assert pa.concat_tables([part[index] for part in parts]).equals(whole[index])
    assert whole[0].num_rows == 35 and whole[1].num_rows == 3  # long, bad UTF-8, not JSON
    assert sum(part[2].episodes_in for part in parts) == whole[2].episodes_in


def test_parquet_input(tmp_path):
    path = tmp_path / "records.parquet"
    rows = [
        {"group_id": "g", "id": "r1", "kind": "json", "timestamp": "2024-01-01T00:00:00Z",
         "source": "crm.customers", "data": json.dumps({"customer_id": "C-1"}), "content": None},
        {"group_id": "g", "id": "r2", "kind": "text", "timestamp": "2024-01-02T00:00:00Z",
         "source": None, "data": None, "content": "A memo."},
        {"group_id": "g", "id": "r3", "kind": "text", "timestamp": "never",
         "source": None, "data": None, "content": "Bad time."},
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    episodes, rejects, stats = read(path)
    assert sorted(episodes["source_id"].to_pylist()) == ["r1", "r2"]
    assert rejects["line"].to_pylist() == [3]
    assert stats.episodes_in == 3


def test_discover_files_folders_and_globs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.jsonl").write_text("")
    (tmp_path / "a" / "notes.txt").write_text("")
    (tmp_path / "two.parquet").write_bytes(b"")
    assert [p.name for p in discover([str(tmp_path / "a")])] == ["one.jsonl"]
    assert [p.name for p in discover([str(tmp_path / "**" / "*.jsonl")])] == ["one.jsonl"]
    assert len(discover([str(tmp_path)])) == 2
    with pytest.raises(InputError, match="matches no file"):
        discover([str(tmp_path / "missing*.jsonl")])


def _raw(rows: list[dict]) -> pa.Table:
    episodes = []
    for line, record in enumerate(rows, start=1):
        row, _ = to_episode(record, LIMITS)
        row.update(file="f.jsonl", line=line, created_at=NOW, run_id="r")
        episodes.append(row)
    return schema.from_rows(episodes, schema.RAW_EPISODES)


def test_window_keeps_previous_messages_in_time_order():
    rows = [message(id=f"m{i}", timestamp=f"2024-03-01T10:0{i}:00Z", content=f"line {i}")
            for i in (5, 1, 3, 2, 4, 0)]
    episodes, rejects = window_episodes(_raw(rows), 4, run_id="r", created_at=NOW,
                                        payload_chars=100)
    assert not rejects
    assert episodes["source_id"].to_pylist() == [f"m{i}" for i in range(6)]
    contexts = episodes["context"].to_pylist()
    assert contexts[0] == []
    assert contexts[5] == [f"Ana: line {i}" for i in range(1, 5)]


def test_window_drops_redeliveries_and_rejects_conflicting_ids():
    rows = [message(), message(), message(content="a different text")]
    episodes, rejects = window_episodes(_raw(rows), 4, run_id="r", created_at=NOW,
                                        payload_chars=100)
    assert episodes.num_rows == 1
    assert episodes["content"][0].as_py() == "I live in Porto."
    assert len(rejects) == 1
    assert rejects[0]["line"] == 3
    assert "different content" in rejects[0]["reason"]


def test_unreachable_object_storage_is_an_input_error(s3_config):
    import pytest
    from tkg.pipeline.sources import InputError, discover

    with pytest.raises(InputError, match="no-such-bucket"):
        discover(["s3://no-such-bucket/in"], s3_config.storage)
    with pytest.raises(ValueError, match="unsupported scheme"):
        discover(["ftp://host/in"])


def test_the_read_stage_reads_a_big_file_in_spans_on_ray(tmp_path, ray_session, config,
                                                         monkeypatch):
    """The read stage cuts a file past `SPAN_BYTES` into spans, a Ray task each, and gets
    the rows and counts one task gets (this test's file: 16 spans)."""
    from tkg.pipeline import engine
    from tkg.pipeline.context import RunContext
    from tkg.pipeline.stages import read

    path = tmp_path / "in.jsonl"
    path.write_bytes(_awkward_lines())
    limited = config.model_copy(update={"limits": LimitsConfig(max_line_bytes=1_000)})

    def read_all() -> tuple[list[pa.Table], dict[str, int]]:
        ctx = RunContext(config=limited, run_id="r", created_at=NOW, files=[path],
                         work_dir=tmp_path, dim=384, cpus=2)
        out = read.read_stage(ctx, {})
        return [engine.gather(ctx, out[name]).sort_by("line")
                for name in ("raw_episodes", "read_rejects")], ctx.counters

    whole, counted = read_all()
    monkeypatch.setattr(sources, "SPAN_BYTES", 600)
    assert len(sources.spans(path)) == 16
    spanned, counted_in_spans = read_all()
    assert [t.num_rows for t in whole] == [35, 3]
    assert spanned[0].equals(whole[0]) and spanned[1].equals(whole[1])
    assert counted_in_spans == counted
