"""Entity resolution across the whole backfill, in three shuffles, each keyed by group:

1. mentions -> name nodes, by (group, normalized name): every surface form that normalizes
   the same is one node (exact match);
2. nodes -> candidate pairs, by (group, blocking key): the order-free core name (legal forms,
   honorifics and abbreviations normalized away), its one-letter deletions (spelling
   variants: symmetric-deletion blocking finds every pair within one edit, and only those,
   where MinHash bands either miss a third of typo pairs or pair every "James ..." with
   every other), a short name and the full names it can stand for (a first or last name, a
   given name said alike, an organisation without its generic head, a code, a nickname:
   `name_parts`; it merges when it can mean only one), random-hyperplane (SimHash) bands
   of the name embedding; each pair is decided by rules, vectorized, and the undecidable
   ones are kept for an adjudicator (none on the embedded default: they stay apart);
3. pairs -> clusters, by group: connected components; an entity is named after its most
   complete member and its id derives from that member, so the same input gives the same
   ids.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import datetime
from functools import lru_cache

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import schema
from tkg.pipeline.config import ResolveConfig

GENERIC_LABELS = {"Entity", "Concept", "Thing"}
RECORD_ATTRIBUTE = schema.RECORD_ATTRIBUTE
_PUNCT = re.compile(r"[^\w\s&+@.-]|(?<!\w)[.-]|[.-](?!\w)")


def normalize_name(name: str) -> str:
    """Casefolded, NFKC, punctuation-light, single-spaced, without a leading article."""
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _PUNCT.sub(" ", text)
    text = " ".join(text.split())
    if text.startswith("the ") and len(text) > 4:
        text = text[4:]
    return text


def mention_rows(extractions: pa.Table) -> pa.Table:
    """One row per (episode, extracted entity), with the resolution key: its normalized
    name, or a business record's normalized key name (`record_key`: two records called
    alike are two name nodes, its name meets other names in `blocking_keys`)."""
    entities = extractions["entities"]
    flat = pc.list_flatten(entities)
    parents = pc.list_parent_indices(entities)
    if len(flat) == 0:
        return MENTION_ROWS.empty_table()
    names = pc.struct_field(flat, "name")
    normal = {n: normalize_name(n or "") for n in pc.unique(names).to_pylist()}
    normalized = [normal[n] for n in names.to_pylist()]
    attributes = pc.struct_field(flat, "attributes")
    keyed = pc.fill_null(pc.match_substring(attributes, f'"{RECORD_ATTRIBUTE}"'), False)
    rows = np.flatnonzero(keyed.to_numpy(zero_copy_only=False))
    # each distinct attributes text parsed once (a record's mentions repeat it): the
    # 160,000-episode store's 57,514 keyed mentions, a parse and a scalar read each, were
    # half of this function's 1.07 s
    texts = pc.take(attributes, pa.array(rows, pa.int64())).to_pylist()
    keys = {text: record_key(text) for text in set(texts)}
    for row, text in zip(rows.tolist(), texts, strict=True):
        normalized[row] = keys[text] or normalized[row]
    table = pa.table({
        "group_id": pc.take(extractions["group_id"], parents),
        "episode_id": pc.take(extractions["episode_id"], parents),
        "valid_at": pc.take(extractions["valid_at"], parents),
        "name": names,
        "label": pc.struct_field(flat, "label"),
        "attributes": attributes,
        "normalized": pa.array(normalized, pa.string()),
    }, schema=MENTION_ROWS)
    return table.filter(pc.not_equal(table["normalized"], ""))


MENTION_ROWS = schema.ENTITY_MENTIONS


def resolve_entities(mentions: pa.Table, created_at: datetime, ids: bool = True
                     ) -> pa.Table:
    """Mentions -> one row per entity, vectorized (polars). Mentions mapped by the resolver
    carry `entity_id`, `root`, `evidence` and `score`; unmapped ones are grouped by
    normalized name (name nodes), whose `entity_id` is the id the name would have as an
    entity, null without `ids`. Each row keeps what merging it with later mentions needs
    (`schema.RESOLVED_ENTITIES`, `node_merge`). An entity is named
    by its most complete surface form (most words, then most frequent, then longest, then
    alphabetical), a name node's labels are the specific ones (generic ones only when there
    are none), an entity's its strongest (`strongest_labels`), later attributes win."""
    if mentions.num_rows == 0:
        return schema.RESOLVED_ENTITIES.empty_table()
    df = pl.from_arrow(mentions)
    mapped = "entity_id" in df.columns
    if not mapped:
        df = df.with_columns(root=pl.col("normalized"), evidence=pl.lit("exact"),
                             score=pl.lit(1.0), entity_id=pl.lit(None, pl.String))
    keys = ["group_id", "_key"]
    # in time, then by content: mentions of one episode tie in time, and which of their
    # normalized names and attributes come first must not depend on the order the rows
    # arrived in (the driver and Ray Data deliver them in different orders)
    df = df.with_columns(_key=pl.col("entity_id" if mapped else "normalized")).sort(
        [*keys, "valid_at", "episode_id", "normalized", "attributes"])
    base = df.group_by(keys, maintain_order=True).agg(
        entity_id=pl.col("entity_id").first(), normalized=pl.col("root").first(),
        first_seen=pl.col("valid_at").first(), last_seen=pl.col("valid_at").last(),
        mention_count=pl.col("episode_id").n_unique(),
    )
    # A record's key name (`Employee 2`) names an entity only when nothing else does.
    key_name = spelled_as_key()
    short = pl.col("evidence").is_in(NEVER_NAMES)  # Mel, T-17: never the entity's name
    # each surface name of an entity once, for its name and its aliases alike (one
    # grouping of the mentions, where two took 0.8 s at 1,000,000 mentions)
    per_name = df.group_by([*keys, "name"], maintain_order=True).agg(
        count=pl.len(), key_name=key_name.any(), short=short.any(),
        normalized=pl.col("normalized").first(),
        evidence=pl.col("evidence").first().fill_null("exact"),
        score=pl.col("score").first().fill_null(1.0))
    named = chosen_names(per_name, keys)
    labelled = df.filter(pl.col("label").is_not_null())
    if mapped:  # an entity: one label, its strongest
        counted = label_counts(labelled, keys)
        labelled = labelled.join(strongest_labels(counted, keys), on=[*keys, "label"])
    specific_label = ~pl.col("label").is_in(sorted(GENERIC_LABELS))
    labels = labelled.group_by(keys).agg(
        every=pl.col("label").unique().sort(),
        specific=pl.col("label").filter(specific_label).unique().sort())
    aliases = (per_name.sort([*keys, "name"]).group_by(keys, maintain_order=True)
               .agg(aliases=pl.col("name"), alias_normalized=pl.col("normalized"),
                    alias_evidence=pl.col("evidence"), alias_score=pl.col("score"),
                    alias_mentions=pl.col("count").cast(pl.Int64),
                    alias_key_name=pl.col("key_name"), alias_short=pl.col("short")))
    attributes: dict[tuple[str, str], dict] = {}
    for group_id, key, text in df.filter(pl.col("attributes").is_not_null()).select(
            [*keys, "attributes"]).iter_rows():
        attributes.setdefault((group_id, key), {}).update(json.loads(text))
    out = (base.join(named, on=keys, how="left").join(labels, on=keys, how="left")
           .join(aliases, on=keys, how="left").sort(keys))
    if mapped:
        out = with_label_lists(out, counted, keys)
    rows = out.select(["group_id", "_key", "normalized", "entity_id"]).rows()
    # "{}" without json.dumps for a name without attributes: 0.5 s of this function's 2.8 s
    # at 152,472 names
    table = out.with_columns(
        labels=pl.when(pl.col("specific").list.len() > 0).then(pl.col("specific"))
        .otherwise(pl.col("every")).fill_null([]),
        entity_id=pl.Series([entity or (schema.stable_id(group_id, "entity", root) if ids
                                        else None)
                             for group_id, _, root, entity in rows], dtype=pl.String),
        attributes=pl.Series([attributes_text(attributes[g, k]) if (g, k) in attributes
                              else "{}" for g, k, _, _ in rows], dtype=pl.String),
        summary=pl.lit(""),
    ).to_arrow()
    table = table.append_column("created_at", pa.array([created_at] * table.num_rows,
                                                       schema.TS))
    return schema.conform(table, schema.RESOLVED_ENTITIES)


def spelled_as_key() -> pl.Expr:
    """A mention spelled as its business record's key name (`Employee 2`)."""
    return (pl.col("attributes").cast(pl.String).str.json_path_match(f"$.{RECORD_ATTRIBUTE}")
            == pl.col("name"))


def chosen_names(per_name: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """(keys, name) of each key's name among its surface forms (`per_name`: keys, name,
    count, key_name, short): the most complete, then most frequent, then longest, then
    alphabetical; a record's key name or a short name only where nothing else is."""
    return (per_name.with_columns(words=pl.col("name").str.count_matches(r"\S+"),
                                  chars=pl.col("name").str.len_chars())
            .sort([*keys, "short", "key_name", "words", "count", "chars", "name"],
                  descending=[False] * len(keys) + [False, False, True, True, True, False])
            .group_by(keys, maintain_order=True).agg(name=pl.col("name").first()))


def label_counts(labelled: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """(keys, label, count, last) of each label of each key: its mentions and the latest."""
    return labelled.group_by([*keys, "label"]).agg(count=pl.len(),
                                                   last=pl.col("valid_at").max())


def with_label_lists(rows: pl.DataFrame, counted: pl.DataFrame, keys: list[str]
                     ) -> pl.DataFrame:
    """`rows` with each key's `label_counts` as the sorted lists an entity row keeps
    (`label_names`, `label_counts`, `label_last`; empty without labels)."""
    lists = counted.sort([*keys, "label"]).group_by(keys, maintain_order=True).agg(
        label_names=pl.col("label"), label_counts=pl.col("count").cast(pl.Int64),
        label_last=pl.col("last"))
    return rows.join(lists, on=keys, how="left").with_columns(
        pl.col(c).fill_null([]) for c in ("label_names", "label_counts", "label_last"))


def attributes_text(attributes: dict) -> str:
    """An entity's attributes as its row keeps them."""
    return json.dumps(attributes, ensure_ascii=False, sort_keys=True, default=str)


def strongest_labels(counted: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """(keys, label) of each entity's strongest label (`label_counts`): a specific label
    over a generic one, then the most mentions, then the latest (spaCy tags a company a
    place now and then, a name a person in one sentence and a place in the next). Name
    nodes keep every label: resolution lets two names merge on any shared one."""
    return (counted.with_columns(generic=pl.col("label").is_in(sorted(GENERIC_LABELS)))
            .sort([*keys, "generic", "count", "last", "label"],
                  descending=[False] * len(keys) + [False, True, True, False], nulls_last=True)
            .group_by(keys, maintain_order=True).agg(pl.col("label").first()))


def alias_rows(entities: pa.Table) -> pa.Table:
    """entity_aliases rows: every surface name that resolved to an entity, and why."""
    parents = pc.list_parent_indices(entities["aliases"])
    normalized = pc.list_flatten(entities["alias_normalized"])
    groups = pc.take(entities["group_id"], parents)
    return pa.table({
        "group_id": groups,
        "alias": pc.list_flatten(entities["aliases"]),
        "normalized": normalized,
        "entity_id": pc.take(entities["entity_id"], parents),
        "merged_entity_id": pa.array(
            [schema.stable_id(g, "entity", n) for g, n in
             zip(groups.to_pylist(), normalized.to_pylist(), strict=True)], pa.string()),
        "evidence": pc.list_flatten(entities["alias_evidence"]),
        "score": pc.list_flatten(entities["alias_score"]),
        "created_at": pc.take(entities["created_at"], parents),
    })


def episode_mentions(mentions: pa.Table) -> pa.Table:
    """Distinct (episode, entity) edges of the episodic subgraph (from mapped mentions), in
    the order they first occur (polars: Arrow's group-by took 1.0 s of a night's resolve
    for the 736,000 mentions of the 160,000-episode store, polars 0.2 s)."""
    table = mentions.select(["episode_id", "entity_id", "group_id"])
    return pl.from_arrow(table).unique(maintain_order=True).to_arrow().cast(table.schema)


def node_pairs(nodes: pa.Table) -> pa.Table:
    """Every name node as a self-pair, so clustering sees unpaired names too; `score`
    carries its mention count (the tie-break for naming a cluster), 0 for a record's key
    name, which names its cluster only when nothing else does."""
    keyed = pa.array(_is_key_name(nodes), pa.bool_())
    return pa.table({
        "group_id": nodes["group_id"], "a": nodes["normalized"], "b": nodes["normalized"],
        "evidence": pa.array(["node"] * nodes.num_rows, pa.string()),
        "score": pc.if_else(keyed, 0.0, pc.cast(nodes["mention_count"], pa.float64())),
        "merge": pa.array([False] * nodes.num_rows, pa.bool_()),
    }, schema=PAIRS)


def record_key(attributes: str | None) -> str | None:
    """The normalized key name of the business record a name stands for (its
    RECORD_ATTRIBUTE, pipeline/extract/records.py: `employee 2`), None for other names."""
    if not attributes or f'"{RECORD_ATTRIBUTE}"' not in attributes:
        return None
    value = json.loads(attributes).get(RECORD_ATTRIBUTE)
    return normalize_name(value) if isinstance(value, str) and value.strip() else None


def _attributes(nodes: pa.Table) -> list[str | None]:
    if "attributes" not in nodes.column_names:  # names alone (tests, benchmarks)
        return [None] * nodes.num_rows
    return nodes["attributes"].to_pylist()


def _is_key_name(nodes: pa.Table) -> list[bool]:
    """Whether each node is a record's key name (`Employee 2`), not a name of its own."""
    return [record_key(attributes) == normalized for attributes, normalized in zip(
        _attributes(nodes), nodes["normalized"].to_pylist(), strict=True)]


# --- cross-name resolution: blocking keys, pair decisions, union-find -----------------------

PERSONISH = {"Person", "Speaker", "Contact", "AccountOwner", "SalesRep", "Assignee", "Owner",
             "Manager", "Author"}
_DIGITS = re.compile(r"\d+")
QUANT = 127.0  # name vectors as int8 for embedding-neighbour cosines (error < 0.01)
COSINE_CHUNK = 4_096  # pairs a cosine step holds (`_cosines`): 4,096 x 384 float32, 6 MB
SIMHASH_CHUNK = 4_096  # rows a SimHash step multiplies (`simhash_codes`): 4,096 x 384 float64
KEYED_NAMES = pa.schema([
    ("group_id", pa.string()), ("key", pa.string()), ("normalized", pa.string()),
    ("core", pa.string()), ("cls", pa.string()), ("specific", pa.list_(pa.string())),
    ("digits", pa.string()),
    ("mentions", pa.int64()), ("lone", pa.bool_()),
    ("personish", pa.bool_()), ("role", pa.string()), ("part", pa.string()),
    ("first_seen", schema.TS), ("last_seen", schema.TS),
])
# A name's int8 vector (`name_vectors`), joined onto its embedding-neighbour pairs
# (`near_decisions`), not carried through the shuffle by block under each of its bands.
NAME_VECTORS = pa.schema([("group_id", pa.string()), ("normalized", pa.string()),
                          ("vector", pa.list_(pa.int8()))])
PAIRS = schema.RESOLUTION_PAIRS


def core_name(normalized: str, config: ResolveConfig) -> str:
    """The name without legal forms and honorifics, abbreviations spelled out:
    "initech inc" -> "initech", "dr. sofia costa" -> "sofia costa", "mt. kea" -> "mount kea"."""
    tokens = normalized.replace(",", " ").split()
    while len(tokens) > 1 and _legal_suffix(tokens[-1].strip("."), config.legal_suffixes):
        tokens.pop()
    while len(tokens) > 1 and tokens[0].strip(".") in config.honorifics:
        tokens.pop(0)
    if len(tokens) > 1 and tokens[0].strip(".") in config.leading_abbreviations:
        tokens[0] = config.leading_abbreviations[tokens[0].strip(".")]
    return " ".join(config.abbreviations.get(t.strip("."), t) for t in tokens)


@lru_cache(maxsize=64)
def _misspelt_suffixes(suffixes: tuple[str, ...]) -> frozenset[str]:
    """Long legal forms and their one-letter deletions ("incorporaetd" is still one)."""
    keys = set()
    for suffix in suffixes:
        if len(suffix) >= 7:
            keys.add(suffix)
            keys.update(suffix[:i] + suffix[i + 1:] for i in range(len(suffix)))
    return frozenset(keys)


@lru_cache(maxsize=2**16)  # tokens repeat (given names, legal forms): 0.3 s of 5.8 at 61,046 names
def _legal_suffix(token: str, suffixes: tuple[str, ...]) -> bool:
    if token in suffixes:
        return True
    if len(token) < 6:
        return False
    misspelt = _misspelt_suffixes(suffixes)
    return token in misspelt or any(token[:i] + token[i + 1:] in misspelt
                                    for i in range(len(token)))


def order_free(core: str) -> str:
    """Tokens sorted: "okafor daniel" and "daniel okafor" are one key."""
    return " ".join(sorted(core.split()))


def deletion_keys(text: str, min_chars: int) -> list[str]:
    """`text` with each one letter deleted (symmetric-deletion blocking): two strings within
    one substitution, insertion, deletion or transposition share at least one of these."""
    keys = spelling_keys(pl.Series([text], dtype=pl.String), min_chars)["key"].to_list()
    return sorted(key[2:] for key in keys if key[2:] != text)


def spelling_keys(cores: pl.Series, min_chars: int) -> pl.DataFrame:
    """(row, `d:` key) of each text of `cores` of at least `min_chars` characters: the text
    itself and each of its `deletion_keys`, once (vectorized: a Python loop over each
    name's deletions took 1.0 s of 12.0 s of blocking keys, profiled at 122,169 names)."""
    texts = pl.DataFrame({"core": cores}).with_row_index("row").with_columns(
        chars=pl.col("core").str.len_chars()).filter(pl.col("chars") >= min_chars)
    at = pl.col("at")
    deleted = (texts.with_columns(at=pl.int_ranges(0, pl.col("chars"))).explode("at")
               .filter(pl.col("core").str.slice(at, 1) != " ")
               .select("row", key=pl.col("core").str.slice(0, at)
                       + pl.col("core").str.slice(at + 1)))
    return pl.concat([texts.select("row", key="core"), deleted]).unique(
        maintain_order=True).select(pl.col("row").cast(pl.Int64), key="d:" + pl.col("key"))


def simhash_codes(vectors: np.ndarray, bands: int, bits: int, chunk: int = SIMHASH_CHUNK
                  ) -> np.ndarray:
    """Random-hyperplane LSH: one integer per band; close vectors share a band's code.
    In chunks of `chunk` rows: each row's products are those of the whole matrix (the
    codes of 611,317 names equal), without its float64 copy and products at once
    (3.2 -> 1.3 s of CPU at 1,000,000 mentions)."""
    planes = np.random.default_rng(4321).standard_normal((vectors.shape[1], bands * bits))
    weights = 1 << np.arange(bits, dtype=np.int64)
    codes = np.empty((len(vectors), bands), np.int64)
    for start in range(0, len(vectors), chunk):
        rows = vectors[start:start + chunk]
        signs = (rows @ planes > 0).reshape(len(rows), bands, bits)
        codes[start:start + chunk] = (signs * weights).sum(axis=2)
    return codes


# A consonant skeleton of a word, so that given names spelt differently but said alike
# (Steven, Stephen; Catherine, Katherine; Jon, John) share a block; a similarity threshold
# (`given_name_similarity`) then keeps apart the ones that only sound alike (Tim, Tom).
_SOUNDS = ((re.compile("ph"), "f"), (re.compile("ck"), "k"), (re.compile("c(?=[eiy])"), "s"),
           (re.compile("[cq]"), "k"), (re.compile("x"), "ks"), (re.compile("z"), "s"),
           (re.compile("v"), "f"), (re.compile("dg"), "j"))
_NOT_LETTER = re.compile("[^a-z]")
_QUIET = re.compile("[aeiouyhw]")
_REPEATS = re.compile(r"(.)\1+")


@lru_cache(maxsize=2**16)  # parts repeat (given names): 2.0 s of 5.8 s at 61,046 names
def sound_key(text: str) -> str:
    """Each word's first letter and its later consonants, alike spellings spelt alike
    ("stephen", "steven" -> "stfn"); a text with a digit is its own key ("t-23")."""
    if _DIGITS.search(text):
        return f"={text}"
    return " ".join(_word_sound(word) for word in text.split())


@lru_cache(maxsize=2**18)  # words repeat (given names, surnames) where whole names do not
def _word_sound(word: str) -> str:
    plain = _NOT_LETTER.sub("", unicodedata.normalize("NFKD", word).encode(
        "ascii", "ignore").decode().lower())
    if not plain:  # a script without Latin letters: the word itself
        return word
    for pattern, sound in _SOUNDS:
        plain = pattern.sub(sound, plain)
    return plain[0] + _REPEATS.sub(r"\1", _QUIET.sub("", plain[1:]))


def name_parts(core: str, name: str, personish: bool, config: ResolveConfig
               ) -> list[tuple[str, str, str]]:
    """(key, role, part) of a name under the short-name rules. `s:` keys hold, by the
    sound of the part, a name that may be a short one ("self": up to three words, a proper
    name or a code) and the parts a full name can be called by: a person's first and last
    name, an organisation's name without its generic heads ("short_form": Fordham of
    Fordham University), the code after a type word ("code": T-23 of Ticket T-23). `n:`
    keys hold a person's given name under its first `nickname_chars` letters, both as the
    name a nickname may stand for ("given") and, for a lone name, as a nickname ("self")."""
    tokens = core.split()
    if not config.short_names or not tokens:
        return []
    parts = []
    if len(tokens) <= 3 and (name[:1].isupper() or _DIGITS.search(core)):
        parts.append(("self", core))
    if personish and len(tokens) > 1:
        parts += [("first", tokens[0]), ("last", tokens[-1])]
    headless = list(tokens)
    while not personish and len(headless) > 1 and headless[-1] in config.generic_heads:
        headless.pop()
    if len(headless) < len(tokens):
        parts.append(("short_form", " ".join(headless)))
    if len(tokens) > 1 and _DIGITS.search(tokens[-1]) and not _DIGITS.search(
            " ".join(tokens[:-1])):
        parts.append(("code", tokens[-1]))
    keys = [(f"s:{sound_key(part)}", role, part) for role, part in parts]
    given = tokens[0]
    if (config.nickname_chars and personish and given.isalpha()
            and len(given) >= config.nickname_chars):
        block = f"n:{given[:config.nickname_chars]}"
        keys += [(block, "self", given)] if len(tokens) == 1 else []
        keys.append((block, "given", given))
    return keys


@lru_cache(maxsize=4096)
def _label_features(labels: tuple[str, ...]) -> tuple[bool, str, list[str]]:
    """(personish, `label_class`, specific labels sorted) of a name's labels."""
    return (bool(set(labels) & PERSONISH), label_class(list(labels)),
            sorted(set(labels) - GENERIC_LABELS))


def label_class(labels: list[str] | None) -> str:
    """What decides compatibility: places (L), other named things (N), or generic (""):
    names of two classes merge only when they share a specific label (a company that
    spaCy also tagged as a place still meets its own name)."""
    specific = set(labels or ()) - GENERIC_LABELS
    return "L" if "Location" in specific else ("N" if specific else "")


def _cores(nodes: pa.Table, config: ResolveConfig) -> tuple[list[str], list[str]]:
    """(the normalized name its keys are made of, its `core_name`) of each node: a business
    record's node (its key name, `mention_rows`) has the keys of its name (`Nancy Edwards`)."""
    normals, cores = [], []
    for normalized, name, attributes in zip(nodes["normalized"].to_pylist(),
                                            nodes["name"].to_pylist(), _attributes(nodes),
                                            strict=True):
        if record_key(attributes) == normalized:  # a record: its name meets other names
            normalized = normalize_name(name)
        normals.append(normalized)
        cores.append(core_name(normalized, config))
    return normals, cores


def _named(nodes: pa.Table, config: ResolveConfig) -> tuple[pa.Table, pa.Table]:
    """(each node's `KEYED_NAMES` columns but key, role and part; its `name_parts` as
    (row, key, role, part)). One pass over the names with a list per column (a dict of
    lists filled through `zip` per value was 2.9 s of this function's 9.7 at 200,000
    names, cProfile)."""
    normals, cores = _cores(nodes, config)
    core_keys, classes, specifics, digits, lones, persons = [], [], [], [], [], []
    part_rows, keys, roles, texts = [], [], [], []
    for row, (normalized, core, name, node_labels) in enumerate(zip(
            normals, cores, nodes["name"].to_pylist(), nodes["labels"].to_pylist(),
            strict=True)):
        personish, cls, specific = _label_features(tuple(node_labels or ()))
        for key, role, part in name_parts(core, name, personish, config):
            part_rows.append(row)
            keys.append(key)
            roles.append(role)
            texts.append(part)
        core_keys.append(order_free(core))
        classes.append(cls)
        specifics.append(specific)
        digits.append(" ".join(_DIGITS.findall(normalized)))
        lones.append(len(core.split()) == 1 and name[:1].isupper())
        persons.append(personish)
    table = nodes.select(["group_id", "normalized"]).append_column(
        "mentions", pc.cast(nodes["mention_count"], pa.int64()))
    for column, values in (("core", core_keys), ("cls", classes), ("specific", specifics),
                           ("digits", digits), ("lone", lones), ("personish", persons)):
        table = table.append_column(column, pa.array(values, KEYED_NAMES.field(column).type))
    for column in ("first_seen", "last_seen"):  # a nickname's evidence (`_nicknames`)
        table = table.append_column(column, nodes[column].cast(schema.TS)
                                    if column in nodes.column_names
                                    else pa.nulls(nodes.num_rows, schema.TS))
    return table, pa.table({"row": pa.array(part_rows, pa.int64()),
                            **{c: pa.array(v, pa.string()) for c, v in (
                                ("key", keys), ("role", roles), ("part", texts))}})


def _with_parts(table: pa.Table, parts: pa.Table) -> pa.Table:
    """The rows of `table` under their `name_parts` keys (`s:`, `n:`), with role and part."""
    keyed = table.take(parts["row"])
    for column in ("key", "role", "part"):
        keyed = keyed.append_column(column, parts[column])
    return keyed


def _spelled(table: pa.Table, ordered: list[str], config: ResolveConfig) -> list[pa.Table]:
    """The `c:` and `d:` rows of `table`'s names (`ordered`: their order-free cores)."""
    keyed = [table.append_column("key", pa.array(["c:" + core for core in ordered],
                                                 pa.string()))]
    # the name itself meets its variants' deletions
    spelling = spelling_keys(pl.Series(ordered, dtype=pl.String), config.min_typo_chars)
    if spelling.height:
        keyed.append(table.take(spelling["row"].to_arrow()).append_column(
            "key", spelling["key"].to_arrow()))
    return keyed


def blocking_keys(nodes: pa.Table, config: ResolveConfig, vectors: bool = True) -> pa.Table:
    """Each name node under every blocking key it has; names meet only under a shared key:
    `c:` the order-free core name (legal forms, honorifics, abbreviations, word order),
    `d:` the core and its one-letter deletions (spelling variants), `s:` and `n:` a short
    name and the full names it can stand for (`name_parts`), `e<band>:` SimHash bands of the
    name vector. A business record's node (its key name, `mention_rows`) has these keys of
    its name (`Nancy Edwards`). With `vectors`, each band row carries its name's int8 vector
    (`name_vectors`), so that `candidate_pairs` decides embedding neighbours in one table.
    The stage splits the same rows (`name_rows`, and `name_keys` of those)."""
    table, parts = _named(nodes, config)
    spelled = _spelled(table, table["core"].to_pylist(), config)
    keyed = [spelled[0], _with_parts(table, parts), *spelled[1:]]
    embedded, band_keys = _bands(nodes, config)
    if len(band_keys):
        keyed.append(table.take(pa.array(embedded)).append_column("key", band_keys))
    out = pa.concat_tables([schema.conform(part, KEYED_NAMES) for part in keyed])
    if not vectors:
        return out
    carried = pa.nulls(out.num_rows - len(band_keys), pa.list_(pa.int8()))
    if len(band_keys):  # the band rows come last, in `name_vectors`' order, bands together
        bands = config.simhash_bands
        own = name_vectors(nodes)["vector"].take(pa.array(
            np.repeat(np.arange(len(band_keys) // bands), bands)))
        carried = pa.concat_arrays([carried, own.combine_chunks()])
    return out.append_column("vector", carried)


# The stage's shuffle by block carries only (group, key, name, mentions) of the `c:`, `d:`
# and `e` keys (`name_keys`): 88 % of the key rows, which carried every feature a pair
# decision reads through it. What a decision reads of a name (`name_rows`: its features and
# vector, and its `s:` and `n:` rows, decided whole within a group) meets the pairs the blocks
# find in a shuffle by group (`decide_in_groups`).
KEY_ROWS = pa.schema([("group_id", pa.string()), ("key", pa.string()),
                      ("normalized", pa.string()), ("mentions", pa.int64())])
NAME_PAIRS = pa.schema([("group_id", pa.string()), ("kind", pa.string()),
                        ("normalized", pa.string()), ("normalized_b", pa.string())])


def name_keys(rows: pa.Table, config: ResolveConfig, bands: bool = True) -> pa.Table:
    """`KEY_ROWS` of each name under its `c:`, `d:` and (with `bands`) `e` keys, the keys
    `blocking_keys` gives its node, made from its "name" row of `name_rows` (with band
    codes): its order-free core and its codes, so that a name's core is found once (the
    160,000-episode night found every name's twice, 0.34 s each time). A full run leaves the
    `e` keys out: each name's band codes go to the shuffle by group, where
    `decide_in_groups` finds the names that share one."""
    names = rows.filter(pc.equal(rows["tag"], "name"))
    table = names.select(["group_id", "normalized", "mentions"])
    keyed = _spelled(table, names["core"].to_pylist(), config)
    if bands and names.num_rows:
        codes = names["bands"].combine_chunks()
        width = max(config.simhash_bands, 0)
        present = pc.list_parent_indices(codes).to_numpy()
        flat = pc.list_flatten(codes).to_numpy()
        band_keys = [f"e{band}:{code}" for band, code in
                     zip(np.tile(np.arange(width), len(flat) // width if width else 0), flat,
                         strict=True)]
        keyed.append(table.take(pa.array(present, pa.int64())).append_column(
            "key", pa.array(band_keys, pa.string())))
    return pa.concat_tables([schema.conform(part, KEY_ROWS) for part in keyed])


def without_bands(rows: pa.Table) -> pa.Table:
    """`name_rows`' rows without their band codes (a later run's: its bands are keys)."""
    at = rows.schema.get_field_index("bands")
    return rows.set_column(at, "bands", pa.nulls(rows.num_rows, rows.schema.field(at).type))


def name_rows(nodes: pa.Table, config: ResolveConfig, bands: bool = False) -> pa.Table:
    """`DECIDING` rows of each node: "name" (its `PAIR_FEATURES`, mentions, int8 vector
    and, with `bands`, its SimHash band codes; null without a vector) and "short" (its `s:`
    and `n:` rows, `blocking_keys`)."""
    table, parts = _named(nodes, config)
    embedded = _embedded(nodes)  # once for both
    named = table.select(["group_id", "normalized", "mentions", *PAIR_FEATURES]
                         ).append_column("vector", _node_vectors(nodes, embedded))
    if bands:
        named = named.append_column("bands", _node_codes(nodes, config, embedded))
    return pa.concat_tables([deciding(named, "name"),
                             deciding(_with_parts(table, parts), "short")])


def _embedded(nodes: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(indexes of the nodes with a name vector, their vectors as one float32 matrix)."""
    if "name_embedding" not in nodes.column_names or nodes.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
    column = nodes["name_embedding"]
    present = np.flatnonzero(pc.is_valid(column).to_numpy(zero_copy_only=False))
    if not len(present):
        return present, np.zeros((0, 0), np.float32)
    # every node embedded (a full run): no copy of the lists first (2.2 s of CPU a call at
    # 611,317 names)
    embedded = column if len(present) == nodes.num_rows else column.take(pa.array(present))
    return present, np.asarray(pc.list_flatten(embedded).to_numpy(),
                               dtype=np.float32).reshape(len(present), -1)


def _bands(nodes: pa.Table, config: ResolveConfig) -> tuple[np.ndarray, pa.Array]:
    """(node index, `e<band>:<code>` key) of each SimHash band of each embedded name, a
    name's bands together."""
    present, matrix = _embedded(nodes)
    bands = config.simhash_bands
    if bands <= 0 or not len(present):
        return np.zeros(0, np.int64), pa.array([], pa.string())
    codes = simhash_codes(matrix, bands, config.simhash_bits)
    keys = [f"e{band}:{code}" for band, code in
            zip(np.tile(np.arange(bands), len(present)), codes.ravel(), strict=True)]
    return np.repeat(present, bands), pa.array(keys, pa.string())


def name_vectors(nodes: pa.Table) -> pa.Table:
    """Each embedded name's vector as int8 (`QUANT`): what an embedding-neighbour pair
    reads of its names (`near_decisions`)."""
    present, matrix = _embedded(nodes)
    quantized = _quantized(matrix)
    flat = pa.array(quantized.ravel(), pa.int8())
    offsets = pa.array(np.arange(len(present) + 1, dtype=np.int32) * quantized.shape[1])
    index = pa.array(present, pa.int64())
    return pa.table({"group_id": nodes["group_id"].take(index),
                     "normalized": nodes["normalized"].take(index),
                     "vector": pa.ListArray.from_arrays(offsets, flat)}, schema=NAME_VECTORS)


def _quantized(matrix: np.ndarray) -> np.ndarray:
    scaled = matrix * QUANT  # one float copy, rounded and clipped in place
    np.rint(scaled, out=scaled)
    return np.clip(scaled, -127, 127, out=scaled).astype(np.int8)


def _node_vectors(nodes: pa.Table, embedded: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> pa.Array:
    """Each node's vector as int8 (`name_vectors`), null for a node without one
    (`embedded`: `_embedded(nodes)`, when already at hand)."""
    present, matrix = embedded or _embedded(nodes)
    quantized = _quantized(matrix)
    lengths = np.zeros(nodes.num_rows, np.int64)
    lengths[present] = quantized.shape[1]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    absent = np.ones(nodes.num_rows, dtype=bool)
    absent[present] = False
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(quantized.ravel(), pa.int8()),
                                    mask=pa.array(absent))


def _node_codes(nodes: pa.Table, config: ResolveConfig,
                embedded: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Array:
    """Each node's SimHash band codes (`simhash_codes`, the codes of its `e` keys), null for
    a node without a vector (`embedded` as in `_node_vectors`)."""
    present, matrix = embedded or _embedded(nodes)
    bands = max(config.simhash_bands, 0)
    codes = (simhash_codes(matrix, bands, config.simhash_bits) if bands and len(present)
             else np.zeros((len(present), bands), np.int64))
    lengths = np.zeros(nodes.num_rows, np.int64)
    lengths[present] = bands
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    absent = np.ones(nodes.num_rows, dtype=bool)
    absent[present] = False
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(codes.ravel(), pa.int64()),
                                    mask=pa.array(absent))


PAIR_FEATURES = ("core", "cls", "specific", "digits")  # what a pair decision reads of a name


def _ranked(keyed: pl.DataFrame, config: ResolveConfig, ordered: bool = True
            ) -> pl.DataFrame:
    """The key rows of blocks of two names or more, with their `kind` (the key's first
    letter); a block of over `max_block` names cut to its most mentioned, so one common
    key never costs quadratic time. In block order, or (not `ordered`) only the blocks
    that are cut sorted: at 1,000,000 mentions none was, and the sort of every row took
    2.4 s of a group's 3.4 s of `pair_ids`."""
    block = ["group_id", "key"]
    sized = (keyed.with_columns(kind=pl.col("key").str.slice(0, 1))
             .with_columns(size=pl.len().over(block)).filter(pl.col("size") > 1))
    cut = pl.col("size") > config.max_block
    if not ordered:
        return pl.concat([sized.filter(~cut), _ranked(sized.filter(cut).drop("kind", "size"),
                                                      config).drop("rank")])
    return (sized.sort([*block, "mentions", "normalized"], descending=[False, False, True, False])
            .with_columns(rank=pl.int_range(pl.len()).over(block))
            .filter(pl.col("rank") < config.max_block))


def _name_pairs(ranked: pl.DataFrame) -> pl.DataFrame:
    """`NAME_PAIRS`: each pair of names (normalized < normalized_b) that share a `c:`, `d:`
    or `e` block of `ranked`, once per kind of key (blocks are joined on names alone)."""
    block = ["group_id", "key"]
    keys = ranked.filter(pl.col("kind").is_in(["c", "d", "e"])).select(
        *block, "kind", "normalized")
    return (keys.join(keys.drop("kind"), on=block, suffix="_b")
            .filter(pl.col("normalized") < pl.col("normalized_b"))
            .select("group_id", "kind", "normalized", "normalized_b")
            .unique(maintain_order=True))


def _with_features(pairs: pl.DataFrame, features: pl.DataFrame) -> pl.DataFrame:
    """`pairs` (group_id, normalized, normalized_b) with both names' `PAIR_FEATURES` (one
    row of `features` per name), attached once per pair."""
    other = features.rename({"normalized": "normalized_b",
                             **{f: f"{f}_b" for f in PAIR_FEATURES}})
    return (pairs.join(features, on=["group_id", "normalized"])
            .join(other, on=["group_id", "normalized_b"]))


def _features(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.select("group_id", "normalized", *PAIR_FEATURES).unique(
        ["group_id", "normalized"], keep="first", maintain_order=True)


def near_decisions(pairs: pa.Table, vectors: pa.Table, config: ResolveConfig,
                   chunk: int = COSINE_CHUNK) -> pa.Table:
    """Embedding neighbours decided (PAIRS): `pairs` are `candidate_pairs`' pending ones
    (score null, `merge` whether both names are named things), `vectors` their names'
    (`NAME_VECTORS`). A pair's score is its cosine; it merges at `embedding_merge` and is
    kept for an adjudicator from `embedding_ambiguous`. Products of int8 values sum exactly
    in float32 (at most 127^2 x dim < 2^24), so the cosine does not depend on the order."""
    if pairs.num_rows == 0 or vectors.num_rows == 0:
        return PAIRS.empty_table()
    decided = _near(pl.from_arrow(pairs), vectors, config, chunk).with_columns(
        score=pl.col("cosine").round(4),
        merge=pl.col("merge") & (pl.col("cosine") >= config.embedding_merge))
    return schema.conform(decided.drop("cosine").to_arrow(), PAIRS)


def _near(pairs: pl.DataFrame, vectors: pa.Table, config: ResolveConfig,
          chunk: int = COSINE_CHUNK) -> pl.DataFrame:
    """`pairs` (group_id, a, b) of names with a vector whose cosine reaches
    `embedding_ambiguous`, with it (`cosine`)."""
    index = pl.from_arrow(vectors.select(["group_id", "normalized"])).with_row_index("row")
    matrix = np.asarray(pc.list_flatten(vectors["vector"]).to_numpy(zero_copy_only=False),
                        dtype=np.int8).reshape(vectors.num_rows, -1)
    found = (pairs.join(index.rename({"normalized": "a"}), on=["group_id", "a"])
             .join(index.rename({"normalized": "b", "row": "row_b"}), on=["group_id", "b"]))
    cosine = _cosines(matrix, found["row"].to_numpy(), found["row_b"].to_numpy(), chunk)
    return found.drop("row", "row_b").with_columns(
        cosine=pl.Series(cosine, dtype=pl.Float64)).filter(
        pl.col("cosine") >= config.embedding_ambiguous)


def _cosines(matrix: np.ndarray, a: np.ndarray, b: np.ndarray, chunk: int = COSINE_CHUNK
             ) -> np.ndarray:
    """The cosine of each pair of rows (`a`, `b`) of the int8 `matrix` (`QUANT`), in chunks
    of `chunk` pairs. Exact: every partial sum of int8 products is an integer of at most
    127^2 x dim, which float32 holds up to 2^24 (1,040 dimensions; float64 past them), in
    any order. The rows of a chunk in float, multiplied and summed by einsum: 0.5-0.6 s for
    1.2 M pairs of 384 dimensions, where int16 products summed in int64 took 1.0-1.1 s."""
    dots = np.empty(len(a), np.int64)
    exact = np.float32 if QUANT**2 * matrix.shape[1] < 2**24 else np.float64
    for start in range(0, len(a), chunk):
        end = start + chunk
        rows = np.take(matrix, a[start:end], axis=0).astype(exact)
        rows_b = np.take(matrix, b[start:end], axis=0).astype(exact)
        dots[start:end] = np.einsum("ij,ij->i", rows, rows_b)
    return dots / QUANT**2


NEAR = {"group_id": pl.String, "kind": pl.String, "a": pl.String, "b": pl.String,
        "cosine": pl.Float64}


def _band_neighbours(names: pa.Table, config: ResolveConfig, chunk: int = COSINE_CHUNK
                     ) -> pl.DataFrame:
    """`_near` of the pairs of `names` (`NAME_ROWS`) that share a SimHash band code (their
    `e` blocks, cut at `max_block` as `_ranked` cuts them: most mentioned first), kind "e":
    the pairs `pair_ids` finds under `e` keys, found here from each name's codes by row
    number. At 1,000,000 mentions a group of 152,472 names shares 1.2 M band pairs by chance,
    66 of them near: shuffled by block and again by group they were 83 % of the 8.9 M pair
    rows, and half the resolve stage's 81 s."""
    carried = names.filter(pc.is_valid(names["bands"]))
    width = config.simhash_bands
    if carried.num_rows == 0 or width <= 0:
        return pl.DataFrame(schema=NEAR)
    # each name once, in (group, name) order, so that rank < rank_b is normalized <
    # normalized_b and names of one group share `group`: a group's names can arrive twice
    # (the sample corpus after a forget: by row number "hooli" then paired with itself at
    # 1.0093, a pair the `e` keys never gave)
    ordered = (pl.from_arrow(carried.select(["group_id", "normalized"])).with_row_index("row")
               .unique(["group_id", "normalized"], keep="first")
               .sort(["group_id", "normalized"]))
    order = ordered["row"].to_numpy()  # rank -> row of `carried`
    count = len(order)
    group = ordered["group_id"].rle_id().to_numpy()
    picked = pa.array(order)
    block = ["group", "band", "code"]
    keys = pl.DataFrame({
        "group": np.repeat(group, width),
        "band": np.tile(np.arange(width), count),
        "code": pc.list_flatten(carried["bands"].take(picked)).to_numpy(),
        "row": np.repeat(np.arange(count), width),
        "mentions": np.repeat(carried["mentions"].take(picked).to_numpy(), width),
    }).with_columns(size=pl.len().over(block)).filter(pl.col("size") > 1)
    cut = pl.col("size") > config.max_block
    keys = pl.concat([keys.filter(~cut), keys.filter(cut).sort(
        [*block, "mentions", "row"], descending=[False, False, False, True, False]).filter(
        pl.int_range(pl.len()).over(block) < config.max_block)]).select(*block, "row")
    pairs = keys.join(keys.rename({"row": "row_b"}), on=block).filter(
        pl.col("row") < pl.col("row_b")).select("row", "row_b").unique()
    matrix = np.asarray(pc.list_flatten(carried["vector"]).to_numpy(zero_copy_only=False),
                        dtype=np.int8).reshape(carried.num_rows, -1)
    a, b = order[pairs["row"].to_numpy()], order[pairs["row_b"].to_numpy()]
    cosine = _cosines(matrix, a, b, chunk)
    near = cosine >= config.embedding_ambiguous
    a, b = pa.array(a[near]), pa.array(b[near])
    return pl.DataFrame({
        "group_id": pl.from_arrow(carried["group_id"].take(a)),
        "kind": pl.repeat("e", len(a), dtype=pl.String, eager=True),
        "a": pl.from_arrow(carried["normalized"].take(a)),
        "b": pl.from_arrow(carried["normalized"].take(b)),
        "cosine": cosine[near]}, schema=NEAR)


def pending(pairs: pa.Table, waiting: bool) -> pa.Table:
    """`candidate_pairs`' embedding neighbours still without a cosine (`waiting`), or the
    decided rest."""
    unknown = pc.is_null(pairs["score"])
    return pairs.filter(unknown if waiting else pc.invert(unknown))


# The stage's shuffle by group: the pairs the blocks found ("pair", `NAME_PAIRS`), each name's
# features and vector ("name") and the names' `s:` and `n:` rows ("short", `KEYED_NAMES`).
DECIDING = pa.schema([("tag", pa.string()), *KEYED_NAMES, ("kind", pa.string()),
                      ("normalized_b", pa.string()), ("vector", pa.list_(pa.int8())),
                      ("bands", pa.list_(pa.int64()))])
NAME_ROWS = pa.schema([("group_id", pa.string()), ("normalized", pa.string()),
                       ("mentions", pa.int64()),
                       *(KEYED_NAMES.field(f) for f in PAIR_FEATURES),
                       ("vector", pa.list_(pa.int8())), ("bands", pa.list_(pa.int64()))])


def deciding(table: pa.Table, tag: str) -> pa.Table:
    """`table`'s rows as `DECIDING` rows marked `tag` (rows marked already keep theirs)."""
    rows = schema.conform(table, DECIDING)
    return rows.set_column(0, "tag", pc.fill_null(rows["tag"], tag))


def pair_ids(keyed: pa.Table, config: ResolveConfig) -> pa.Table:
    """`NAME_PAIRS` of the blocks in `KEY_ROWS` (shuffled by block), undecided."""
    if keyed.num_rows == 0:
        return NAME_PAIRS.empty_table()
    return _name_pairs(_ranked(pl.from_arrow(keyed), config, ordered=False)
                       ).to_arrow().cast(NAME_PAIRS)


def spelled_pairs(names: pa.Table, config: ResolveConfig) -> pl.DataFrame:
    """`NAME_PAIRS` of the `c:` and `d:` blocks of `names` (`NAME_ROWS` of whole groups):
    what `pair_ids` finds of their `name_keys` without bands, each name under its
    order-free core (`core`) and its deletions, as often as it arrives."""
    table = names.select(["group_id", "normalized", "mentions"])
    keyed = [schema.conform(part, KEY_ROWS)
             for part in _spelled(table, names["core"].to_pylist(), config)]
    return pl.from_arrow(pair_ids(pa.concat_tables(keyed), config))


def decide_in_groups(rows: pa.Table, config: ResolveConfig, blocks: bool = False
                     ) -> pa.Table:
    """The `DECIDING` rows of whole groups decided as `candidate_pairs` decides one table:
    the pairs by their names' features, embedding neighbours by their vectors
    (`near_decisions`), short names in their `s:` and `n:` blocks; each pair once (blocks of
    one group meet in different partitions, and a pair two keys found would be published
    twice: the forget test's rebuilt store had 2 more rows). The `c:` and `d:` pairs come
    from "pair" rows (a later run's shuffle by block) or, with `blocks`, from the names'
    own keys here (`spelled_pairs`, a full run: every block of a group is in its rows)."""
    def part(tag: str, table_schema: pa.Schema) -> pa.Table:
        return schema.conform(rows.filter(pc.equal(rows["tag"], tag)), table_schema)

    names = part("name", NAME_ROWS)
    vectors = names.filter(pc.is_valid(names["vector"])).select(list(NAME_VECTORS.names))
    found = pl.from_arrow(part("pair", NAME_PAIRS))
    if blocks:
        found = pl.concat([found, spelled_pairs(names, config)])
    found = found.unique()
    # an embedding neighbour is decided only from `embedding_ambiguous` on: at 1,000,000
    # mentions 1,235,095 band pairs of a group of 152,472 names, 66 of them; the others
    # dropped first, before their features (the same pairs: `near_decisions` keeps them).
    # The band pairs come from the names' codes (a full run) or from `e` keys (a later run).
    band = pl.col("kind") == "e"
    near = found.filter(band).rename({"normalized": "a", "normalized_b": "b"})
    near = (_near(near, vectors, config) if vectors.num_rows and near.height
            else pl.DataFrame(schema=NEAR))
    near = pl.concat([near, _band_neighbours(names, config)]).unique(
        ["group_id", "kind", "a", "b"])
    found = pl.concat([found.filter(~band), near.select(
        "group_id", "kind", normalized="a", normalized_b="b")])
    short = _ranked(pl.from_arrow(part("short", KEYED_NAMES)), config)
    pairs = _decided(_with_features(found, _features(pl.from_arrow(
        names.drop_columns(["vector"])))), _shorts(short, config), config)
    return distinct_pairs(pa.concat_tables([pending(pairs, False), near_decisions(
        pending(pairs, True), vectors, config)]))


def _shorts(ranked: pl.DataFrame, config: ResolveConfig) -> pl.DataFrame:
    return pl.concat([_short_names(ranked, config), _nicknames(ranked, config)])


def _decided(pairs: pl.DataFrame, short: pl.DataFrame, config: ResolveConfig) -> pa.Table:
    """PAIRS of `pairs` (`_name_pairs` with `_with_features`) and the `short` name matches,
    decided by rules; embedding neighbours pending (score null, `merge` whether both are
    named things; `near_decisions` gives their cosine)."""
    shared = pl.col("specific").list.set_intersection(pl.col("specific_b")).list.len() > 0
    compatible = (pl.col("digits") == pl.col("digits_b")) & (
        (pl.col("cls") == "") | (pl.col("cls_b") == "") | (pl.col("cls") == pl.col("cls_b"))
        | shared)
    same_core = (pl.col("kind") == "d") & (pl.col("core") == pl.col("core_b"))  # c: has it
    pairs = pairs.filter(compatible & ~same_core)
    # an organisation's short form keeps its meaning whatever its label: spaCy tags a bare
    # "Fordham" a place in the sentence after "Fordham University", an organisation
    short = short.filter(compatible | ((pl.col("evidence") == "short_form")
                                       & (pl.col("digits") == pl.col("digits_b"))))
    if pairs.height == 0 and short.height == 0:
        return PAIRS.empty_table()
    similarity = np.zeros(pairs.height)
    spelling = (pairs["kind"] == "d").to_numpy()
    if spelling.any():
        from rapidfuzz import fuzz, process

        chosen = pairs.filter(pl.col("kind") == "d")
        similarity[spelling] = process.cpdist(chosen["core"].to_list(),
                                              chosen["core_b"].to_list(),
                                              scorer=fuzz.ratio, workers=1) / 100.0
    named_both = (pl.col("cls") != "") & (pl.col("cls_b") != "")
    kind = pl.col("kind")
    decided = pairs.with_columns(similarity=pl.Series(similarity)).with_columns(
        evidence=pl.when(kind == "c").then(pl.lit("exact"))
        .when(kind == "d").then(pl.lit("spelling"))
        .otherwise(pl.lit("embedding")),
        score=pl.when(kind == "c").then(pl.lit(1.0))
        .when(kind == "d").then(pl.col("similarity").round(4))
        .otherwise(pl.lit(None, pl.Float64)),
        merge=pl.when(kind == "c").then(pl.lit(True))
        .when(kind == "d").then(pl.col("similarity") >= config.min_similarity)
        .otherwise(named_both),  # and its cosine at embedding_merge: near_decisions
        keep=pl.when(kind == "d").then(pl.col("similarity") >= config.min_similarity)
        .otherwise(pl.lit(True)),
    ).filter(pl.col("keep"))
    out = pl.concat([decided, short.with_columns(merge=pl.lit(True))], how="diagonal").select(
        "group_id", a=pl.min_horizontal("normalized", "normalized_b"),
        b=pl.max_horizontal("normalized", "normalized_b"),
        evidence="evidence", score="score", merge="merge")
    out = out.unique(["group_id", "a", "b", "evidence"], keep="first", maintain_order=True)
    return schema.conform(out.sort(["group_id", "a", "b", "evidence"]).to_arrow(), PAIRS)


def candidate_pairs(keyed: pa.Table, config: ResolveConfig) -> pa.Table:
    """Pair decisions inside each (group, key) block of `blocking_keys`, vectorized. Blocks
    over `max_block` names are cut to their most mentioned names (`_ranked`). Undecidable
    pairs (embedding neighbours below the merge threshold) are kept with `merge` false, for
    an adjudicator; without the keys' vectors, embedding neighbours are left pending (the
    stage decides the same pairs in two shuffles: `pair_ids`, `decide_in_groups`)."""
    if keyed.num_rows == 0:
        return PAIRS.empty_table()
    df = _ranked(pl.from_arrow(keyed), config)
    pairs = _decided(_with_features(_name_pairs(df), _features(df)), _shorts(df, config),
                     config)
    if "vector" not in keyed.column_names:
        return pairs  # embedding neighbours pending
    # A pair of names sharing several bands is one pair, its cosine computed once, after
    # the blocks (`near_decisions`: the vectors of 860,000 band pairs of 6,500 names, copied
    # per pair, were 2.6 GB and 8 s).
    vectors = (pl.from_arrow(keyed.select(["group_id", "normalized", "vector"]))
               .filter(pl.col("vector").is_not_null()).unique(["group_id", "normalized"])
               .to_arrow())
    near = near_decisions(pending(pairs, True), vectors, config)
    frame = pl.from_arrow(pa.concat_tables([pending(pairs, False), near]))
    return schema.conform(frame.sort(["group_id", "a", "b", "evidence"]).to_arrow(), PAIRS)


def _one_meaning(matched: pl.DataFrame, config: ResolveConfig) -> pl.DataFrame:
    """The matches of the short names that match exactly one full name of their block: a
    name that could mean two stays apart (no pair: an adjudicator is not asked either). A
    short name said far more often than its full name is a name of its own: on LoCoMo the
    participant "Jon" (in 197 episodes) and a stray "Yep Jon" (1)."""
    # one person under two names of one core ("Ms. Rita Almeida", "Rita Almeida") is one
    meanings = pl.col("core_b").n_unique().over(["group_id", "key", "normalized"])
    return matched.filter(
        (meanings == 1)
        & (pl.col("mentions") <= config.short_name_ratio * pl.col("mentions_b"))).unique(
        ["group_id", "normalized", "normalized_b"], keep="first", maintain_order=True)


_SHORT_COLUMNS = ["group_id", "normalized", "normalized_b", "evidence", "score",
                  *(f"{f}{side}" for f in PAIR_FEATURES for side in ("", "_b"))]


def _short_names(df: pl.DataFrame, config: ResolveConfig) -> pl.DataFrame:
    """Short names and the full names they can stand for, in `s:` blocks (`name_parts`):
    a lone word, a person or of no specific label, that is a person's first name
    (`first_name`), last name (`surname`) or a given name said alike (`given_name`, Steven
    of Stephen Dubner; an organisation's short name said alike is not one), an organisation's
    short form (`short_form`) or a code (`code`); each merges when it matches exactly one
    full name of its group (all of a short name's matches share its block)."""
    rows = df.filter(pl.col("kind") == "s").drop("vector", strict=False)
    selves = rows.filter(pl.col("role") == "self")
    matched = selves.join(rows.filter(pl.col("role") != "self"), on=["group_id", "key"],
                          suffix="_b").filter(pl.col("normalized") != pl.col("normalized_b"))
    if matched.height == 0:
        return pl.DataFrame(schema={c: pl.String for c in _SHORT_COLUMNS}).with_columns(
            score=pl.lit(0.0), specific=pl.lit([], pl.List(pl.String)),
            specific_b=pl.lit([], pl.List(pl.String)))
    from rapidfuzz import fuzz, process

    similarity = process.cpdist(matched["part"].to_list(), matched["part_b"].to_list(),
                                scorer=fuzz.ratio, workers=1) / 100.0
    role, same = pl.col("role_b"), pl.col("part") == pl.col("part_b")
    person = role.is_in(["first", "last"])
    # a person is no organisation's short form (Tania Tetlow, Tania Tetlow Foundation)
    only_person = pl.col("personish") & (pl.col("specific").list.set_difference(
        sorted(PERSONISH)).list.len() == 0)
    matched = matched.with_columns(similarity=pl.Series(similarity, dtype=pl.Float64)
                               ).with_columns(
        evidence=pl.when(role == "first").then(
            pl.when(same).then(pl.lit("first_name")).otherwise(pl.lit("given_name")))
        .when(role == "last").then(pl.lit("surname")).otherwise(role),
        score=pl.when(same).then(pl.lit(1.0)).otherwise(pl.col("similarity").round(4)),
    ).filter((same | ((role == "first")
                      & (pl.col("similarity") >= config.given_name_similarity)))
             & (~person | (pl.col("lone") & (pl.col("personish") | (pl.col("cls") == ""))))
             & ((role != "short_form") | ~only_person))
    return _one_meaning(matched, config).select(_SHORT_COLUMNS)


def _nicknames(df: pl.DataFrame, config: ResolveConfig) -> pl.DataFrame:
    """A lone person name that begins the given name of exactly one person of its group
    (`n:` blocks: Mel, Melanie), when the group's mentions of the two overlap in time: the
    nickname is used while that person is in the conversation (`nickname`). A name given
    in full by someone else too (Mel Gibson) makes it mean two."""
    rows = df.filter(pl.col("kind") == "n").drop("vector", strict=False)
    matched = rows.filter(pl.col("role") == "self").join(
        rows.filter(pl.col("role") == "given"), on=["group_id", "key"], suffix="_b").filter(
        (pl.col("normalized") != pl.col("normalized_b"))
        & pl.col("part_b").str.starts_with(pl.col("part")))
    together = ((pl.col("first_seen") <= pl.col("last_seen_b"))
                & (pl.col("first_seen_b") <= pl.col("last_seen"))).fill_null(False)
    return _one_meaning(matched, config).filter(
        (pl.col("part") != pl.col("part_b")) & together).with_columns(
        evidence=pl.lit("nickname"), score=pl.lit(1.0)).select(_SHORT_COLUMNS)


def person_name_duplicates(entities: pa.Table) -> list[tuple[str, str, str]]:
    """(group_id, name, full name) for each person entity whose one-word name is a word of
    exactly one other person's name in its group (Tetlow and Tania Tetlow): the duplicates
    a reader would have merged, left among person names (`entities` needs group_id, name
    and labels; honorifics are not words of a name)."""
    config = ResolveConfig()
    rows = [(group, name, core_name(normalize_name(name), config).split())
            for group, name, labels in zip(entities["group_id"].to_pylist(),
                                           entities["name"].to_pylist(),
                                           entities["labels"].to_pylist(), strict=True)
            if name and set(labels or ()) & PERSONISH]
    words: dict[tuple[str, str], set[str]] = {}
    for group, name, tokens in rows:
        if len(tokens) > 1:
            for token in tokens:
                words.setdefault((group, token), set()).add(name)
    return sorted((group, name, next(iter(fulls))) for group, name, tokens in rows
                  if len(tokens) == 1 and len(fulls := words.get((group, tokens[0]), ())) == 1)


ALIAS_MAP = schema.ALIAS_MAP
NEVER_NAMES = ("nickname", "code")  # evidence whose shorter name never names an entity


def cluster(pairs: pa.Table) -> pa.Table:
    """Connected components of the merge pairs, per group (scipy, vectorized); `node`
    self-pairs list every name, paired or not. A cluster is named after its most complete
    member (a name of its own before a record's key name, then most words, most mentioned,
    then alphabetical); each name keeps the evidence of
    the first merge (in (a, b, evidence) order) that touched it. A business record is an
    entity of its own (`one_record_each`)."""
    df = pl.from_arrow(pairs)
    nodes = (df.filter(pl.col("evidence") == "node")
             .select("group_id", normalized=pl.col("a"), mentions=pl.col("score"))
             .unique(["group_id", "normalized"], keep="first")
             .sort(["group_id", "normalized"]).with_row_index("i"))
    if nodes.height == 0:
        return ALIAS_MAP.empty_table()
    index = nodes.select("group_id", "normalized", "i")
    merges = (df.filter(pl.col("merge") & (pl.col("evidence") != "node"))
              .sort(["group_id", "a", "b", "evidence"]).with_row_index("order")
              .join(index.rename({"normalized": "a", "i": "ia"}), on=["group_id", "a"])
              .join(index.rename({"normalized": "b", "i": "ib"}), on=["group_id", "b"]))
    size = nodes.height
    merges = one_record_each(merges, nodes["i"].filter(nodes["mentions"] == 0).to_numpy(),
                             size)
    component = _components(merges, size)
    nodes = nodes.with_columns(component=pl.Series(component),
                               words=pl.col("normalized").str.count_matches(r"\S+"))
    # a nickname or a bare code never names its entity, even a record's (Mel said more often
    # than Melanie; T-17 of the record Ticket T-17): the shorter name of such a merge
    words_a, words_b = (pl.col(side).str.count_matches(r"\S+") for side in ("a", "b"))
    shorter_a = (words_a < words_b) | ((words_a == words_b) & (
        pl.col("a").str.len_chars() < pl.col("b").str.len_chars()))
    shorts = merges.filter(pl.col("evidence").is_in(NEVER_NAMES)).select(
        "group_id", normalized=pl.when(shorter_a).then(pl.col("a")).otherwise(pl.col("b"))
    ).unique().with_columns(short=pl.lit(True))
    roots = (nodes.with_columns(key_name=pl.col("mentions") == 0)  # node_pairs' score
             .join(shorts, on=["group_id", "normalized"], how="left")
             .with_columns(pl.col("short").fill_null(False))
             .sort(["component", "short", "key_name", "words", "mentions", "normalized"],
                   descending=[False, False, False, True, True, False])
             .group_by("component", maintain_order=True).agg(root=pl.col("normalized").first()))
    touched = pl.concat([
        merges.select("order", "evidence", "score", i=pl.col("ia")),
        merges.select("order", "evidence", "score", i=pl.col("ib")),
    ]).sort(["i", "order"]).group_by("i", maintain_order=True).agg(
        pl.col("evidence").first().alias("first_evidence"), pl.col("score").first().alias(
            "first_score"))
    out = (nodes.join(roots, on="component").join(touched, on="i", how="left")
           .with_columns(
               evidence=pl.when(pl.col("normalized") == pl.col("root")).then(pl.lit("exact"))
               .otherwise(pl.col("first_evidence")),
               score=pl.when(pl.col("normalized") == pl.col("root")).then(pl.lit(1.0))
               .otherwise(pl.col("first_score")))
           .sort(["group_id", "normalized"]))
    ids = {key: schema.stable_id(key[0], "entity", key[1])
           for key in out.select("group_id", "root").unique().rows()}
    out = out.with_columns(entity_id=pl.Series(
        [ids[key] for key in out.select("group_id", "root").rows()], dtype=pl.String))
    return schema.conform(out.to_arrow(), ALIAS_MAP)


def one_record_each(merges: pl.DataFrame, records: np.ndarray, size: int) -> pl.DataFrame:
    """`merges` (node indexes `ia`, `ib` below `size`) less those that would make one entity
    of two business records (`records`: their nodes' indexes, node_pairs' score 0): a
    record's identity is its key, its name only a label, so two records never merge, and
    the names that merge among themselves join a record only when they meet exactly one
    (a third "Ana Silva" beside two contacts so named could mean either: it stays apart)."""
    is_record = np.zeros(size, dtype=bool)
    is_record[records] = True
    a_record, b_record = (is_record[merges[side].to_numpy()] for side in ("ia", "ib"))
    if not (a_record | b_record).any():
        return merges
    plain = merges.filter(pl.Series(~a_record & ~b_record))
    names = _components(plain, size)
    linking = merges.filter(pl.Series(a_record ^ b_record))
    ia, ib = (linking[side].to_numpy().astype(np.int64) for side in ("ia", "ib"))
    name_side = np.where(is_record[ia], ib, ia)
    record_side = ia + ib - name_side
    met = pl.DataFrame({"names": names[name_side], "record": record_side}).select(
        pl.col("record").n_unique().over("names") == 1)
    return pl.concat([plain, linking.filter(met.to_series())]).sort("order")


def _components(merges: pl.DataFrame, size: int) -> np.ndarray:
    """The connected component of each of `size` nodes under the `merges` (`ia`, `ib`)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(merges.height), (merges["ia"].to_numpy(),
                                                 merges["ib"].to_numpy())), shape=(size, size))
    return connected_components(graph, directed=False)[1]


def changed_entities(stored: pa.Table, alias_map: pa.Table) -> set[str]:
    """Entities whose names differ between a stored snapshot's aliases and a new alias map
    (both with group_id, normalized, entity_id): new entities, entities that gained or lost
    a name (a merge, a new spelling) and entities that are gone (merged into another, or
    renamed when a more complete name became their root). Facts of every other entity have
    the same endpoints as before."""
    def names(table: pa.Table) -> dict[str, frozenset[str]]:
        rows = pl.from_arrow(table.select(["group_id", "normalized", "entity_id"])).unique()
        grouped = rows.group_by("entity_id").agg(pl.col("normalized"))
        return {entity: frozenset(found) for entity, found in grouped.iter_rows()}

    before, after = names(stored), names(alias_map)
    return {entity for entity in before.keys() | after.keys()
            if before.get(entity) != after.get(entity)}


# --- a later run: pairs decided against what is stored ---------------------------------------
#
# A pair decision reads only its two names (`PAIR_FEATURES`, their vectors) and the block
# that holds them (its most mentioned `max_block` names; for first names, how many full
# names share it). A name node changes only when a run mentions it. So a stored pair whose
# blocks hold no name mentioned tonight is decided as before, and a run recomputes only the
# blocks its names fall in, plus every block of a stored pair it may drop (the pair may
# still come from one of them). A pair between two unchanged names that a recomputed block
# yields again keeps its stored row, an adjudicator's answer included: nothing is judged
# twice. Stored pairs serve only a run under the same resolve settings
# (`stages.resolve._stored_pairs`).


def _name_keys_frame(keyed: pa.Table) -> pl.DataFrame:
    return pl.from_arrow(keyed.select(["group_id", "normalized", "key"])).unique()


def _shared_keys(pairs: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """(group_id, a, b, key) for each block key both names of a pair are under."""
    return (pairs.select("group_id", "a", "b").unique()
            .join(keys.rename({"normalized": "a"}), on=["group_id", "a"])
            .join(keys.rename({"normalized": "b"}), on=["group_id", "b", "key"]))


def blocks_to_recompute(stored: pa.Table, keyed: pa.Table, changed: pa.Table
                        ) -> tuple[pa.Table, pa.Table]:
    """(stored pairs kept as they are, the (group_id, key) blocks to recompute) for names
    `changed` (group_id, normalized) tonight."""
    keys = _name_keys_frame(keyed)
    touched = keys.join(pl.from_arrow(changed).unique(), on=["group_id", "normalized"]
                        ).select("group_id", "key").unique()
    pairs = pl.from_arrow(stored)
    shared = _shared_keys(pairs, keys)
    dropped = shared.join(touched, on=["group_id", "key"]).select("group_id", "a", "b").unique()
    blocks = pl.concat([touched, shared.join(dropped, on=["group_id", "a", "b"])
                        .select("group_id", "key")]).unique()
    kept = pairs.join(dropped, on=["group_id", "a", "b"], how="anti")
    return (schema.conform(kept.to_arrow(), PAIRS),
            blocks.sort(["group_id", "key"]).to_arrow().cast(BLOCKS))


BLOCKS = pa.schema([("group_id", pa.string()), ("key", pa.string())])


def known_pairs(fresh: pa.Table, stored: pa.Table, changed: pa.Table) -> tuple[pa.Table,
                                                                               pa.Table]:
    """The recomputed blocks' pairs split into (stored rows of pairs between unchanged names
    that the blocks yield again, pairs with a changed name: tonight's decisions)."""
    names = pl.from_arrow(changed).unique().with_columns(changed=pl.lit(True))
    decided = (pl.from_arrow(fresh)
               .join(names.rename({"normalized": "a", "changed": "changed_a"}),
                     on=["group_id", "a"], how="left")
               .join(names.rename({"normalized": "b", "changed": "changed_b"}),
                     on=["group_id", "b"], how="left"))
    new = decided.filter(pl.col("changed_a").is_not_null() | pl.col("changed_b").is_not_null())
    again = decided.filter(pl.col("changed_a").is_null() & pl.col("changed_b").is_null())
    repeated = pl.from_arrow(stored).join(again.select("group_id", "a", "b").unique(),
                                          on=["group_id", "a", "b"])
    return (schema.conform(repeated.to_arrow(), PAIRS),
            schema.conform(new.drop("changed_a", "changed_b").to_arrow(), PAIRS))


# The same decisions over whole groups: a later run puts the stored pairs, every name's block
# keys and tonight's names in one shuffle by group (`TAGGED` rows, each marked with what it
# is), so a worker holds one group's rows and the driver none of the store's.

TAGGED = pa.schema([
    ("tag", pa.string()), ("group_id", pa.string()), ("normalized", pa.string()),
    ("key", pa.string()), ("a", pa.string()), ("b", pa.string()), ("evidence", pa.string()),
    ("score", pa.float64()), ("merge", pa.bool_()),
])
NAMES = pa.schema([("group_id", pa.string()), ("normalized", pa.string())])
NAME_KEYS = pa.schema([("group_id", pa.string()), ("normalized", pa.string()),
                       ("key", pa.string())])


def tagged(table: pa.Table, tag: str) -> pa.Table:
    """`table`'s rows as `TAGGED` rows marked `tag` (the columns it lacks null)."""
    marks = pa.array([tag] * table.num_rows, pa.string())
    return schema.conform(table, TAGGED).set_column(0, "tag", marks)


def untagged(rows: pa.Table, tag: str, table_schema: pa.Schema) -> pa.Table:
    """The `TAGGED` rows marked `tag`, as a table of `table_schema`."""
    return schema.conform(rows.filter(pc.equal(rows["tag"], tag)), table_schema)


def against_stored(rows: pa.Table) -> pa.Table:
    """`blocks_to_recompute` over the `TAGGED` rows of whole groups: stored pairs ("stored"),
    every name's block keys ("key", and "short": its `s:` and `n:` rows) and tonight's names
    ("changed") give the stored pairs kept ("kept") and dropped ("dropped": all
    `known_pairs` needs of the store) and the blocks to recompute ("block")."""
    stored = untagged(rows, "stored", PAIRS)
    keys = pa.concat_tables([untagged(rows, tag, NAME_KEYS) for tag in ("key", "short")])
    kept, blocks = blocks_to_recompute(stored, keys, untagged(rows, "changed", NAMES))
    dropped = pl.from_arrow(stored).join(pl.from_arrow(kept).select("group_id", "a", "b"),
                                         on=["group_id", "a", "b"], how="anti")
    return pa.concat_tables([tagged(kept, "kept"),
                             tagged(schema.conform(dropped.to_arrow(), PAIRS), "dropped"),
                             tagged(blocks, "block")])


def known_in_groups(rows: pa.Table) -> pa.Table:
    """`known_pairs` over the `TAGGED` rows of whole groups: the recomputed blocks' pairs
    ("fresh"), stored pairs ("stored") and tonight's names ("changed") give the stored rows
    of pairs yielded again ("repeated") and tonight's decisions ("tonight")."""
    repeated, tonight = known_pairs(untagged(rows, "fresh", PAIRS),
                                    untagged(rows, "stored", PAIRS),
                                    untagged(rows, "changed", NAMES))
    return pa.concat_tables([tagged(repeated, "repeated"), tagged(tonight, "tonight")])


def distinct_pairs(pairs: pa.Table) -> pa.Table:
    """Each pair row once, in (group_id, a, b, evidence) order."""
    frame = pl.from_arrow(schema.conform(pairs, PAIRS)).unique()
    return schema.conform(frame.sort(["group_id", "a", "b", "evidence", "merge"]).to_arrow(),
                          PAIRS)
