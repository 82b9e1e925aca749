"""Facts (entity edges): one edge per (entity pair, relation) whatever the wording, its
provenance merged; then invalidation among the facts of one subject, never the whole graph.
A fact said of one entity alone is one edge per statement (`claim_key`).

Relations in one class (config `facts.relation_classes`) are one relation: `moved to` and
`lives in` are both LIVES_IN. In an exclusive class a subject holds one value at a time: a
newer fact with another object ends the older one (`invalid_at` = the newer `valid_at`,
`invalidated_by` = its edge), and so does a negation (`NOT_WORKS_AT` the same object).
An ending (`LEFT`: "left X", "quit X", "moved out of X", and any relation that states its
own end, `NO_LONGER_GOES_TO`) ends the open fact of any class with that object, and one
worded as the ending's own relation ("goes to X" by "no longer goes to X"). Facts without a
date are never invalidated and never invalidate. Relation phrases outside the synonym lists
join a class by meaning (`RelationClassifier`, run where the phrase is extracted).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import schema
from tkg.pipeline.config import FactsConfig, RelationClass
from tkg.pipeline.resolve import normalize_name

if TYPE_CHECKING:
    import polars as pl


def relation_class(relation: str, config: FactsConfig
                   ) -> tuple[str, RelationClass | None, bool]:
    """(canonical relation, its class or None, negated?) of an extracted relation; an
    ending (`LEAVE`, `QUIT`, ...) comes back as the ending class, not negated."""
    if relation.startswith(config.ending_prefix):  # "no longer goes to": its own end
        base, _, _ = relation_class(relation[len(config.ending_prefix):], config)
        return config.ending_prefix + base, config.ending, False
    prefix = config.negation_prefix
    negated = relation.startswith(prefix)
    base = relation[len(prefix):] if negated else relation
    for cls in (*config.relation_classes, config.ending):
        if base == cls.relation or base in cls.synonyms:
            if cls is config.ending and negated:  # "I did not leave X" ends nothing
                return relation, None, True
            return (prefix if negated else "") + cls.relation, cls, negated
    return relation, None, negated


# What an object stands for in the sentences a relation phrase is classified as. The
# sentence that scores best counts: spaCy's small model often tags an unknown company a
# place or a product, and the phrase alone decides better ("got hired at" + the city: 0.62,
# + the company: 0.82).
OBJECT_NOUNS = ("the company", "the city")
# Common nouns ("set up the meeting") take no class by meaning: only named things do.
UNNAMED_LABELS = {None, "", "Entity", "Concept"}
PERSON_NOUNS = ("someone",)


class RelationClassifier:
    """Relation phrases -> the relation of their class, by meaning: "start job at" is
    WORKS_AT, "relocate to" LIVES_IN, "retire from" the ending. Synonyms match exactly and
    need no model; any other phrase, said as "I <phrase> <object>", joins the class of its
    nearest prototype sentence when the cosine reaches `class_threshold`. Each distinct
    sentence is embedded once per instance (one per extractor actor)."""

    def __init__(self, config: FactsConfig, embed: Callable[[list[str]], np.ndarray] | None
                 ) -> None:
        self.config = config
        self._embed = embed
        self._prototypes: tuple[np.ndarray, list[RelationClass]] | None = None
        self._known: dict[str, RelationClass | None] = {}

    def relation(self, relation: str, words: Sequence[str], label: str | None) -> str:
        """The relation to record for a phrase (`words` are lemmas: "start", "job", "at")
        whose object has `label`."""
        _, cls, negated = relation_class(relation, self.config)
        if (cls is not None or self._embed is None or self.config.class_threshold >= 1
                or label in UNNAMED_LABELS):
            return relation
        nouns = PERSON_NOUNS if label == "Person" else OBJECT_NOUNS
        found = self.classify([f"I {' '.join(words)} {noun}" for noun in nouns])
        if found is None or (negated and found is self.config.ending):
            return relation
        return (self.config.negation_prefix if negated else "") + found.relation

    def classify(self, sentences: list[str]) -> RelationClass | None:
        """The class of the nearest prototype to any of `sentences`, if near enough."""
        key = "\n".join(sentences)
        if key not in self._known:
            vectors, owners = self._prototype_vectors()
            if not owners:
                return None
            scores = np.asarray(self._embed(sentences), dtype=np.float32) @ vectors.T
            best = np.unravel_index(int(np.argmax(scores)), scores.shape)
            self._known[key] = (owners[best[1]] if scores[best] >= self.config.class_threshold
                                else None)
        return self._known[key]

    def _prototype_vectors(self) -> tuple[np.ndarray, list[RelationClass]]:
        if self._prototypes is None:
            owners = [cls for cls in (*self.config.relation_classes, self.config.ending)
                      for _ in cls.prototypes]
            texts = [p for cls in (*self.config.relation_classes, self.config.ending)
                     for p in cls.prototypes]
            self._prototypes = (np.asarray(self._embed(texts), dtype=np.float32), owners)
        return self._prototypes


def fact_mentions(extractions: pa.Table) -> pa.Table:
    """One row per extracted fact, with its endpoints' normalized names (for the alias map).
    Arrow column by column, each distinct name normalized once: a night into a
    160,000-episode store maps every stored extraction here (679,612 facts: 8.6 s row by
    row in Python, 0.9 s so)."""
    lists = extractions["facts"].combine_chunks()
    parents = pc.list_parent_indices(lists)
    facts = pc.list_flatten(lists)

    def field(name: str, kind: pa.DataType) -> pa.Array:
        found = facts.type.get_field_index(name) >= 0  # (an older extraction lacks it)
        return pc.struct_field(facts, name) if found else pa.nulls(len(facts), kind)

    raw_source, raw_target = (pc.fill_null(field(n, pa.string()), "") for n in ("source", "target"))
    source, target = _normalized(raw_source, raw_target)
    invalid_at = field("invalid_at", schema.TS).cast(schema.TS)
    undated = pc.fill_null(field("undated", pa.bool_()), False)
    # a fact's own valid time; else its episode's, unless it ended or is undated
    episode_time = pc.take(extractions["valid_at"], parents).cast(schema.TS)
    fallback = pc.if_else(pc.or_(pc.is_valid(invalid_at), undated),
                          pa.scalar(None, schema.TS), episode_time)
    by_key = pc.fill_null(field("target_by_key", pa.bool_()), False)
    rows = pa.table({
        "group_id": pc.take(extractions["group_id"], parents),
        "episode_id": pc.take(extractions["episode_id"], parents),
        "source_normalized": source, "target_normalized": target,
        "relation": field("relation", pa.string()), "fact": field("fact", pa.string()),
        "valid_at": pc.coalesce(field("valid_at", schema.TS).cast(schema.TS), fallback),
        "invalid_at": invalid_at,
        "target_key": pc.if_else(by_key, field("target", pa.string()),
                                 pa.scalar(None, pa.string())),
    })
    # source == target: a fact about one entity; an empty name: no endpoint
    keep = pc.and_(pc.not_equal(source, ""), pc.not_equal(target, ""))
    return rows.filter(keep).cast(schema.FACT_MENTIONS)


def _normalized(*raw: pa.Array) -> tuple[pa.Array, ...]:
    """Each array of raw names normalized, each distinct name once."""
    names = pc.unique(pa.concat_arrays(list(raw)))
    normal = pa.array([normalize_name(n) for n in names.to_pylist()], pa.string())
    return tuple(pc.take(normal, pc.index_in(r, value_set=names)) for r in raw)


def fact_subjects(extractions: pa.Table) -> tuple[pa.Array, pa.Array]:
    """The row of `extractions` and the normalized subject (source) name of each extracted
    fact: what `fact_mentions` finds of subjects, without the rest of the fact."""
    lists = extractions["facts"].combine_chunks()
    facts = pc.list_flatten(lists)
    raw = (pc.fill_null(pc.struct_field(facts, "source"), "")
           if facts.type.get_field_index("source") >= 0 else pa.nulls(len(facts), pa.string()))
    return pc.list_parent_indices(lists), _normalized(raw)[0]


def fact_rows(mentions: pa.Table, config: FactsConfig) -> pa.Table:
    """Fact mentions whose endpoints carry entity ids -> rows with an edge id. Self-loops
    that resolution made (two names of one entity: "Bob is Robert Kim") are dropped; a fact
    said of one entity (one name at both ends: "Ana creates a daily schedule") stays, and
    is one edge per statement (`claim_key`), not per relation. Column by column, each
    distinct relation classed once: a dict per row was 0.70 s of the 160,000-episode
    night's facts (its rebuilt subjects' 58,665 mentions)."""
    if mentions.num_rows == 0:  # (a block may come without columns)
        return schema.FACT_ROWS.empty_table()
    rows = mentions.filter(pc.invert(_made_self_loop(mentions)))
    said = rows["relation"].to_pylist()
    classed = {relation: relation_class(relation, config) for relation in set(said)}
    relations = [classed[relation][0] for relation in said]
    same = _eq_missing(rows["source_entity_id"], rows["target_entity_id"]).to_pylist()
    claims = [claim_key(text) if alone and classed[relation][1] is None else None
              for text, alone, relation in zip(rows["fact"].to_pylist(), same, said,
                                               strict=True)]
    ids = edge_ids(rows["group_id"].to_pylist(), rows["source_entity_id"].to_pylist(),
                   rows["target_entity_id"].to_pylist(), relations, claims)
    columns = {"edge_id": pa.array(ids, pa.string()),
               "relation": pa.array(relations, pa.string())}
    return pa.table([columns[f.name] if f.name in columns
                     else rows[f.name].cast(f.type) if f.name in rows.column_names
                     else pa.nulls(rows.num_rows, f.type) for f in schema.FACT_ROWS],
                    schema=schema.FACT_ROWS)


def edge_ids(groups: Sequence[str], sources: Sequence[str], targets: Sequence[str],
             relations: Sequence[str], claims: Sequence[str | None] | None = None
             ) -> list[str]:
    """Each edge's id: its group, its two entities and its relation's class, and for a fact
    said of one entity its statement (`claim_key`, where `claims` has one)."""
    return [schema.stable_id(group, "fact", source, target, relation,
                             *([claim] if claim else []))
            for group, source, target, relation, claim in zip(
                groups, sources, targets, relations, claims or [None] * len(groups),
                strict=True)]


def _made_self_loop(mentions: pa.Table) -> pa.Array:
    """Whether each mention joins two names that resolution made one entity: the same
    entity at both ends, named differently (a missing name column: never)."""
    if "source_normalized" not in mentions.column_names or (
            "target_normalized" not in mentions.column_names):
        return pa.array([False] * mentions.num_rows, pa.bool_())
    same = _eq_missing(mentions["source_entity_id"], mentions["target_entity_id"])
    named = _eq_missing(mentions["source_normalized"], mentions["target_normalized"])
    return pc.and_(same, pc.invert(named))


def _eq_missing(left: pa.ChunkedArray, right: pa.ChunkedArray) -> pa.Array:
    """Equality with a null equal to a null (Python's `==` on the rows' values)."""
    both_null = pc.and_(pc.is_null(left), pc.is_null(right))
    return pc.fill_null(pc.or_kleene(pc.equal(left, right), both_null), False)


# --- texts that call their target by a record's key name -----------------------------------
#
# A reference field's fact ("Jane Peacock: reports to Employee 2") is extracted before
# anything knows the referenced record's name; its `target_key` is replaced by the name
# of the entity it resolved to, after resolution and before merging, so every path that
# reads the text (the answer, the context, the full-text index, the embedding) sees
# "Nancy Edwards", and the key name stays while no record of that key has arrived.


def keyed_targets(rows: pa.Table, keyed: bool = True) -> pa.Table:
    """Fact rows whose text calls the target by a key name (`keyed`), or the others."""
    import pyarrow.compute as pc

    if "target_key" not in rows.column_names:  # a block without rows or columns
        return rows
    found = pc.is_valid(rows["target_key"])
    return rows.filter(found if keyed else pc.invert(found))


def name_targets(rows: pa.Table) -> pa.Table:
    """Keyed fact rows joined (left) with their target entity's name (`target_name`) ->
    FACT_ROWS whose text names the target by that name in place of the key name (its
    last occurrence)."""
    if "target_name" not in rows.column_names:  # no names joined: texts as they are
        return schema.conform(rows, schema.FACT_ROWS)
    texts = [_renamed(text, key, name) for text, key, name in zip(
        rows["fact"].to_pylist(), rows["target_key"].to_pylist(),
        rows["target_name"].to_pylist(), strict=True)]
    rows = rows.set_column(rows.schema.get_field_index("fact"), "fact",
                           pa.array(texts, pa.string()))
    return schema.conform(rows, schema.FACT_ROWS)


def _renamed(text: str | None, key: str | None, name: str | None) -> str | None:
    if not (text and key and name) or (at := text.rfind(key)) < 0:
        return text
    return text[:at] + name + text[at + len(key):]


def claim_key(text: str | None) -> str:
    """What identifies a fact said of one entity alone: its statement, case and spacing
    aside. Such a fact has no object to tell two claims apart (its object's words are in
    its relation, or it has none: "Sam says that's great news"), so keyed by relation
    alone it merged every claim with the same verb into one edge with one of their texts
    and all their episodes (LoCoMo: 8,975 such mentions in 8,122 edges, one "means a lot"
    edge citing 16 turns), which a reader and a search citing its sources both misread."""
    return " ".join((text or "").lower().split()).rstrip(".!")


def merge_facts(rows: pa.Table, created_at: datetime) -> pa.Table:
    """Fact rows (any number of edges) -> the first version of each edge, in edge order:
    `merge_edge` of each edge's rows, by columns (an edge's rows share its group, ends and
    relation: they are in its id). A dict per row was 0.52 s of the 160,000-episode
    night's facts."""
    import polars as pl

    if rows.num_rows == 0:  # (a block may come without columns)
        return schema.MERGED_FACTS.empty_table()
    texts, relations = rows["fact"].to_pylist(), rows["relation"].to_pylist()
    frame = pl.from_arrow(rows.select(["edge_id", "group_id", "source_entity_id",
                                       "target_entity_id", "relation", "fact", "episode_id",
                                       "valid_at", "invalid_at"])).with_columns(
        _wordy=pl.Series([not _says(t, r) for t, r in zip(texts, relations, strict=True)],
                         dtype=pl.Boolean),
        _length=-pl.col("fact").str.len_chars().cast(pl.Int64))
    best = pl.col("fact").sort_by(["_wordy", "_length", "fact"]).first()
    merged = frame.group_by("edge_id").agg(
        pl.col("group_id", "source_entity_id", "target_entity_id", "relation").first(),
        best, pl.col("episode_id").unique().sort().alias("episode_ids"),
        pl.col("valid_at").min(), pl.col("invalid_at").min()).sort("edge_id")
    return schema.conform(merged.with_columns(
        version=pl.lit(1, pl.Int64), created_at=pl.lit(created_at, pl.Datetime("us", "UTC")),
        expired_at=pl.lit(None, pl.Datetime("us", "UTC")),
        invalidated_by=pl.lit(None, pl.String)).to_arrow(), schema.MERGED_FACTS)


def merge_edge(occurrences: list[dict], created_at: datetime) -> dict:
    """All occurrences of one edge -> its first version, provenance merged. An edge is valid
    from its earliest dated occurrence; an end date stated anywhere ends it. Its text is
    the wording that says the relation itself ("lives in Paris" over "moved to Paris last
    summer" for LIVES_IN: what a question about the state matches), then the most
    detailed."""
    first = occurrences[0]
    valid = [o["valid_at"] for o in occurrences if o["valid_at"] is not None]
    invalid = [o["invalid_at"] for o in occurrences if o["invalid_at"] is not None]
    return {
        **{k: first[k] for k in ("edge_id", "group_id", "source_entity_id", "target_entity_id",
                                 "relation")},
        "version": 1,
        "fact": min((o["fact"] for o in occurrences), key=_wording(first["relation"])),
        "episode_ids": sorted({o["episode_id"] for o in occurrences}),
        "valid_at": min(valid) if valid else None,
        "invalid_at": min(invalid) if invalid else None,
        "created_at": created_at,
        "expired_at": None,
        "invalidated_by": None,
    }


def _wording(relation: str) -> Callable[[str], tuple[bool, int, str]]:
    """The order of an edge's texts, best first: the relation's own verb, then detail."""
    return lambda text: (not _says(text, relation), -len(text), text)


def combine_edges(stored: pa.Table, tonight: pa.Table) -> pa.Table:
    """The edges of subjects a later run has facts about, as one merge of every occurrence
    would give them: each stored open version, combined with tonight's edge of the same id
    (`merge_edge` is a min, a union and a choice of wording over occurrences, so it merges
    merged edges too), and tonight's new edges. An end that invalidation gave a stored edge
    stays: ends only move earlier (`_end`) and every edge that caused one is still there, so
    invalidating again ends each edge as invalidating everything would. A combined edge
    keeps only a stated end (no cause), its causes are found again. Only the stored edges
    tonight restates pass through Python, the subject's others go on as they are (the
    160,000-episode night's 108 extended subjects held 19,111 stored edges: 0.49 s of its
    facts stage as dicts, py-spy)."""
    new = {row["edge_id"]: row for row in tonight.to_pylist()}
    stored = schema.conform(stored, schema.MERGED_FACTS)
    restated = pc.is_in(stored["edge_id"], value_set=pa.array(list(new), pa.string()))
    combined = []
    for old in stored.filter(restated).to_pylist():
        now = new.pop(old["edge_id"], None)
        combined.append(old if now is None else _combined(old, now))
    out = pa.concat_tables([stored.filter(pc.invert(restated)), pa.Table.from_pylist(
        [*combined, *new.values()], schema=schema.MERGED_FACTS)])
    return out.take(pc.sort_indices(out, [("edge_id", "ascending")]))  # (a stable sort)


def _combined(old: dict, now: dict) -> dict:
    stated = old["invalid_at"] if old["invalidated_by"] is None else None
    ends = [t for t in (stated, now["invalid_at"]) if t is not None]
    starts = [t for t in (old["valid_at"], now["valid_at"]) if t is not None]
    return {**now, "fact": min((old["fact"], now["fact"]), key=_wording(now["relation"])),
            "episode_ids": sorted(set(old["episode_ids"] or ()) | set(now["episode_ids"] or ())),
            "valid_at": min(starts) if starts else None,
            "invalid_at": min(ends) if ends else None, "invalidated_by": None}


def changed_edges(edges: pa.Table, stored: pa.Table) -> pa.Table:
    """The rows of `edges` that are new or differ from their stored open version (what
    `version_edges` would append a version for: not `_same_belief`). Compared column by
    column: a dict per row of both sides was 0.68 s of the 160,000-episode night (19,111
    stored open edges of the subjects it extended)."""
    import polars as pl

    fields = ["edge_id", *VERSIONED_FIELDS]
    before = (pl.from_arrow(stored.select(fields)).unique("edge_id", keep="last",
                                                          maintain_order=True)
              .with_columns(_stored=pl.lit(True)))
    joined = pl.from_arrow(edges.select(fields)).join(
        before, on="edge_id", how="left", suffix="_before", maintain_order="left")
    keep = joined.select(pl.col("_stored").is_null() | ~_same_belief("_before")).to_series()
    return edges.filter(keep.to_arrow())


def _same_belief(suffix: str) -> pl.Expr:
    """Whether a row says what the columns named `<field><suffix>` say (no new version for
    it): every versioned field equal, a null equal only to a null, a list to the same list
    (a polars expression)."""
    import polars as pl

    return pl.all_horizontal(pl.col(f).eq_missing(pl.col(f"{f}{suffix}"))
                             for f in VERSIONED_FIELDS)


def _says(text: str, relation: str) -> bool:
    """Whether `text` uses the relation's own verb (LIVES_IN: live, lives, lived)."""
    verb = relation.split("_")[0].lower()
    stem = verb[:-1] if verb.endswith("s") and len(verb) > 3 else verb
    return bool(stem) and re.search(rf"\b{re.escape(stem)}", text.lower()) is not None


# What the rules read of an edge (`invalidate_subject`); its times as integers.
RULE_COLUMNS = ("edge_id", "group_id", "source_entity_id", "target_entity_id", "relation",
                "episode_ids", "valid_at", "invalid_at", "invalidated_by")
ROW = "_row"  # an edge's row in the table `invalidate` was given


def invalidate(edges: pa.Table, config: FactsConfig) -> pa.Table:
    """Edges of any number of subjects -> the same edges with invalidations applied, by
    subject, each subject's by edge id. Only the columns the rules read become Python
    values, the times as microseconds (the rules only compare and copy them), and only the
    ends they set are written back: every column as dicts, times as datetimes, was 0.45 s
    of the 160,000-episode night's facts stage for its 23,000 edges (py-spy)."""
    if edges.num_rows == 0:
        return edges
    rules = edges.select(RULE_COLUMNS).append_column(ROW, pa.array(
        np.arange(edges.num_rows, dtype=np.int64)))
    for name in ("valid_at", "invalid_at"):
        at = rules.schema.get_field_index(name)
        rules = rules.set_column(at, name, pc.cast(rules[name], pa.int64()))
    by_subject: dict[tuple[str, str], list[dict]] = {}
    for edge in rules.to_pylist():
        by_subject.setdefault((edge["group_id"], edge["source_entity_id"]), []).append(edge)
    out = []
    for _, subject_edges in sorted(by_subject.items()):
        out += invalidate_subject(subject_edges, config)
    ordered = edges.take(pa.array([edge[ROW] for edge in out], pa.int64()))
    ends = {"invalid_at": pa.array([edge["invalid_at"] for edge in out], pa.int64()).cast(
        edges.schema.field("invalid_at").type),
            "invalidated_by": pa.array([edge["invalidated_by"] for edge in out], pa.string())}
    for name, values in ends.items():
        at = ordered.schema.get_field_index(name)
        ordered = ordered.set_column(at, ordered.schema.field(at), values)
    return ordered


def invalidate_subject(edges: list[dict], config: FactsConfig) -> list[dict]:
    """Apply the exclusive-class rules to one subject's edges (returned in a stable order):
    a newer value of the class, a negation of the class with the same object, or an ending
    with the same object ends an open fact; so ends the subject's unclassed facts with that
    object stated while it held (the place it moved away from, the company it left)."""
    kinds = _kinds(edges, config)
    _exclusive_ends(kinds, config)
    _other_ends(kinds, config)
    return sorted(edges, key=lambda e: e["edge_id"])


@dataclass
class _Kinds:
    """One subject's edges by the part each plays in the rules (`_kinds`)."""

    classes: dict[str, list[dict]]  # exclusive, by class
    negations: dict[str, list[dict]]  # by the class negated
    endings: list[dict]
    unclassed: list[dict]
    shared: list[tuple[str, dict]]  # of a class one holds many of (memberships), by class


def _kinds(edges: list[dict], config: FactsConfig) -> _Kinds:
    kinds = _Kinds({}, {}, [], [], [])
    for edge in edges:
        _, cls, negated = relation_class(edge["relation"], config)
        if cls is config.ending and edge["valid_at"] is not None:
            kinds.endings.append(edge)
        if cls is None and not negated and edge["valid_at"] is not None:
            kinds.unclassed.append(edge)
        if cls is None or cls is config.ending or edge["valid_at"] is None:
            continue
        if not cls.exclusive and not negated:
            kinds.shared.append((cls.name, edge))
            continue
        (kinds.negations if negated else kinds.classes).setdefault(cls.name, []).append(edge)
    return kinds


def _scoping(config: FactsConfig) -> dict[str, str]:
    """class -> the class that scopes it (a title's: the employment it was held at)."""
    return {cls.name: cls.per for cls in config.relation_classes if cls.per}


def _exclusive_ends(kinds: _Kinds, config: FactsConfig) -> None:
    """Each exclusive class's members ended by their earliest cause, and the unclassed
    facts about the same object stated while the member held."""
    per = _scoping(config)
    unclassed_of = _by_target(kinds.unclassed)
    for name, members in kinds.classes.items():
        members.sort(key=lambda e: (e["valid_at"], e["edge_id"]))
        scope = _scopes(members, kinds.classes.get(per.get(name, ""), []))
        for index, old in enumerate(members):
            causes = [n for n in (*kinds.negations.get(name, ()), *kinds.endings)
                      if n["target_entity_id"] == old["target_entity_id"]
                      and n["valid_at"] >= old["valid_at"]]
            if (newer := _first_newer(members, index, scope)) is not None:
                causes.append(newer)
            if not causes:
                continue
            cause = min(causes, key=lambda e: (e["valid_at"], e["edge_id"]))
            _end(old, cause["valid_at"], cause["edge_id"])
            # "can run the demo from Berlin" ends with the move
            for other in unclassed_of.get(old["target_entity_id"], ()):
                if old["valid_at"] <= other["valid_at"] < cause["valid_at"]:
                    _end(other, cause["valid_at"], cause["edge_id"])


def _other_ends(kinds: _Kinds, config: FactsConfig) -> None:
    """Memberships, facts worded as an ending's object and titles, ended after the
    exclusive classes (`_exclusive_ends`)."""
    for name, edge in kinds.shared:  # a membership ends only by its own ending or negation
        _end_by(edge, [n for n in (*kinds.negations.get(name, ()), *kinds.endings)
                       if n["target_entity_id"] == edge["target_entity_id"]])
    prefix = config.ending_prefix
    for ending in kinds.endings:  # "no longer goes to X" ends "goes to X", as first worded
        if ending["relation"].startswith(prefix):
            for other in kinds.unclassed:
                if other["relation"] == ending["relation"][len(prefix):]:
                    _end_by(other, [ending] if other["target_entity_id"] == (
                        ending["target_entity_id"]) else [])
    per = _scoping(config)
    for name, members in kinds.classes.items():  # a title ends with the job it was held at
        scoping = {e["edge_id"]: e for e in kinds.classes.get(per.get(name, ""), [])}
        for edge in members:
            for other in scoping.values():
                if other["invalid_at"] is not None and set(edge["episode_ids"] or ()) & set(
                        other["episode_ids"] or ()):
                    _end(edge, other["invalid_at"], other["invalidated_by"])


def _end_by(edge: dict, causes: list[dict]) -> None:
    """End `edge` by the earliest of `causes` stated at or after it began."""
    causes = [c for c in causes if c["valid_at"] >= edge["valid_at"]]
    if causes:
        cause = min(causes, key=lambda e: (e["valid_at"], e["edge_id"]))
        _end(edge, cause["valid_at"], cause["edge_id"])


def _end(edge: dict, when: datetime, cause: str | None) -> None:
    """End an edge at `when` unless it already ends earlier. Of two ends at one instant the
    stated one (no cause) wins, then the smaller cause id: the first offered would depend on
    the order a shuffle delivers the subject's edges in (an unclassed fact about the old
    object is offered the end of each class that held it, and a job and its company record
    can change in one episode), and runs over parts would disagree with one run."""
    if edge["invalid_at"] is None or _end_key(when, cause) < _end_key(
            edge["invalid_at"], edge["invalidated_by"]):
        edge["invalid_at"] = when
        edge["invalidated_by"] = cause


def _end_key(when: datetime, cause: str | None) -> tuple[datetime, bool, str]:
    return when, cause is not None, cause or ""


def _scopes(members: list[dict], scoping: list[dict]) -> dict[str, str | None]:
    """edge id -> the one object of a scoping class stated in the same episodes (a title's
    employer), or None when none or several are."""
    objects_of: dict[str, set[str]] = {}  # episode -> the scoping objects stated in it
    for scoped in scoping:
        for episode in scoped["episode_ids"] or ():
            objects_of.setdefault(episode, set()).add(scoped["target_entity_id"])
    found: dict[str, str | None] = {}
    for edge in members:
        objects = set().union(*(objects_of.get(e, ()) for e in edge["episode_ids"] or ()))
        found[edge["edge_id"]] = objects.pop() if len(objects) == 1 else None
    return found


def _first_newer(members: list[dict], index: int, scope: dict[str, str | None]
                 ) -> dict | None:
    """The earliest member after `index` that replaces it (another object, later, in a
    comparable scope): members are sorted by (valid_at, edge_id), the order causes are
    chosen in, so the first found is the one. Every later member gathered for each was
    quadratic in a subject's history (a hub's open edges of one class, every night)."""
    old = members[index]
    for at in range(index + 1, len(members)):
        new = members[at]
        if new["target_entity_id"] != old["target_entity_id"] and (
                new["valid_at"] > old["valid_at"]) and _comparable(
                scope[new["edge_id"]], scope[old["edge_id"]]):
            return new
    return None


def _by_target(edges: list[dict]) -> dict[str, list[dict]]:
    """`edges` by their object, each object's in the order given."""
    found: dict[str, list[dict]] = {}
    for edge in edges:
        found.setdefault(edge["target_entity_id"], []).append(edge)
    return found


def _comparable(one: str | None, other: str | None) -> bool:
    """Two scoped values replace each other unless both scopes are known and differ."""
    return one is None or other is None or one == other


def undecided_candidates(edges: pa.Table, config: FactsConfig) -> pa.Table:
    """Invalidation the rules cannot decide, for an optional judge (`facts.invalidation_judge`):
    per subject, a relation outside every class, two dated edges with other targets, each
    edge against the next newer one (linear, not all pairs). The rules never touch these."""
    by_key: dict[tuple[str, str, str], list[dict]] = {}
    for edge in edges.to_pylist():
        relation, cls, negated = relation_class(edge["relation"], config)
        if cls is None and not negated and edge["valid_at"] is not None and (
                edge["invalidated_by"] is None):
            key = (edge["group_id"], edge["source_entity_id"], relation)
            by_key.setdefault(key, []).append(edge)
    rows = []
    for (group_id, _, relation), members in sorted(by_key.items()):
        members.sort(key=lambda e: (e["valid_at"], e["edge_id"]))
        for old, new in pairwise(members):
            if new["target_entity_id"] != old["target_entity_id"] and (
                    new["valid_at"] > old["valid_at"]) and old["invalid_at"] is None:
                rows.append({"group_id": group_id, "old_edge_id": old["edge_id"],
                             "new_edge_id": new["edge_id"], "relation": relation,
                             "old_fact": old["fact"], "new_fact": new["fact"],
                             "old_valid_at": old["valid_at"], "new_valid_at": new["valid_at"]})
    return pa.Table.from_pylist(rows, schema=schema.INVALIDATION_CANDIDATES)


def apply_judged(edges: pa.Table, ended: dict[str, tuple[datetime, str]]) -> pa.Table:
    """Edges with the judge's yeses applied: `ended[old_edge_id] = (when, newer edge_id)`."""
    if not ended:
        return edges
    rows = edges.to_pylist()
    for edge in rows:
        if edge["edge_id"] in ended and edge["invalid_at"] is None:
            edge["invalid_at"], edge["invalidated_by"] = ended[edge["edge_id"]]
    return pa.Table.from_pylist(rows, schema=edges.schema)


VERSIONED_FIELDS = ("source_entity_id", "target_entity_id", "relation", "fact", "episode_ids",
                    "valid_at", "invalid_at", "invalidated_by")


def version_edges(rows: pa.Table, now: datetime) -> pa.Table:
    """This run's facts (`side` = new) against every stored version (`side` = old), any
    number of edges -> all versions, each edge's in version order, edges in id order.
    Nothing is updated in place but `expired_at` of a version the store stops believing:
    an edge's open version (its first, by version, without `expired_at`) is closed at
    `now` unless its first new row says the same (`_same_belief`), and that row is
    appended as the next version when it differs. Column by column (polars): a dict per
    row was 0.46 s of the 160,000-episode night's versions stage."""
    import polars as pl

    # Vectors stay in Arrow, taken by row position: as Python lists they were most of
    # the time (0.7 s for 6,900 rows of 384 floats at 10,000 + 200 episodes).
    vectors = [c for c in rows.column_names if c.endswith("_embedding")]
    slim = rows.drop_columns(vectors).append_column(
        ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    frame = pl.from_arrow(slim)
    old = frame.filter(pl.col("side") == "old").drop("side")
    current = frame.filter(pl.col("side") == "new").drop("side").unique(
        "edge_id", keep="first", maintain_order=True)
    open_ = (old.filter(pl.col("expired_at").is_null()).sort(["edge_id", "version"],
                                                              maintain_order=True)
             .unique("edge_id", keep="first", maintain_order=True)
             .select("edge_id", *(pl.col(f).alias(f"{f}_open") for f in VERSIONED_FIELDS),
                     open_row=ROW))
    said = current.join(open_, on="edge_id", how="inner").filter(_same_belief("_open"))
    kept = said["edge_id"].implode()  # edges whose stored versions stay as they are
    closing = open_.filter(~pl.col("edge_id").is_in(kept))["open_row"].implode()
    closed = old.with_columns(
        expired_at=pl.when(pl.col(ROW).is_in(closing))
        .then(pl.lit(now, dtype=old.schema["expired_at"])).otherwise(pl.col("expired_at")),
        appended=pl.lit(False))
    latest = old.group_by("edge_id").agg(latest=pl.col("version").max())
    appended = (current.filter(~pl.col("edge_id").is_in(kept))
                .join(latest, on="edge_id", how="left")
                .with_columns(version=(pl.col("latest").fill_null(0) + 1).cast(
                    old.schema["version"]),
                    created_at=pl.lit(now, dtype=old.schema["created_at"]),
                    expired_at=pl.lit(None, dtype=old.schema["expired_at"]),
                    appended=pl.lit(True)).drop("latest").select(closed.columns))
    versions = (pl.concat([closed, appended]).sort(["edge_id", "appended", "version", ROW],
                                                   maintain_order=True)
                .drop("appended").to_arrow())
    taken = rows.select(vectors).take(versions[ROW])
    for name in vectors:
        versions = versions.append_column(name, taken[name])
    result = rows.schema.remove(rows.schema.get_field_index("side"))
    return versions.select(result.names).cast(result)


ROW = "_row"  # a version's source row in version_edges' input


SUMMARY_SOURCES = pa.schema([
    ("group_id", pa.string()), ("entity_id", pa.string()), ("fact", pa.string()),
    ("episodes", pa.int64()), ("valid_at", schema.TS),
])
SUMMARIES = pa.schema([("group_id", pa.string()), ("entity_id", pa.string()),
                       ("summary", pa.string())])


def summary_sources(edges: pa.Table) -> pa.Table:
    """Each fact that still holds, once for each of its two entities."""
    import pyarrow.compute as pc

    holding = edges.filter(pc.is_null(edges["invalid_at"]))
    episodes = pc.list_value_length(holding["episode_ids"]).cast(pa.int64())
    sides = [pa.table({"group_id": holding["group_id"], "entity_id": holding[column],
                       "fact": holding["fact"], "episodes": episodes,
                       "valid_at": holding["valid_at"]}, schema=SUMMARY_SOURCES)
             for column in ("source_entity_id", "target_entity_id")]
    return pa.concat_tables(sides)


def entity_summaries(sources: pa.Table, max_facts: int) -> pa.Table:
    """An extractive summary per entity: the texts of its `max_facts` facts that still hold,
    best attested first (most episodes, then most recent). The LLM path may replace it."""
    import polars as pl

    if sources.num_rows == 0:
        return SUMMARIES.empty_table()
    keys = ["group_id", "entity_id"]
    sentence = pl.col("fact").str.strip_chars()
    top = (pl.from_arrow(sources).with_columns(
               fact=pl.when(sentence.str.contains(r"[.!?]$")).then(sentence)
               .otherwise(sentence + "."))
           .filter(pl.col("fact").str.len_chars() > 1)
           .sort([*keys, "episodes", "valid_at", "fact"],
                 descending=[False, False, True, True, False], nulls_last=True)
           # after the sort, so a text said by several facts ranks by its best-attested one,
           # not by whichever arrived first (that followed the shuffle's block order)
           .unique([*keys, "fact"], keep="first", maintain_order=True)
           .group_by(keys, maintain_order=True)
           .agg(summary=pl.col("fact").head(max_facts).str.join(" ")))
    return schema.conform(top.to_arrow(), SUMMARIES)
