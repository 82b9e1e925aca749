"""Resolution rules on names whose outcome is known."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from tkg.pipeline import schema
from tkg.pipeline.config import ResolveConfig
from tkg.pipeline.resolve import (
    blocking_keys,
    blocks_to_recompute,
    candidate_pairs,
    cluster,
    core_name,
    deletion_keys,
    distinct_pairs,
    known_pairs,
    node_pairs,
    normalize_name,
)

CONFIG = ResolveConfig()


def node(name, labels=("Person",), mentions=1, vector=None):
    return {"group_id": "g", "normalized": normalize_name(name), "name": name,
            "labels": list(labels), "mention_count": mentions, "mentions": mentions,
            "vector": vector, "name_embedding": vector}


def resolve_names(nodes: list[dict]) -> dict[str, str]:
    table = pa.Table.from_pylist([
        {"group_id": n["group_id"], "normalized": n["normalized"], "name": n["name"],
         "labels": n["labels"], "mention_count": n["mention_count"],
         "name_embedding": n["name_embedding"]} for n in nodes])
    pairs = candidate_pairs(blocking_keys(table, CONFIG), CONFIG)
    everything = pa.concat_tables([pairs, node_pairs(table)])
    mapping = cluster(everything)
    roots = {r["normalized"]: r["root"] for r in mapping.to_pylist()}
    return {n["name"]: roots[n["normalized"]] for n in nodes}


def test_core_names():
    assert core_name("initech inc", CONFIG) == "initech"
    assert core_name("globex corporation", CONFIG) == "globex"
    assert core_name("dr. sofia costa", CONFIG) == "sofia costa"
    assert core_name("inc", CONFIG) == "inc"


def test_deletion_keys_meet_within_one_edit_only():
    def meet(a: str, b: str) -> bool:
        return bool({*deletion_keys(a, 6), a} & {*deletion_keys(b, 6), b})

    assert meet("daniel okafor", "daniel okafur")  # substitution
    assert meet("daniel okafor", "daniel okfor")  # deletion
    assert meet("daniel okafor", "daniel oakfor")  # transposition
    assert not meet("daniel okafor", "daniel okefur")
    assert deletion_keys("li wu", 6) == []


def test_abbreviations_and_word_order_share_the_core_key():
    roots = resolve_names([
        node("Mount Kavorin", ("Location",), 3), node("Mt. Kavorin", ("Location",)),
        node("Daniel Okafor", mentions=2), node("Okafor, Daniel"), node("Dr. Daniel Okafor"),
        node("Zephyr International Corp", ("Organization",), 2),
        node("Zephyr Intl", ("Organization",)),
    ])
    assert roots["Mt. Kavorin"] == "mount kavorin"
    assert roots["Okafor, Daniel"] == roots["Daniel Okafor"] == roots["Dr. Daniel Okafor"]
    assert roots["Zephyr Intl"] == "zephyr international corp"


def test_rules_merge_variants_and_keep_apart_the_rest():
    roots = resolve_names([
        node("Globex Corporation", ("Organization",), 5), node("Globex", ("Organization",)),
        node("Initech Inc.", ("Organization",)), node("Initech", ("Organization",), 3),
        node("Daniel Okafor", mentions=4), node("Daniel Okafur"), node("Maria"),
        node("Maria Lopez"),
        node("Alice Walker"), node("Tom Walker"), node("Alice"),
        node("Customer CUST-001", ("Customer",)), node("Customer CUST-002", ("Customer",)),
    ])
    assert roots["Globex"] == roots["Globex Corporation"] == "globex corporation"
    assert roots["Initech"] == roots["Initech Inc."] == "initech inc"
    assert roots["Daniel Okafur"] == "daniel okafor"
    assert roots["Maria"] == "maria lopez"
    assert roots["Alice"] == "alice walker"
    assert roots["Tom Walker"] != roots["Alice Walker"]
    assert roots["Customer CUST-001"] != roots["Customer CUST-002"]


def test_a_first_name_shared_by_two_people_stays_apart():
    roots = resolve_names([node("Alice Walker"), node("Alice Chen"), node("Alice")])
    assert roots["Alice"] == "alice"


def test_embedding_neighbours_merge_only_named_things_above_the_threshold():
    base = np.zeros(8, dtype=np.float32)
    base[0] = 1.0
    near = base.copy()
    near[1] = 0.2
    near /= np.linalg.norm(near)  # cosine 0.98
    roots = resolve_names([
        node("NYC", ("Location",), 2, vector=base.tolist()),
        node("New York City", ("Location",), vector=near.tolist()),
        node("biggest account", ("Concept",), 2, vector=(-base).tolist()),
        node("largest account", ("Concept",), vector=(-near).tolist()),
    ])
    assert roots["NYC"] == roots["New York City"] == "new york city"
    assert roots["biggest account"] != roots["largest account"]  # generic: adjudicator's call


def test_ambiguous_pairs_are_kept_for_the_adjudicator():
    base = np.zeros(8, dtype=np.float32)
    base[0] = 1.0
    near = base.copy()
    near[1] = 0.5
    near /= np.linalg.norm(near)  # cosine 0.89: between the two thresholds
    table = pa.Table.from_pylist([
        {"group_id": "g", "normalized": n, "name": n, "labels": ["Organization"],
         "mention_count": 1, "name_embedding": v}
        for n, v in (("globex", base.tolist()), ("initrode", near.tolist()))])
    pairs = candidate_pairs(blocking_keys(table, CONFIG), CONFIG).to_pylist()
    assert [(p["a"], p["b"], p["evidence"], p["merge"]) for p in pairs] == [
        ("globex", "initrode", "embedding", False)]


def test_cluster_ids_are_deterministic():
    nodes = [node("Globex Corporation", ("Organization",)), node("Globex", ("Organization",))]
    first = resolve_names(nodes)
    second = resolve_names(list(reversed(nodes)))
    assert first == second
    table = pa.Table.from_pylist([{k: n[k] for k in ("group_id", "normalized",
                                                     "mention_count")} for n in nodes])
    assert schema.stable_id("g", "entity", "globex corporation") in cluster(
        node_pairs(table.append_column("name", pa.array(["x", "y"])))
    )["entity_id"].to_pylist()


def test_a_shared_label_overrides_a_stray_place_label():
    """spaCy tags "Initech" as a place in some sentences; it is still Initech Inc."""
    roots = resolve_names([
        node("Initech", ("Organization", "Location", "Group"), 16),
        node("Initech Inc.", ("Organization", "Customer"), 16),
        node("Paris", ("Location",)), node("Paris Hilton", ("Person",)),
    ])
    assert roots["Initech"] == roots["Initech Inc."]
    assert roots["Paris"] != roots["Paris Hilton"]


def _nodes_table(nodes: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([
        {"group_id": n["group_id"], "normalized": n["normalized"], "name": n["name"],
         "labels": n["labels"], "mention_count": n["mention_count"],
         "name_embedding": n["name_embedding"]} for n in nodes])


def _unit(*values: float) -> list[float]:
    vector = np.array(values, dtype=np.float32)
    return (vector / np.linalg.norm(vector)).tolist()


def _rows(pairs: pa.Table) -> list[tuple]:
    return sorted((p["a"], p["b"], p["evidence"], p["merge"]) for p in pairs.to_pylist())


def test_a_later_run_decides_only_its_blocks_and_keeps_stored_answers():
    """Stored pairs + the blocks tonight's names fall in = every pair decided again, and a
    stored adjudicator's answer between two names tonight did not mention stays."""
    before = [node("Alice Walker"), node("Alice", mentions=3),
              node("Globex", ("Organization",), vector=_unit(1, 0, 0, 0)),
              node("Initrode", ("Organization",), vector=_unit(1, 0.5, 0, 0)),
              node("Contoso Ltd", ("Organization",)), node("Kim", ("Person",))]
    # tonight: a second Alice (the lone "Alice" no longer goes to Alice Walker), a new
    # spelling of Contoso, and more mentions of Kim
    tonight = [node("Alice Chen"), node("Contosso Ltd", ("Organization",)),
               node("Kim", ("Person",), mentions=2)]
    stored = candidate_pairs(blocking_keys(_nodes_table(before), CONFIG), CONFIG)
    judged = [dict(p, merge=True, evidence="llm") if p["evidence"] == "embedding" else p
              for p in stored.to_pylist()]  # an adjudicator said yes to Globex/Initrode
    stored = pa.Table.from_pylist(judged, schema=schema.RESOLUTION_PAIRS)
    everyone = _nodes_table([n for n in before if n["normalized"] != "kim"] + tonight)
    keyed = blocking_keys(everyone, CONFIG)
    changed = pa.table({"group_id": ["g"] * len(tonight),
                        "normalized": [n["normalized"] for n in tonight]})
    kept, blocks = blocks_to_recompute(stored, keyed, changed)
    chosen = {(g, k) for g, k in zip(blocks["group_id"].to_pylist(),
                                     blocks["key"].to_pylist(), strict=True)}
    rows = keyed.filter(pa.array([(g, k) in chosen for g, k in zip(
        keyed["group_id"].to_pylist(), keyed["key"].to_pylist(), strict=True)]))
    repeated, new = known_pairs(candidate_pairs(rows, CONFIG), stored, changed)
    later = distinct_pairs(pa.concat_tables([kept, repeated, new]))
    whole = candidate_pairs(keyed, CONFIG)
    assert ("globex", "initrode", "llm", True) in _rows(later)  # kept, not judged again
    assert _rows(new) == [("contoso ltd", "contosso ltd", "spelling", True)]
    without_judged = [r for r in _rows(later) if r[2] != "llm"]
    assert without_judged == [r for r in _rows(whole) if r[2] != "embedding"]
    assert ("alice", "alice walker", "first_name", True) in _rows(stored)
    assert ("alice", "alice walker", "first_name", True) not in _rows(later)
