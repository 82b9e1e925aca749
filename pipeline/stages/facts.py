"""facts: edges and entity summaries. The full computation runs over every extraction; an
update over the subjects a later run touched (`_touched_facts`)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import adjudicate, engine, facts, resolve, schema
from tkg.pipeline.context import RunContext, Stage
from tkg.pipeline.datasets import empty_dataset
from tkg.pipeline.stages.common import (
    FACT_COLUMNS,
    INTERNAL_EXTRACTIONS,
    all_extractions,
    in_set,
    join_alias_map,
    name_keys,
    open_versions,
    previous_table,
    rename,
    without,
)


def _merged_edges(ctx: RunContext, mentions: Dataset, alias_map: Dataset) -> Dataset:
    """Fact mentions -> edges: endpoints resolved through the alias map, one edge per (pair,
    relation) with merged provenance (shuffled by edge)."""
    with_source = join_alias_map(mentions, alias_map, ctx, "source_normalized", "source_")
    with_both = join_alias_map(with_source, alias_map, ctx, "target_normalized", "target_")
    rows = engine.map(ctx, with_both, facts.fact_rows, ctx.config.facts)
    return engine.shuffle(ctx, rows, ["edge_id"], facts.merge_facts, ctx.created_at)


def _checked(ctx: RunContext, edges: Dataset) -> Dataset:
    """Invalidation per subject (shuffled by subject) and the optional judge for what the
    rules left open."""
    checked = engine.shuffle(ctx, edges, ["group_id", "source_entity_id"], facts.invalidate,
                             ctx.config.facts)
    if (judge := adjudicate.build_invalidation_judge(ctx.config)) is not None:
        checked = adjudicate.judge_invalidations(ctx, checked, judge)  # what rules left open
    return checked.materialize()  # feeds the summaries and the stage output


def _edges(ctx: RunContext, mentions: Dataset, alias_map: Dataset) -> Dataset:
    return _checked(ctx, _merged_edges(ctx, mentions, alias_map))


def _summaries(ctx: RunContext, edges: Dataset, only: set[str] | None = None) -> Dataset:
    """Extractive summaries (group_id, entity_id, summary) of every entity, or of `only`."""
    sources = engine.map(ctx, edges, facts.summary_sources)
    if only is not None:
        sources = engine.map(ctx, sources, in_set("entity_id", only))
    return engine.shuffle(ctx, sources, ["group_id", "entity_id"], facts.entity_summaries,
                          ctx.config.facts.summary_facts)


def facts_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Edges and summaries over every extraction (earlier runs' included)."""
    mentions = engine.map(ctx, all_extractions(ctx, inputs["extractions"], FACT_COLUMNS),
                          facts.fact_mentions)
    checked = _edges(ctx, mentions, inputs["alias_map"])
    return _with_summaries(ctx, inputs, checked, _summaries(ctx, checked), empty_dataset())


def facts_update(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Edges and summaries of the subjects a later run touched (`_touched_facts`: its edges
    are those subjects' only)."""
    stored = previous_table(ctx, "facts", schema.MERGED_FACTS.names)
    if stored is None:
        return facts_stage(ctx, inputs)
    checked, summaries, recomputed = _touched_facts(
        ctx, inputs["extractions"], inputs["alias_map"], stored)
    return _with_summaries(ctx, inputs, checked, summaries, recomputed)


def _with_summaries(ctx: RunContext, inputs: dict[str, Dataset], checked: Dataset,
                    summaries: Dataset, recomputed: Dataset) -> dict[str, Dataset]:
    """The stage's outputs: the resolved entities with their summaries, each keeping the
    transaction time it was first stored at."""
    entities = engine.map(ctx, engine.join(
        ctx, engine.map(ctx, inputs["resolved_entities"], without, ["summary"]),
        engine.map(ctx, summaries, without, ["group_id"]),
        "left_outer", ("entity_id",),
    ), _no_null_summary)
    stored = previous_table(ctx, "entities", ["entity_id", "created_at"])
    if stored is not None:
        first = engine.map(ctx, stored, rename({"created_at": "first_created_at"}))
        entities = engine.map(ctx, engine.join(ctx, entities, first, "left_outer",
                                               ("entity_id",)), _first_created)
    return {"merged_facts": checked, "entities_summarized": entities,
            "recomputed_subjects": recomputed}


# --- an update: only what the run touched ----------------------------------------------------


NAME_COLUMNS = ["group_id", "normalized", "entity_id"]  # a name's entity


def _touched_facts(ctx: RunContext, new: Dataset, alias_map: Dataset, stored: Dataset
                   ) -> tuple[Dataset, Dataset, Dataset]:
    """Edges and summaries where a later run changed something; everything else is the
    previous snapshot's. Invalidation and merging look at one subject's edges only.

    - Subjects rebuilt from their whole history: entities whose names changed (merges,
      renames, new entities: `resolve.changed_entities`) and subjects with a stored edge
      to one (its edge id changes). Their edges are rebuilt from every mention that has
      them as subject, earlier runs' included, exactly as a full build would; earlier
      extractions are read only when such a subject was stored before.
    - The other subjects of tonight's facts: their stored open edges combined with
      tonight's (`facts.combine_edges`) and invalidated again. A subject with years of
      facts costs its open edges, not its mentions (the 20,000 + 200 run rebuilt 12,615
      edges from every mention for 139 subjects).

    Only edges that are new or differ from their stored version go on (to embedding and
    `versions_stage`), with the rebuilt subjects, whose other stored edges are gone.
    Summaries are recomputed for the endpoints of those edges and of the gone ones."""
    aliases = engine.gather(ctx, alias_map, NAME_COLUMNS, what="the alias map")
    stored_aliases = engine.gather(ctx, previous_table(ctx, "entity_aliases", NAME_COLUMNS),
                                   NAME_COLUMNS, what="stored aliases")
    changed = resolve.changed_entities(stored_aliases, aliases)
    entity_of = dict(zip(name_keys(aliases["group_id"], aliases["normalized"]).to_pylist(),
                         aliases["entity_id"].to_pylist(), strict=True))

    def names_of(entities: set[str]) -> set[str]:
        return {name for name, entity in entity_of.items() if entity in entities}

    def subjects_in(mentions: pa.Table) -> set[str]:
        keys = name_keys(mentions["group_id"], mentions["source_normalized"]).to_pylist()
        return {entity_of[k] for k in keys if k in entity_of}

    new_mentions = engine.map(ctx, new, facts.fact_mentions).materialize()
    tonight = subjects_in(engine.gather(ctx, new_mentions, ["group_id", "source_normalized"],
                                        what="tonight's fact subjects"))
    to_changed = engine.map(ctx, stored, in_set("target_entity_id", changed))  # the night's
    rebuilt = changed | set(engine.gather(ctx, to_changed, ["source_entity_id"],
                                          what="subjects of edges to changed entities")
                            ["source_entity_id"].to_pylist())
    plain = tonight - rebuilt
    open_edges = engine.map(ctx, stored, open_versions).materialize()
    edges = [_rebuilt_edges(ctx, new_mentions, alias_map, names_of(rebuilt),
                            bool(rebuilt & set(stored_aliases["entity_id"].to_pylist()))),
             _combined_edges(ctx, new_mentions, alias_map, names_of(plain),
                             engine.map(ctx, open_edges, in_set("source_entity_id", plain)))]
    emitted = engine.union(ctx, *edges).materialize()
    dropped = engine.map(ctx, open_edges, in_set("source_entity_id", rebuilt))
    touched = set(changed)
    for rows in (emitted, dropped):
        ends = engine.gather(ctx, rows, ["source_entity_id", "target_entity_id"],
                             what="touched fact endpoints")
        touched |= set(ends["source_entity_id"].to_pylist())
        touched |= set(ends["target_entity_id"].to_pylist())
    ctx.count("facts_subjects_recomputed", len(rebuilt))
    ctx.count("facts_subjects_extended", len(plain))
    replaced = set(engine.gather(ctx, emitted, ["edge_id"], what="emitted edges")
                   ["edge_id"].to_pylist())
    carried = engine.map(ctx, engine.map(ctx, open_edges, in_set("source_entity_id", rebuilt,
                                                             keep=False)),
                     in_set("edge_id", replaced, keep=False))
    now = engine.union(ctx, emitted, engine.map(ctx, carried, schema.conform, schema.MERGED_FACTS))
    kept = engine.map(ctx, previous_table(ctx, "entities", ["group_id", "entity_id", "summary"]),
                  in_set("entity_id", touched, keep=False))
    recomputed = pa.table({"source_entity_id": pa.array(sorted(rebuilt), pa.string())})
    return (emitted, engine.union(ctx, _summaries(ctx, now.materialize(), touched), kept),
            engine.as_dataset(recomputed))


def _rebuilt_edges(ctx: RunContext, new_mentions: Dataset, alias_map: Dataset,
                   names: set[str], stored_before: bool) -> Dataset:
    """The edges of subjects named `names`, from every mention with them as subject: this
    run's and, when one of them was `stored_before`, earlier runs'."""
    mentions = engine.map(ctx, new_mentions, in_set("source_normalized", names,
                                                 group_column="group_id"))
    earlier = previous_table(ctx, INTERNAL_EXTRACTIONS, FACT_COLUMNS) if stored_before else None
    if earlier is not None:
        old = engine.map(ctx, engine.map(ctx, earlier, schema.conform, schema.EXTRACTIONS),
                     facts.fact_mentions)
        mentions = engine.union(ctx, mentions, engine.map(
            ctx, old, in_set("source_normalized", names, group_column="group_id")))
    return _edges(ctx, mentions.materialize(), alias_map)


def _combined_edges(ctx: RunContext, new_mentions: Dataset, alias_map: Dataset,
                    names: set[str], stored: Dataset) -> Dataset:
    """Tonight's edges of subjects named `names` combined with their `stored` open edges,
    invalidated again; only the new and changed ones."""
    mentions = engine.map(ctx, new_mentions, in_set("source_normalized", names,
                                                 group_column="group_id"))
    edges = schema.MERGED_FACTS
    tonight = engine.gather(ctx, _merged_edges(ctx, mentions.materialize(), alias_map),
                            table_schema=edges, what="tonight's edges")
    if tonight.num_rows == 0:
        return empty_dataset()
    before = engine.gather(ctx, stored, table_schema=edges, what="stored open edges")
    checked = engine.gather(ctx, _checked(ctx, engine.as_dataset(
        facts.combine_edges(before, tonight))), table_schema=edges, what="combined edges")
    return engine.as_dataset(facts.changed_edges(checked, before))


def _no_null_summary(batch: pa.Table) -> pa.Table:
    if "summary" not in batch.column_names:  # joined with no summaries at all
        return batch.append_column("summary", pa.array([""] * batch.num_rows, pa.string()))
    summary = pc.fill_null(batch["summary"], "")
    return batch.set_column(batch.schema.get_field_index("summary"), "summary", summary)


def _first_created(batch: pa.Table) -> pa.Table:
    if "first_created_at" not in batch.column_names:  # no stored entities joined
        return batch
    created = pc.coalesce(batch["first_created_at"], batch["created_at"])
    rest = batch.drop_columns(["first_created_at"])
    return rest.set_column(rest.schema.get_field_index("created_at"), "created_at", created)


STAGE = Stage("facts", ("extractions", "alias_map", "resolved_entities"),
              ("merged_facts", "entities_summarized", "recomputed_subjects"), facts_stage,
              update=facts_update,
              state=("facts", "entities", "entity_aliases", INTERNAL_EXTRACTIONS))
