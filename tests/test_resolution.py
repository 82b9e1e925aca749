"""Resolution rules on names whose outcome is known."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tkg.pipeline import schema
from tkg.pipeline.config import ResolveConfig
from tkg.pipeline.resolve import (
    BLOCKS,
    KEY_ROWS,
    NAME_KEYS,
    NAMES,
    PAIRS,
    against_stored,
    blocking_keys,
    blocks_to_recompute,
    candidate_pairs,
    cluster,
    core_name,
    decide_in_groups,
    deciding,
    deletion_keys,
    distinct_pairs,
    known_in_groups,
    known_pairs,
    name_keys,
    name_rows,
    name_vectors,
    near_decisions,
    node_pairs,
    normalize_name,
    pair_ids,
    pending,
    simhash_codes,
    tagged,
    untagged,
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


def test_embedding_neighbours_decided_after_the_blocks_are_those_of_one_table():
    """The stage's shuffle by block carries no vectors: the blocks leave embedding
    neighbours pending (score null), and their names' vectors, joined on afterwards, decide
    them as the blocks of one table with its vectors do."""
    table = _nodes_table([
        node("Globex", ("Organization",), 2, vector=_unit(1, 0, 0, 0)),
        node("Initrode", ("Organization",), vector=_unit(1, 0.5, 0, 0)),  # adjudicator's
        node("NYC", ("Location",), 2, vector=_unit(0, 1, 0, 0)),
        node("New York City", ("Location",), vector=_unit(0, 1, 0.2, 0)),  # merges
        node("biggest account", ("Concept",), vector=_unit(0, 0, 1, 0)),
        node("largest account", ("Concept",), vector=_unit(0, 0, 1, 0.2)),  # generic
        node("Daniel Okafor", vector=_unit(0, 0, 0, 1)), node("Daniel Okafur")])
    found = candidate_pairs(blocking_keys(table, CONFIG, False), CONFIG)
    waiting = pending(found, True)
    assert waiting.num_rows >= 3 and set(waiting["evidence"].to_pylist()) == {"embedding"}
    near = near_decisions(waiting, name_vectors(table), CONFIG)
    whole = candidate_pairs(blocking_keys(table, CONFIG), CONFIG)
    assert _sorted(pa.concat_tables([pending(found, False), near])) == _sorted(whole)
    assert {(p["a"], p["merge"]) for p in whole.to_pylist() if p["evidence"] == "embedding"
            } == {("globex", False), ("new york city", True), ("biggest account", False)}


@pytest.mark.parametrize("bands_by_block", [True, False])
@pytest.mark.parametrize("max_block", [200, 2])
def test_the_stage_decides_in_two_shuffles_as_one_table(max_block, bands_by_block):
    """The stage's shuffle by block carries only (group, key, name, mentions)
    (`name_keys`) and finds pairs of names (`pair_ids`, in blocks spread over partitions);
    a shuffle by group decides them with each name's features, vector and short-name rows
    (`name_rows`, `decide_in_groups`): the pairs of `candidate_pairs` over one table,
    blocks cut at `max_block` included, whether the SimHash bands are keys of the shuffle
    by block (a later run) or codes matched in the shuffle by group (a full run). A full
    run finds its `c:` and `d:` blocks in the shuffle by group too, with no shuffle by
    block (`decide_in_groups` with `blocks`)."""
    config = ResolveConfig(max_block=max_block)
    table = _nodes_table([
        node("Globex", ("Organization",), 2, vector=_unit(1, 0, 0, 0)),
        node("Globex Corp", ("Organization",), vector=_unit(1, 0.1, 0, 0)),
        node("Initrode", ("Organization",), vector=_unit(1, 0.5, 0, 0)),
        node("NYC", ("Location",), 2, vector=_unit(0, 1, 0, 0)),
        node("New York City", ("Location",), vector=_unit(0, 1, 0.2, 0)),
        node("Daniel Okafor", mentions=3, vector=_unit(0, 0, 0, 1)), node("Daniel Okafur"),
        node("Okafor, Daniel", mentions=2), node("Okafor"), node("Dr. Daniel Okafor"),
        node("Melanie Ruiz", mentions=2), node("Mel"), node("Ticket T-17", ("Ticket",)),
        node("T-17", ("Ticket",))])
    keyed = name_keys(name_rows(table, config, True), config, bands_by_block)
    assert set(keyed.column_names) == {"group_id", "key", "normalized", "mentions"}
    assert pc.any(pc.starts_with(keyed["key"], "e")).as_py() == bands_by_block
    spelling = pc.starts_with(keyed["key"], "d:")  # whole blocks in two partitions, and
    parts = [keyed.filter(spelling), keyed.filter(pc.invert(spelling)), keyed]  # all again
    found = pa.concat_tables([pair_ids(part, config) for part in parts])
    rows = pa.concat_tables([deciding(found, "pair"),
                             name_rows(table, config, not bands_by_block)])
    whole = candidate_pairs(blocking_keys(table, config), config)
    assert whole.num_rows > 5 and "embedding" in whole["evidence"].to_pylist()
    assert _sorted(decide_in_groups(rows, config)) == _sorted(distinct_pairs(whole))
    if not bands_by_block:  # a full run: the blocks found in the shuffle by group alone
        alone = decide_in_groups(name_rows(table, config, True), config, True)
        assert _sorted(alone) == _sorted(distinct_pairs(whole))


def test_name_keys_from_name_rows_are_the_blocking_keys_of_the_nodes():
    """A later run makes each name's `c:`, `d:` and `e` keys from its row of `name_rows`
    (its core and band codes, found once): the rows `blocking_keys` gives the nodes, in
    its order, the `s:` and `n:` rows (`name_rows`' "short") left out."""
    config = ResolveConfig()
    table = _nodes_table([
        node("Globex Corp", ("Organization",), 2, vector=_unit(1, 0.1, 0, 0)),
        node("NYC", ("Location",), vector=_unit(0, 1, 0, 0)), node("Daniel Okafur"),
        node("Dr. Daniel Okafor", mentions=3, vector=_unit(0, 0, 0, 1))])
    every = blocking_keys(table, config, vectors=False)
    short = pc.or_(pc.starts_with(every["key"], "s:"), pc.starts_with(every["key"], "n:"))
    expected = every.filter(pc.invert(short)).select(KEY_ROWS.names)
    keyed = name_keys(name_rows(table, config, True), config)
    assert keyed.equals(expected.cast(KEY_ROWS))
    assert pc.sum(pc.starts_with(keyed["key"], "e")).as_py() == 3 * config.simhash_bands
    without = name_keys(name_rows(table, config, True), config, bands=False)
    assert without.equals(keyed.filter(pc.invert(pc.starts_with(keyed["key"], "e"))))


def test_simhash_codes_in_chunks_are_those_of_the_whole_matrix():
    """The codes, made `chunk` rows at a time, are those of one product of the whole matrix
    (float32 rows by float64 planes, the signs weighted by bit)."""
    vectors = np.random.default_rng(7).standard_normal((1000, 384)).astype(np.float32)
    planes = np.random.default_rng(4321).standard_normal((384, 6 * 16))
    signs = (vectors @ planes > 0).reshape(1000, 6, 16)
    whole = (signs * (1 << np.arange(16, dtype=np.int64))).sum(axis=2)
    for chunk in (1, 97, 4096):
        assert np.array_equal(simhash_codes(vectors, 6, 16, chunk), whole)


def test_name_rows_of_embedded_names_carry_each_ones_vector_and_codes():
    """Every node embedded (no vector taken out first) or one without: each name's row
    carries its own int8 vector and band codes, null for the one without."""
    vectors = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    nodes = [node(name, vector=vector.tolist()) for name, vector in zip(
        ("Ana Silva", "Bo Chen", "Cy Twombly", "Di Fox"), vectors, strict=True)]
    for table in (_nodes_table(nodes), _nodes_table([*nodes, node("Ed Wu")])):
        rows = name_rows(table, CONFIG, True)
        named = rows.filter(pc.equal(rows["tag"], "name"))
        assert named["normalized"].to_pylist() == table["normalized"].to_pylist()
        quantized = np.clip(np.rint(vectors * 127), -127, 127).astype(np.int8).tolist()
        assert named["vector"].to_pylist()[:4] == quantized
        codes = simhash_codes(vectors, CONFIG.simhash_bands, CONFIG.simhash_bits).tolist()
        assert named["bands"].to_pylist()[:4] == codes
        assert named["vector"].to_pylist()[4:] == named["bands"].to_pylist()[4:] == [
            None] * (table.num_rows - 4)


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


def _later_run(group: str = "g") -> tuple[pa.Table, pa.Table, pa.Table]:
    """(stored pairs, every name's block keys, tonight's names) of a later run in `group`."""
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
    changed = pa.table({"group_id": [group] * len(tonight),
                        "normalized": [n["normalized"] for n in tonight]})
    return _in_group(stored, group), _in_group(keyed, group), changed


def _in_group(table: pa.Table, group: str) -> pa.Table:
    return table.set_column(table.schema.get_field_index("group_id"), "group_id",
                            pa.array([group] * table.num_rows, pa.string()))


def test_a_later_run_decides_only_its_blocks_and_keeps_stored_answers():
    """Stored pairs + the blocks tonight's names fall in = every pair decided again, and a
    stored adjudicator's answer between two names tonight did not mention stays."""
    stored, keyed, changed = _later_run()
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


def _sorted(table: pa.Table) -> list[tuple]:
    return sorted(tuple(row.values()) for row in table.to_pylist())


def test_the_decisions_per_group_are_those_of_the_whole_tables():
    """A later run decides in shuffles by group (`against_stored`, `known_in_groups` over
    tagged rows): one group at a time, or two groups in one block, gives the rows of
    `blocks_to_recompute` and `known_pairs` over the whole tables."""
    parts = [_later_run(group) for group in ("g", "h")]
    stored, keyed, changed = (pa.concat_tables(tables) for tables in zip(*parts, strict=True))
    kept, blocks = blocks_to_recompute(stored, keyed, changed)

    def per_group(rows: list[pa.Table]) -> pa.Table:
        return pa.concat_tables([against_stored(block) for block in rows])

    def tag_all(group_parts: list[tuple[pa.Table, ...]]) -> list[pa.Table]:
        return [pa.concat_tables([tagged(s, "stored"), tagged(k, "key"), tagged(c, "changed")])
                for s, k, c in group_parts]

    one_block = against_stored(pa.concat_tables(tag_all(parts)))
    for against in (per_group(tag_all(parts)), one_block):
        assert _sorted(untagged(against, "kept", PAIRS)) == _sorted(kept)
        assert _sorted(untagged(against, "block", BLOCKS)) == _sorted(blocks)
    dropped = untagged(one_block, "dropped", PAIRS)
    assert _sorted(pa.concat_tables([dropped, untagged(one_block, "kept", PAIRS)])) == \
        _sorted(stored)
    assert _sorted(untagged(tagged(keyed, "key"), "key", NAME_KEYS)) == _sorted(
        keyed.select(["group_id", "normalized", "key"]))
    fresh = candidate_pairs(keyed, CONFIG)
    repeated, new = known_pairs(fresh, stored, changed)
    known = known_in_groups(pa.concat_tables([
        tagged(fresh, "fresh"), tagged(dropped, "stored"), tagged(changed, "changed")]))
    assert _sorted(untagged(known, "tonight", PAIRS)) == _sorted(new)
    # only the dropped stored pairs go in: the kept ones it misses are kept already
    assert set(_sorted(repeated)) - set(_sorted(untagged(known, "repeated", PAIRS))) <= set(
        _sorted(kept))
    assert _sorted(untagged(tagged(changed, "changed"), "changed", NAMES)) == _sorted(changed)


def _message(id_: str, day: str, speaker: str, content: str) -> dict:
    return {"group_id": "later", "id": id_, "kind": "message", "timestamp": f"{day}T10:00:00Z",
            "conversation_id": f"c-{id_}", "speaker": speaker, "content": content}


FIRST = (_message("r1", "2024-01-10", "Alice Chen", "Daniel Okafor lives in Berlin."),
         _message("r2", "2024-01-11", "Sofia Moreno", "Sofia Moreno lives in Madrid."),
         _message("r3", "2024-01-12", "Sophia Moreno", "Thanks, see you at the office."),
         _message("r4", "2024-02-10", "Alice Chen", "Alice Chen works at Acme."))
# One edit from Sofia and from Sophia: blocks of stored pairs are decided again.
LATER = (_message("r5", "2024-03-10", "Sopia Moreno", "Thanks, see you at the office."),
         _message("r6", "2024-06-01", "Alice Chen", "Daniel Okafor moved to Paris."))


def _write(folder, records: tuple[dict, ...]) -> str:
    import json

    folder.mkdir(parents=True)
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


def _published(result, sql: str) -> list[tuple]:
    from tkg.pipeline import store

    with store.open_catalog(result.snapshot) as con:
        return sorted(con.execute(sql).fetchall())


def _stored_pairs(result) -> list[tuple]:
    import pyarrow.parquet as pq
    from tkg.pipeline import store
    from tkg.pipeline.stages.common import INTERNAL_PAIRS

    files = store.table_files(result.snapshot, INTERNAL_PAIRS)
    return _sorted(pa.concat_tables([pq.read_table(f) for f in files]))


def _recomputed_blocks(result) -> int | None:
    import json
    from pathlib import Path

    folder = Path(result.summary["store"]) / "work" / result.summary["run_id"] / "resolve"
    return json.loads((folder / "_SUCCESS.json").read_text())["counters"].get(
        "resolve_blocks_recomputed")


def test_a_later_run_resolves_without_gathering_the_store(ray_session, config, tmp_path,
                                                          monkeypatch):
    """A later run's resolution gathers nothing into the driver: the stored pairs and every
    name's block keys stay datasets. In the driver (small data, `ray.driver_mb`) and on Ray
    Data throughout (`ray.driver_mb` 0) it publishes the same tables, and the pairs of one
    run over everything."""
    import sys

    from tkg.pipeline import engine
    from tkg.pipeline.build import build
    from tkg.pipeline.stages import resolve as resolve_stage

    gathers: list[tuple[str, str]] = []  # (calling module, what)
    real_gather = engine.gather

    def recorded(*args, **kwargs):
        gathers.append((sys._getframe(1).f_globals["__name__"], kwargs.get("what", "rows")))
        return real_gather(*args, **kwargs)

    monkeypatch.setattr(engine, "gather", recorded)
    on_ray = config.model_copy(update={"ray": config.ray.model_copy(update={"driver_mb": 0})})
    later = {}
    for name, settings in (("driver", config), ("ray", on_ray)):
        build(config, [_write(tmp_path / f"{name}-1", FIRST)], tmp_path / name, run_id="a")
        later[name] = build(settings, [_write(tmp_path / f"{name}-2", LATER)],
                            tmp_path / name, run_id="b")
    whole = build(config, [_write(tmp_path / "all", FIRST + LATER)], tmp_path / "whole",
                  run_id="all")
    assert [what for module, what in gathers if module == resolve_stage.__name__] == []
    assert not {"stored pairs", "blocking keys"} & {what for _, what in gathers}
    assert _recomputed_blocks(later["driver"]) == _recomputed_blocks(later["ray"]) > 0
    assert _stored_pairs(later["driver"]) == _stored_pairs(later["ray"]) == _stored_pairs(
        whole)
    for sql in ("SELECT entity_id, name FROM entities",
                "SELECT alias, entity_id, merged_entity_id FROM entity_aliases"):
        assert _published(later["driver"], sql) == _published(later["ray"], sql) == \
            _published(whole, sql)
