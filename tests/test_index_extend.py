"""A publish that extends a LanceDB table leaves the rows it adds outside the indexes until
they pass `index.MAX_UNINDEXED_SHARE` of the table (pipeline/index.py `_extend`): LanceDB
searches them exactly beside the indexed rows, so a search finds every added row and no
deleted one, and the extension that passes the share puts them into every index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from tkg.pipeline import index, store
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.index import SPECS, Extendable, build_indexes, connect

DIM = 32


def _edited(table: pa.Table, changed: int, dropped: int) -> pa.Table:
    """`table` with its first `changed` rows' texts replaced (deleted and added rows of an
    extension) and the next `dropped` rows left out (deleted)."""
    text = SPECS["facts"].text[-1]
    edited = table.slice(0, changed).set_column(
        table.schema.get_field_index(text), text,
        pa.array([f"zanzibar quokka {i}" for i in range(changed)]))
    return pa.concat_tables([table.slice(changed + dropped), edited])


def _extend(snapshot: Path, tables: dict, base: Extendable, config: QueryConfig) -> dict:
    built = build_indexes(snapshot, DIM, config, tables=tables, bases={"facts": base})
    return built["facts"]


def _unindexed(folder: Path, version: int) -> dict[str, int]:
    table = connect(folder).open_table("facts")
    table.checkout(version)
    return {i.name: table.index_stats(i.name).num_unindexed_rows
            for i in table.list_indices()}


def test_added_rows_are_searched_before_they_are_indexed(tmp_path):
    from tkg.jobs.bench.query import synth_tables, write_store

    config = QueryConfig(ann_min_rows=500)
    tables, _ = synth_tables(3_000, DIM, 3, seed=5)
    write_store(tmp_path, tables, DIM, config)
    first = store.current_snapshot(tmp_path)
    figures = store.read_manifest(first)["retrieval"]["facts"]
    assert figures["vector_index"] == config.ann_index
    folder = first / "lance"
    base = Extendable(folder, int(figures["version"]), int(figures["appends"]), folder)

    facts = tables["facts"]
    night = _edited(facts, changed=7, dropped=5)
    built = _extend(store.prepare_snapshot(tmp_path, "night-1"), {**tables, "facts": night},
                    base, config)
    assert built["extended"] and (built["added"], built["deleted"]) == (7, 12), built
    assert built["unindexed"] == 7
    assert set(_unindexed(folder, built["version"]).values()) == {7}  # every index

    table = connect(folder).open_table("facts")
    table.checkout(built["version"])
    found = table.search("zanzibar quokka", query_type="fts").select(["text"]).limit(20)
    assert sorted(found.to_arrow()["text"].to_pylist()) == sorted(
        f"zanzibar quokka {i}" for i in range(7))
    vectors = np.stack(facts["fact_embedding"].to_numpy(zero_copy_only=False))

    def nearest(at: int) -> str:
        return (table.search(vectors[at].astype(np.float32), vector_column_name="vector")
                .distance_type("cosine").nprobes(config.nprobes).select(["text"]).limit(1)
                .to_arrow()["text"][0].as_py())

    assert nearest(3) == "zanzibar quokka 3"  # edited: deleted, and added unindexed
    assert nearest(9) != facts["fact"][9].as_py()  # dropped
    assert table.count_rows() == facts.num_rows - 5

    # a night that passes the share puts every added row into the indexes
    later = _edited(facts, changed=300, dropped=5)  # (changed rows count twice)
    second = Extendable(folder, int(built["version"]), int(built["appends"]), folder,
                        int(built["unindexed"]))
    rebuilt = _extend(store.prepare_snapshot(tmp_path, "night-2"), {**tables, "facts": later},
                      second, config)
    assert rebuilt["extended"] and rebuilt["unindexed"] == 0, rebuilt
    assert rebuilt["added"] > index.MAX_UNINDEXED_SHARE * rebuilt["rows"] - 7
    assert set(_unindexed(folder, rebuilt["version"]).values()) == {0}
