"""facts: edges and entity summaries. The full computation runs over every extraction; an
update over the subjects a later run touched (`_touched_facts`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import adjudicate, engine, facts, schema
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.datasets import empty_dataset
from tkg.pipeline.extract import records
from tkg.pipeline.stages.common import (
    FACT_COLUMNS,
    INTERNAL_EXTRACTIONS,
    INTERNAL_NAMES,
    all_extractions,
    distinct_entities,
    in_set,
    join_alias_map,
    name_keys,
    on_one_side,
    only,
    open_versions,
    previous_table,
    rename,
    without,
)


def _merged_edges(ctx: RunContext, mentions: Dataset, alias_map: Dataset,
                  entity_names: Dataset) -> Dataset:
    """Fact mentions -> edges: endpoints resolved through the alias map, texts that call
    their target by a record's key name given its entity's name (`entity_names`, the
    resolved entities: `_named_targets`), one edge per (pair, relation) with merged
    provenance (shuffled by edge)."""
    with_source = join_alias_map(mentions, alias_map, ctx, "source_normalized", "source_")
    with_both = join_alias_map(with_source, alias_map, ctx, "target_normalized", "target_")
    rows = engine.map(ctx, with_both, facts.fact_rows, ctx.config.facts).materialize()
    return engine.shuffle(ctx, _named_targets(ctx, rows, entity_names), ["edge_id"],
                          facts.merge_facts, ctx.created_at)


TARGET_COLUMNS = ["group_id", "entity_id", "name"]  # a resolved entity's, as a fact's target
TARGET_NAMES = {"entity_id": "target_entity_id", "name": "target_name"}


def _named_targets(ctx: RunContext, rows: Dataset, entity_names: Dataset) -> Dataset:
    """Fact rows with `facts.name_targets` applied to those whose text calls the target by
    a key name (a record's references: a few per record, none in conversations), joined
    alone to the entities' names: the other rows are not joined."""
    keyed = engine.nonempty(engine.map(ctx, rows, facts.keyed_targets))
    if keyed is None:
        return rows
    names = engine.map(ctx, engine.map(ctx, entity_names, only, TARGET_COLUMNS),
                       rename(TARGET_NAMES))
    named = engine.join(ctx, keyed, names, "left_outer", ("group_id", "target_entity_id"))
    return engine.union(ctx, engine.map(ctx, rows, facts.keyed_targets, False),
                        engine.map(ctx, named, facts.name_targets))


def _checked(ctx: RunContext, edges: Dataset, ends: Dataset) -> Dataset:
    """Invalidation per subject (shuffled by subject), the ends of record fields a newer
    version of their record no longer states (`ends`, `_version_ends`), and the optional
    judge for what the rules left open."""
    checked = engine.shuffle(ctx, edges, ["group_id", "source_entity_id"], facts.invalidate,
                             ctx.config.facts)
    checked = engine.map(ctx, engine.join(
        ctx, checked, engine.map(ctx, ends, only, records.END_COLUMNS), "left_outer",
        ("edge_id",)), records.apply_version_ends)
    if (judge := adjudicate.build_invalidation_judge(ctx.config)) is not None:
        checked = adjudicate.judge_invalidations(ctx, checked, judge)  # what rules left open
    return checked.materialize()  # feeds the summaries and the stage output


def _edges(ctx: RunContext, mentions: Dataset, alias_map: Dataset, entity_names: Dataset,
           ends: Dataset) -> Dataset:
    return _checked(ctx, _merged_edges(ctx, mentions, alias_map, entity_names), ends)


RECORD_COLUMNS = ["group_id", "episode_id", "valid_at", "entities", "facts"]


def _tonight_statements(ctx: RunContext, extractions: Dataset) -> Dataset:
    """`records.record_statements` of this run's extractions (its record versions)."""
    return engine.map(ctx, extractions, records.record_statements, True).materialize()


def _version_ends(ctx: RunContext, statements: Dataset, alias_map: Dataset) -> Dataset:
    """`records.version_ends` of the records in `statements` (every version of each), by a
    shuffle per record: a version arriving tonight ends the stored edges its record no
    longer states, as one run over everything would."""
    statements = statements.materialize()
    stated = engine.map(ctx, statements, records.stated_only)
    resolved = join_alias_map(join_alias_map(stated, alias_map, ctx, "source_normalized",
                                             "source_"),
                              alias_map, ctx, "target_normalized", "target_")
    rows = engine.union(ctx, engine.map(ctx, statements, records.versions_only),
                        engine.map(ctx, resolved, records.resolved_statements))
    return engine.shuffle(ctx, rows, ["group_id", "record"], records.version_ends,
                          ctx.config.facts).materialize()


def _with_earlier(ctx: RunContext, statements: Dataset, earlier: Dataset | None,
                  records_of: set[str] | None = None) -> Dataset:
    """`statements` and the `earlier` ones (of the records keyed `records_of` alone: a
    (group, record) `name_keys` set; all where None)."""
    if earlier is None:
        return statements
    if records_of is not None:
        earlier = _of_records(ctx, earlier, records_of)
    return engine.union(ctx, statements, earlier)


def _of_records(ctx: RunContext, statements: Dataset, keys: set[str]) -> Dataset:
    """The `statements` of the records whose (group, record) `name_keys` are `keys`."""
    return engine.map(ctx, statements, in_set("record", keys, group_column="group_id"))


def _record_keys(ctx: RunContext, statements: Dataset) -> set[str]:
    """The (group, record) keys of the records in `statements`."""
    keys = engine.gather(ctx, engine.map(ctx, statements, only, ["group_id", "record"]),
                         ["group_id", "record"], what="records versioned tonight")
    return set(name_keys(keys["group_id"], keys["record"]).to_pylist())


INTERNAL_STATEMENTS = "_record_statements"  # each run's `_tonight_statements`


def _earlier_statements(ctx: RunContext) -> Dataset | None:
    """The statements of earlier runs' records, as those runs kept them; of a snapshot
    from before they were kept, parsed from its stored extractions. A night into the
    160,000-episode synthetic store parsed 32,007 stored records every night (py-spy: 5.0 s
    of its facts stage)."""
    kept = previous_table(ctx, INTERNAL_STATEMENTS)
    if kept is not None:
        return engine.map(ctx, kept, _not_tonight)
    earlier = previous_table(ctx, INTERNAL_EXTRACTIONS, RECORD_COLUMNS)
    if earlier is None:
        return None
    return engine.map(ctx, engine.map(ctx, engine.map(ctx, earlier, _maybe_records),
                                      schema.conform, schema.EXTRACTIONS),
                      records.record_statements, False)


def _not_tonight(statements: pa.Table) -> pa.Table:
    statements = schema.conform(statements, schema.RECORD_STATEMENTS)
    return statements.set_column(statements.schema.get_field_index("tonight"), "tonight",
                                 pa.array([False] * statements.num_rows, pa.bool_()))


def _maybe_records(extractions: pa.Table) -> pa.Table:
    """The extractions whose first entity's attributes mention the record attribute: a
    cheap pass before `records.record_statements` parses them (it keeps the keyed records
    among these, and none of the others). A night into the 160,000-episode synthetic store
    read every stored extraction into Python dicts there for 32,007 records (7.4 s; 3.0 s
    with this pass, the same statements)."""
    if "entities" not in extractions.column_names:  # a block without rows or columns
        return extractions
    entities = extractions["entities"].combine_chunks()
    attributes = pc.struct_field(pc.list_flatten(entities), "attributes")
    mentioned = records.may_name_a_record(attributes).to_numpy(zero_copy_only=False)
    # each extraction's first entity: the first flattened row of each non-empty list
    parents = pc.list_parent_indices(entities).to_numpy()
    firsts = np.flatnonzero(np.r_[True, parents[1:] != parents[:-1]]) if len(parents) else (
        np.zeros(0, np.int64))
    keep = np.zeros(extractions.num_rows, dtype=bool)
    keep[parents[firsts]] = mentioned[firsts]
    return extractions.filter(pa.array(keep))


def _summaries(ctx: RunContext, edges: Dataset, entities: Dataset | None = None) -> Dataset:
    """Extractive summaries (group_id, entity_id, summary) of every entity, or of those in
    `entities` (entity_id, once each)."""
    sources = engine.map(ctx, edges, facts.summary_sources)
    if entities is not None:
        sources = engine.join(ctx, sources, entities, "inner", ("entity_id",))
    return engine.shuffle(ctx, sources, ["group_id", "entity_id"], facts.entity_summaries,
                          ctx.config.facts.summary_facts)


def facts_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Edges and summaries over every extraction (earlier runs' included)."""
    mentions = engine.map(ctx, all_extractions(ctx, inputs["extractions"], FACT_COLUMNS),
                          facts.fact_mentions)
    statements = _tonight_statements(ctx, inputs["extractions"])
    ends = _version_ends(ctx, _with_earlier(ctx, statements, _earlier_statements(ctx)),
                         inputs["alias_map"])
    checked = _edges(ctx, mentions, inputs["alias_map"], inputs["resolved_entities"], ends)
    return _with_summaries(ctx, inputs, checked, _summaries(ctx, checked), empty_dataset(),
                           statements)




def facts_update(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Edges and summaries of the subjects a later run touched (`_touched_facts`: its edges
    are those subjects' only)."""
    stored = previous_table(ctx, "facts", schema.MERGED_FACTS.names)
    if stored is None:
        return facts_stage(ctx, inputs)
    statements = _tonight_statements(ctx, inputs["extractions"])
    earlier, restated = _earlier_statements(ctx), _record_keys(ctx, statements)
    ends = RecordEnds(ctx, _version_ends(ctx, _with_earlier(ctx, statements, earlier, restated),
                                         inputs["alias_map"]), earlier, restated,
                      inputs["alias_map"])
    checked, summaries, recomputed = _touched_facts(
        ctx, inputs["extractions"], inputs["alias_map"], inputs["resolved_entities"], stored,
        ends, _versioned_records(ctx, statements, inputs["alias_map"]))
    return _with_summaries(ctx, inputs, checked, summaries, recomputed, statements)


def _with_summaries(ctx: RunContext, inputs: dict[str, Dataset], checked: Dataset,
                    summaries: Dataset, recomputed: Dataset, statements: Dataset
                    ) -> dict[str, Dataset]:
    """The stage's outputs: the resolved entities with their summaries, each keeping the
    transaction time it was first stored at, and this run's record statements."""
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
            "recomputed_subjects": recomputed, "record_statements": statements,
            "name_map": inputs["alias_map"]}


# --- an update: only what the run touched ----------------------------------------------------
#
# Every store-sized input (the alias maps, stored edges, stored summaries) stays a dataset:
# it is compared, selected and combined by engine joins and shuffles. Only what the night
# touched comes to the driver: the names that changed, tonight's subjects, the subjects with
# a stored edge to a changed entity, and the names of those subjects.


NAME_COLUMNS = ["group_id", "normalized", "entity_id"]  # a name's entity
SIDE = "_side"  # which input a row of a tagged union comes from: "old" (stored) or "new"


@dataclass(frozen=True)
class RecordEnds:
    """The ends of record fields (`_version_ends`) a later run needs: of the records a
    version of this run restates (`tonight`), and (`of`) of the earlier records among the
    subjects it rebuilds or extends; no other record's statements are resolved and
    shuffled (every stored record's were: 224,000 statements, 3.4 s of py-spy in a night's
    facts stage on the 160,000-episode synthetic store). A record's statements all have it
    as subject (`records.record_statements`), so its key is one of its entity's names."""

    ctx: RunContext
    tonight: Dataset
    earlier: Dataset | None
    restated: set[str]  # the (group, record) keys of tonight's records
    alias_map: Dataset

    def of(self, names: set[str]) -> Dataset:
        """Tonight's ends and those of the earlier records keyed by `names` (name keys)."""
        others = names - self.restated
        if self.earlier is None or not others:
            return self.tonight
        more = engine.nonempty(_of_records(self.ctx, self.earlier, others))
        if more is None:
            return self.tonight
        return engine.union(self.ctx, self.tonight,
                            _version_ends(self.ctx, more, self.alias_map)).materialize()


def _touched_facts(ctx: RunContext, new: Dataset, alias_map: Dataset, entity_names: Dataset,
                   stored: Dataset, record_ends: RecordEnds, versioned: set[str]
                   ) -> tuple[Dataset, Dataset, Dataset]:
    """Edges and summaries where a later run changed something; everything else is the
    previous snapshot's. Invalidation and merging look at one subject's edges only.

    - Subjects rebuilt from their whole history: entities whose names changed (merges,
      renames, new entities: `_changed_entities`), the records a version of this run
      restates (`versioned`: `_versioned_records`) and subjects with a stored edge
      to one (its edge id changes) or to a record whose name changed (its text may name
      it: `_renamed_records`). Their edges are rebuilt from every mention that has
      them as subject, earlier runs' included, exactly as a full build would; earlier
      extractions are read only when such a subject was stored before.
    - The other subjects of tonight's facts: their stored open edges combined with
      tonight's (`facts.combine_edges`) and invalidated again. A subject with years of
      facts costs its open edges, not its mentions (the 20,000 + 200 run rebuilt 12,615
      edges from every mention for 139 subjects).

    Only edges that are new or differ from their stored version go on (to embedding and
    `versions_stage`), with the rebuilt subjects, whose other stored edges are gone.
    Summaries are recomputed for the endpoints of those edges and of the gone ones."""
    stored_names = previous_table(ctx, INTERNAL_NAMES, NAME_COLUMNS)
    if stored_names is None:  # a snapshot from before the name map was kept: the nearest
        stored_names = previous_table(ctx, "entity_aliases", NAME_COLUMNS)  # (more changed)
    if stored_names is None:  # a snapshot from before aliases were stored: every name is new
        stored_names = empty_dataset()
    changed = _changed_entities(ctx, stored_names, alias_map)
    new_mentions = engine.map(ctx, new, facts.fact_mentions).materialize()
    tonight = (_tonight_subjects(ctx, new_mentions, alias_map)
               | _record_subjects(ctx, record_ends.tonight))
    to_changed = engine.map(ctx, stored, in_set(  # the night's
        "target_entity_id", changed | _renamed_records(ctx, entity_names)))
    edged = engine.gather(ctx, to_changed, ["source_entity_id"],
                          what="subjects of edges to changed entities")
    rebuilt = (changed | versioned | set(edged["source_entity_id"].to_pylist()))
    plain = tonight - rebuilt
    open_edges = engine.map(ctx, stored, open_versions).materialize()
    stored_before = engine.total(engine.map(ctx, stored_names, in_set("entity_id", rebuilt)),
                                 len) > 0
    rebuilt_names, plain_names = _names_of(ctx, alias_map, rebuilt), _names_of(ctx, alias_map,
                                                                               plain)
    ends = record_ends.of(rebuilt_names | plain_names)
    edges = [_rebuilt_edges(ctx, new_mentions, alias_map, entity_names, rebuilt_names,
                            stored_before, ends),
             _combined_edges(ctx, new_mentions, alias_map, entity_names, plain_names,
                             engine.map(ctx, open_edges, in_set("source_entity_id", plain)),
                             ends)]
    emitted = engine.union(ctx, *edges).materialize()
    dropped = engine.map(ctx, open_edges, in_set("source_entity_id", rebuilt))
    touched = _touched_entities(ctx, changed, emitted, dropped)
    ctx.count("facts_subjects_recomputed", len(rebuilt))
    ctx.count("facts_subjects_extended", len(plain))
    carried = engine.join(
        ctx, engine.map(ctx, open_edges, in_set("source_entity_id", rebuilt, keep=False)),
        engine.map(ctx, emitted, only, ["edge_id"]), "left_anti", ("edge_id",))
    now = engine.union(ctx, emitted, engine.map(ctx, carried, schema.conform,
                                                schema.MERGED_FACTS))
    kept = engine.join(
        ctx, previous_table(ctx, "entities", ["group_id", "entity_id", "summary"]), touched,
        "left_anti", ("entity_id",))
    recomputed = pa.table({"source_entity_id": pa.array(sorted(rebuilt), pa.string())})
    return (emitted, engine.union(ctx, _summaries(ctx, now.materialize(), touched), kept),
            engine.as_dataset(recomputed))


def _changed_entities(ctx: RunContext, stored_names: Dataset, alias_map: Dataset
                      ) -> set[str]:
    """`resolve.changed_entities` by engine joins: an entity's names differ exactly when one
    of its (group, name, entity) rows is on one side only (an entity id belongs to one
    group). Only those rows, the names that changed, come to the driver."""
    differing = on_one_side(ctx, stored_names, alias_map, NAME_COLUMNS)
    names = engine.gather(ctx, differing, ["entity_id"], what="changed names")
    return set(names["entity_id"].to_pylist())


def _renamed_records(ctx: RunContext, entity_names: Dataset) -> set[str]:
    """The record entities (`records.record_names`) whose name is not their stored one: a
    fact whose text called one by its key name (`facts.name_targets`) names it again when
    its record arrives or a version renames it, though none of its names (the alias map's
    keys: the key name) changed. Only the night's new and renamed records come to the
    driver; a store without records reads no stored entity."""
    keyed = engine.nonempty(engine.map(ctx, entity_names, records.record_names))
    stored = None if keyed is None else previous_table(ctx, "entities",
                                                         records.RECORD_NAMES.names)
    if keyed is None or stored is None:
        return set()
    renamed = engine.join(ctx, keyed, stored, "left_anti", tuple(records.RECORD_NAMES.names))
    return set(engine.gather(ctx, renamed, ["entity_id"], what="renamed records")
               ["entity_id"].to_pylist())


def _tonight_subjects(ctx: RunContext, mentions: Dataset, alias_map: Dataset) -> set[str]:
    """The entities tonight's fact mentions have as subject."""
    names = engine.map(ctx, mentions, only, ["group_id", "source_normalized"])
    subjects = join_alias_map(names, alias_map, ctx, "source_normalized", "source_")
    return set(engine.gather(ctx, subjects, ["source_entity_id"],
                             what="tonight's fact subjects")["source_entity_id"].to_pylist())


def _versioned_records(ctx: RunContext, statements: Dataset, alias_map: Dataset
                       ) -> set[str]:
    """The entities of the records a version of this run restates (`statements`, this
    run's `_tonight_statements`): rebuilt, not extended.
    A record's ends are not monotone as the stated ends of facts are (`combine_edges`): a
    version that states again a field an earlier one dropped reopens its edge, which a
    stored end kept by `combine_edges` would not (10,000 + 200 synthetic episodes: 2 edges
    left ended once record subjects stopped being rebuilt every night)."""
    versions = engine.map(ctx, statements, records.versions_only)
    entities = join_alias_map(versions, alias_map, ctx, "record")
    return set(engine.gather(ctx, entities, ["entity_id"], what="records versioned tonight")
               ["entity_id"].to_pylist())


def _record_subjects(ctx: RunContext, ends: Dataset) -> set[str]:
    """The subjects of edges a record version of this run ends: a version that states no
    edge at all (every field dropped) has no fact mention to bring its subject in."""
    tonight = engine.map(ctx, ends, _tonight_ends)
    return set(engine.gather(ctx, tonight, ["source_entity_id"], what="subjects of "
                             "record versions")["source_entity_id"].to_pylist())


def _tonight_ends(ends: pa.Table) -> pa.Table:
    if "tonight" not in ends.column_names:  # a block without rows or columns
        return ends
    return ends.filter(pc.fill_null(ends["tonight"], False)).select(["source_entity_id"])


def _names_of(ctx: RunContext, alias_map: Dataset, entities: set[str]) -> set[str]:
    """The (group, normalized) keys (`name_keys`) of the names of `entities`."""
    if not entities:
        return set()
    names = engine.gather(ctx, engine.map(ctx, alias_map, in_set("entity_id", entities)),
                          ["group_id", "normalized"], what="names of touched subjects")
    return set(name_keys(names["group_id"], names["normalized"]).to_pylist())


def _touched_entities(ctx: RunContext, changed: set[str], emitted: Dataset,
                      dropped: Dataset) -> Dataset:
    """The entities whose summaries change (entity_id, once each): the changed ones and the
    endpoints of the emitted and the dropped edges."""
    named = engine.as_dataset(pa.table({"entity_id": pa.array(sorted(changed), pa.string())}))
    ends = engine.union(ctx, named, engine.map(ctx, emitted, _endpoints),
                        engine.map(ctx, dropped, _endpoints))
    return engine.shuffle(ctx, ends, ["entity_id"], distinct_entities)


def _endpoints(edges: pa.Table) -> pa.Table:
    return pa.table({"entity_id": pa.chunked_array(
        [*edges["source_entity_id"].chunks, *edges["target_entity_id"].chunks], pa.string())})


def _rebuilt_edges(ctx: RunContext, new_mentions: Dataset, alias_map: Dataset,
                   entity_names: Dataset, names: set[str], stored_before: bool, ends: Dataset
                   ) -> Dataset:
    """The edges of subjects named `names`, from every mention with them as subject: this
    run's and, when one of them was `stored_before`, earlier runs'."""
    mentions = engine.map(ctx, new_mentions, in_set("source_normalized", names,
                                                 group_column="group_id"))
    earlier = previous_table(ctx, INTERNAL_EXTRACTIONS, FACT_COLUMNS) if stored_before else None
    if earlier is not None:
        about = engine.map(ctx, earlier, _with_subjects, pa.array(sorted(names), pa.string()))
        old = engine.map(ctx, engine.map(ctx, about, schema.conform, schema.EXTRACTIONS),
                         facts.fact_mentions)
        mentions = engine.union(ctx, mentions, engine.map(
            ctx, old, in_set("source_normalized", names, group_column="group_id")))
    return _edges(ctx, mentions.materialize(), alias_map, entity_names, ends)


def _with_subjects(extractions: pa.Table, names: pa.Array) -> pa.Table:
    """The extractions with a fact whose subject's (group, normalized) key (`name_keys`) is
    one of `names`: the mentions of every stored fact were 1.5 s of the 160,000-episode
    night, to find those of its 46 rebuilt subjects."""
    if "facts" not in extractions.column_names:  # a block without rows or columns
        return extractions
    rows, subjects = facts.fact_subjects(extractions)
    keys = name_keys(pc.take(extractions["group_id"], rows), subjects)
    return extractions.take(pc.unique(pc.filter(rows, pc.is_in(keys, value_set=names))))


def _combined_edges(ctx: RunContext, new_mentions: Dataset, alias_map: Dataset,
                    entity_names: Dataset, names: set[str], stored: Dataset, ends: Dataset
                    ) -> Dataset:
    """Tonight's edges of subjects named `names` combined with their `stored` open edges,
    invalidated again; only the new and changed ones. Both combinations are shuffles of the
    stored and tonight's edges tagged by side (by subject, then by edge): a subject's
    stored edges never come to the driver as such. A subject with no edge tonight (a record
    version that dropped every field, `_record_subjects`) has its stored edges checked
    again."""
    mentions = engine.map(ctx, new_mentions, in_set("source_normalized", names,
                                                 group_column="group_id"))
    tonight = engine.nonempty(_merged_edges(ctx, mentions.materialize(), alias_map,
                                            entity_names))
    if tonight is None and engine.nonempty(stored) is None:
        return empty_dataset()
    before = engine.map(ctx, stored, _tagged, "old").materialize()
    sides = [before] if tonight is None else [before, engine.map(ctx, tonight, _tagged, "new")]
    combined = engine.shuffle(ctx, engine.union(ctx, *sides),
                              ["group_id", "source_entity_id"], _combine_sides)
    checked = engine.map(ctx, _checked(ctx, combined, ends), _tagged, "new")
    return engine.shuffle(ctx, engine.union(ctx, before, checked), ["edge_id"],
                          _changed_sides)


def _tagged(edges: pa.Table, side: str) -> pa.Table:
    """Edges as MERGED_FACTS rows of one `side` of a tagged union."""
    rows = schema.conform(edges, schema.MERGED_FACTS)
    return rows.append_column(SIDE, pa.array([side] * rows.num_rows, pa.string()))


def _sides(block: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The (old, new) rows of a block of a tagged union, untagged."""
    old = pc.equal(block[SIDE], "old")
    return (block.filter(old).drop_columns([SIDE]),
            block.filter(pc.invert(old)).drop_columns([SIDE]))


def _combine_sides(block: pa.Table) -> pa.Table:
    """`facts.combine_edges` of the subjects in a block (stored and tonight's edges)."""
    stored, tonight = _sides(block)
    return facts.combine_edges(stored, tonight)


def _changed_sides(block: pa.Table) -> pa.Table:
    """`facts.changed_edges` of the edges in a block (checked against stored)."""
    stored, checked = _sides(block)
    return facts.changed_edges(checked, stored)


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
              ("merged_facts", "entities_summarized", "recomputed_subjects", "name_map",
               "record_statements"),
              facts_stage, update=facts_update,
              state=("facts", "entities", "entity_aliases", INTERNAL_NAMES, INTERNAL_EXTRACTIONS,
                     INTERNAL_STATEMENTS),
              publishes=(Publish("name_map", INTERNAL_NAMES),
                         Publish("record_statements", INTERNAL_STATEMENTS, grows=True)))
