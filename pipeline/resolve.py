"""Entity resolution across the whole backfill, in three shuffles, each keyed by group:

1. mentions -> name nodes, by (group, normalized name): every surface form that normalizes
   the same is one node (exact match);
2. nodes -> candidate pairs, by (group, blocking key): legal-suffix-free core name, MinHash
   LSH bands of character shingles (spelling variants), first name (a lone "Maria" and the
   only "Maria ..." of the group), random-hyperplane bands of the name embedding; each pair
   is decided by rules, and the undecidable ones are kept for an adjudicator (none on the
   embedded default: they stay apart);
3. pairs -> clusters, by group: union-find; an entity is named after its most complete
   member and its id derives from that member, so the same input gives the same ids.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import schema
from pipeline.config import ResolveConfig

GENERIC_LABELS = {"Entity", "Concept", "Thing"}
_PUNCT = re.compile(r"[^\w\s&+@.-]|(?<!\w)[.-]|[.-](?!\w)")


def normalize_name(name: str) -> str:
    """Casefolded, NFKC, punctuation-light, single-spaced, without a leading article."""
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _PUNCT.sub(" ", text)
    text = " ".join(text.split())
    if text.startswith("the ") and len(text) > 4:
        text = text[4:]
    return text


def entity_id(group_id: str, name: str) -> str:
    return schema.stable_id(group_id, "entity", normalize_name(name))


def mention_rows(extractions: pa.Table) -> pa.Table:
    """One row per (episode, extracted entity), with the resolution key."""
    entities = extractions["entities"]
    flat = pc.list_flatten(entities)
    parents = pc.list_parent_indices(entities)
    if len(flat) == 0:
        return pa.table({
            "group_id": pa.array([], pa.string()), "episode_id": pa.array([], pa.string()),
            "valid_at": pa.array([], schema.TS), "name": pa.array([], pa.string()),
            "label": pa.array([], pa.string()), "attributes": pa.array([], pa.string()),
            "normalized": pa.array([], pa.string()),
        })
    names = pc.struct_field(flat, "name")
    table = pa.table({
        "group_id": pc.take(extractions["group_id"], parents),
        "episode_id": pc.take(extractions["episode_id"], parents),
        "valid_at": pc.take(extractions["valid_at"], parents),
        "name": names,
        "label": pc.struct_field(flat, "label"),
        "attributes": pc.struct_field(flat, "attributes"),
        "normalized": pa.array([normalize_name(n or "") for n in names.to_pylist()]),
    })
    return table.filter(pc.not_equal(table["normalized"], ""))


def canonical_name(names: Counter[str]) -> str:
    """The most complete surface form: most words, then most frequent, then longest."""
    return min(names, key=lambda n: (-len(n.split()), -names[n], -len(n), n))


def resolve_entities(mentions: pa.Table, created_at: datetime) -> pa.Table:
    """Mentions -> one row per entity. Mentions mapped by the resolver carry `entity_id`,
    `root`, `evidence` and `score`; unmapped ones are grouped by normalized name (nodes)."""
    mapped = "entity_id" in mentions.column_names
    by_key: dict[tuple[str, str], list[dict]] = {}
    for row in mentions.to_pylist():
        key = row["entity_id"] if mapped else row["normalized"]
        by_key.setdefault((row["group_id"], key), []).append(row)
    return pa.Table.from_pylist(
        [resolve_group(rows, created_at) for _, rows in sorted(by_key.items())],
        schema=schema.RESOLVED_ENTITIES,
    )


def resolve_group(rows: list[dict], created_at: datetime) -> dict:
    """All mentions of one entity (or one name node) -> its row, with its aliases."""
    rows = sorted(rows, key=lambda r: (r["valid_at"], r["episode_id"]))
    names = Counter(r["name"] for r in rows)
    labels = sorted({r["label"] for r in rows if r["label"]} - GENERIC_LABELS) or sorted(
        {r["label"] for r in rows if r["label"]}
    )
    attributes: dict = {}
    for row in rows:  # later records win
        if row["attributes"]:
            attributes.update(json.loads(row["attributes"]))
    first = rows[0]
    group_id = first["group_id"]
    root = first.get("root") or first["normalized"]
    aliases: dict[str, dict] = {}
    for row in rows:
        aliases.setdefault(row["name"], row)
    alias_names = sorted(aliases)
    return {
        "entity_id": first.get("entity_id") or schema.stable_id(group_id, "entity", root),
        "group_id": group_id,
        "name": canonical_name(names),
        "normalized": root,
        "labels": labels,
        "summary": "",
        "attributes": json.dumps(attributes, ensure_ascii=False, sort_keys=True, default=str),
        "created_at": created_at,
        "first_seen": rows[0]["valid_at"],
        "last_seen": rows[-1]["valid_at"],
        "mention_count": len({r["episode_id"] for r in rows}),
        "aliases": alias_names,
        "alias_normalized": [aliases[n]["normalized"] for n in alias_names],
        "alias_evidence": [aliases[n].get("evidence") or "exact" for n in alias_names],
        "alias_score": [aliases[n].get("score") or 1.0 for n in alias_names],
    }


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
    """Distinct (episode, entity) edges of the episodic subgraph (from mapped mentions)."""
    table = mentions.select(["episode_id", "entity_id", "group_id"])
    return table.group_by(["episode_id", "entity_id", "group_id"]).aggregate([])


def node_pairs(nodes: pa.Table) -> pa.Table:
    """Every name node as a self-pair, so clustering sees unpaired names too; `score`
    carries its mention count (the tie-break for naming a cluster)."""
    return pa.table({
        "group_id": nodes["group_id"], "a": nodes["normalized"], "b": nodes["normalized"],
        "evidence": pa.array(["node"] * nodes.num_rows, pa.string()),
        "score": pc.cast(nodes["mention_count"], pa.float64()),
        "merge": pa.array([False] * nodes.num_rows, pa.bool_()),
    }, schema=PAIRS)


# --- cross-name resolution: blocking keys, pair decisions, union-find -----------------------

PERSONISH = {"Person", "Speaker", "Contact", "AccountOwner", "SalesRep", "Assignee", "Owner",
             "Manager", "Author"}
_DIGITS = re.compile(r"\d+")
_HASH_PRIME = (1 << 61) - 1
KEYED_NAMES = pa.schema([
    ("group_id", pa.string()), ("key", pa.string()), ("normalized", pa.string()),
    ("name", pa.string()), ("labels", pa.list_(pa.string())), ("mentions", pa.int64()),
    ("vector", pa.list_(pa.float32())),
])
PAIRS = schema.RESOLUTION_PAIRS


def core_name(normalized: str, config: ResolveConfig) -> str:
    """The name without legal forms and honorifics: "initech inc" -> "initech",
    "dr. sofia costa" -> "sofia costa"."""
    tokens = normalized.replace(",", " ").split()
    while len(tokens) > 1 and tokens[-1].strip(".") in config.legal_suffixes:
        tokens.pop()
    while len(tokens) > 1 and tokens[0].strip(".") in config.honorifics:
        tokens.pop(0)
    return " ".join(tokens)


def shingles(text: str, size: int) -> set[str]:
    padded = f" {text} "
    return {padded[i : i + size] for i in range(max(len(padded) - size + 1, 1))}


def _stable_hash(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def minhash_keys(text: str, bands: int, rows: int, size: int) -> list[str]:
    """LSH band keys of the MinHash signature of `text`'s character shingles."""
    import numpy as np

    hashes = np.array([_stable_hash(s) % _HASH_PRIME for s in shingles(text, size)],
                      dtype=np.uint64)
    rng = np.random.default_rng(1234)
    count = bands * rows
    a = rng.integers(1, 1 << 30, size=count, dtype=np.uint64)
    b = rng.integers(0, 1 << 30, size=count, dtype=np.uint64)
    signature = ((hashes[:, None] * a[None, :] + b[None, :]) % np.uint64(_HASH_PRIME)).min(0)
    return [f"m{band}:" + ".".join(map(str, signature[band * rows : (band + 1) * rows]))
            for band in range(bands)]


def simhash_keys(vector: list[float], bands: int, bits: int) -> list[str]:
    """Random-hyperplane LSH keys: names whose vectors are close share a band key."""
    import numpy as np

    planes = np.random.default_rng(4321).standard_normal((bands * bits, len(vector)))
    signs = (planes @ np.asarray(vector, dtype=np.float64)) > 0
    return [f"e{band}:" + "".join("1" if s else "0" for s in signs[band * bits:(band + 1) * bits])
            for band in range(bands)]


def blocking_keys(nodes: pa.Table, config: ResolveConfig) -> pa.Table:
    """Each name node under every blocking key it belongs to; names meet only under a key."""
    rows = []
    for node in nodes.to_pylist():
        normalized = node["normalized"]
        core = core_name(normalized, config)
        keys = {f"c:{core}": None}
        keys.update(dict.fromkeys(
            minhash_keys(core, config.minhash_bands, config.minhash_rows, config.shingle_size)))
        tokens = core.split()
        if config.first_names and tokens and (len(tokens) == 1 or _personish(node["labels"])):
            keys[f"f:{tokens[0]}"] = None
        base = {"group_id": node["group_id"], "normalized": normalized, "name": node["name"],
                "labels": node["labels"], "mentions": node["mention_count"]}
        rows += [{**base, "key": key, "vector": None} for key in keys]
        if node.get("name_embedding") is not None:
            vector = list(node["name_embedding"])
            rows += [{**base, "key": key, "vector": vector}
                     for key in simhash_keys(vector, config.simhash_bands, config.simhash_bits)]
    return pa.Table.from_pylist(rows, schema=KEYED_NAMES)


def _specific(labels: list[str] | None) -> bool:
    """Named things (people, places, records), not generic noun phrases."""
    return bool(set(labels or ()) - GENERIC_LABELS)


def _personish(labels: list[str] | None) -> bool:
    return bool(set(labels or ()) & PERSONISH)


def _compatible(a: dict, b: dict) -> bool:
    """Record ids never merge across different numbers; people never merge with places."""
    if _DIGITS.findall(a["normalized"]) != _DIGITS.findall(b["normalized"]):
        return False
    specific_a = set(a["labels"] or ()) - GENERIC_LABELS
    specific_b = set(b["labels"] or ()) - GENERIC_LABELS
    if not specific_a or not specific_b:
        return True
    return bool(specific_a & specific_b) or not (
        ("Location" in specific_a) ^ ("Location" in specific_b))


def _similarity(a: str, b: str) -> float:
    from difflib import SequenceMatcher

    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def decide_pair(kind: str, a: dict, b: dict, config: ResolveConfig, *, unique_full: bool = False
                ) -> tuple[str, float, bool] | None:
    """(evidence, score, merge?) for two names met under a key of `kind`; None if unrelated."""
    if not _compatible(a, b):
        return None
    if kind == "c":
        return "exact", 1.0, True
    if kind == "m":
        core_a = core_name(a["normalized"], config)
        core_b = core_name(b["normalized"], config)
        sa, sb = shingles(core_a, config.shingle_size), shingles(core_b, config.shingle_size)
        jaccard = len(sa & sb) / len(sa | sb)
        similarity = _similarity(core_a, core_b)
        same_shape = len(core_a.split()) == len(core_b.split())
        if jaccard >= config.min_jaccard and similarity >= config.min_similarity and same_shape:
            return "minhash", round(similarity, 4), True
        return None
    if kind == "f":
        return ("first_name", 1.0, True) if unique_full else None
    if kind == "e":
        import numpy as np

        cosine = float(np.dot(a["vector"], b["vector"]))
        named = _specific(a["labels"]) and _specific(b["labels"])
        if cosine >= config.embedding_merge and named:
            return "embedding", round(cosine, 4), True
        if cosine >= config.embedding_ambiguous:
            return "embedding", round(cosine, 4), False  # for the adjudicator, if any
    return None


def candidate_pairs(keyed: pa.Table, config: ResolveConfig) -> pa.Table:
    """Pair decisions inside each (group, key) block; blocks over `max_block` names are cut
    to their most mentioned names, so one common key never costs quadratic time."""
    blocks: dict[tuple[str, str], list[dict]] = {}
    for row in keyed.to_pylist():
        blocks.setdefault((row["group_id"], row["key"]), []).append(row)
    pairs = []
    for (group_id, key), members in blocks.items():
        kind = key[0]
        members = sorted(members, key=lambda m: (-m["mentions"], m["normalized"]))
        members = members[: config.max_block]
        if kind == "f":  # a capitalized lone name, and the person names it could be
            words = {m["normalized"]: len(core_name(m["normalized"], config).split())
                     for m in members}
            singles = [m for m in members if words[m["normalized"]] == 1
                       and m["name"][:1].isupper()]
            full = [m for m in members if words[m["normalized"]] > 1
                    and _personish(m["labels"])]
            candidates = [(s, f) for s in singles for f in full]
            unique = len(full) == 1
        else:
            candidates = [(x, y) for i, x in enumerate(members) for y in members[i + 1 :]]
            unique = False
        for x, y in candidates:
            decision = decide_pair(kind, x, y, config, unique_full=unique)
            if decision:
                a, b = sorted((x["normalized"], y["normalized"]))
                evidence, score, merge = decision
                pairs.append({"group_id": group_id, "a": a, "b": b, "evidence": evidence,
                              "score": score, "merge": merge})
    return pa.Table.from_pylist(pairs, schema=PAIRS)


ALIAS_MAP = schema.ALIAS_MAP


def cluster(pairs: pa.Table) -> pa.Table:
    """Union-find over merge pairs, per group; `node` self-pairs list every name, paired or
    not. A cluster is named after its most complete member (most words, most mentioned)."""
    weight = {(r["group_id"], r["a"]): (len(r["a"].split()), int(r["score"]), r["a"])
              for r in pairs.filter(pc.equal(pairs["evidence"], "node")).to_pylist()}
    parent: dict[tuple[str, str], tuple[str, str]] = {key: key for key in weight}
    evidence_of: dict[tuple[str, str], tuple[str, float]] = {}

    def find(key: tuple[str, str]) -> tuple[str, str]:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    ordered = sorted(pairs.filter(pc.field("merge")).to_pylist(),
                     key=lambda p: (p["group_id"], p["a"], p["b"], p["evidence"]))
    for pair in ordered:
        a, b = (pair["group_id"], pair["a"]), (pair["group_id"], pair["b"])
        if a not in parent or b not in parent:
            continue
        for node in (a, b):  # the first merge that touched a name is its evidence
            evidence_of.setdefault(node, (pair["evidence"], pair["score"]))
        root_a, root_b = find(a), find(b)
        if root_a != root_b:
            keep, join = sorted((root_a, root_b), key=lambda k: _rank(weight[k]))
            parent[join] = keep
    rows = []
    for key in sorted(parent):
        root = find(key)
        evidence, score = ("exact", 1.0) if key == root else evidence_of[key]
        rows.append({"group_id": key[0], "normalized": key[1], "root": root[1],
                     "entity_id": schema.stable_id(key[0], "entity", root[1]),
                     "evidence": evidence, "score": score})
    return pa.Table.from_pylist(rows, schema=ALIAS_MAP)


def _rank(weight: tuple[int, int, str]) -> tuple[int, int, str]:
    words, mentions, normalized = weight
    return (-words, -mentions, normalized)
