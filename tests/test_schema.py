import pyarrow as pa
import pytest
from tkg.pipeline import schema


@pytest.mark.parametrize("name", [n for n in schema.PUBLISHED if n != "runs"])
def test_every_published_table_is_stored_one_folder_per_group(name, tmp_path):
    """A reader scoped to its groups reads only their folders: every published table but
    `runs` is written under `group_id=<g>/` and reads back whole."""
    from tkg.pipeline import store

    table_schema = schema.PUBLISHED[name](4)
    rows = pa.table({"group_id": ["a", "b", "a"]})
    assert store.write_table(rows, tmp_path / name, table_schema) == 3
    folders = sorted(p.name for p in (tmp_path / name).iterdir() if p.is_dir())
    assert folders == ["group_id=a", "group_id=b"]
    back = store.read_table(tmp_path, name, table_schema, ["group_id"])
    assert sorted(back["group_id"].to_pylist()) == ["a", "a", "b"]


@pytest.mark.parametrize("dim", [8, 384])
def test_vectors_are_as_wide_as_the_embedder_and_no_other(dim):
    """The embedder's width is the schema's: a vector of that width is kept as written, one
    of another width is refused rather than stored beside the others."""
    for make, column in ((schema.entities, "name_embedding"), (schema.facts, "fact_embedding"),
                         (schema.episodes, "content_embedding")):
        vector = [float(i) for i in range(dim)]
        out = schema.conform(pa.table({column: [vector]}), make(dim))
        assert out[column].to_pylist() == [vector]
        with pytest.raises(pa.ArrowInvalid):
            schema.conform(pa.table({column: [[*vector, 0.0]]}), make(dim))


def test_facts_keep_both_timelines_and_versions_through_a_write(tmp_path):
    from datetime import UTC, datetime, timedelta, timezone

    from tkg.pipeline import store

    paris = timezone(timedelta(hours=2))
    row = {"edge_id": "x", "group_id": "g", "version": 2, "episode_ids": ["e1", "e2"],
           "valid_at": datetime(2024, 6, 1, 2, tzinfo=paris),
           "invalid_at": datetime(2024, 9, 1, tzinfo=UTC),
           "created_at": datetime(2024, 10, 1, tzinfo=UTC),
           "expired_at": datetime(2024, 11, 1, tzinfo=UTC), "invalidated_by": "y"}
    store.write_table(pa.Table.from_pylist([row]), tmp_path / "facts", schema.facts(4))
    back = store.read_table(tmp_path, "facts", schema.facts(4), list(row)).to_pylist()
    assert back == [{**row, "valid_at": datetime(2024, 6, 1, tzinfo=UTC)}]


def test_conform_selects_casts_and_fills():
    table = pa.table({"episode_id": ["e"], "extra": [1], "group_id": ["g"]})
    out = schema.conform(table, schema.MENTIONS)
    assert out.schema == schema.MENTIONS
    assert out.to_pylist() == [{"episode_id": "e", "entity_id": None, "group_id": "g"}]


def test_conform_makes_fixed_size_vectors():
    table = pa.table({"entity_id": ["a"], "name_embedding": [[1.0, 2.0]]})
    out = schema.conform(table, schema.entities(2))
    assert out.schema.field("name_embedding").type == pa.list_(pa.float32(), 2)


def test_stable_id_is_deterministic_and_separated():
    # a pinned value: a changed namespace or separator would re-key every stored row
    assert schema.stable_id("g", "x") == "60b41f9e-5109-5fc5-ad2e-7a82bb948fa9"
    assert schema.stable_id("g", "x") != schema.stable_id("gx", "")
    assert schema.stable_id("a", "b") != schema.stable_id("a b")


def test_stable_id_is_uuid5_of_its_joined_parts():
    """Ids stored by earlier runs stay valid: the same strings as uuid.uuid5."""
    import random
    import uuid

    rng = random.Random(7)
    letters = "abcXYZ 019\x1fé中😀-"
    for _ in range(2_000):
        parts = ["".join(rng.choice(letters) for _ in range(rng.randint(0, 24)))
                 for _ in range(rng.randint(1, 5))]
        assert schema.stable_id(*parts) == str(uuid.uuid5(schema.NAMESPACE, "\x1f".join(parts)))


def test_work_tables_cover_every_stage_output():
    from tkg.pipeline.stages import STAGES

    outputs = {name for stage in STAGES for name in stage.outputs}
    assert outputs <= set(schema.WORK_TABLES)
