"""Locations in object storage, against a real S3-compatible server (moto, tests/s3.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tkg.pipeline import sources, storage
from tkg.pipeline.config import LimitsConfig, StorageConfig

CORPUS = Path(__file__).resolve().parent / "corpus"


@pytest.fixture
def settings(s3) -> StorageConfig:
    return StorageConfig.model_validate(s3.storage())


def _upload(local: Path, url: str, settings: StorageConfig) -> None:
    storage.write_bytes(url, local.read_bytes(), settings)


def test_objects_round_trip(s3, settings):
    root = s3.url()
    storage.write_text(storage.join(root, "a", "CURRENT"), "run-1\n", settings)
    storage.write_bytes(storage.join(root, "a", "b", "x.jsonl"), b"{}\n", settings)
    assert storage.read_text(storage.join(root, "a", "CURRENT"), settings) == "run-1\n"
    assert storage.is_file(storage.join(root, "a", "CURRENT"), settings)
    assert not storage.exists(storage.join(root, "missing"), settings)
    assert storage.list_files(root, settings) == [
        f"{root}/a/CURRENT", f"{root}/a/b/x.jsonl"]
    assert storage.list_files(root, settings, {".jsonl"}) == [f"{root}/a/b/x.jsonl"]
    storage.delete_dir(storage.join(root, "a", "b"), settings)
    assert storage.list_files(root, settings) == [f"{root}/a/CURRENT"]


def test_local_paths_and_bad_urls(tmp_path):
    fs, path = storage.resolve(tmp_path / "x")
    assert type(fs).__name__ == "LocalFileSystem" and path == (tmp_path / "x").as_posix()
    assert storage.resolve(f"file://{tmp_path}")[1] == tmp_path.as_posix()
    with pytest.raises(storage.StorageError, match="unsupported scheme"):
        storage.resolve("ftp://host/x")
    with pytest.raises(storage.StorageError, match="names no bucket"):
        storage.resolve("s3://")


def test_endpoint_from_environment(s3, monkeypatch):
    """Without a `storage` section the usual AWS_ENDPOINT_URL reaches the same server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    url = storage.join(s3.url(), "env.txt")
    storage.write_text(url, "via env")
    assert storage.read_text(url) == "via env"
    assert storage.lance_options(url)["aws_endpoint"] == s3.endpoint
    assert storage.lance_options("/local/path") is None


def test_discover_objects(s3, settings):
    root = s3.url()
    for name in ("conversations.jsonl", "records.jsonl"):
        _upload(CORPUS / name, f"{root}/in/{name}", settings)
    storage.write_bytes(f"{root}/in/notes.txt", b"not an input", settings)
    files = [f"{root}/in/conversations.jsonl", f"{root}/in/records.jsonl"]
    assert sources.discover([f"{root}/in"], settings) == files
    assert sources.discover([f"{root}/in/rec*.jsonl"], settings) == files[1:]
    assert sources.discover([files[0]], settings) == files[:1]
    with pytest.raises(sources.InputError, match="matches no"):
        sources.discover([f"{root}/nothing"], settings)


def _read(path, settings=None):
    return sources.read_file(path, run_id="r", limits=LimitsConfig(),
                             created_at=datetime(2026, 1, 1, tzinfo=UTC), storage_config=settings)


@pytest.mark.parametrize("name", ["conversations.jsonl", "records.jsonl"])
def test_read_objects_like_files(s3, settings, name):
    """An object reads into the same episodes and rejects as the local file."""
    url = f"{s3.url()}/{name}"
    _upload(CORPUS / name, url, settings)
    local, remote = _read(CORPUS / name), _read(url, settings)
    assert remote[0].drop_columns(["file"]) == local[0].drop_columns(["file"])
    assert remote[1].drop_columns(["file"]) == local[1].drop_columns(["file"])
    assert set(remote[0]["file"].to_pylist()) <= {url}
    assert remote[2].episodes_in == local[2].episodes_in > 0


def test_read_an_object_in_spans(s3, settings):
    """Spans of an object (ranged reads, a count of the lines before each) give what one
    read of it gives."""
    url = f"{s3.url()}/spans/conversations.jsonl"
    _upload(CORPUS / "conversations.jsonl", url, settings)
    whole = _read(url, settings)
    cut = sources.spans(url, settings, span_bytes=997)
    assert len(cut) > 3
    parts, first_line = [], 1
    for start, end in cut:
        parts.append(_read(sources.Span(url, start, end, first_line), settings))
        first_line += sources.lines_starting(url, start, end, settings)
    assert pa.concat_tables([part[0] for part in parts]).equals(whole[0])
    assert pa.concat_tables([part[1] for part in parts]).equals(whole[1])


def test_read_parquet_object(s3, settings, tmp_path):
    episodes, _, _ = _read(CORPUS / "records.jsonl")
    rows = [{"group_id": r["group_id"], "id": r["source_id"], "kind": "text",
             "timestamp": r["valid_at"].isoformat(), "content": r["content"]}
            for r in episodes.to_pylist()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    url = f"{s3.url()}/in.parquet"
    _upload(tmp_path / "in.parquet", url, settings)
    remote, _, stats = _read(url, settings)
    assert remote.num_rows == len(rows) == stats.episodes_ok


def _kept_by_key(rows):
    """The rows of every third key, as a keyed read keeps them (`storage.rows_in`)."""
    return storage.rows_in(rows, rows["key"], pa.array([f"k{i}" for i in range(0, 50, 3)]))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_keyed_read_streams_a_file_into_its_kept_rows(s3, settings, tmp_path, where):
    """A file read a batch at a time gives the rows a read of it whole and filtered gives,
    in the columns asked for and their order, and an empty table of them when none is
    kept (`storage.read_parquet_rows`)."""
    table = pa.table({"group_id": ["g"] * 50, "key": [f"k{i}" for i in range(50)],
                      "vector": pa.array([[float(i)] * 4 for i in range(50)],
                                         pa.list_(pa.float32(), 4)),
                      "n": pa.array(range(50), pa.int64())})
    location = (tmp_path / "t.parquet") if where == "local" else f"{s3.url()}/t.parquet"
    storage.write_parquet(table, location, settings, row_group_size=16)
    columns = ["vector", "key"]
    streamed = storage.read_parquet_rows(location, _kept_by_key, columns, settings,
                                         batch_rows=7)
    whole = storage.read_parquet(location, columns, settings)
    assert streamed.column_names == columns
    assert streamed.equals(_kept_by_key(whole).combine_chunks())
    assert streamed.num_rows == 17
    none = storage.read_parquet_rows(location, lambda rows: rows.slice(0, 0), None, settings)
    assert none.num_rows == 0 and none.schema.names == table.schema.names


@pytest.mark.parametrize("where", ["local", "local without copy_file_range", "s3"])
def test_a_spliced_file_holds_its_ranges_and_bytes_in_order(s3, settings, tmp_path, where,
                                                             monkeypatch):
    """`storage.write_spliced`: ranges of a source (copied by the kernel locally, or
    through this process where the filesystem refuses; read a window at a time from an
    object store, here a window of 10 bytes: a range inside it, one across it, one longer
    than it) and bytes, in the order given."""
    if where == "local without copy_file_range":
        def refused(*_: object) -> int:
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(storage.os, "copy_file_range", refused)
    root = tmp_path if where.startswith("local") else s3.url()
    source, target = storage.join(root, "source.bin"), storage.join(root, "out", "spliced.bin")
    data = bytes(range(256)) * 4
    storage.write_bytes(source, data, settings)
    pieces = [b"head", (3, 5), (8, 4), memoryview(b"-mid-"), (40, 37), (600, 1), (1000, 24)]
    storage.write_spliced(target, source, iter(pieces), settings, window=10)
    expected = b"".join(p if not isinstance(p, tuple) else data[p[0]:p[0] + p[1]]
                        for p in pieces)
    assert storage.read_bytes(target, settings) == expected
    with pytest.raises(EOFError):
        storage.write_spliced(target, source, [(1020, 10)], settings, window=10)


def test_lancedb_on_object_storage(s3, settings):
    """LanceDB writes and searches a table under the bucket with the same settings."""
    import lancedb

    url = s3.url()
    db = lancedb.connect(url, storage_options=storage.lance_options(url, settings))
    db.create_table("t", pa.table({"id": ["a", "b"], "vector": [[1.0, 0.0], [0.0, 1.0]]}))
    hits = db.open_table("t").search([0.9, 0.1]).limit(1).to_list()
    assert hits[0]["id"] == "a"
    assert any("/t.lance/" in f for f in storage.list_files(url, settings))


def test_snapshot_in_object_storage_reads_through_duckdb(s3, monkeypatch, tmp_path, capsys):
    """A published snapshot copied to the bucket (as `aws s3 sync` would) is read where it
    lies: CURRENT, the manifest, and a DuckDB catalog built at open time over its objects;
    `tkg stats --store s3://...` counts it. Endpoint from AWS_ENDPOINT_URL, as on a cluster."""
    from tkg.jobs.cli import main
    from tkg.pipeline import schema, store

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    local = tmp_path / "store"
    snapshot = store.prepare_snapshot(local, "run-1")
    for table, table_schema in schema.PUBLISHED.items():
        store.write_empty(snapshot / table, table_schema(384))
    store.write_table(schema.from_rows(
        [{"group_id": "g", "entity_id": "e1", "name": "Ada"},
         {"group_id": "h", "entity_id": "e2", "name": "Bob"}], schema.PUBLISHED["entities"](384)),
        snapshot / "entities", schema.PUBLISHED["entities"](384))
    store.write_manifest(snapshot, {"run_id": "run-1", "summary": {}})
    store.switch_current(local, "run-1")
    remote = s3.url()
    assert store.current_run(remote) is None
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        storage.write_bytes(storage.join(remote, *path.relative_to(local).parts),
                            path.read_bytes())
    assert store.current_run(remote) == "run-1"
    with store.connect(remote) as con:
        assert con.execute("SELECT group_id, name FROM entities ORDER BY 1").fetchall() == [
            ("g", "Ada"), ("h", "Bob")]
        assert con.execute("SELECT count(*) FROM facts_current").fetchone() == (0,)
    assert main(["stats", "--store", remote, "--json"]) == 0
    assert '"entities": 2' in capsys.readouterr().out
    assert main(["report", "--store", remote, "--out", str(tmp_path / "r.html")]) == 0
    assert "run-1" in (tmp_path / "r.html").read_text()
