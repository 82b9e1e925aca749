"""Name nodes and entities as mergeable state: the row of a key's stored mentions and a later
run's mentions of it, made from the stored row and the row of the later mentions alone.

A name node or an entity (`resolve.resolve_entities`: a `schema.RESOLVED_ENTITIES` row, of
a normalized name or of an entity's mapped mentions) is a function of its mentions in
(valid_at, episode_id) order. Where every later mention comes after every stored one (a
later valid_at than the row's `last_seen`, none undated) the merge is exact: the first
sighting is the stored row's, the last the later one's; the mentions add up (a run leaves
out the episodes the store holds, so no episode counts twice); the surface forms add up,
each with its mentions, whether a record's key spelt it and whether its evidence keeps it
from naming (the stored row's alias fields where it has the form), and the name is chosen
among them as from the mentions (`resolve.chosen_names`); a node's labels are the union,
the specific ones where there are any, an entity's its strongest of the labels' counts and
latest times added up (`resolve.strongest_labels`); the later attributes update the stored
ones. Else (an earlier or undated mention, a row stored before these columns) the key's row
is made again from every mention of it (`merge_rows` marks it).

The 160,000-episode night's names were 467,041 of the store's 735,391 mentions (hub names),
grouped again each night to change a few hundred nodes.
"""

from __future__ import annotations

import json
from datetime import datetime

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import resolve, schema

NODE_KEYS = ["group_id", "normalized"]
ENTITY_KEYS = ["group_id", "entity_id"]
SIDE = "side"  # "stored" or "later" (`tagged`)
AGAIN = "again"  # a row of `merge_rows`: the key's row is to be made from every mention
MERGED = schema.RESOLVED_ENTITIES.append(pa.field(AGAIN, pa.bool_()))
SURFACES = ["aliases", "alias_mentions", "alias_key_name", "alias_short", "alias_normalized",
            "alias_evidence", "alias_score"]
LABELS = ["label_names", "label_counts", "label_last"]


def tagged(rows: pa.Table, side: str) -> pa.Table:
    """`RESOLVED_ENTITIES` rows marked with their side, for `merge_rows`."""
    rows = schema.conform(rows, schema.RESOLVED_ENTITIES)
    return rows.append_column(SIDE, pa.array([side] * rows.num_rows, pa.string()))


def marked(rows: pa.Table, again: bool) -> pa.Table:
    """The `RESOLVED_ENTITIES` rows of `merge_rows` that are (`again`) or are not marked to
    be made again."""
    flags = rows[AGAIN]
    return schema.conform(rows.filter(flags if again else pc.invert(flags)),
                          schema.RESOLVED_ENTITIES)


def merge_rows(rows: pa.Table, created_at: datetime, entities: bool) -> pa.Table:
    """`MERGED` rows of the keys of the later rows among `rows` (`tagged`, whole keys; name
    nodes, or with `entities` entities): a key without a stored row keeps its later row;
    one whose merge is exact gets the merged row; any other is marked `AGAIN` (its row
    otherwise the later one)."""
    keys = ENTITY_KEYS if entities else NODE_KEYS
    frame = pl.from_arrow(rows)
    later = frame.filter(pl.col(SIDE) == "later").drop(SIDE)
    stored = frame.filter(pl.col(SIDE) == "stored").drop(SIDE)
    if later.is_empty():
        return MERGED.empty_table()
    pairs = later.join(stored.with_columns(_known=pl.lit(True)), on=keys, how="left",
                       suffix="_stored")
    known = pl.col("_known").fill_null(False)
    state = pl.col("alias_mentions_stored").is_not_null()
    if entities:
        state = state & pl.col("label_names_stored").is_not_null()
    exact = (known & state & pl.col("first_seen").is_not_null()
             & pl.col("last_seen_stored").is_not_null()
             & (pl.col("first_seen") > pl.col("last_seen_stored")))
    pairs = pairs.with_columns(_exact=exact.fill_null(False))
    kept = pairs.filter(~pl.col("_exact")).select(*later.columns, known.alias(AGAIN))
    out = [schema.conform(kept.to_arrow(), MERGED)]
    both = pairs.filter(pl.col("_exact"))
    if not both.is_empty():
        out.append(schema.conform(_merged(both, keys, created_at, entities).to_arrow(),
                                  MERGED))
    return pa.concat_tables(out)


def _merged(pairs: pl.DataFrame, keys: list[str], created_at: datetime, entities: bool
            ) -> pl.DataFrame:
    """The merged row of each (later, stored) pair of `pairs` (`merge_rows`' join)."""
    surfaces = _surfaces(pairs, keys)
    named = resolve.chosen_names(surfaces, keys)
    listed = surfaces.group_by(keys, maintain_order=True).agg(
        aliases=pl.col("name"), alias_mentions=pl.col("count"),
        alias_key_name=pl.col("key_name"), alias_short=pl.col("short"),
        alias_normalized=pl.col("form_normalized"), alias_evidence=pl.col("form_evidence"),
        alias_score=pl.col("form_score"))
    own = {c: pl.col(c + "_stored") for c in ("normalized", "entity_id") if c not in keys}
    merged = pairs.select(
        *keys, **own, first_seen=pl.col("first_seen_stored"), last_seen=pl.col("last_seen"),
        mention_count=pl.col("mention_count") + pl.col("mention_count_stored"),
        attributes=pl.Series(
            [_attributes(before, after) for before, after in
             pairs.select("attributes_stored", "attributes").iter_rows()], dtype=pl.String),
        summary=pl.lit(""), created_at=pl.lit(created_at, pl.Datetime("us", "UTC")),
        again=pl.lit(False))
    merged = merged.join(named, on=keys, how="left").join(listed, on=keys, how="left")
    if entities:
        return _with_entity_labels(merged, pairs, keys)
    generic = sorted(resolve.GENERIC_LABELS)
    every = pl.concat_list(["labels", "labels_stored"]).list.unique().list.sort()
    specific = every.list.eval(pl.element().filter(~pl.element().is_in(generic)))
    labels = pairs.select(*keys, labels=pl.when(specific.list.len() > 0).then(specific)
                          .otherwise(every))
    return merged.join(labels, on=keys, how="left")


def _sides(pairs: pl.DataFrame, keys: list[str], columns: list[str]) -> pl.DataFrame:
    """`columns` (lists) of both sides of `pairs` exploded, the stored side first."""
    return pl.concat([pairs.select(*keys, *(pl.col(c + suffix).alias(c) for c in columns))
                      for suffix in ("_stored", "")]).explode(columns)


def _surfaces(pairs: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """(keys, name, count, key_name, short, form_normalized, form_evidence, form_score) of
    every surface form of both sides of `pairs`, in `aliases`' order; a form's normalized
    name, evidence and score are its first mention's: the stored side's where it has it."""
    return (_sides(pairs, keys, SURFACES)
            .group_by([*keys, "aliases"], maintain_order=True)
            .agg(count=pl.col("alias_mentions").sum(), key_name=pl.col("alias_key_name").any(),
                 short=pl.col("alias_short").any(),
                 form_normalized=pl.col("alias_normalized").first(),
                 form_evidence=pl.col("alias_evidence").first(),
                 form_score=pl.col("alias_score").first())
            .rename({"aliases": "name"}).sort([*keys, "name"]))


def _with_entity_labels(merged: pl.DataFrame, pairs: pl.DataFrame, keys: list[str]
                        ) -> pl.DataFrame:
    """`merged` with each entity's label counts added up and its strongest label."""
    counted = (_sides(pairs, keys, LABELS).drop_nulls("label_names")
               .group_by([*keys, "label_names"])
               .agg(count=pl.col("label_counts").sum(), last=pl.col("label_last").max())
               .rename({"label_names": "label"}))
    strongest = resolve.strongest_labels(counted, keys).select(
        *keys, labels=pl.concat_list("label"))
    return (resolve.with_label_lists(merged, counted, keys)
            .join(strongest, on=keys, how="left")
            .with_columns(labels=pl.col("labels").fill_null([])))


def _attributes(before: str | None, after: str | None) -> str:
    """The stored attributes updated by the later ones, as `resolve_entities` writes them."""
    return resolve.attributes_text({**json.loads(before or "{}"), **json.loads(after or "{}")})
