"""The visibility rule rendered three ways (DuckDB SQL, LanceDB filters, numpy masks) selects
the same rows, on generated facts and at the instants where facts begin and end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import duckdb
import lancedb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tkg.pipeline import schema, store, visibility
from tkg.pipeline.index import SPECS, micros

EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
GROUPS = ("g1", "g2", "g3")
TIMES = ("valid_at", "invalid_at", "created_at", "expired_at")
moment = st.integers(0, 5)  # days after EPOCH: few values, so equal instants are common
maybe = st.none() | moment
fact = st.fixed_dictionaries({"group_id": st.sampled_from(GROUPS),
                              **{c: maybe for c in TIMES}})


def day(n: int | None) -> datetime | None:
    return None if n is None else EPOCH + timedelta(days=n)


def us(n: int) -> int:
    return int((day(n) - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))


def facts_table(rows: list[dict]) -> pa.Table:
    ts = pa.timestamp("us", tz="UTC")
    return pa.table({"row": pa.array(range(len(rows)), pa.int64()),
                     "group_id": pa.array([r["group_id"] for r in rows], pa.string()),
                     **{c: pa.array([day(r[c]) for r in rows], ts) for c in TIMES}})


def by_duckdb(table: pa.Table, groups, as_of: int, known_at: int) -> set[int]:
    where = visibility.duckdb_where("facts", as_of="$as_of", known_at="$known_at",
                                    groups="$groups")
    with duckdb.connect() as con:
        con.register("facts", table)
        found = con.execute(f"SELECT row FROM facts WHERE {where}",
                            {"as_of": day(as_of), "known_at": day(known_at),
                             "groups": list(groups)}).fetchall()
    return {r for (r,) in found}


def indexed(table: pa.Table) -> pa.Table:
    """The `<time>_us` columns as the publish writes them (index.SPECS sentinels)."""
    sentinels = dict(SPECS["facts"].times)
    return table.select(["row", "group_id"]).append_column(
        "valid_at_us", micros(table["valid_at"], sentinels["valid_at"])).append_column(
        "invalid_at_us", micros(table["invalid_at"], sentinels["invalid_at"])).append_column(
        "created_at_us", micros(table["created_at"], sentinels["created_at"])).append_column(
        "expired_at_us", micros(table["expired_at"], sentinels["expired_at"]))


def by_lance(db, table: pa.Table, groups, as_of: int, known_at: int) -> set[int]:
    lance = db.create_table("facts", indexed(table), mode="overwrite")
    where = visibility.lance_where("facts", groups, as_of=us(as_of), known_at=us(known_at))
    found = lance.search().where(where).select(["row"]).limit(table.num_rows + 1).to_arrow()
    return set(found["row"].to_pylist())


def by_numpy(table: pa.Table, groups, as_of: int, known_at: int) -> set[int]:
    codes = np.array([GROUPS.index(g) for g in table["group_id"].to_pylist()], dtype=np.int64)
    allowed = np.array([GROUPS.index(g) for g in groups], dtype=np.int64)
    ok = visibility.group_table(allowed, len(GROUPS))[codes]
    ok &= visibility.numpy_mask("facts", visibility.arrow_times(table, "facts"),
                                as_of=us(as_of), known_at=us(known_at))
    return set(np.flatnonzero(ok).tolist())


@pytest.fixture(scope="module")
def lance_db(tmp_path_factory):
    return lancedb.connect(str(tmp_path_factory.mktemp("lance")))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(fact, min_size=1, max_size=12),
       groups=st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3, unique=True),
       as_of=moment, known_at=moment)
@example(rows=[{"group_id": "g1", "valid_at": 2, "invalid_at": 3, "created_at": 0,
                "expired_at": None},
               {"group_id": "g1", "valid_at": 3, "invalid_at": None, "created_at": 0,
                "expired_at": 3}],
         groups=["g1"], as_of=3, known_at=3)
def test_three_renderings_select_the_same_rows(lance_db, rows, groups, as_of, known_at):
    table = facts_table(rows)
    want = by_numpy(table, groups, as_of, known_at)
    assert by_duckdb(table, groups, as_of, known_at) == want
    assert by_lance(lance_db, table, groups, as_of, known_at) == want


def test_a_fact_ends_at_its_invalid_at_and_its_successor_begins_there(lance_db, tmp_path):
    """At the instant one fact ends and the next begins, only the next is visible: in every
    rendering, and in the catalog's macros (facts_as_of, facts_known_at) of a real store."""
    rows = [{"group_id": "g1", "valid_at": 1, "invalid_at": 3, "created_at": 0,
             "expired_at": None},  # held until day 3
            {"group_id": "g1", "valid_at": 3, "invalid_at": None, "created_at": 0,
             "expired_at": None},  # holds from day 3
            {"group_id": "g1", "valid_at": 1, "invalid_at": None, "created_at": 0,
             "expired_at": 2},  # a version the store stopped believing on day 2
            {"group_id": "g2", "valid_at": 1, "invalid_at": None, "created_at": 0,
             "expired_at": None}]  # another tenant
    table = facts_table(rows)
    assert by_numpy(table, ["g1"], 3, 5) == {1}
    assert by_duckdb(table, ["g1"], 3, 5) == {1}
    assert by_lance(lance_db, table, ["g1"], 3, 5) == {1}
    assert by_numpy(table, ["g1"], 2, 1) == {0, 2}  # before day 2 the old version was held
    assert by_numpy(table, ["g1"], 2, 2) == {0}  # ... and no longer at day 2

    assert visibility.current(table)["row"].to_pylist() == [0, 1, 3]
    ids = {f"e{i}": i for i in range(len(rows))}
    published = schema.conform(table.append_column(
        "edge_id", pa.array(list(ids))), schema.facts(4))
    snapshot = store.prepare_snapshot(tmp_path, "s")
    for name, make in schema.PUBLISHED.items():
        store.write_empty(snapshot / name, make(4))
    store.write_group_parts(published, snapshot / "facts", schema.facts(4))
    store.build_catalog(snapshot)
    with store.open_catalog(snapshot) as con:
        def edges(sql: str, *params) -> set[int]:
            return {ids[e] for (e,) in con.execute(sql, list(params)).fetchall()}

        assert edges("SELECT edge_id FROM facts_as_of(?)", day(3)) == {1, 3}
        assert edges("SELECT edge_id FROM facts_as_of(?)", day(3) - timedelta(microseconds=1)
                     ) == {0, 3}
        assert edges("SELECT edge_id FROM facts_known_at(?)", day(2)) == {0, 1, 3}
        assert edges("SELECT edge_id FROM facts_known_at(?)", day(1)) == {0, 1, 2, 3}
        assert edges("SELECT edge_id FROM facts_current") == {0, 1, 3}


def test_filters_refuse_what_is_not_an_id_or_a_parameter():
    with pytest.raises(ValueError, match="group id"):
        visibility.lance_where("facts", ["g1' OR '1'='1"], as_of=0, known_at=0)
    with pytest.raises(ValueError, match="parameter"):
        visibility.duckdb_where("facts", as_of="now(); DROP TABLE facts")
    assert visibility.duckdb_where("entities", as_of="t") == "TRUE"  # valid time: facts only
