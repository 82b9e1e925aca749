"""resolve: blocking keys -> pair decisions (-> adjudicator) -> connected components -> entities.
An update decides only the blocks tonight's names fall in and keeps the stored pairs of the
others."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import adjudicate, engine, node_merge, resolve, runner, schema, store
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.context import Publish, RunContext, Stage
from tkg.pipeline.llm.usage import take_usage, usage_snapshot, with_usage
from tkg.pipeline.stages.common import (
    INTERNAL_ENTITIES,
    INTERNAL_NAMES,
    INTERNAL_PAIRS,
    created_now,
    distinct_entities,
    distinct_rows,
    grown,
    join_alias_map,
    on_one_side,
    only,
    previous_table,
)
from tkg.pipeline.stages.names import MENTIONS


class AdjudicateBatch:
    """Ray Data UDF: the configured judge (built once per actor) decides undecided pairs."""

    def __init__(self, config: TkgConfig) -> None:
        self.judge = adjudicate.build_judge(config)
        self.batch_size = config.resolve.adjudicate_batch

    def __call__(self, pairs: pa.Table) -> pa.Table:
        before = usage_snapshot(self.judge)
        judged = adjudicate.adjudicate(pairs, self.judge, self.batch_size)[0]
        return with_usage(judged, before, usage_snapshot(self.judge))  # counted by the stage


def _undecided(pairs: Dataset) -> int:
    return engine.total(pairs, lambda block: int(pc.sum(pc.invert(block["merge"])).as_py() or 0))


def _candidates(ctx: RunContext, keyed: Dataset, names: dict[str, Dataset]) -> Dataset:
    """Pair decisions of the blocks in `keyed` (`resolve.KEY_ROWS`): the blocks' pairs of
    names (a shuffle by block, `resolve.pair_ids`), decided with what `names` carry of each
    name (`resolve.name_rows`: features, vector, short-name rows) in a shuffle by group
    (`resolve.decide_in_groups`)."""
    found = engine.shuffle(ctx, keyed, ["group_id", "key"], resolve.pair_ids,
                           ctx.config.resolve, partitions=ctx.partitions_for(keyed.count())
                           ).materialize()
    parts = {"pair": found, **names}
    # a few big groups in the default 2 x CPUs partitions share some (the 1,000,000-mention
    # bench's 4 groups fell in 3 of 4: one task decided two groups, after the others)
    rows = sum(part.count() for part in parts.values())
    return engine.shuffle_together(ctx, parts, ["group_id"], resolve.deciding,
                                   resolve.decide_in_groups, ctx.config.resolve,
                                   partitions=ctx.partitions_for(rows)).materialize()


def _adjudicated(ctx: RunContext, pairs: Dataset) -> Dataset:
    """`pairs` with the undecided ones put to the configured adjudicator (if any)."""
    undecided = _undecided(pairs)
    ctx.count("ambiguous_pairs", undecided)
    if undecided and ctx.config.resolve.adjudicator != "none":
        pairs = runner.over_rows(ctx, pairs, runner.Model(
            AdjudicateBatch, (ctx.config,), actors=1, fixed_pool=True))
        pairs = take_usage(ctx, pairs, "resolve").materialize()  # LLM judges' calls, tokens
        ctx.count("adjudicated_pairs", undecided - _undecided(pairs))
    return pairs


def _stored_pairs(ctx: RunContext) -> Dataset | None:
    """The previous snapshot's resolution pairs when it decided them under this run's
    `resolve` settings; after a change of thresholds, keys or adjudicator every block is
    decided again."""
    if ctx.previous is None:
        return None
    decided_under = (store.read_manifest(ctx.previous).get("config") or {}).get("resolve")
    if decided_under != json.loads(json.dumps(ctx.config.resolve.model_dump(mode="json"))):
        return None
    return previous_table(ctx, INTERNAL_PAIRS)


def _by_group(ctx: RunContext, per_group: Callable[[pa.Table], pa.Table],
              **parts: Dataset) -> Dataset:
    """`parts` as `resolve.TAGGED` rows (each marked with its name), shuffled by group and
    `per_group` run once per block of whole groups: a worker holds one block of groups, the
    driver only what the size policy places there."""
    return engine.shuffle_together(ctx, parts, ["group_id"], resolve.tagged,
                                   per_group).materialize()


def _part(ctx: RunContext, rows: Dataset, tag: str, table_schema: pa.Schema) -> Dataset:
    """The `tag` rows of a `_by_group` result, as a dataset of `table_schema`."""
    return engine.map(ctx, rows, resolve.untagged, tag, table_schema).materialize()


def _pairs_against_stored(ctx: RunContext, keyed: Dataset, names: Dataset, stored: Dataset,
                          new: Dataset) -> Dataset:
    """The pairs of a later run: the stored ones no name of tonight can alter, and the
    blocks tonight's names fall in decided again (`resolve.blocks_to_recompute`, per group);
    only pairs with a name of tonight go to the adjudicator. The stored pairs and every
    name's block keys stay datasets: each step is a shuffle by group or a join, so nothing
    of the store's size comes to the driver beyond what the size policy places there."""
    changed = engine.map(ctx, new, resolve.mention_rows).materialize()
    short = _part(ctx, names, "short", resolve.KEYED_NAMES)
    against = _by_group(ctx, resolve.against_stored, stored=stored, key=keyed, short=short,
                        changed=changed)
    blocks = _part(ctx, against, "block", resolve.BLOCKS)
    ctx.count("resolve_blocks_recomputed", blocks.count())  # computed: read off metadata
    def in_blocks(rows: Dataset) -> Dataset:
        # blocks are distinct (group_id, key): the inner join is the semi-join "in blocks"
        return engine.join(ctx, rows, blocks, "inner", ("group_id", "key")).materialize()

    fresh = _candidates(ctx, in_blocks(keyed), {
        "name": _part(ctx, names, "name", resolve.NAME_ROWS), "short": in_blocks(short)})
    known = _by_group(ctx, resolve.known_in_groups, fresh=fresh,
                      stored=_part(ctx, against, "dropped", resolve.PAIRS), changed=changed)
    decided = _adjudicated(ctx, _part(ctx, known, "tonight", resolve.PAIRS))
    every = engine.union(ctx, _part(ctx, against, "kept", resolve.PAIRS),
                         _part(ctx, known, "repeated", resolve.PAIRS), decided).materialize()
    return engine.shuffle(ctx, every, ["group_id"], resolve.distinct_pairs).materialize()


def _whole(ctx: RunContext, nodes: Dataset) -> Dataset:
    """A full run's pair decisions in one shuffle by group: each name's row
    (`resolve.name_rows`: features, int8 vector, SimHash band codes, short-name rows), and
    the names that share a `c:`, `d:` or band block found there, from the rows of the whole
    group (`resolve.decide_in_groups` with `blocks`). At 1,000,000 mentions the names' `c:`
    and `d:` keys were 10.3 M rows shuffled by block (14 s) and a second map over the
    nodes (7 s)."""
    config = ctx.config.resolve
    names = engine.map(ctx, nodes, resolve.name_rows, config, True).materialize()
    return engine.shuffle(ctx, names, ["group_id"], resolve.decide_in_groups, config, True,
                          partitions=ctx.partitions_for(names.count())).materialize()


def _resolved(ctx: RunContext, inputs: dict[str, Dataset],
              decide: Callable[[Dataset], Dataset]) -> dict[str, Dataset]:
    """The pairs `decide` makes of the name nodes, connected components and entities, each
    a shuffle keyed by group; the entities and the episodes' mention rows of a later run
    from what the night changed (`_night`)."""
    nodes = inputs["name_vectors"]
    pairs = decide(nodes)
    every_node = engine.map(ctx, nodes, resolve.node_pairs)
    alias_map = engine.shuffle(ctx, engine.union(ctx, pairs, every_node), ["group_id"],
                               resolve.cluster).materialize()
    every_mention = grown(ctx, MENTIONS, inputs["entity_mentions"])
    night = _night(ctx, alias_map, every_mention, inputs["entity_mentions"])
    if night is None:
        by_entity = engine.partition(ctx, join_alias_map(every_mention, alias_map, ctx,
                                                         "normalized"),
                                     ["group_id", "entity_id"])  # 2 uses
        entities = engine.map(ctx, by_entity, resolve.resolve_entities, ctx.created_at,
                              batch_size=None).materialize()
        mentions = engine.map(ctx, by_entity, resolve.episode_mentions, batch_size=None)
    else:
        entities, mentions = night
    return {
        "resolution_pairs": pairs,
        "alias_map": alias_map,
        "resolved_entities": entities,
        "entity_aliases": engine.map(ctx, entities, resolve.alias_rows),
        "mentions": mentions,
    }


def _night(ctx: RunContext, alias_map: Dataset, every_mention: Dataset, new: Dataset
           ) -> tuple[Dataset, Dataset] | None:
    """A later run's entities (`_entities`) and the mention rows of the episodes whose rows
    change (`_episode_mentions`: published as `MENTIONS_TABLE`, replacing those episodes'
    rows), from the alias rows that changed since the previous snapshot's `_name_map`; None
    on a first run, or where that snapshot lacks what this needs."""
    stored = previous_table(ctx, INTERNAL_ENTITIES)
    before = previous_table(ctx, INTERNAL_NAMES)  # (a snapshot of an earlier tkg kept
    if stored is None or before is None or not (  # three of its columns)
            set(schema.NAME_MAP.names) <= set(engine.columns(before))):
        return None
    changed = on_one_side(ctx, before, alias_map, schema.NAME_MAP.names).materialize()
    entities = _entities(ctx, stored, changed, alias_map, every_mention, new)
    return entities, _episode_mentions(ctx, changed, alias_map, every_mention, new)


def _mapped_of(ctx: RunContext, every_mention: Dataset, alias_map: Dataset, names: Dataset
               ) -> Dataset:
    """The mentions of `names` (group_id, normalized: distinct) with their entity."""
    return join_alias_map(engine.join(ctx, every_mention, names, "inner",
                                      ("group_id", "normalized")), alias_map, ctx, "normalized")


def _entities(ctx: RunContext, stored: Dataset, changed: Dataset, alias_map: Dataset,
              every_mention: Dataset, new: Dataset) -> Dataset:
    """`resolve.resolve_entities` of every entity's mentions. An entity's row is a function
    of its mentions and of its names' alias rows, so a later run merges the row of
    tonight's mentions (`new`: the names stage's own, `names.MENTIONS`) into the stored row
    of each entity none of whose alias rows `changed` (`node_merge.merge_rows`), computes
    again from every mention of its names each entity with a changed alias row and each a
    merge cannot make exactly, and keeps the stored row of every other entity
    (`_resolved_entities`), with this run's transaction time as every row gets. Every
    entity's row was 0.94 s of the 160,000-episode night (713,000 mentions), to change a
    few hundred; those the night mentions, from all their mentions, 0.64 s (hub names)."""
    moved = engine.shuffle(ctx, engine.map(ctx, changed, only, ["entity_id"]), ["entity_id"],
                           distinct_entities).materialize()
    merged = _merged_entities(ctx, stored, moved, alias_map, new)
    kept_merged = engine.map(ctx, merged, node_merge.marked, False).materialize()
    ctx.count("entities_merged", kept_merged.count())
    redo = engine.shuffle(ctx, engine.union(ctx, moved, engine.map(
        ctx, engine.map(ctx, merged, node_merge.marked, True), only, ["entity_id"])),
        ["entity_id"], distinct_entities).materialize()
    ctx.count("entities_resolved_again", redo.count())
    names = engine.shuffle(ctx, engine.map(ctx, engine.join(ctx, alias_map, redo, "inner", (
        "entity_id",)), only, ["group_id", "normalized"]), ["group_id", "normalized"],
        distinct_rows).materialize()
    again = engine.shuffle(ctx, _mapped_of(ctx, every_mention, alias_map, names),
                           ["group_id", "entity_id"], resolve.resolve_entities, ctx.created_at)
    done = engine.union(ctx, redo, engine.map(ctx, kept_merged, only, ["entity_id"]))
    kept = engine.map(ctx, engine.join(ctx, stored, done, "left_anti", ("entity_id",)),
                      created_now, ctx.created_at)
    return engine.union(ctx, kept_merged, again, kept).materialize()


def _merged_entities(ctx: RunContext, stored: Dataset, moved: Dataset, alias_map: Dataset,
                     new: Dataset) -> Dataset:
    """`node_merge.merge_rows` of the entities tonight's mentions (`new`) name, but those
    `moved` (an alias row changed): each stored row merged with the row of tonight's
    mentions of it, or marked to be made again."""
    mentioned = engine.join(ctx, join_alias_map(new, alias_map, ctx, "normalized"), moved,
                            "left_anti", ("entity_id",))
    later = engine.shuffle(ctx, mentioned, ["group_id", "entity_id"], resolve.resolve_entities,
                           ctx.created_at).materialize()
    ids = engine.map(ctx, later, only, ["entity_id"])
    return engine.shuffle_together(
        ctx, {"later": later, "stored": engine.join(ctx, stored, ids, "inner", ("entity_id",))},
        node_merge.ENTITY_KEYS, node_merge.tagged, node_merge.merge_rows, ctx.created_at,
        True).materialize()


def _episode_mentions(ctx: RunContext, changed: Dataset, alias_map: Dataset,
                      every_mention: Dataset, new: Dataset) -> Dataset:
    """The (episode, entity) rows of the episodes whose rows change: tonight's, and those
    that mention a name whose alias row changed (its entity may have). Every episode's
    rows were 0.49 s of the 160,000-episode night (735,000 mentions) and their mapping to
    entities 0.24 s."""
    names = engine.shuffle(ctx, engine.map(ctx, changed, only, ["group_id", "normalized"]),
                           ["group_id", "normalized"], distinct_rows)
    episodes = engine.union(ctx, engine.map(ctx, new, only, ["group_id", "episode_id"]),
                            engine.map(ctx, engine.join(ctx, every_mention, names, "inner", (
                                "group_id", "normalized")), only, ["group_id", "episode_id"]))
    touched = engine.shuffle(ctx, episodes, ["group_id", "episode_id"], distinct_rows)
    rows = join_alias_map(engine.join(ctx, every_mention, touched, "inner", (
        "group_id", "episode_id")), alias_map, ctx, "normalized")
    return engine.map(ctx, engine.partition(ctx, rows, ["group_id", "episode_id"]),
                      resolve.episode_mentions, batch_size=None)


def resolve_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Every block decided (the adjudicator asked about what the rules leave open)."""
    return _resolved(ctx, inputs, lambda nodes: _adjudicated(ctx, _whole(ctx, nodes)))


def resolve_update(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """The stored pairs kept where no name of tonight can alter them
    (`_pairs_against_stored`); all decided again when they were decided under other
    settings. Every name's blocking keys, its SimHash bands among them, are rows of the
    shuffles by group and by block (`resolve.name_keys`): the run recomputes only the
    blocks its names fall in."""
    stored = _stored_pairs(ctx)
    if stored is None:
        return resolve_stage(ctx, inputs)
    config = ctx.config.resolve

    def against_stored(nodes: Dataset) -> Dataset:
        rows = engine.map(ctx, nodes, resolve.name_rows, config, True).materialize()
        keyed = engine.map(ctx, rows, resolve.name_keys, config).materialize()
        names = engine.map(ctx, rows, resolve.without_bands).materialize()
        return _pairs_against_stored(ctx, keyed, names, stored, inputs["extractions"])

    return _resolved(ctx, inputs, against_stored)


# the episodes' mention rows: a later run's output holds every row of the episodes whose
# rows change (`_episode_mentions`), the table keeps the stored rows of every other episode
MENTIONS_TABLE = Publish("mentions", "mentions", replaces="episode_id")
STAGE = Stage("resolve", ("name_vectors", "extractions", "entity_mentions"),
              ("resolution_pairs", "alias_map", "resolved_entities", "entity_aliases",
               "mentions"), resolve_stage, update=resolve_update,
              state=(INTERNAL_PAIRS, INTERNAL_ENTITIES, INTERNAL_NAMES, MENTIONS.table),
              publishes=(Publish("resolution_pairs", INTERNAL_PAIRS),
                         Publish("resolved_entities", INTERNAL_ENTITIES),
                         Publish("entity_aliases", "entity_aliases"),
                         MENTIONS_TABLE))
