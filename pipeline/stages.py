"""The build as named steps in a registry: each a function from Ray datasets to Ray datasets.

The runner (`tkg.pipeline.build`) materializes every output under `STORE/work/<run_id>/<stage>/`,
so a stage sees only finished tables and a rerun can resume after the last finished stage.
Keys of heavy work (conversations, entity names, edges) are shuffled with group_id in the
key, so memory per worker is bounded by the largest block, never by the dataset.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.data import Dataset
from tkg.pipeline import (
    adjudicate,
    communities,
    engine,
    facts,
    faults,
    resolve,
    runner,
    schema,
    sources,
    store,
)
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.context import RunContext, Stage
from tkg.pipeline.datasets import empty_dataset, from_tables, read_parquet_files
from tkg.pipeline.embed import EmbedColumn, shared_embedder
from tkg.pipeline.extract import EpisodeInput, build_extractor
from tkg.pipeline.extract.llm import dataset_extractor
from tkg.pipeline.extract.records import record_text
from tkg.pipeline.llm.usage import count_llm, take_usage, usage_snapshot, with_usage
from tkg.pipeline.resume import resumable


def previous_table(ctx: RunContext, table: str, columns: list[str] | None = None
                   ) -> Dataset | None:
    """A table of the snapshot this run builds on (incremental runs), or None; `columns`:
    only these."""
    if ctx.previous is None:
        return None
    files = store.table_files(ctx.previous, table)
    if not files:
        return None
    rows = read_parquet_files(files, columns, engine.policy(ctx).driver_bytes)
    ctx.count("previous_rows_read", rows.count())  # what the run costs in the store's size
    return rows


def all_extractions(ctx: RunContext, new: Dataset, columns: list[str]) -> Dataset:
    """This run's extractions plus those of every earlier run (their `columns`, the rest
    null): resolution is recomputed over every name, so several runs over parts agree with
    one run over all."""
    previous = previous_table(ctx, INTERNAL_EXTRACTIONS, columns)
    return new if previous is None else engine.union(ctx, new, engine.map(
        ctx, previous, schema.conform, schema.EXTRACTIONS))


INTERNAL_EXTRACTIONS = "_extractions"  # published with each snapshot, not in the catalog
INTERNAL_PAIRS = "_resolution_pairs"  # the pairs resolution decided (what a later run keeps)
# What entity resolution and facts read of earlier extractions (not raw LLM output).
ENTITY_COLUMNS = ["group_id", "episode_id", "valid_at", "entities"]
FACT_COLUMNS = ["group_id", "episode_id", "valid_at", "facts"]


# --- read + validate ------------------------------------------------------------------------


@ray.remote
def _read_file(path: Path | str, run_id: str, config: TkgConfig, created_at: datetime):
    return sources.read_file(path, run_id=run_id, limits=config.limits, created_at=created_at,
                             storage_config=config.storage)


def read_stage(ctx: RunContext, _: dict[str, Dataset]) -> dict[str, Dataset]:
    """One Ray task per input file; bad records become rejects with file and line."""
    read = engine.run_tasks(_read_file, ((p, ctx.run_id, ctx.config, ctx.created_at)
                                         for p in ctx.files))
    episodes, rejects = [], []
    for ep_table, rej_table, stats in read:
        episodes.append(ep_table)
        rejects.append(rej_table)
        for key in ("episodes_in", "episodes_ok", "rejected", "missing_timezone"):
            ctx.count(key, getattr(stats, key))
    return {
        "raw_episodes": from_tables(episodes),
        "read_rejects": from_tables(rejects),
    }


# --- window -------------------------------------------------------------------------------


def _with_window_key(batch: pa.Table) -> pa.Table:
    keys = [sources.window_key(g, k, c, e) for g, k, c, e in zip(
        batch["group_id"].to_pylist(), batch["kind"].to_pylist(),
        batch["conversation_id"].to_pylist(), batch["episode_id"].to_pylist(), strict=True)]
    return batch.append_column("window_key", pa.array(keys, pa.string()))


WINDOW_OUT = schema.WINDOWED_EPISODES.append(pa.field("reject", pa.string()))


def _window_block(rows: pa.Table, args: dict) -> pa.Table:
    episodes, rejects = sources.window_episodes(rows.drop_columns(["window_key"]), **args)
    out = schema.conform(episodes, WINDOW_OUT)
    if rejects:
        marked = [{"reject": json.dumps(r, default=str)} for r in rejects]
        out = pa.concat_tables([out, pa.Table.from_pylist(marked, schema=WINDOW_OUT)])
    return out


def window_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Deduplicate by episode id and attach the previous n messages of each conversation."""
    args = {
        "context_messages": ctx.config.extract.context_messages, "run_id": ctx.run_id,
        "created_at": ctx.created_at, "payload_chars": ctx.config.limits.reject_payload_chars,
    }
    keyed = engine.map(ctx, inputs["raw_episodes"], _with_window_key)
    grouped = engine.shuffle(ctx, keyed, ["window_key"], _window_block, args).materialize()
    # Re-deliveries (same id, same content) are what the window dropped: rows in minus rows
    # out, kept or rejected.
    ctx.count("duplicates", inputs["raw_episodes"].count() - grouped.count())
    episodes = engine.map(ctx, grouped, _kept_episodes)
    stored = previous_table(ctx, "episodes", ["episode_id"])
    if stored is not None:  # re-ingesting what the store has is a no-op
        episodes = episodes.materialize()  # counted and joined: computed once
        before = episodes.count()
        episodes = engine.join(ctx, episodes, stored, "left_anti",
                               ("episode_id",)).materialize()
        ctx.count("already_ingested", before - episodes.count())
    rejects = engine.map(ctx, grouped, _decode_rejects)
    return {"episodes": episodes, "window_rejects": rejects}


def _kept_episodes(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.is_null(batch["reject"])).drop_columns(["reject"])


def _decode_rejects(batch: pa.Table) -> pa.Table:
    rows = [json.loads(r) for r in batch["reject"].to_pylist() if r is not None]
    for row in rows:
        row["created_at"] = datetime.fromisoformat(row["created_at"])
    return schema.from_rows(rows, schema.REJECTS)


# --- extract ------------------------------------------------------------------------------


class ExtractBatch:
    """Ray Data UDF: one extractor per actor, Arrow batches in and out."""

    def __init__(self, config: TkgConfig, crash: bool = False) -> None:
        self.extractor = build_extractor(config)
        self.crash = crash  # faults.actor_exit: the process dies on every batch

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.crash:
            faults.die()
        episodes = [
            EpisodeInput(
                episode_id=r["episode_id"], group_id=r["group_id"], kind=r["kind"],
                content=r["content"] or "", valid_at=r["valid_at"], source_id=r["source_id"],
                speaker=r["speaker"], title=r["title"], source=r["source"],
                context=tuple(r["context"] or ()),
            )
            for r in batch.select(["episode_id", "group_id", "kind", "content", "valid_at",
                                   "source_id", "speaker", "title", "source", "context"]
                                  ).to_pylist()
        ]
        rows = []
        for episode, result in zip(episodes, self.extractor.extract(episodes), strict=True):
            rows.append({
                "episode_id": episode.episode_id, "group_id": episode.group_id,
                "valid_at": episode.valid_at,
                "entities": [vars(e) for e in result.entities],
                "facts": [vars(f) for f in result.facts],
                "error": result.error, "raw_output": result.raw_output,
                **{k: getattr(result, k) for k in LLM_USAGE},
            })
        return schema.from_rows(rows, schema.EXTRACTIONS)


def _extraction_rejects(run_id: str, created_at: datetime) -> Callable[[pa.Table], pa.Table]:
    def to_rejects(batch: pa.Table) -> pa.Table:
        failed = batch.filter(pc.is_valid(batch["error"]))
        rows = [
            sources.reject_row(run_id=run_id, stage="extract", group_id=r["group_id"],
                               episode_id=r["episode_id"], reason=r["error"],
                               payload=r["raw_output"], created_at=created_at)
            for r in failed.select(["group_id", "episode_id", "error", "raw_output"]).to_pylist()
        ]
        return schema.from_rows(rows, schema.REJECTS)

    return to_rejects


LLM_USAGE = ("llm_calls", "llm_prompt_tokens", "llm_completion_tokens", "llm_retries")


_DRIVER_EXTRACTORS: dict[str, ExtractBatch] = {}  # per config: loaded once per process


def _driver_extractor(config: TkgConfig) -> ExtractBatch:
    """The driver's extractor, loaded once per process and config."""
    key = config.model_dump_json()
    if key not in _DRIVER_EXTRACTORS:
        _DRIVER_EXTRACTORS[key] = ExtractBatch(config)
    return _DRIVER_EXTRACTORS[key]


def extractor(config: TkgConfig, crash: bool) -> runner.Model:
    """Extraction as a model over episodes: spaCy may run in the driver (a night of a few
    hundred episodes spent most of its extract stage starting actors that load spaCy and a
    model each); an LLM extractor, or one told to crash, runs on actors."""
    in_driver = config.extract.backend == "spacy" and not crash
    return runner.Model(ExtractBatch, (config, crash), batch_rows=config.extract.batch_size,
                        actors=config.extract.actors,
                        local=(lambda: _driver_extractor(config)) if in_driver else None)


def extract_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Entities and facts per episode; a failed episode stays, with no extraction, in rejects."""
    if (dataset_extract := dataset_extractor(ctx.config)) is not None:  # vLLM on GPU actors
        extractions = runner.over_dataset(
            inputs["episodes"], lambda episodes: dataset_extract(episodes, ctx.config))
    elif engine.nonempty(inputs["episodes"]) is None:  # no model load for no rows
        return {"extractions": empty_dataset(), "extract_rejects": empty_dataset()}
    else:
        model = extractor(ctx.config, crash=faults.actor_exit("extract"))
        extractions = runner.over_rows(ctx, inputs["episodes"], model)
    rejects = engine.map(ctx, extractions, _extraction_rejects(ctx.run_id, ctx.created_at))
    return {"extractions": count_llm(ctx, extractions), "extract_rejects": rejects}


# --- resolve entities ---------------------------------------------------------------------


def name_nodes(mentions: pa.Table, created_at: datetime) -> pa.Table:
    """One node per normalized name of a group: the mentions, not yet mapped to entities,
    grouped by name (what `resolve.resolve_entities` does with unmapped mentions)."""
    return resolve.resolve_entities(mentions, created_at)


def names_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Name nodes: every surface form that normalizes the same, per group (exact match)."""
    extractions = all_extractions(ctx, inputs["extractions"], ENTITY_COLUMNS)
    mentions = engine.map(ctx, extractions, resolve.mention_rows).materialize()
    nodes = engine.shuffle(ctx, mentions, ["group_id", "normalized"], name_nodes,
                           ctx.created_at)
    return {"name_nodes": nodes, "entity_mentions": mentions}  # resolve maps the mentions


def embed_names_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Vectors of each name node, for the embedding-neighbour blocking of resolution. A name
    that a stored entity is named by keeps that entity's vector (an entity's name is one
    of its names' surface forms, so (group, name) is unique among entities)."""
    return {"name_vectors": embed_changed(ctx, inputs["name_nodes"], "entities", "group_id",
                                          "name", "name_embedding", what="names")}


def _rename(mapping: dict[str, str]) -> Callable[[pa.Table], pa.Table]:
    def rename(batch: pa.Table) -> pa.Table:
        return batch.rename_columns([mapping.get(c, c) for c in batch.column_names])

    return rename


def join_alias_map(ds: Dataset, alias_map: Dataset, ctx: RunContext, column: str,
                   prefix: str = "") -> Dataset:
    """Attach the resolved entity of `column` (a normalized name) to every row."""
    right = engine.map(ctx, alias_map, _rename({
        "normalized": column, "entity_id": f"{prefix}entity_id", "root": f"{prefix}root",
        "evidence": f"{prefix}evidence", "score": f"{prefix}score"}))
    return engine.join(ctx, ds, right, "inner", ("group_id", column))


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


def _candidates(ctx: RunContext, keyed: Dataset) -> Dataset:
    """Pair decisions of the blocks in `keyed` (shuffled by block)."""
    return engine.shuffle(ctx, keyed, ["group_id", "key"], resolve.candidate_pairs,
                          ctx.config.resolve, partitions=ctx.partitions_for(keyed.count())
                          ).materialize()


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


KEY_COLUMNS = ["group_id", "normalized", "key"]


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


def _pairs_against_stored(ctx: RunContext, keyed: Dataset, stored: Dataset,
                          new: Dataset) -> Dataset:
    """The pairs of a later run: the stored ones no name of tonight can alter, and the
    blocks tonight's names fall in decided again (`resolve.blocks_to_recompute`); only
    pairs with a name of tonight go to the adjudicator. The store's block keys come to the
    driver as three string columns; the pairs are a few per name."""
    changed = engine.gather(ctx, engine.map(ctx, new, resolve.mention_rows),
                            ["group_id", "normalized"], what="tonight's names")
    before = engine.gather(ctx, stored, table_schema=resolve.PAIRS, what="stored pairs")
    kept, blocks = resolve.blocks_to_recompute(
        before, engine.gather(ctx, keyed, KEY_COLUMNS, what="blocking keys"), changed)
    ctx.count("resolve_blocks_recomputed", blocks.num_rows)
    chosen = set(_name_keys(blocks["group_id"], blocks["key"]).to_pylist())
    fresh = _candidates(ctx, engine.map(ctx, keyed, _in_set("key", chosen, group_column="group_id")
                                    ).materialize())
    repeated, tonight = resolve.known_pairs(
        engine.gather(ctx, fresh, table_schema=resolve.PAIRS, what="pairs decided again"),
        before, changed)
    decided = engine.gather(ctx, _adjudicated(ctx, engine.as_dataset(tonight)),
                            table_schema=resolve.PAIRS, what="adjudicated pairs")
    return engine.as_dataset(resolve.distinct_pairs(pa.concat_tables([kept, repeated, decided])))


def resolve_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Blocking keys -> pair decisions (-> adjudicator) -> connected components, each a
    shuffle keyed by group. A later run decides only the blocks its names fall in and
    keeps the stored pairs of the others (`_pairs_against_stored`)."""
    nodes = inputs["name_vectors"]
    keyed = engine.map(ctx, nodes, resolve.blocking_keys, ctx.config.resolve).materialize()
    stored = _stored_pairs(ctx)
    if stored is None:
        pairs = _adjudicated(ctx, _candidates(ctx, keyed))
    else:
        pairs = _pairs_against_stored(ctx, keyed, stored, inputs["extractions"])
    every_node = engine.map(ctx, nodes, resolve.node_pairs)
    alias_map = engine.shuffle(ctx, engine.union(ctx, pairs, every_node), ["group_id"],
                               resolve.cluster).materialize()
    with_entity = join_alias_map(inputs["entity_mentions"], alias_map, ctx, "normalized")
    by_entity = engine.partition(ctx, with_entity, ["group_id", "entity_id"])  # a shuffle, 2 uses
    entities = engine.map(ctx, by_entity, resolve.resolve_entities, ctx.created_at,
                      batch_size=None).materialize()
    return {
        "resolution_pairs": pairs,
        "alias_map": alias_map,
        "resolved_entities": entities,
        "entity_aliases": engine.map(ctx, entities, resolve.alias_rows),
        "mentions": engine.map(ctx, by_entity, resolve.episode_mentions, batch_size=None),
    }


# --- facts --------------------------------------------------------------------------------


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
        sources = engine.map(ctx, sources, _in_set("entity_id", only))
    return engine.shuffle(ctx, sources, ["group_id", "entity_id"], facts.entity_summaries,
                          ctx.config.facts.summary_facts)


def facts_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Edges and entity summaries: over every extraction in a first run, over the subjects
    a later run touched otherwise (`_touched_facts`: its edges are those subjects' only)."""
    stored = previous_table(ctx, "facts", schema.MERGED_FACTS.names)
    recomputed = empty_dataset()
    if stored is None:
        mentions = engine.map(ctx, all_extractions(ctx, inputs["extractions"], FACT_COLUMNS),
                          facts.fact_mentions)
        checked = _edges(ctx, mentions, inputs["alias_map"])
        summaries = _summaries(ctx, checked)
    else:
        checked, summaries, recomputed = _touched_facts(
            ctx, inputs["extractions"], inputs["alias_map"], stored)
    entities = engine.map(ctx, engine.join(
        ctx, engine.map(ctx, inputs["resolved_entities"], _without, ["summary"]),
        engine.map(ctx, summaries, _without, ["group_id"]),
        "left_outer", ("entity_id",),
    ), _no_null_summary)
    stored = previous_table(ctx, "entities", ["entity_id", "created_at"])
    if stored is not None:  # an entity keeps the transaction time it was first stored at
        first = engine.map(ctx, stored, _rename({"created_at": "first_created_at"}))
        entities = engine.map(ctx, engine.join(ctx, entities, first, "left_outer",
                                               ("entity_id",)), _first_created)
    return {"merged_facts": checked, "entities_summarized": entities,
            "recomputed_subjects": recomputed}


# --- facts of a later run: only what it touched ----------------------------------------------


def _name_keys(groups: pa.ChunkedArray | pa.Array, names: pa.ChunkedArray | pa.Array
               ) -> pa.Array:
    """(group, normalized name) as one string: names are only unique within a group."""
    return pc.binary_join_element_wise(groups, names, "\x1f")


def _in_set(column: str, values: set[str], keep: bool = True,
            group_column: str | None = None) -> Callable[[pa.Table], pa.Table]:
    """Rows whose `column` (with `group_column`: the group and it) is in `values`, or, with
    `keep` false, is not."""
    value_set = pa.array(sorted(values), pa.string())

    def select(batch: pa.Table) -> pa.Table:
        if column not in batch.column_names:  # a block without rows or columns
            return batch
        keys = (batch[column] if group_column is None
                else _name_keys(batch[group_column], batch[column]))
        found = pc.fill_null(pc.is_in(keys, value_set=value_set), False)
        return batch.filter(found if keep else pc.invert(found))

    return select


def _open_versions(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.is_null(batch["expired_at"]))


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
    entity_of = dict(zip(_name_keys(aliases["group_id"], aliases["normalized"]).to_pylist(),
                         aliases["entity_id"].to_pylist(), strict=True))

    def names_of(entities: set[str]) -> set[str]:
        return {name for name, entity in entity_of.items() if entity in entities}

    def subjects_in(mentions: pa.Table) -> set[str]:
        keys = _name_keys(mentions["group_id"], mentions["source_normalized"]).to_pylist()
        return {entity_of[k] for k in keys if k in entity_of}

    new_mentions = engine.map(ctx, new, facts.fact_mentions).materialize()
    tonight = subjects_in(engine.gather(ctx, new_mentions, ["group_id", "source_normalized"],
                                        what="tonight's fact subjects"))
    ends = engine.gather(ctx, stored, ["source_entity_id", "target_entity_id"],
                         what="stored fact endpoints")
    rebuilt = changed | {source for source, target in zip(
        ends["source_entity_id"].to_pylist(), ends["target_entity_id"].to_pylist(),
        strict=True) if target in changed}
    plain = tonight - rebuilt
    open_versions = engine.map(ctx, stored, _open_versions).materialize()
    edges = [_rebuilt_edges(ctx, new_mentions, alias_map, names_of(rebuilt),
                            bool(rebuilt & set(stored_aliases["entity_id"].to_pylist()))),
             _combined_edges(ctx, new_mentions, alias_map, names_of(plain),
                             engine.map(ctx, open_versions, _in_set("source_entity_id", plain)))]
    emitted = engine.union(ctx, *edges).materialize()
    dropped = engine.map(ctx, open_versions, _in_set("source_entity_id", rebuilt))
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
    carried = engine.map(ctx, engine.map(ctx, open_versions, _in_set("source_entity_id", rebuilt,
                                                             keep=False)),
                     _in_set("edge_id", replaced, keep=False))
    now = engine.union(ctx, emitted, engine.map(ctx, carried, schema.conform, schema.MERGED_FACTS))
    kept = engine.map(ctx, previous_table(ctx, "entities", ["group_id", "entity_id", "summary"]),
                  _in_set("entity_id", touched, keep=False))
    recomputed = pa.table({"source_entity_id": pa.array(sorted(rebuilt), pa.string())})
    return (emitted, engine.union(ctx, _summaries(ctx, now.materialize(), touched), kept),
            engine.as_dataset(recomputed))


def _rebuilt_edges(ctx: RunContext, new_mentions: Dataset, alias_map: Dataset,
                   names: set[str], stored_before: bool) -> Dataset:
    """The edges of subjects named `names`, from every mention with them as subject: this
    run's and, when one of them was `stored_before`, earlier runs'."""
    mentions = engine.map(ctx, new_mentions, _in_set("source_normalized", names,
                                                 group_column="group_id"))
    earlier = previous_table(ctx, INTERNAL_EXTRACTIONS, FACT_COLUMNS) if stored_before else None
    if earlier is not None:
        old = engine.map(ctx, engine.map(ctx, earlier, schema.conform, schema.EXTRACTIONS),
                     facts.fact_mentions)
        mentions = engine.union(ctx, mentions, engine.map(
            ctx, old, _in_set("source_normalized", names, group_column="group_id")))
    return _edges(ctx, mentions.materialize(), alias_map)


def _combined_edges(ctx: RunContext, new_mentions: Dataset, alias_map: Dataset,
                    names: set[str], stored: Dataset) -> Dataset:
    """Tonight's edges of subjects named `names` combined with their `stored` open edges,
    invalidated again; only the new and changed ones."""
    mentions = engine.map(ctx, new_mentions, _in_set("source_normalized", names,
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


def _only(batch: pa.Table, columns: list[str]) -> pa.Table:
    return batch.select(columns)


def _without(batch: pa.Table, columns: list[str]) -> pa.Table:
    return batch.drop_columns(columns)


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


# --- embed --------------------------------------------------------------------------------


def _episode_text(batch: pa.Table) -> pa.Table:
    texts = []
    for kind, speaker, title, source, content in zip(
        *(batch[c].to_pylist() for c in ("kind", "speaker", "title", "source", "content")),
        strict=True,
    ):
        if kind == "json":
            content = record_text(content or "{}")
        prefix = {"message": speaker, "text": title, "json": source}.get(kind)
        texts.append(f"{prefix}: {content}" if prefix else content)
    return batch.append_column("embed_text", pa.array(texts, pa.string()))


EMBED_BLOCK_ROWS = 1024


def embedder(config: TkgConfig, text: str, vector: str) -> runner.Model:
    """Embedding of `text` into `vector` as a model over rows. On a CPU it may run in the
    driver: a night's new names and facts are a few hundred texts, and an actor pool per
    column started a model per actor for them. The driver's model is `build_embedder`'s (the
    actors' too, so both give the same vectors), loaded once per process and shared with
    the driver's extractor."""
    gpus = config.embed.gpus_per_actor  # BGE-m3 on GPU actors

    def local() -> EmbedColumn:
        return EmbedColumn(config, text, vector, embedder=shared_embedder(config))

    return runner.Model(EmbedColumn, (config, text, vector), batch_rows=EMBED_BLOCK_ROWS,
                        actors=config.embed.actors, gpus=gpus, local=None if gpus else local)


def embed_column(ctx: RunContext, ds: Dataset, text: str, vector: str) -> Dataset:
    """`vector` = the embedding of `text`, for every row of `ds`."""
    return runner.over_rows(ctx, ds, embedder(ctx.config, text, vector))


def _stored_vectors(key: str, text: str, vector: str) -> Callable[[pa.Table], pa.Table]:
    """The (key, text, vector) rows of a stored table that a new row may reuse: the open
    version of each fact (one per edge), every entity."""

    def select(batch: pa.Table) -> pa.Table:
        if "expired_at" in batch.column_names:
            batch = batch.filter(pc.is_null(batch["expired_at"]))
        return batch.select([key, text, vector])

    return select


def _vector_split(vector: str, carried: bool) -> Callable[[pa.Table], pa.Table]:
    """Rows of a left join with stored vectors: those that found one (`carried`), or the
    others without the (null) vector column."""

    def split(batch: pa.Table) -> pa.Table:
        if vector not in batch.column_names:  # nothing stored joined
            return batch.slice(0, 0) if carried else batch
        found = pc.is_valid(batch[vector])
        return batch.filter(found) if carried else batch.filter(
            pc.invert(found)).drop_columns([vector])

    return split


def embed_changed(ctx: RunContext, ds: Dataset, table: str, key: str, text: str,
                  vector: str, what: str | None = None) -> Dataset:
    """`embed_column`, for the rows whose (key, text) the previous snapshot's `table` does
    not hold; the others keep their stored vector. A vector is a function of its text, so
    this equals embedding everything, and a night embeds what the night changed (embedding
    every entity and fact again was 111 s of 165 s for 200 episodes into 19,800)."""
    columns = [key, text, vector]
    if "expired_at" in schema.PUBLISHED[table](1).names:
        columns.append("expired_at")  # of versioned tables, the open versions' texts
    stored = previous_table(ctx, table, columns)
    if stored is None:
        return embed_column(ctx, ds, text, vector)
    old = engine.map(ctx, stored, _stored_vectors(key, text, vector))
    both = engine.join(ctx, ds, old, "left_outer", (key, text)).materialize()
    fresh = engine.map(ctx, both, _vector_split(vector, carried=False))
    kept = engine.nonempty(engine.map(ctx, both, _vector_split(vector, carried=True)))
    embedded = embed_column(ctx, fresh, text, vector)
    ctx.count(f"{what or table}_vectors_carried", kept.count() if kept is not None else 0)
    return embedded if kept is None else engine.union(ctx, embedded, kept)


def embed_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Vectors for episode contents, entity names and fact texts (one model per actor);
    names and facts the previous snapshot holds with the same text keep their vectors."""
    episodes = engine.map(ctx, inputs["episodes"], _episode_text)
    return {
        "episodes_embedded": embed_column(ctx, episodes, "embed_text", "content_embedding"),
        "entities": embed_changed(ctx, inputs["entities_summarized"], "entities",
                                  "entity_id", "name", "name_embedding"),
        "facts": embed_changed(ctx, inputs["merged_facts"], "facts", "edge_id", "fact",
                               "fact_embedding"),
    }


def _tag(side: str, dim: int) -> Callable[[pa.Table], pa.Table]:
    def tag(batch: pa.Table) -> pa.Table:
        batch = schema.conform(batch, schema.facts(dim))
        return batch.append_column("side", pa.array([side] * batch.num_rows, pa.string()))

    return tag


def versions_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Bi-temporal versions against the previous snapshot, shuffled by edge: an unchanged
    fact keeps its version; a changed one closes the open version and appends the next."""
    stored = previous_table(ctx, "facts")
    if stored is None:
        return {"facts_versioned": inputs["facts"]}
    # Stored edges keep their versions as they are unless the facts stage passed them on
    # (new or changed) or rebuilt their subject (rebuilt, or gone): only those meet in the
    # shuffle. Which edges are carried is a join, on Ray Data when the store is big.
    untouched = engine.join(ctx, engine.map(ctx, stored, _open_versions),
                            engine.map(ctx, inputs["recomputed_subjects"], _only,
                                       ["source_entity_id"]),
                            "left_anti", ("source_entity_id",))
    carried = engine.join(ctx, engine.map(ctx, untouched, _only, ["edge_id"]),
                          engine.map(ctx, inputs["facts"], _only, ["edge_id"]),
                          "left_anti", ("edge_id",)).materialize()
    both = engine.union(ctx, engine.map(ctx, inputs["facts"], _tag("new", ctx.dim)), engine.map(
        ctx, engine.join(ctx, stored, carried, "left_anti", ("edge_id",)),
        _tag("old", ctx.dim)))
    versioned = engine.shuffle(ctx, both, ["edge_id"], facts.version_edges, ctx.created_at)
    kept = engine.join(ctx, stored, carried, "inner", ("edge_id",))
    return {"facts_versioned": engine.union(ctx, versioned, kept)}


def communities_stage(ctx: RunContext, inputs: dict[str, Dataset]) -> dict[str, Dataset]:
    """Label propagation per group (shuffled by group, one call per block). Incremental runs
    extend the previous snapshot's communities (communities.refresh: "always" reruns it)."""
    config = ctx.config.communities
    parts = [engine.map(ctx, inputs[name], communities.input_rows, kind)
             for name, kind in (("entities", "entity"), ("facts_versioned", "fact"),
                                ("mentions", "mention"))]
    mode = "extend" if ctx.previous is not None and config.refresh == "extend" else "refresh"
    for table, kind in (("communities", "community"), ("community_members", "member")):
        stored = previous_table(ctx, table)
        if stored is not None:  # a refresh matches ids against them
            parts.append(engine.map(ctx, stored, communities.input_rows, kind))
    rows = engine.shuffle(ctx, engine.union(ctx, *parts), ["group_id"],
                          communities.community_block, ctx.config, ctx.created_at, mode
                          ).materialize()
    rows = take_usage(ctx, rows, "communities").materialize()  # an LLM summarizer's calls
    found = rows.count()
    ctx.count("communities_extended",
              engine.total(rows, lambda block: int(pc.sum(block["placed"]).as_py() or 0)))
    named = embed_column(ctx, rows, "name", "name_embedding") if found else rows
    return {"community_rows": rows, "communities": named,
            "community_members": engine.map(ctx, rows, communities.member_rows)}


STAGES: tuple[Stage, ...] = (
    Stage("read", (), ("raw_episodes", "read_rejects"), read_stage),
    Stage("window", ("raw_episodes",), ("episodes", "window_rejects"), window_stage),
    # Chunked by a hash of episode_id, each chunk kept: a resumed run skips finished ones.
    resumable(Stage("extract", ("episodes",), ("extractions", "extract_rejects"),
                    extract_stage, model=True), chunk_rows=lambda c: c.extract.chunk_rows),
    Stage("names", ("extractions",), ("name_nodes", "entity_mentions"), names_stage),
    Stage("embed_names", ("name_nodes",), ("name_vectors",), embed_names_stage, model=True),
    Stage("resolve", ("name_vectors", "extractions", "entity_mentions"),
          ("resolution_pairs", "alias_map", "resolved_entities", "entity_aliases", "mentions"),
          resolve_stage),
    Stage("facts", ("extractions", "alias_map", "resolved_entities"),
          ("merged_facts", "entities_summarized", "recomputed_subjects"), facts_stage),
    Stage("embed", ("episodes", "entities_summarized", "merged_facts"),
          ("episodes_embedded", "entities", "facts"), embed_stage, model=True),
    Stage("versions", ("facts", "recomputed_subjects"), ("facts_versioned",), versions_stage),
    Stage("communities", ("entities", "facts_versioned", "mentions"),
          ("community_rows", "communities", "community_members"), communities_stage),
)
REGISTRY: dict[str, Stage] = {stage.name: stage for stage in STAGES}
