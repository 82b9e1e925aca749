import pyarrow as pa
import pytest
from tkg.pipeline import schema


@pytest.mark.parametrize("name", list(schema.PUBLISHED))
def test_every_published_table_is_partitionable_by_group(name):
    table_schema = schema.PUBLISHED[name](384)
    if name != "runs":
        assert table_schema.field("group_id").type == pa.string()


def test_vector_width_comes_from_the_embedder():
    for dim in (8, 384, 1024):
        assert schema.entities(dim).field("name_embedding").type == pa.list_(pa.float32(), dim)
        assert schema.facts(dim).field("fact_embedding").type.list_size == dim
        assert schema.episodes(dim).field("content_embedding").type.list_size == dim


def test_facts_carry_both_timelines_and_versions():
    names = set(schema.facts(4).names)
    assert {"valid_at", "invalid_at", "created_at", "expired_at", "version",
            "invalidated_by", "episode_ids"} <= names


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


def test_work_tables_cover_every_stage_output():
    from tkg.pipeline.stages import STAGES

    outputs = {name for stage in STAGES for name in stage.outputs}
    assert outputs <= set(schema.WORK_TABLES)
