"""What several stages share: the previous snapshot's tables, earlier extractions, name and
id filters, the alias map join, and embedding with stored vectors carried."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from tkg.pipeline import engine, runner, schema, store
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.context import Publish, RunContext
from tkg.pipeline.datasets import Keys, read_parquet_files
from tkg.pipeline.embed import RANKED, EmbedColumn, shared_embedder
from tkg.pipeline.storage import rows_in

INTERNAL_EXTRACTIONS = "_extractions"  # published with each snapshot, not in the catalog


INTERNAL_PAIRS = "_resolution_pairs"  # the pairs resolution decided (what a later run keeps)
INTERNAL_NAMES = "_name_map"  # every name's entity, what the next run compares its own to
INTERNAL_ENTITIES = "_resolved_entities"  # resolution's entity rows (kept where unchanged)
# What entity resolution and facts read of earlier extractions (not raw LLM output).
ENTITY_COLUMNS = ["group_id", "episode_id", "valid_at", "entities"]
FACT_COLUMNS = ["group_id", "episode_id", "valid_at", "facts"]


def previous_table(ctx: RunContext, table: str, columns: list[str] | None = None,
                   keys: Keys | None = None) -> Dataset | None:
    """A table of the snapshot this run builds on (incremental runs), or None; `columns`:
    only these; `keys` (a key column and values of it): only the rows of those keys."""
    if ctx.previous is None:
        return None
    files = store.table_files(ctx.previous, table)
    if not files:
        return None
    rows = read_parquet_files(files, columns, engine.policy(ctx).driver_bytes, keys)
    ctx.count("previous_rows_read", rows.count())  # what the run costs in the store's size
    return rows


def replaced(ctx: RunContext, published: Publish, rows: Dataset,
             columns: list[str] | None = None) -> Dataset:
    """What publish will write of a table published with `Publish.replaces`: the stage's
    `rows` (every row of the keys the run changed) and the previous snapshot's rows of
    every other key (their `columns`); `rows` alone on a first run."""
    stored = previous_table(ctx, published.table, columns)
    if stored is None or published.replaces is None:
        return rows
    key = published.replaces
    kept = engine.join(ctx, stored, engine.map(ctx, rows, only, [key]), "left_anti", (key,))
    return engine.union(ctx, rows, kept)


def grown(ctx: RunContext, published: Publish, rows: Dataset) -> Dataset:
    """What publish will write of a table published with `Publish.grows`: the previous
    snapshot's rows and this run's `rows` (those alone on a first run)."""
    stored = previous_table(ctx, published.table)
    return rows if stored is None else engine.union(ctx, rows, stored)


def created_now(rows: pa.Table, created_at: datetime) -> pa.Table:
    """`rows` with this run's transaction time (`created_at`): a row a stage keeps as the
    previous snapshot stored it, where every row the stage computes gets it."""
    at = rows.schema.get_field_index("created_at")
    return rows.set_column(at, "created_at", pa.array([created_at] * rows.num_rows,
                                                      rows.schema.field(at).type))


def all_extractions(ctx: RunContext, new: Dataset, columns: list[str]) -> Dataset:
    """This run's extractions plus those of every earlier run (their `columns`, the rest
    null): resolution is recomputed over every name, so several runs over parts agree with
    one run over all."""
    previous = previous_table(ctx, INTERNAL_EXTRACTIONS, columns)
    return new if previous is None else engine.union(ctx, new, engine.map(
        ctx, previous, schema.conform, schema.EXTRACTIONS))


def rename(mapping: dict[str, str]) -> Callable[[pa.Table], pa.Table]:
    def rename(batch: pa.Table) -> pa.Table:
        return batch.rename_columns([mapping.get(c, c) for c in batch.column_names])

    return rename


def join_alias_map(ds: Dataset, alias_map: Dataset, ctx: RunContext, column: str,
                   prefix: str = "") -> Dataset:
    """Attach the resolved entity of `column` (a normalized name) to every row."""
    right = engine.map(ctx, alias_map, rename({
        "normalized": column, "entity_id": f"{prefix}entity_id", "root": f"{prefix}root",
        "evidence": f"{prefix}evidence", "score": f"{prefix}score"}))
    return engine.join(ctx, ds, right, "inner", ("group_id", column))


def name_keys(groups: pa.ChunkedArray | pa.Array, names: pa.ChunkedArray | pa.Array
               ) -> pa.Array:
    """(group, normalized name) as one string: names are only unique within a group."""
    return pc.binary_join_element_wise(groups, names, "\x1f")


def in_set(column: str, values: set[str], keep: bool = True,
            group_column: str | None = None) -> Callable[[pa.Table], pa.Table]:
    """Rows whose `column` (with `group_column`: the group and it) is in `values`, or, with
    `keep` false, is not."""
    value_set = pa.array(sorted(values), pa.string())

    def select(batch: pa.Table) -> pa.Table:
        if column not in batch.column_names:  # a block without rows or columns
            return batch
        keys = (batch[column] if group_column is None
                else name_keys(batch[group_column], batch[column]))
        return rows_in(batch, keys, value_set, keep)

    return select


def on_one_side(ctx: RunContext, before: Dataset, after: Dataset, keys: list[str]
                ) -> Dataset:
    """The rows (their `keys` columns) that one of `before` and `after` holds and the other
    lacks: what changed between two versions of a table."""
    a, b = (engine.map(ctx, rows, only, keys).materialize() for rows in (before, after))
    return engine.union(ctx, engine.join(ctx, a, b, "left_anti", tuple(keys)),
                        engine.join(ctx, b, a, "left_anti", tuple(keys)))


def distinct_entities(block: pa.Table) -> pa.Table:
    """The distinct `entity_id`s of a block (a shuffle by entity makes them distinct)."""
    return block.group_by("entity_id").aggregate([])


def distinct_rows(block: pa.Table) -> pa.Table:
    """The distinct rows of a block (a shuffle by every column makes them distinct)."""
    return block.group_by(block.column_names).aggregate([])


def open_versions(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.is_null(batch["expired_at"]))


def without(batch: pa.Table, columns: list[str]) -> pa.Table:
    return batch.drop_columns(columns)


def only(batch: pa.Table, columns: list[str]) -> pa.Table:
    return batch.select(columns)


# --- embedding ---------------------------------------------------------------------------

EMBED_BLOCK_ROWS = 1024


def embedder(config: TkgConfig, text: str, vector: str, ranked: bool = False
             ) -> runner.Model:
    """Embedding of `text` into `vector` as a model over rows. On a CPU it may run in the
    driver: a night's new names and facts are a few hundred texts, and an actor pool per
    column started a model per actor for them. The driver's model is `build_embedder`'s (the
    actors' too, so both give the same vectors), loaded once per process and shared with
    the driver's extractor."""
    gpus = config.embed.gpus_per_actor  # BGE-m3 on GPU actors

    def local() -> EmbedColumn:
        return EmbedColumn(config, text, vector, embedder=shared_embedder(config, ranked))

    return runner.Model(EmbedColumn, (config, text, vector, None, ranked),
                        batch_rows=EMBED_BLOCK_ROWS,
                        actors=config.embed.actors, gpus=gpus, local=None if gpus else local)


def embed_column(ctx: RunContext, ds: Dataset, text: str, vector: str,
                 ranked: bool = False) -> Dataset:
    """`vector` = the embedding of `text`, for every row of `ds` (`ranked`: vectors that
    only rank search results, `embed.RANKED`)."""
    return runner.over_rows(ctx, ds, embedder(ctx.config, text, vector, ranked))


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
    fresh, kept = split_stored(ctx, ds, table, key, text, vector, what)
    return with_kept(ctx, embed_column(ctx, fresh, text, vector, table in RANKED), kept)


def split_stored(ctx: RunContext, ds: Dataset, table: str, key: str, text: str,
                 vector: str, what: str | None = None, keyed: bool = False
                 ) -> tuple[Dataset, Dataset | None]:
    """The rows of `ds` whose (key, text) the previous snapshot's `table` does not hold,
    and the others with their stored `vector` (None: no such rows). `keyed`: the stored
    rows of `ds`'s keys alone are read (`key` nearly unique and `ds` a night's rows: the
    160,000-episode store's facts with their vectors were 240 MB of the driver, for the
    4,839 edges of a night)."""
    columns = [key, text, vector]
    if "expired_at" in schema.PUBLISHED[table](1).names:
        columns.append("expired_at")  # of versioned tables, the open versions' texts
    keys = (key, pc.unique(engine.gather(ctx, ds, [key], what=f"{what or table} keys")[key]
                           .combine_chunks())) if keyed and ctx.previous is not None else None
    stored = previous_table(ctx, table, columns, keys)
    if stored is None:
        return ds, None
    old = engine.map(ctx, stored, _stored_vectors(key, text, vector))
    return split_known(ctx, ds, old, (key, text), vector, what or table)


def split_known(ctx: RunContext, ds: Dataset, known: Dataset, on: tuple[str, ...],
                vector: str, what: str) -> tuple[Dataset, Dataset | None]:
    """The rows of `ds` that find no row of `known` (the `on` columns and `vector`) with the
    same `on`, and the others with its vector (counted as `<what>_vectors_carried`; None:
    no such rows)."""
    both = engine.join(ctx, ds, known, "left_outer", on).materialize()
    fresh = engine.map(ctx, both, _vector_split(vector, carried=False))
    kept = engine.nonempty(engine.map(ctx, both, _vector_split(vector, carried=True)))
    ctx.count(f"{what}_vectors_carried", kept.count() if kept is not None else 0)
    return fresh, kept


def with_kept(ctx: RunContext, embedded: Dataset, kept: Dataset | None) -> Dataset:
    return embedded if kept is None else engine.union(ctx, embedded, kept)
