import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tkg.pipeline import schema, store
from tkg.pipeline.config import QueryConfig


def test_group_parts_and_empty_tables_are_readable_in_duckdb(tmp_path):
    snapshot = tmp_path / "snap"
    rows = pa.table({"episode_id": ["e1", "e2", "e3"], "entity_id": ["a", "b", "c"],
                     "group_id": ["g1", "g2", "g1"]})
    counts = store.write_group_parts(rows, snapshot / "mentions", schema.MENTIONS)
    assert dict(zip(counts["group_id"].to_pylist(), counts["rows"].to_pylist(),
                    strict=True)) == {"g1": 2, "g2": 1}
    assert sorted(p.name for p in (snapshot / "mentions").iterdir()) == [
        "group_id=g1", "group_id=g2"]
    for table in schema.PUBLISHED:
        if table != "mentions":
            store.write_empty(snapshot / table, schema.PUBLISHED[table](4))
    store.write_empty(snapshot / "mentions", schema.MENTIONS)
    store.build_catalog(snapshot)
    with store.open_catalog(snapshot) as con:
        assert con.execute("SELECT count(*) FROM mentions WHERE group_id = ?",
                           ["g1"]).fetchone() == (2,)
        assert con.execute("SELECT count(*) FROM facts_current").fetchone() == (0,)
        columns = [r[0] for r in con.execute("DESCRIBE entities").fetchall()]
        assert columns == schema.entities(4).names


def test_rows_without_group_are_kept(tmp_path):
    rejects = schema.from_rows([{"run_id": "r", "stage": "read", "reason": "bad"}],
                               schema.REJECTS)
    store.write_group_parts(rejects, tmp_path / "rejects", schema.REJECTS)
    back = pq.read_table(tmp_path / "rejects" / "group_id=_none", partitioning=None)
    assert back["group_id"].to_pylist() == [None]


def test_parts_are_streamed_into_a_file_per_group_without_the_replaced_keys(
        tmp_path, monkeypatch):
    """`write_parts` reads a batch at a time and writes a row group once a group's rows fill
    one: the same rows as the files read whole, filtered and split by group (nulls too)."""
    monkeypatch.setattr(store, "STREAM_ROWS", 3)
    monkeypatch.setattr(store, "ROW_GROUP_BYTES", 1)
    files = []
    for part, groups in enumerate([["g1", "g2", "g1", None, "g1"], ["g2", "g2", "g1"]]):
        rows = pa.table({"episode_id": [f"e{part}{i}" for i in range(len(groups))],
                         "entity_id": [f"x{i % 3}" for i in range(len(groups))],
                         "group_id": groups})
        files.append(str(tmp_path / f"in{part}.parquet"))
        pq.write_table(rows, files[-1])
    written = store.write_parts(files, tmp_path / "out", schema.MENTIONS, None, "entity_id",
                                pa.array(["x1"]))
    expected = pa.concat_tables([pq.read_table(f) for f in files])
    expected = expected.filter(pa.compute.not_equal(expected["entity_id"], "x1"))
    assert written == expected.num_rows == 5
    by_group = {}
    for folder in sorted((tmp_path / "out").iterdir()):
        (only,) = folder.iterdir()  # one file per group
        by_group[folder.name] = sorted(pq.read_table(only)["episode_id"].to_pylist())
        assert pq.ParquetFile(only).schema_arrow == schema.MENTIONS
    assert by_group == {"group_id=_none": ["e03"], "group_id=g1": ["e00", "e02", "e12"],
                        "group_id=g2": ["e10"]}
    assert pq.ParquetFile(tmp_path / "out" / "group_id=g1" / next(
        (tmp_path / "out" / "group_id=g1").iterdir()).name).metadata.num_row_groups > 1


def test_current_switches_only_to_a_complete_snapshot(tmp_path):
    assert store.current_run(tmp_path) is None
    with pytest.raises(store.StoreError, match="tkg build"):
        store.current_snapshot(tmp_path)
    snapshot = store.prepare_snapshot(tmp_path, "run-1")
    with pytest.raises(store.StoreError, match="no manifest"):
        store.switch_current(tmp_path, "run-1")
    store.write_manifest(snapshot, {"run_id": "run-1"})
    store.switch_current(tmp_path, "run-1")
    assert store.current_run(tmp_path) == "run-1"
    assert json.loads((snapshot / store.MANIFEST).read_text())["run_id"] == "run-1"
    assert not list(tmp_path.glob(".CURRENT*"))


def test_a_crashed_publish_leaves_the_last_good_snapshot(tmp_path):
    good = store.prepare_snapshot(tmp_path, "good")
    store.write_manifest(good, {"run_id": "good"})
    store.switch_current(tmp_path, "good")
    half = store.prepare_snapshot(tmp_path, "half")
    (half / "entities").mkdir()  # the crash happens before the manifest and the switch
    assert store.current_snapshot(tmp_path) == good
    again = store.prepare_snapshot(tmp_path, "half")  # a rerun starts clean
    assert not any(again.iterdir())
    with pytest.raises(store.StoreError, match="already published"):
        store.prepare_snapshot(tmp_path, "good")


def _facts(n: int, group: str = "g1") -> pa.Table:
    rows = [{"edge_id": f"e{i}", "group_id": group, "fact": f"fact {i}", "version": 1,
             "fact_embedding": [1.0, 0.0, 0.0, float(i)], "created_at": store.now()}
            for i in range(n)]
    return schema.from_rows(rows, schema.facts(4))


def _publish(store_dir, run_id: str, tables: dict, **options) -> dict:
    """`store.publish` of in-memory tables (every other published table empty)."""
    writers = {name: (lambda target, t=table, name=name: store.write_table(
        t, target, schema.PUBLISHED[name](4))) for name, table in tables.items()}
    for name, make in schema.PUBLISHED.items():
        if name not in tables and name not in options.get("kept", ()) and name != "runs":
            writers[name] = lambda target, make=make: store.write_table(
                make(4).empty_table(), target, make(4))

    def describe(done: store.Published):
        run = schema.from_rows([{"run_id": run_id, "status": "succeeded"}], schema.RUNS)
        return {"run_id": run_id, "tables": done.rows, "retrieval": done.retrieval}, run

    return store.publish(store_dir, run_id, writers, dim=4, query=QueryConfig(),
                         describe=describe, **options)


def test_publish_keeps_tables_and_their_indexes_from_the_previous_snapshot(tmp_path):
    first = _publish(tmp_path, "r1", {"facts": _facts(3)}, previous=None)
    assert first["tables"]["facts"] == 3 and first["retrieval"]["facts"]["rows"] == 3
    old = store.snapshot_dir(tmp_path, "r1")
    second = _publish(tmp_path, "r2", {"communities": schema.communities(4).empty_table()},
                      previous=old, kept=["facts"])
    new = store.snapshot_dir(tmp_path, "r2")
    assert store.current_run(tmp_path) == "r2"
    assert second["tables"]["facts"] == 3
    assert second["retrieval"]["facts"] == first["retrieval"]["facts"]  # linked, not rebuilt
    part = next((old / "facts").glob("group_id=*/part-*.parquet"))  # referenced, not copied
    assert second["files"]["facts"] == [f"../r1/{part.relative_to(old).as_posix()}"]
    assert not (new / "facts").exists() and second["lance"]["facts"] == "../r1/lance"
    with store.connect(tmp_path) as con:
        assert con.execute("SELECT count(*) FROM facts_current").fetchone() == (3,)
        assert con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall() == [
            ("r1",), ("r2",)]


def test_a_copied_store_reads_its_own_files(tmp_path, monkeypatch):
    """The catalog names files relative to its snapshot: a copy whose original is gone
    answers from its own files, and a catalog opened without its folder fails loudly
    instead of reading another snapshot's files."""
    import shutil

    original, copy = tmp_path / "original", tmp_path / "copy"
    _publish(original, "r1", {"facts": _facts(2)}, previous=None)
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    with store.connect(copy) as con:
        assert con.execute("SELECT count(*) FROM facts_current").fetchone() == (2,)
        assert con.execute("SELECT count(*) FROM entities").fetchone() == (0,)
    monkeypatch.chdir(tmp_path)
    with duckdb.connect(str(store.current_snapshot(copy) / store.CATALOG),
                        read_only=True) as con, pytest.raises(duckdb.IOException):
        con.execute("SELECT count(*) FROM facts").fetchone()


@pytest.mark.parametrize("point", ["publish:tables", "publish:catalog", "publish:indexes",
                                   "before_switch"])
def test_a_crash_while_publishing_keeps_the_good_snapshot(tmp_path, monkeypatch, point):
    from tkg.pipeline import faults

    _publish(tmp_path, "good", {"facts": _facts(2)}, previous=None)
    monkeypatch.setenv(faults.ENV, point)
    with pytest.raises(faults.InjectedCrash):
        _publish(tmp_path, "next", {"facts": _facts(5)}, previous=None)
    assert store.current_run(tmp_path) == "good"
    with store.connect(tmp_path) as con:
        assert con.execute("SELECT count(*) FROM facts_current").fetchone() == (2,)
    monkeypatch.delenv(faults.ENV)
    _publish(tmp_path, "next", {"facts": _facts(5)}, previous=None)
    with store.connect(tmp_path) as con:
        assert con.execute("SELECT count(*) FROM facts_current").fetchone() == (5,)
