import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tkg.pipeline import schema, store


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
    store.build_catalog(snapshot, list(schema.PUBLISHED))
    with duckdb.connect(str(snapshot / store.CATALOG), read_only=True) as con:
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
