"""Arrow schemas of every table: the one source of truth for columns.

Vector columns are fixed-size float32 lists whose width comes from the embedder, so the
tables that carry one are built by a function of `dim`, never with a hard-coded width.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
NAMESPACE = uuid.UUID("6f1c6a2e-3d1b-5b0a-9d36-7a4b0c2e8f10")


_SEEDED = hashlib.sha1(NAMESPACE.bytes)  # uuid5's hash with the namespace already in it


def stable_id(*parts: str) -> str:
    """Deterministic id from its parts: re-ingesting the same thing gives the same id.
    The string of `uuid.uuid5(NAMESPACE, "\x1f".join(parts))`, computed without its UUID
    object: 1.2 against 3.9 us a call, and a 1,000,000-mention resolution makes 723,000
    of them in `alias_rows` alone (`tests/test_schema.py` holds the two equal)."""
    digest = _SEEDED.copy()
    digest.update("\x1f".join(parts).encode())
    head = bytearray(digest.digest()[:16])
    head[6] = (head[6] & 0x0F) | 0x50  # version 5
    head[8] = (head[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = head.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def vector(dim: int) -> pa.DataType:
    return pa.list_(pa.float32(), dim)


def episodes(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("episode_id", pa.string()),
            ("group_id", pa.string()),
            ("source_id", pa.string()),
            ("kind", pa.string()),
            ("conversation_id", pa.string()),
            ("speaker", pa.string()),
            ("role", pa.string()),
            ("title", pa.string()),
            ("source", pa.string()),
            ("content", pa.string()),
            ("source_description", pa.string()),
            ("valid_at", TS),
            ("created_at", TS),
            ("run_id", pa.string()),
            ("content_embedding", vector(dim)),
        ]
    )


def entities(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("entity_id", pa.string()),
            ("group_id", pa.string()),
            ("name", pa.string()),
            ("labels", pa.list_(pa.string())),
            ("summary", pa.string()),
            ("name_embedding", vector(dim)),
            ("attributes", pa.string()),  # JSON object
            ("created_at", TS),
            ("first_seen", TS),
            ("last_seen", TS),
            ("mention_count", pa.int64()),
        ]
    )


ENTITY_ALIASES = pa.schema(
    [
        ("group_id", pa.string()),
        ("alias", pa.string()),
        ("normalized", pa.string()),
        ("entity_id", pa.string()),
        ("merged_entity_id", pa.string()),
        ("evidence", pa.string()),  # exact | spelling | first_name | embedding | llm
        ("score", pa.float64()),
        ("created_at", TS),
    ]
)

MENTIONS = pa.schema(
    [
        ("episode_id", pa.string()),
        ("entity_id", pa.string()),
        ("group_id", pa.string()),
    ]
)


def facts(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("edge_id", pa.string()),
            ("version", pa.int32()),
            ("group_id", pa.string()),
            ("source_entity_id", pa.string()),
            ("target_entity_id", pa.string()),
            ("relation", pa.string()),
            ("fact", pa.string()),
            ("fact_embedding", vector(dim)),
            ("episode_ids", pa.list_(pa.string())),
            ("valid_at", TS),
            ("invalid_at", TS),
            ("created_at", TS),
            ("expired_at", TS),
            ("invalidated_by", pa.string()),
        ]
    )


def communities(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("community_id", pa.string()),
            ("group_id", pa.string()),
            ("name", pa.string()),
            ("summary", pa.string()),
            ("name_embedding", vector(dim)),
            ("size", pa.int64()),
            ("created_at", TS),
        ]
    )


COMMUNITY_MEMBERS = pa.schema(
    [
        ("community_id", pa.string()),
        ("entity_id", pa.string()),
        ("group_id", pa.string()),
    ]
)

# Communities before their names are embedded, with their members (pipeline.communities);
# `placed`: members that joined by dynamic extension in this run.
COMMUNITY_ROWS = pa.schema(
    [f for f in communities(1) if f.name != "name_embedding"]
    + [pa.field("placed", pa.int64()), pa.field("members", pa.list_(pa.string()))]
)
# One group's graph inputs in one shuffle: `kind` says which columns a row uses
# (entity | fact | mention | member | community). A fact keeps its edge_id: the graph orders
# facts by it, so a summary's key facts never depend on the order the shuffle delivers them.
COMMUNITY_INPUT = pa.schema([
    ("kind", pa.string()), ("group_id", pa.string()), ("entity_id", pa.string()),
    ("name", pa.string()), ("summary", pa.string()), ("mention_count", pa.int64()),
    ("edge_id", pa.string()), ("source_entity_id", pa.string()), ("target_entity_id", pa.string()),
    ("fact", pa.string()), ("n_episodes", pa.int64()), ("expired_at", TS),
    ("invalid_at", TS), ("episode_id", pa.string()), ("community_id", pa.string()),
    ("created_at", TS),
])

REJECTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("stage", pa.string()),  # read | window | extract
        ("group_id", pa.string()),
        ("file", pa.string()),
        ("line", pa.int64()),  # 1-based line (JSONL) or row (Parquet)
        ("episode_id", pa.string()),
        ("reason", pa.string()),
        ("payload", pa.string()),  # truncated raw record or raw model output
        ("created_at", TS),
    ]
)

RUNS = pa.schema(
    [
        ("run_id", pa.string()),
        ("status", pa.string()),
        ("config_hash", pa.string()),
        ("inputs", pa.list_(pa.string())),
        ("started_at", TS),
        ("finished_at", TS),
        ("episodes_in", pa.int64()),
        ("episodes_ok", pa.int64()),
        ("rejected", pa.int64()),
        ("duplicates", pa.int64()),
        ("missing_timezone", pa.int64()),
        ("entities", pa.int64()),
        ("facts", pa.int64()),
        ("facts_current", pa.int64()),
        ("facts_invalidated", pa.int64()),
        ("communities", pa.int64()),
        ("llm_calls", pa.int64()),
        ("llm_prompt_tokens", pa.int64()),
        ("llm_completion_tokens", pa.int64()),
        ("stage_seconds", pa.map_(pa.string(), pa.float64())),
    ]
)

# The erasure log (`tkg forget`), kept beside the snapshots (STORE/erasures/): what was
# asked, by whom, and how much went; never erased content or ids in clear. `erased_hashes`:
# sha256 of `salt` + group + "\x1f" + source id of each erased episode, so an auditor who
# knows an id can confirm it was erased.
ERASURES = pa.schema(
    [
        ("request_id", pa.string()),
        ("requested_at", TS),
        ("requested_by", pa.string()),
        ("selector", pa.string()),  # JSON: selector kinds, their values as salted hashes
        ("dry_run", pa.bool_()),
        ("counts", pa.map_(pa.string(), pa.int64())),  # rows removed per table
        ("snapshot", pa.string()),  # the snapshot the forget published
        ("snapshots_retired", pa.list_(pa.string())),  # by --purge
        ("salt", pa.string()),
        ("erased_hashes", pa.list_(pa.string())),
    ]
)

# --- work tables: stage outputs under STORE/work/<run_id>/, not published -----------------

EXTRACTED_ENTITY = pa.struct(
    [("name", pa.string()), ("label", pa.string()), ("attributes", pa.string())]
)
EXTRACTED_FACT = pa.struct(
    [
        ("source", pa.string()),
        ("target", pa.string()),
        ("relation", pa.string()),
        ("fact", pa.string()),
        ("valid_at", TS),
        ("invalid_at", TS),
        ("date_text", pa.string()),
        ("undated", pa.bool_()),  # past state with no date in the text: valid time unknown
        # the text calls the target by a record's key name ("Employee 2"), written over by
        # the resolved entity's name in the facts stage (extract/records.py; null: no)
        ("target_by_key", pa.bool_()),
    ]
)
EXTRACTIONS = pa.schema(
    [
        ("episode_id", pa.string()),
        ("group_id", pa.string()),
        ("valid_at", TS),
        ("entities", pa.list_(EXTRACTED_ENTITY)),
        ("facts", pa.list_(EXTRACTED_FACT)),
        ("error", pa.string()),
        ("raw_output", pa.string()),
        ("llm_calls", pa.int64()),  # LLM extraction: calls and tokens this episode cost
        ("llm_prompt_tokens", pa.int64()),
        ("llm_completion_tokens", pa.int64()),
        ("llm_retries", pa.int64()),
    ]
)

# Episodes before embedding: the published schema minus the vector, plus the context window.
RAW_EPISODES = pa.schema(
    [f for f in episodes(1) if f.name != "content_embedding"]
    + [
        pa.field("file", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("content_hash", pa.string()),
    ]
)
WINDOWED_EPISODES = RAW_EPISODES.append(pa.field("context", pa.list_(pa.string())))

RESOLVED_ENTITIES = pa.schema(
    [f for f in entities(1) if f.name != "name_embedding"]
    + [
        pa.field("normalized", pa.string()),
        pa.field("aliases", pa.list_(pa.string())),
        pa.field("alias_normalized", pa.list_(pa.string())),
        pa.field("alias_evidence", pa.list_(pa.string())),
        pa.field("alias_score", pa.list_(pa.float64())),
        # what merging the row with the node or entity of later mentions needs
        # (`node_merge`): per surface form in `aliases`' order, its mentions, whether a
        # record's key spelt it and whether its evidence keeps it from naming; an entity's
        # labels (sorted), each with its mentions and latest time
        pa.field("alias_mentions", pa.list_(pa.int64())),
        pa.field("alias_key_name", pa.list_(pa.bool_())),
        pa.field("alias_short", pa.list_(pa.bool_())),
        pa.field("label_names", pa.list_(pa.string())),
        pa.field("label_counts", pa.list_(pa.int64())),
        pa.field("label_last", pa.list_(TS)),
    ]
)
FACT_MENTIONS = pa.schema([
    ("group_id", pa.string()), ("episode_id", pa.string()),
    ("source_normalized", pa.string()), ("target_normalized", pa.string()),
    ("relation", pa.string()), ("fact", pa.string()), ("valid_at", TS), ("invalid_at", TS),
    ("target_key", pa.string()),  # the key name the text calls the target by (null: none)
])
FACT_ROWS = pa.schema([
    ("edge_id", pa.string()), ("group_id", pa.string()), ("episode_id", pa.string()),
    ("source_entity_id", pa.string()), ("target_entity_id", pa.string()),
    ("relation", pa.string()), ("fact", pa.string()), ("valid_at", TS), ("invalid_at", TS),
    ("target_key", pa.string()),
])
MERGED_FACTS = pa.schema([f for f in facts(1) if f.name != "fact_embedding"])

PUBLISHED: dict[str, Callable[[int], pa.Schema]] = {
    "episodes": episodes,
    "entities": entities,
    "entity_aliases": lambda _dim: ENTITY_ALIASES,
    "mentions": lambda _dim: MENTIONS,
    "facts": facts,
    "communities": communities,
    "community_members": lambda _dim: COMMUNITY_MEMBERS,
    "rejects": lambda _dim: REJECTS,
    "runs": lambda _dim: RUNS,
}


# Invalidation pairs no relation rule decides, for the optional LLM judge (pipeline.facts).
INVALIDATION_CANDIDATES = pa.schema([
    ("group_id", pa.string()), ("old_edge_id", pa.string()), ("new_edge_id", pa.string()),
    ("relation", pa.string()), ("old_fact", pa.string()), ("new_fact", pa.string()),
    ("old_valid_at", TS), ("new_valid_at", TS),
])

RESOLUTION_PAIRS = pa.schema([
    ("group_id", pa.string()), ("a", pa.string()), ("b", pa.string()),
    ("evidence", pa.string()), ("score", pa.float64()), ("merge", pa.bool_()),
])
# One row per (episode, extracted entity) with its resolution key (names -> resolve).
ENTITY_MENTIONS = pa.schema([
    ("group_id", pa.string()), ("episode_id", pa.string()), ("valid_at", TS),
    ("name", pa.string()), ("label", pa.string()), ("attributes", pa.string()),
    ("normalized", pa.string()),
])
# The subjects whose edges an incremental run rebuilt (facts -> versions): every other
# subject's stored versions stay as they are (entity ids hold their group).
RECOMPUTED_SUBJECTS = pa.schema([("source_entity_id", pa.string())])
# The entity attribute that holds the key name of the business record an entity stands for
# ("Employee 2"): written by extract/records.py, merged on by resolve.py.
RECORD_ATTRIBUTE = "record"
ALIAS_MAP = pa.schema([
    ("group_id", pa.string()), ("normalized", pa.string()), ("entity_id", pa.string()),
    ("root", pa.string()), ("evidence", pa.string()), ("score", pa.float64()),
])

# Every name node's entity (the alias map), kept by a snapshot as `_name_map` for the next
# run's facts and resolve stages: `entity_aliases` lists one normalized form per surface
# name, so it cannot say which names an entity had (a record's key name, `contact
# con-00007`, is never listed) and against it every entity with such a name looked changed
# every night; resolve keeps the stored row of an entity whose names' rows are the same.
NAME_MAP = ALIAS_MAP

# The statements of keyed records (`extract.records.record_statements`): a version row per
# record version (relation null) and a row per fact it states. Each run keeps its own, so
# that a later run reads them instead of parsing every earlier extraction again.
RECORD_STATEMENTS = pa.schema([
    ("group_id", pa.string()), ("record", pa.string()), ("episode_id", pa.string()),
    ("valid_at", TS), ("source_normalized", pa.string()),
    ("target_normalized", pa.string()), ("relation", pa.string()),
    ("tonight", pa.bool_()),  # from this run's extractions (else an earlier run's)
])

# Stage outputs under STORE/work/<run_id>/, by name (see pipeline.stages).
WORK_TABLES: dict[str, Callable[[int], pa.Schema]] = {
    "raw_episodes": lambda _dim: RAW_EPISODES,
    "read_rejects": lambda _dim: REJECTS,
    "episodes": lambda _dim: WINDOWED_EPISODES,
    "window_rejects": lambda _dim: REJECTS,
    "extractions": lambda _dim: EXTRACTIONS,
    "extract_rejects": lambda _dim: REJECTS,
    "name_nodes": lambda _dim: RESOLVED_ENTITIES,
    "entity_mentions": lambda _dim: ENTITY_MENTIONS,
    "name_vectors": lambda dim: RESOLVED_ENTITIES.append(pa.field("name_embedding", vector(dim))),
    "resolution_pairs": lambda _dim: RESOLUTION_PAIRS,
    "alias_map": lambda _dim: ALIAS_MAP,
    "resolved_entities": lambda _dim: RESOLVED_ENTITIES,
    "entities_summarized": lambda _dim: RESOLVED_ENTITIES,
    "entity_aliases": lambda _dim: ENTITY_ALIASES,
    "mentions": lambda _dim: MENTIONS,
    "merged_facts": lambda _dim: MERGED_FACTS,
    "recomputed_subjects": lambda _dim: RECOMPUTED_SUBJECTS,
    "name_map": lambda _dim: NAME_MAP,
    "record_statements": lambda _dim: RECORD_STATEMENTS,
    "episodes_embedded": episodes,
    "entities_embedded": entities,
    "facts_embedded": facts,
    "facts_versioned": facts,
    "community_rows": lambda _dim: COMMUNITY_ROWS,
    "communities": communities,
    "community_members": lambda _dim: COMMUNITY_MEMBERS,
}


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select and cast `table` to `schema`; missing nullable columns become nulls.

    Every writer goes through this, so a table on disk always has exactly its schema's columns.
    """
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table[field.name].cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def from_rows(rows: Iterable[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=schema)
