"""JSON business records -> entities, edges and attributes, by a fixed mapping (not by
flattening text), shared by every extractor backend. What it reads is config `records`
(`RecordsConfig`: inference, overridden per source by `records.sources`):

1. The record is one entity. Its label is the singular of the source's last segment
   (`crm.customers` -> `Customer`; a record about one person, PERSON_RECORDS, is a Person).
   Its key is the value of its key field (`id`, `<label>_id`, ... then the first `*_id`);
   its *key name* is `"<Label> <key>"` (`Employee 2`). It is named by its name fields
   (`name`, `first_name` + `last_name`, ...: `Nancy Edwards`), else by its key name.
   Its identity is its key name, never its name: the entity carries the key name in the
   attribute RECORD_ATTRIBUTE, its facts name it by the key name (their text by its name),
   and entity resolution makes one name node of a key name (`resolve.mention_rows`), so two
   records called alike (two contacts "Ana Silva") stay two entities, each with its own
   edges and attributes; other names meet a record by its name only when they can mean
   that one record (`resolve.cluster`).
2. A reference field (`customer_id`, or one named in `references`) is an edge to the key
   name of the record it points at (`REPORTS_TO Employee 2`), which meets the referenced
   record's own entity (`Nancy Edwards`) by that key, whichever run or episode brought
   that record. Its text names the target by the key name too (the record may not have
   arrived), marked `target_by_key` (`RecordFact`): the facts stage writes the resolved
   entity's name in its place (`facts.name_targets`: "Jane Peacock: reports to Nancy
   Edwards"), and the key name stays while no record of that key has arrived.
3. An entity field (`company`, `city`, ... `records.entity_fields`) with a short text value
   is an edge to an entity of that name, labelled after the field.
4. Nested objects and lists of objects are child records (label = singular field name),
   linked by the field, up to the depth limit; lists of short texts give one edge per item.
5. Every other value (phones, postal codes, emails, first names, numbers, dates, long text)
   is an attribute of the record's entity: stored, searchable and summarized, never an
   entity. A newer version of the record replaces its attributes (resolution merges the
   attributes of one entity, later ones win).
6. Versions: the records of one group with one key name are versions of one record, in
   valid-time order. An edge the record itself states (its fields, not its children's)
   ends when the first version after the last one stating it arrives: a changed field
   whatever its name (EMAIL, a custom field, not only the exclusive relation classes), an
   item gone from a list, a field dropped (`version_ends`, applied to the facts stage's
   edges by `apply_version_ends`). A record's own entity is its extraction's first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import schema
from tkg.pipeline.config import FactsConfig, RecordsConfig, RecordSource
from tkg.pipeline.extract.base import (
    EpisodeInput,
    ExtractedEntity,
    ExtractedFact,
    Extraction,
    relation_name,
)

RECORD_ATTRIBUTE = schema.RECORD_ATTRIBUTE  # the key name ("Employee 2"): resolution merges on it
# Records about one person are labelled Person, so the resolver meets the same person in
# the group's messages by name.
PERSON_RECORDS = {"Contact", "Employee", "Person", "People", "User", "Staff", "Member",
                  "Patient", "Student", "Candidate", "Author", "Teacher"}
MAX_VALUE_WORDS = 6
MAX_VALUE_CHARS = 80
ID_KEY = re.compile(r"^(?:id|pk|key|(.+?)_?(?:id|Id|ID))$")


def singular(word: str) -> str:
    word = word.strip()
    if word.lower().endswith(("us", "ss", "is")):
        return word
    for suffix, replacement in (("ies", "y"), ("sses", "ss"), ("ses", "s"), ("s", "")):
        if word.lower().endswith(suffix) and len(word) > len(suffix) + 1:
            return word[: -len(suffix)] + replacement
    return word


def label_of(name: str) -> str:
    """`crm.customers` -> `Customer`, `line_items` -> `LineItem`."""
    last = re.split(r"[./:]", name.strip())[-1] or "record"
    return "".join(part.capitalize() for part in re.split(r"[_\-\s]+", singular(last)) if part)


def _folded(field: str) -> str:
    """A field name without case or separators: `postal_code`, `PostalCode` -> postalcode."""
    return re.sub(r"[^a-z0-9]", "", field.lower())


def _is_scalar_key(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool) and bool(
        str(value).strip())


def _is_short_text(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value.strip()) <= MAX_VALUE_CHARS
        and len(value.split()) <= MAX_VALUE_WORDS
    )


def key_field(data: dict, label: str, source: RecordSource, config: RecordsConfig
              ) -> str | None:
    """The field whose value identifies the record: the source's `key`, else the first of
    `key_fields` it fills, else its first id-like field."""
    candidates = [source.key] if source.key else [
        k.format(label=label.lower()) for k in config.key_fields]
    candidates += [k for k in data if ID_KEY.match(k) and k not in source.references]
    return next((k for k in candidates if k and _is_scalar_key(data.get(k))), None)


def key_name(label: str, value: Any) -> str:
    """The name every record with this label and key is known by: `Employee 2`."""
    return f"{label} {str(value).strip()}"


def _name_fields(data: dict, source: RecordSource, config: RecordsConfig) -> tuple[str, ...]:
    """The fields that name the record: the source's, else the first inferred group filled."""
    groups = (source.name_fields,) if source.name_fields else config.name_fields
    for group in groups:
        if group and all(_is_short_text(data.get(f)) for f in group):
            return tuple(group)
    return ()


def _referenced_label(field: str, source: RecordSource) -> str | None:
    """The label of the record a reference field points at, None for other fields."""
    if field in source.references:
        return source.references[field]
    match = ID_KEY.match(field)
    return label_of(match.group(1)) if match and match.group(1) else None


def _entity_label(field: str, config: RecordsConfig, source: RecordSource) -> str | None:
    """The label of an entity field's value (matched by name or name ending: billingcity is
    a city), None when the field is not an entity field."""
    folded = _folded(field)
    if field in source.entities:
        return config.entity_labels.get(field, label_of(field))
    for name in config.entity_fields:
        if folded.endswith(_folded(name)):
            return config.entity_labels.get(name, label_of(field))
    return None


@dataclass
class RecordFact(ExtractedFact):
    """A record's fact; `target_by_key`: its text calls the target by its key name
    (`Employee 2`), for the facts stage to replace by the resolved entity's name."""

    target_by_key: bool = False


def _without_id(field: str) -> str:
    """A field name less its id word (`reports_to_id` -> `reports_to`, `SupportRepId` ->
    `SupportRep`): what its relation and a reference's text are named after."""
    return re.sub(r"_?(id|Id|ID)$", "", field) or field


def field_words(field: str, reference: bool = False) -> str:
    """A field name as the words of a fact's text: `billing_city` -> `billing city`; a
    reference's in words without its id word (the edge is to the record, not its id):
    `reports_to_id` -> `reports to`, `SupportRepId` -> `support rep`."""
    if not reference:
        return field.replace("_", " ")
    return relation_name(_without_id(field)).lower().replace("_", " ")


class Named(NamedTuple):
    """An entity of a record's extraction: `known_as`, what facts name it by (a keyed
    record's key name, else its name), and `name`, what its facts' texts call it."""

    known_as: str
    name: str


class _Mapper:
    """One record (and its children) -> entities, facts and attributes."""

    def __init__(self, episode: EpisodeInput, config: RecordsConfig, max_depth: int) -> None:
        self.episode, self.config, self.max_depth = episode, config, max_depth
        self.source = config.sources.get(episode.source or "", RecordSource())
        self.out = Extraction()

    def fact(self, subject: Named, field: str, target: Named, by_key: bool = False) -> None:
        """An edge of the field; `by_key`: the target is a record named by its key name."""
        relation = self.source.relations.get(field) or relation_name(_without_id(field))
        words = field_words(field, reference=by_key)
        self.out.facts.append(RecordFact(subject.known_as, target.known_as, relation,
                                         f"{subject.name}: {words} {target.name}",
                                         valid_at=self.episode.valid_at, target_by_key=by_key))

    def record(self, data: dict, label: str, fallback: str, depth: int) -> Named:
        """Map one record; how its entity is known and named."""
        key = key_field(data, label, self.source if depth == 0 else RecordSource(),
                        self.config)
        known_as = key_name(label, data[key]) if key else fallback
        naming = _name_fields(data, self.source if depth == 0 else RecordSource(),
                              self.config)
        name = " ".join(data[f].strip() for f in naming) or known_as
        entity = self._own_entity(name, "Person" if label in PERSON_RECORDS and naming
                                  else label, known_as if key else None)
        subject = Named(known_as if key else name, name)
        attributes: dict[str, Any] = {RECORD_ATTRIBUTE: known_as} if key else {}
        for field, value in data.items():
            if field in naming or field in self.source.drop or value is None:
                continue
            if field == key or not self.field(subject, field, value, depth):
                attributes[field] = value
        entity.attributes = json.dumps(attributes, ensure_ascii=False, sort_keys=True,
                                       default=str)
        return subject

    def _own_entity(self, name: str, label: str, record: str | None) -> ExtractedEntity:
        """The entity of a record: a keyed record's own (its name may be another's: two
        children called alike), an unkeyed one's shared with whatever has its name."""
        for entity in self.out.entities:
            if entity.name == name and (record is None or _own_key([
                    {"attributes": entity.attributes}]) == record):
                return entity
        entity = ExtractedEntity(name, label)
        self.out.entities.append(entity)
        return entity

    def field(self, subject: Named, field: str, value: Any, depth: int) -> bool:
        """Map one field as an edge (True), or leave it to the attributes (False)."""
        if field in self.source.attributes:
            return False
        return any(handler(self, subject, field, value, depth) for handler in FIELD_HANDLERS)

    def reference(self, subject: Named, field: str, value: Any, _depth: int) -> bool:
        referenced = _referenced_label(field, self.source)
        if referenced is None or not _is_scalar_key(value):
            return False
        target = key_name(referenced, value)
        # labelled as the record labels itself: a reference must not outvote it (8 Chinook
        # employees are referenced 66 times as reports_to and support rep: 6 were Employee)
        self.out.add_entity(target, "Person" if referenced in PERSON_RECORDS else referenced,
                            json.dumps({RECORD_ATTRIBUTE: target}))
        self.fact(subject, field, Named(target, target), by_key=True)
        return True

    def entity(self, subject: Named, field: str, value: Any, _depth: int) -> bool:
        label = _entity_label(field, self.config, self.source)
        if label is None or not _is_short_text(value):
            return False
        self.out.add_entity(value.strip(), label)
        self.fact(subject, field, Named(value.strip(), value.strip()))
        return True

    def child(self, subject: Named, field: str, value: Any, depth: int) -> bool:
        if not isinstance(value, dict) or depth >= self.max_depth:
            return False
        # an unkeyed child is its parent's: named after the parent's key, not its name
        child = self.record(value, label_of(field), f"{subject.known_as} {label_of(field)}",
                            depth + 1)
        self.fact(subject, field, child)
        return True

    def items(self, subject: Named, field: str, value: Any, depth: int) -> bool:
        """A list of objects (child records) or of short texts (entities); anything else in
        the list stays an attribute."""
        if not isinstance(value, list) or not value or depth >= self.max_depth:
            return False
        if not all(isinstance(i, dict) or (_is_short_text(i) and not _has_digit(i))
                   for i in value):
            return False
        label = label_of(field)
        for index, item in enumerate(value, start=1):
            if isinstance(item, dict):
                target = self.record(item, label, f"{subject.known_as} {label} {index}",
                                     depth + 1)
            else:
                target = Named(item.strip(), item.strip())
                self.out.add_entity(target.name, label)
            self.fact(subject, field, target)
        return True


def _has_digit(text: str) -> bool:
    return any(c.isdigit() for c in text)


# Tried in order on each field; the first that maps it wins, none: an attribute.
FIELD_HANDLERS: tuple[Callable[[_Mapper, Named, str, Any, int], bool], ...] = (
    _Mapper.reference, _Mapper.entity, _Mapper.child, _Mapper.items)


def extract_record(episode: EpisodeInput, max_depth: int = 3,
                   config: RecordsConfig | None = None) -> Extraction:
    """Entities and facts of one JSON record episode."""
    mapper = _Mapper(episode, config or RecordsConfig(), max_depth)
    label = mapper.source.label or label_of(episode.source or "record")
    fallback = f"{label} {episode.source_id or episode.episode_id}"
    mapper.record(json.loads(episode.content), label, fallback, 0)
    return mapper.out


def record_text(content: str, max_items: int = 48) -> str:
    """A record as short `key value` phrases for embedding: JSON punctuation costs tokens
    (about 2.5x more for the same record) and carries no meaning for a sentence encoder."""
    parts: list[str] = []
    stack: list[tuple[str, Any]] = [("", json.loads(content))]
    while stack and len(parts) < max_items:
        prefix, node = stack.pop(0)
        if isinstance(node, dict):
            stack[:0] = [(k.replace("_", " "), v) for k, v in node.items()]
        elif isinstance(node, list):
            stack[:0] = [(prefix, v) for v in node]
        elif node is not None and node != "":
            parts.append(f"{prefix} {node}".strip())
    return "; ".join(parts)


# --- versions: a newer record supersedes the edges it no longer states ---------------------

# One row per record version (relation null) and per edge a version states from the record
# itself: the facts stage maps the names to entities and shuffles the rows by record.
RECORD_STATEMENTS = schema.RECORD_STATEMENTS
RESOLVED_STATEMENTS = RECORD_STATEMENTS.append(pa.field("source_entity_id", pa.string())
                                               ).append(pa.field("target_entity_id", pa.string()))
VERSION_ENDS = pa.schema([("edge_id", pa.string()), ("record_invalid_at", schema.TS),
                          ("record_invalidated_by", pa.string()),
                          ("source_entity_id", pa.string()), ("tonight", pa.bool_())])
END_COLUMNS = ["edge_id", "record_invalid_at", "record_invalidated_by"]  # joined to edges


RECORD_NAMES = pa.schema([("group_id", pa.string()), ("entity_id", pa.string()),
                          ("name", pa.string())])


def may_name_a_record(attributes: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Whether each attributes JSON mentions RECORD_ATTRIBUTE: a cheap pass before parsing
    (most entities are no record); `_key_of` decides among those it keeps."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.match_substring(attributes, f'"{RECORD_ATTRIBUTE}"'), False)


def record_names(entities: pa.Table) -> pa.Table:
    """Entities -> RECORD_NAMES of those that stand for a record (carry RECORD_ATTRIBUTE)."""
    if "attributes" not in entities.column_names:  # a block without rows or columns
        return RECORD_NAMES.empty_table()
    candidates = entities.filter(may_name_a_record(entities["attributes"]))
    keyed = [_key_of(a) is not None for a in candidates["attributes"].to_pylist()]
    return candidates.filter(pa.array(keyed, pa.bool_())).select(RECORD_NAMES.names).cast(
        RECORD_NAMES)


def record_statements(extractions: pa.Table, tonight: bool) -> pa.Table:
    """Extractions (this run's: `tonight`) -> RECORD_STATEMENTS rows of the keyed records
    among them (their first entity carries RECORD_ATTRIBUTE); other extractions give none."""
    from tkg.pipeline.resolve import normalize_name

    rows = []
    for group_id, episode_id, valid_at, entities, facts in zip(
            *(extractions[c].to_pylist() for c in
              ("group_id", "episode_id", "valid_at", "entities", "facts")), strict=True):
        record = _own_key(entities)
        if record is None:
            continue
        subject = record  # a keyed record's facts name it by its key name (`_Mapper.fact`)
        base = {"group_id": group_id, "record": normalize_name(record),
                "episode_id": episode_id, "valid_at": valid_at, "tonight": tonight}
        rows.append({**base, "source_normalized": None, "target_normalized": None,
                     "relation": None})
        rows += [{**base, "source_normalized": normalize_name(subject),
                  "target_normalized": normalize_name(fact["target"] or ""),
                  "relation": fact["relation"]}
                 for fact in facts or () if fact["source"] == subject and fact["target"]]
    return pa.Table.from_pylist(rows, schema=RECORD_STATEMENTS)


def versions_only(statements: pa.Table) -> pa.Table:
    """The version rows of statements (relation null), as RESOLVED_STATEMENTS."""
    import pyarrow.compute as pc

    return schema.conform(statements.filter(pc.is_null(statements["relation"])),
                          RESOLVED_STATEMENTS)


def stated_only(statements: pa.Table) -> pa.Table:
    """The edge rows of statements (relation set), to be resolved."""
    import pyarrow.compute as pc

    return statements.filter(pc.is_valid(statements["relation"]))


def resolved_statements(statements: pa.Table) -> pa.Table:
    return schema.conform(statements, RESOLVED_STATEMENTS)


def _own_key(entities: list[dict] | None) -> str | None:
    """The key name of the record an extraction maps (its first entity's), else None."""
    return _key_of(entities[0].get("attributes")) if entities else None


def _key_of(attributes: str | None) -> str | None:
    """The record key name in an entity's attributes (JSON), else None."""
    if not attributes:
        return None
    try:
        value = json.loads(attributes).get(RECORD_ATTRIBUTE)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value.strip() else None


def version_ends(statements: pa.Table, config: FactsConfig) -> pa.Table:
    """Statements (resolved: `source_entity_id`, `target_entity_id`) of whole records ->
    VERSION_ENDS: each edge a record stated and a later version of it no longer states
    ends at that version's valid time, caused by a new value that version states for the
    same field (the smallest edge id), or by none when it dropped the field or the item (a
    list's remaining items replace nothing); of several records, the earliest end.
    `tonight`: a record with a version in this run states the edge (a later run revisits
    the subjects of those ends, `source_entity_id`). Column by column (polars), each
    distinct relation classed once: a dict per statement was 0.73 s of the
    160,000-episode night's facts stage."""
    frame = pl.from_arrow(schema.conform(statements, RESOLVED_STATEMENTS)).with_columns(
        tonight=pl.col("tonight").fill_null(False).any().over(RECORD))
    versions = _versions(frame)
    stated = _stated_edges(frame, versions, config)
    at_version = stated.select(*RECORD, "index", "rel", "edge").unique()
    last = (stated.group_by([*RECORD, "edge"]).agg(pl.col("index").max(), pl.col("rel").first())
            .join(versions.group_by(RECORD).agg(count=pl.len()), on=RECORD)
            .filter(pl.col("index") + 1 < pl.col("count"))
            .with_columns(next=pl.col("index") + 1))
    causes = (last.join(at_version.rename({"index": "next", "edge": "cause"}),
                        on=[*RECORD, "next", "rel"], how="left")
              .join(at_version.rename({"edge": "cause"}).with_columns(kept=pl.lit(True)),
                    on=[*RECORD, "index", "rel", "cause"], how="left")
              .group_by([*RECORD, "edge", "next"])
              .agg(by=pl.col("cause").filter(pl.col("kept").is_null()).min()))
    ends = (causes.join(versions.select(*RECORD, next="index", at="valid_at"),
                        on=[*RECORD, "next"])
            .sort(["edge", "at", pl.col("by").is_not_null(), pl.col("by").fill_null("")])
            .group_by("edge", maintain_order=True).first())
    about = stated.group_by("edge").agg(pl.col("source_entity_id").first(),
                                        pl.col("tonight").any())
    out = ends.join(about, on="edge").sort("edge").select(
        edge_id="edge", record_invalid_at="at", record_invalidated_by="by",
        source_entity_id="source_entity_id", tonight="tonight")
    return out.to_arrow().cast(VERSION_ENDS)


RECORD = ["group_id", "record"]


def _versions(frame: pl.DataFrame) -> pl.DataFrame:
    """(record, valid_at, episode_id, index) of each version of each record: its distinct
    (valid time, episode) in that order."""
    return (frame.filter(pl.col("valid_at").is_not_null())
            .select(*RECORD, "valid_at", "episode_id").unique()
            .sort([*RECORD, "valid_at", "episode_id"])
            .with_columns(index=pl.int_range(pl.len()).over(RECORD)))


def _stated_edges(frame: pl.DataFrame, versions: pl.DataFrame, config: FactsConfig
                  ) -> pl.DataFrame:
    """The statements of an edge (two entities, a relation) in a version of its record,
    with the version's index, the relation's class (`rel`) and the edge's id."""
    from tkg.pipeline.facts import edge_ids, relation_class

    source, target = pl.col("source_entity_id"), pl.col("target_entity_id")
    order = versions.group_by([*RECORD, "episode_id"]).agg(pl.col("index").max())
    stated = frame.filter(pl.col("relation").is_not_null() & source.is_not_null()
                          & target.is_not_null() & (source != target)).join(
        order, on=[*RECORD, "episode_id"])
    classes = {relation: relation_class(relation, config)[0]
               for relation in stated["relation"].unique().to_list()}
    stated = stated.with_columns(rel=pl.col("relation").replace_strict(
        classes, return_dtype=pl.String))
    return stated.with_columns(edge=pl.Series(edge_ids(
        stated["group_id"].to_list(), stated["source_entity_id"].to_list(),
        stated["target_entity_id"].to_list(), stated["rel"].to_list()), dtype=pl.String))


def apply_version_ends(edges: pa.Table) -> pa.Table:
    """Edges joined (left) with VERSION_ENDS -> the edges, each ended by its record's newer
    version unless it already ends earlier (`facts._end`, the one rule for two ends)."""
    from tkg.pipeline.facts import _end

    names = [n for n in edges.column_names if n not in END_COLUMNS[1:]]
    if "record_invalid_at" not in edges.column_names or edges.num_rows == 0:
        return edges.select(names)  # no record ends joined
    # only the ends of the rows a record version ends change: every row of the
    # 160,000-episode night's 60,000 edges made a dict and back, 0.66 s
    ended = pc.is_valid(edges["record_invalid_at"]).combine_chunks()
    ends = ["invalid_at", "invalidated_by"]
    rows = edges.filter(ended).select([*ends, *END_COLUMNS[1:]]).to_pylist()
    for edge in rows:
        _end(edge, edge["record_invalid_at"], edge["record_invalidated_by"])
    for name in ends:
        column = edges[name].combine_chunks()
        edges = edges.set_column(edges.schema.get_field_index(name), name, pc.replace_with_mask(
            column, ended, pa.array([edge[name] for edge in rows], column.type)))
    return edges.select(names)
