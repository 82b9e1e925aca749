"""Shuffles and joins of the build meet empty blocks: blocks with no rows that kept the schema
they had before a map (Ray passes them through without calling the function), blocks with no
schema at all (a shuffle partition that received nothing), and inputs with no rows whatsoever.
Each helper the stages shuffle and join through must give the answer it gives without them."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

KEYED = pa.schema([("group_id", pa.string()), ("key", pa.string()), ("value", pa.int64())])


@pytest.fixture(scope="module", params=[0, 256], ids=["ray", "driver"])
def ctx(request, ray_session, config, tmp_path_factory):
    """Shuffles and joins on Ray Data (ray.driver_mb 0) and in the driver (small inputs)."""
    import sys

    from ray import cloudpickle
    from tkg.pipeline.context import RunContext

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests

    config = config.model_copy(update={
        "ray": config.ray.model_copy(update={"driver_mb": request.param})})
    return RunContext(config=config, run_id="empty-blocks", created_at=datetime.now(UTC),
                      files=[], work_dir=tmp_path_factory.mktemp("work"), dim=4, cpus=2)


def _dataset(*tables: pa.Table):
    import ray.data

    return ray.data.from_arrow(list(tables))


def _tag(batch: pa.Table) -> pa.Table:
    """A map that changes the schema: Ray skips it on empty blocks, which keep the old one."""
    return batch.append_column("side", pa.array(["new"] * batch.num_rows, pa.string()))


def _rows(ds) -> list[dict]:
    import ray

    rows = [row for ref in ds.to_arrow_refs() for row in ray.get(ref).to_pylist()]
    return sorted(rows, key=lambda r: tuple(str(v) for v in r.values()))


def _count_per_key(block: pa.Table) -> pa.Table:
    return block.group_by(["group_id", "key"]).aggregate([("value", "sum")])


FULL = pa.table({"group_id": ["g", "g", "h"], "key": ["a", "a", "b"], "value": [1, 2, 3]},
                schema=KEYED)
NO_SCHEMA = pa.table({})


@pytest.mark.parametrize("empty", [KEYED.empty_table(), NO_SCHEMA], ids=["stale", "schemaless"])
def test_shuffle_after_a_map_that_skipped_an_empty_first_block(ctx, empty):
    from tkg.pipeline.engine import shuffle

    tagged = _dataset(empty, FULL).map_batches(_tag, batch_format="pyarrow")
    out = shuffle(ctx, tagged, ["group_id", "key"], _count_per_key)
    assert _rows(out) == [{"group_id": "g", "key": "a", "value_sum": 3},
                          {"group_id": "h", "key": "b", "value_sum": 3}]


def _never(block: pa.Table, *_: object) -> pa.Table:
    raise AssertionError(f"called on {block.num_rows} rows")


@pytest.mark.parametrize("blocks", [[KEYED.empty_table()], [NO_SCHEMA], [NO_SCHEMA, NO_SCHEMA]],
                         ids=["stale", "schemaless", "several"])
def test_shuffle_of_no_rows_is_empty_without_calling_the_function(ctx, blocks):
    from tkg.pipeline.engine import partition, shuffle

    ds = _dataset(*blocks).map_batches(_tag, batch_format="pyarrow")
    assert shuffle(ctx, ds, ["group_id"], _never).count() == 0
    assert partition(ctx, ds, ["group_id"]).count() == 0


def test_partitioned_keeps_every_row_in_blocks_with_rows(ctx):
    import ray
    from tkg.pipeline.engine import partition

    out = partition(ctx, _dataset(NO_SCHEMA, FULL, KEYED.empty_table()), ["group_id"])
    tables = [ray.get(ref) for ref in out.to_arrow_refs()]
    assert all(t.num_rows for t in tables)
    assert sum(t.num_rows for t in tables) == 3


RIGHT = pa.table({"group_id": ["g"], "key": ["a"], "label": ["A"]})


@pytest.mark.parametrize(("join_type", "left", "right", "expected"), [
    ("inner", [FULL], [RIGHT.schema.empty_table()], 0),
    ("inner", [NO_SCHEMA], [RIGHT], 0),
    ("left_outer", [FULL], [NO_SCHEMA], 3),
    ("left_outer", [NO_SCHEMA], [RIGHT], 0),
    ("left_anti", [FULL], [RIGHT.schema.empty_table()], 3),
    ("left_anti", [NO_SCHEMA, FULL], [NO_SCHEMA, RIGHT], 1),
    ("inner", [KEYED.empty_table(), FULL], [NO_SCHEMA, RIGHT], 2),
])
def test_joins_with_an_empty_or_schemaless_side(ctx, join_type, left, right, expected):
    from tkg.pipeline.engine import join

    out = join(ctx, _dataset(*left), _dataset(*right), join_type, ("group_id", "key"))
    assert out.count() == expected


@pytest.mark.parametrize("join_type", ["inner", "left_outer", "left_anti"])
def test_a_big_left_joined_with_a_small_right_in_a_broadcast(ctx, join_type):
    """A right side that fits the driver against a left that does not: each left block is
    joined with the whole right in a map (no shuffle), with the rows of a hash join."""
    from tkg.pipeline.engine import join

    left = pa.table({"group_id": ["g", "h"] * 500, "key": [f"k{i % 7}" for i in range(1000)],
                     "value": list(range(1000))}, schema=KEYED)
    right = pa.table({"group_id": ["g", "h", "g"], "key": ["k1", "k2", "k9"],
                      "other": [10, 20, 30]})
    blocks = [left.slice(start, 100) for start in range(0, 1000, 100)]
    small = ctx.config.model_copy(update={"ray": ctx.config.ray.model_copy(
        update={"driver_mb": 4096 / 2**20})})  # 4 KB: the right fits, the left (20 KB) not
    broadcast = join(type(ctx)(**{**vars(ctx), "config": small}), _dataset(*blocks),
                     _dataset(right), join_type, ("group_id", "key"))
    expected = join(ctx, _dataset(*blocks), _dataset(right), join_type, ("group_id", "key"))
    assert _rows(broadcast) == _rows(expected)
    matched = sum((g, k) in {("g", "k1"), ("h", "k2")} for g, k in zip(
        left["group_id"].to_pylist(), left["key"].to_pylist(), strict=True))
    assert len(_rows(broadcast)) == {"inner": matched, "left_outer": 1000,
                                     "left_anti": 1000 - matched}[join_type]


def _facts(dim: int, edges: list[str], side: str) -> pa.Table:
    from tkg.pipeline import schema

    now = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [{"edge_id": e, "version": 1, "group_id": "g", "source_entity_id": "s",
             "target_entity_id": "t", "relation": "KNOWS", "fact": f"fact {e}",
             "episode_ids": ["ep"], "created_at": now} for e in edges]
    table = schema.conform(pa.Table.from_pylist(rows), schema.facts(dim))
    return table.append_column("side", pa.array([side] * table.num_rows, pa.string()))


def test_versions_with_an_empty_first_block_of_new_facts(ctx):
    """The nightly failure: this run's facts start with an empty block, the stored ones do
    not; versioning shuffles both by edge."""
    from tkg.pipeline import facts, schema
    from tkg.pipeline.engine import shuffle

    new = _dataset(schema.facts(ctx.dim).empty_table(),
                   _facts(ctx.dim, ["e2"], "new").drop_columns(["side"])).map_batches(
        lambda b: b.append_column("side", pa.array(["new"] * b.num_rows, pa.string())),
        batch_format="pyarrow")
    old = _dataset(_facts(ctx.dim, ["e1"], "old"))
    out = shuffle(ctx, new.union(old), ["edge_id"], facts.version_edges, ctx.created_at)
    assert sorted(r["edge_id"] for r in _rows(out)) == ["e1", "e2"]


def test_gather_is_bounded_by_the_policy(ctx):
    """A gather brings rows into the driver up to `ray.gather_mb` and stops the run past it,
    naming what it gathered; no rows gives an empty table of the asked columns."""
    import dataclasses

    from tkg.pipeline import engine

    ds = _dataset(NO_SCHEMA, FULL)
    assert engine.gather(ctx, ds, ["key"])["key"].to_pylist() == ["a", "a", "b"]
    assert engine.gather(ctx, _dataset(NO_SCHEMA), ["key"]).column_names == ["key"]
    tight = dataclasses.replace(ctx, config=ctx.config.model_copy(update={
        "ray": ctx.config.ray.model_copy(update={"gather_mb": 0})}))
    with pytest.raises(engine.DriverLimitError, match="stored pairs"):
        engine.gather(tight, ds, ["key"], what="stored pairs")


def test_shuffle_together_with_one_part_that_has_rows(ctx):
    """Several parts of which only one has rows: on Ray Data the union of that one part
    alone (which Ray cannot plan as a union) gives its rows, tagged once."""
    from tkg.pipeline.engine import shuffle_together

    def tag(block: pa.Table, name: str) -> pa.Table:
        return block.append_column("side", pa.array([name] * block.num_rows, pa.string()))

    out = shuffle_together(ctx, {"full": _dataset(FULL), "none": _dataset(KEYED.empty_table())},
                           ["group_id"], tag, lambda block: block)
    assert [(r["key"], r["side"]) for r in _rows(out)] == [("a", "full"), ("a", "full"),
                                                           ("b", "full")]


def test_union_of_parts_whose_blocks_differ_in_schema(ctx):
    """The million-episode failure: a union whose parts hold an empty block that kept its
    pre-map schema (here with a clashing type) and blocks lacking a column the others have.
    On either path it gives every row in one schema, the missing column null, and the
    shuffle after it runs."""
    from tkg.pipeline.engine import shuffle, union

    clashing = pa.table({"group_id": pa.array([], pa.string()),
                         "value": pa.array([], pa.string())})
    tagged = _dataset(clashing, FULL).map_batches(_tag, batch_format="pyarrow")
    untagged = _dataset(FULL.slice(2), NO_SCHEMA)
    united = union(ctx, tagged, untagged)
    assert _rows(united) == [
        {"group_id": "g", "key": "a", "value": 1, "side": "new"},
        {"group_id": "g", "key": "a", "value": 2, "side": "new"},
        {"group_id": "h", "key": "b", "value": 3, "side": None},
        {"group_id": "h", "key": "b", "value": 3, "side": "new"}]
    out = shuffle(ctx, united, ["group_id", "key"], _count_per_key)
    assert _rows(out) == [{"group_id": "g", "key": "a", "value_sum": 3},
                          {"group_id": "h", "key": "b", "value_sum": 6}]


def test_blocks_of_string_and_large_string_meet_in_one_step(ctx):
    """Ray Data's joins hand back large_string columns where the driver's blocks hold
    string; a night whose store went to Ray Data (`ray.driver_mb: 16`, 10,000 episodes)
    failed in embed when the driver concatenated both kinds. Shuffles, joins and gathers
    over such blocks give every row, on either path."""
    from tkg.pipeline import engine

    large = pa.table({"group_id": pa.array(["h"], pa.large_string()),
                      "key": pa.array(["c"], pa.large_string()),
                      "value": pa.array([4], pa.int64())})
    mixed = _dataset(FULL, large).materialize()
    out = engine.shuffle(ctx, mixed, ["group_id", "key"], _count_per_key)
    assert [(r["group_id"], r["key"], r["value_sum"]) for r in _rows(out)] == [
        ("g", "a", 3), ("h", "b", 3), ("h", "c", 4)]
    joined = engine.join(ctx, mixed, _dataset(FULL.slice(2).select(["key"])), "inner", ("key",))
    assert [r["value"] for r in _rows(joined)] == [3]
    assert sorted(engine.gather(ctx, mixed, ["key"])["key"].to_pylist()) == ["a", "a", "b", "c"]


@pytest.mark.parametrize("join_type", ["inner", "left_outer", "left_anti"])
def test_a_driver_join_cuts_a_bigger_right_side_to_the_left_keys(join_type):
    """`_join_tables` first keeps the right rows whose first key the left holds (a right of
    many chunks, null keys, a key as large_string on one side): the rows it gives are those
    of the join of the whole right side."""
    import polars as pl
    from tkg.pipeline.engine import _join_tables

    left = pa.table({"group_id": ["g", "g", "g", None], "key": ["a", "b", "z", "a"],
                     "value": [1, 2, 3, 4]})
    chunks = [pa.table({"group_id": pa.array(["g", "g", None], pa.large_string()),
                        "key": pa.array([f"k{i}", "a" if i % 2 else "b", "a"]),
                        "vector": pa.array([[float(i)] * 2] * 3, pa.list_(pa.float32(), 2))})
              for i in range(40)]
    right = pa.concat_tables(chunks)
    on = ["group_id", "key"]
    got = _join_tables(left, right, join_type, on)
    how = {"inner": "inner", "left_outer": "left", "left_anti": "anti"}[join_type]
    want = pl.from_arrow(left).join(pl.from_arrow(right).with_columns(
        pl.col("group_id").cast(pl.String)), on=on, how=how, maintain_order="left")
    assert got.num_rows == want.height == {"inner": 40, "left_outer": 42, "left_anti": 2}[
        join_type]
    assert pl.from_arrow(got).sort(pl.all()).equals(
        want.select(got.column_names).sort(pl.all()))


@pytest.mark.parametrize("join_type", ["inner", "left_outer", "left_anti"])
def test_a_driver_join_cuts_a_bigger_left_side_to_the_right_keys(join_type):
    """`_join_tables` with the left the bigger side (many chunks, null keys, a key as
    large_string on one side, keys matched one by one but not together): an inner join
    first keeps the left rows whose every key the right holds, an anti join keeps the
    others where they stand; the rows and their order are those of the whole join."""
    import polars as pl
    from tkg.pipeline.engine import _join_tables

    chunks = [pa.table({"group_id": pa.array(["g", "h", None, "g"], pa.large_string()),
                        "key": pa.array([f"k{i % 7}", "a", "a", "b"]),
                        "vector": pa.array([[float(i)] * 2] * 4, pa.list_(pa.float32(), 2))})
              for i in range(40)]
    left = pa.concat_tables(chunks)
    right = pa.table({"group_id": ["g", "h", "g", None], "key": ["a", "b", "k3", "a"],
                      "value": [1, 2, 3, 4]})
    on = ["group_id", "key"]
    got = _join_tables(left, right, join_type, on)
    how = {"inner": "inner", "left_outer": "left", "left_anti": "anti"}[join_type]
    want = pl.from_arrow(left).with_columns(pl.col("group_id").cast(pl.String)).join(
        pl.from_arrow(right), on=on, how=how, maintain_order="left")
    assert got.num_rows == want.height == {"inner": 6, "left_outer": 160, "left_anti": 154}[
        join_type]
    assert pl.from_arrow(got).with_columns(pl.col("group_id").cast(pl.String)).equals(
        want.select(got.column_names))


def test_driver_tables_are_sized_as_ray_sizes_their_blocks(ray_session):
    """The size policy places a dataset of driver tables by the bytes Ray Data's metadata
    would give their blocks (`DriverDataset.size_bytes`, computed once): sliced, chunked,
    list-valued and empty tables alike."""
    from tkg.pipeline.datasets import block_metadata, from_tables

    whole = pa.table({"name": [f"n{i}" * (i % 7) for i in range(300)],
                      "vector": pa.array([[float(i)] * 4 for i in range(300)],
                                         pa.list_(pa.float32()))})
    tables = [whole, whole.slice(10, 50), pa.concat_tables([whole.slice(0, 3), whole]),
              whole.slice(0, 0), pa.table({})]
    ds = from_tables(tables)
    assert ds.size_bytes() == sum(block_metadata(t).size_bytes or 0 for t in tables)
    assert ds.size_bytes() == ds.size_bytes() > 0


@pytest.mark.parametrize("blocks", [
    [pa.table({"group_id": ["a", "b"], "key": ["k", None], "value": [1, 2]}),
     pa.table({"group_id": pa.array([], pa.string())}),
     pa.table({"value": [3], "group_id": ["c"], "key": ["m"]})],
    [pa.table({})], []], ids=["blocks", "schemaless", "none"])
@pytest.mark.parametrize("columns", [None, ["value", "group_id"]])
def test_an_output_handed_on_equals_its_files_read_back(tmp_path, blocks, columns):
    """A stage output the driver made goes to the next stages as `outputs.write` held it
    (`outputs.handed`), not read back from the files it wrote: both give the same rows,
    schema and blocks."""
    from tkg.pipeline import outputs
    from tkg.pipeline.datasets import from_tables

    held: list[pa.Table] = []
    rows = outputs.write(from_tables(blocks), tmp_path / "out", KEYED, held)
    handed = outputs.handed(held, columns).tables
    read = outputs.read([tmp_path / "out"], 1 << 30, columns).tables
    assert rows == sum(t.num_rows for t in handed)
    assert [t.schema for t in handed] == [t.schema for t in read]
    assert [t.to_pylist() for t in handed] == [t.to_pylist() for t in read]
