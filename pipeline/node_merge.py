"""Name nodes as mergeable state: the node of a name's stored mentions and a later run's
mentions of it, made from the stored node and the node of the later mentions alone.

A node (`resolve.resolve_entities` without ids, a `schema.NAME_NODES` row) is a function of
its name's mentions in (valid_at, episode_id) order. Where every later mention comes after
every stored one (a later valid_at than the node's `last_seen`, none undated), the merge is
exact: the first sighting is the stored node's, the last the later one's; the mentions add
up (a run leaves out the episodes the store holds, so no episode counts twice); the surface
forms add up, each with its mentions and whether a record's key spelt it, and the name is
chosen among them as from the mentions (`resolve.chosen_names`); the labels are the union,
the specific ones where there are any; the later attributes update the stored ones. Else
(an earlier or undated mention, a node stored before these columns) the name's node is
made again from every mention of it (`merge_nodes` marks it).

The 160,000-episode night's names were 467,041 of the store's 735,391 mentions (hub names),
grouped again each night to change a few hundred nodes.
"""

from __future__ import annotations

import json
from datetime import datetime

import polars as pl
import pyarrow as pa
from tkg.pipeline import resolve, schema

KEYS = ["group_id", "normalized"]
SIDE = "side"  # "stored" or "later" (`tagged`)
AGAIN = "again"  # a row of `merge_nodes`: the name's node is to be made from every mention
MERGED = schema.NAME_NODES.append(pa.field(AGAIN, pa.bool_()))
SURFACES = ["aliases", "alias_mentions", "alias_key_name"]


def tagged(nodes: pa.Table, side: str) -> pa.Table:
    """`NAME_NODES` rows marked with their side, for `merge_nodes`."""
    nodes = schema.conform(nodes, schema.NAME_NODES)
    return nodes.append_column(SIDE, pa.array([side] * nodes.num_rows, pa.string()))


def merge_nodes(rows: pa.Table, created_at: datetime) -> pa.Table:
    """`MERGED` rows of the names of the later nodes among `rows` (`tagged`, whole names):
    a name without a stored node keeps its later node; one whose merge is exact gets the
    merged node; any other is marked `AGAIN` (its row otherwise the later node)."""
    frame = pl.from_arrow(rows)
    later = frame.filter(pl.col(SIDE) == "later").drop(SIDE)
    stored = frame.filter(pl.col(SIDE) == "stored").drop(SIDE)
    if later.is_empty():
        return MERGED.empty_table()
    pairs = later.join(stored.with_columns(_known=pl.lit(True)), on=KEYS, how="left",
                       suffix="_stored")
    known = pl.col("_known").fill_null(False)
    exact = (known & pl.col("alias_mentions_stored").is_not_null()
             & pl.col("first_seen").is_not_null() & pl.col("last_seen_stored").is_not_null()
             & (pl.col("first_seen") > pl.col("last_seen_stored")))
    pairs = pairs.with_columns(_exact=exact.fill_null(False))
    kept = pairs.filter(~pl.col("_exact")).select(
        *later.columns, known.alias(AGAIN))
    out = [schema.conform(kept.to_arrow(), MERGED)]
    both = pairs.filter(pl.col("_exact"))
    if not both.is_empty():
        out.append(schema.conform(_merged(both, created_at).to_arrow(), MERGED))
    return pa.concat_tables(out)


def _merged(pairs: pl.DataFrame, created_at: datetime) -> pl.DataFrame:
    """The merged node of each (later, stored) pair of `pairs` (`merge_nodes`' join)."""
    surfaces = _surfaces(pairs)
    named = resolve.chosen_names(surfaces.with_columns(short=pl.lit(False)), KEYS)
    listed = surfaces.group_by(KEYS, maintain_order=True).agg(
        aliases=pl.col("name"), alias_mentions=pl.col("count"),
        alias_key_name=pl.col("key_name"))
    generic = sorted(resolve.GENERIC_LABELS)
    every = pl.concat_list(["labels", "labels_stored"]).list.unique().list.sort()
    specific = every.list.eval(pl.element().filter(~pl.element().is_in(generic)))
    merged = pairs.select(
        *KEYS, first_seen=pl.col("first_seen_stored"), last_seen=pl.col("last_seen"),
        mention_count=pl.col("mention_count") + pl.col("mention_count_stored"),
        labels=pl.when(specific.list.len() > 0).then(specific).otherwise(every),
        attributes=pl.Series(
            [_attributes(before, after) for before, after in
             pairs.select("attributes_stored", "attributes").iter_rows()], dtype=pl.String),
        entity_id=pl.lit(None, pl.String), summary=pl.lit(""),
        created_at=pl.lit(created_at, pl.Datetime("us", "UTC")))
    merged = merged.join(named, on=KEYS, how="left").join(listed, on=KEYS, how="left")
    width = pl.col("aliases").list.len()
    return merged.with_columns(
        alias_normalized=pl.col("normalized").repeat_by(width),
        alias_evidence=pl.lit("exact").repeat_by(width),
        alias_score=pl.lit(1.0).repeat_by(width), again=pl.lit(False))


def _surfaces(pairs: pl.DataFrame) -> pl.DataFrame:
    """(keys, name, count, key_name) of every surface form of both sides of `pairs`, in
    `aliases`' order."""
    sides = [pairs.select(*KEYS, *(pl.col(c + suffix).alias(c) for c in SURFACES))
             for suffix in ("", "_stored")]
    return (pl.concat(sides).explode(SURFACES)
            .group_by([*KEYS, "aliases"])
            .agg(count=pl.col("alias_mentions").sum(), key_name=pl.col("alias_key_name").any())
            .rename({"aliases": "name"}).sort([*KEYS, "name"]))


def _attributes(before: str | None, after: str | None) -> str:
    """The stored attributes updated by the later ones, as `resolve_entities` writes them
    ("{}": none)."""
    merged = {**json.loads(before or "{}"), **json.loads(after or "{}")}
    return json.dumps(merged, ensure_ascii=False, sort_keys=True, default=str)
