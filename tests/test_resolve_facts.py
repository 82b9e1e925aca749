from collections import Counter
from datetime import UTC, datetime

import pyarrow as pa
from tkg.pipeline import schema
from tkg.pipeline.config import FactsConfig
from tkg.pipeline.facts import fact_mentions, fact_rows, merge_facts
from tkg.pipeline.resolve import (
    alias_rows,
    episode_mentions,
    mention_rows,
    normalize_name,
    resolve_entities,
)

T1 = datetime(2024, 1, 1, tzinfo=UTC)
T2 = datetime(2024, 6, 1, tzinfo=UTC)


def extraction(episode_id, group_id, valid_at, entities, facts=()):
    return {"episode_id": episode_id, "group_id": group_id, "valid_at": valid_at,
            "entities": [{"name": n, "label": lab, "attributes": None} for n, lab in entities],
            "facts": [dict(zip(("source", "target", "relation", "fact"), f, strict=True),
                           valid_at=None, invalid_at=None, date_text=None) for f in facts],
            "error": None, "raw_output": None}


def test_normalize_name():
    assert normalize_name("  The  Globex ") == "globex"
    assert normalize_name("GLOBEX") == normalize_name("globex")
    assert normalize_name("Initech Inc.") == "initech inc"
    assert normalize_name("São José") == "são josé"
    assert normalize_name("A.B. Corp") != ""


def canonical_name(names: Counter[str]) -> str:
    """The name resolve_entities gives one entity whose mentions use these surface forms."""
    rows = [{"group_id": "g", "episode_id": f"e{i}-{n}", "valid_at": T1, "name": n,
             "label": "Person", "attributes": None, "normalized": normalize_name(n),
             "entity_id": "one", "root": "root", "evidence": "exact", "score": 1.0}
            for n, count in names.items() for i in range(count)]
    return resolve_entities(pa.Table.from_pylist(rows), T2)["name"].to_pylist()[0]


def test_canonical_name_is_deterministic():
    assert canonical_name(Counter({"globex": 1, "Globex": 3})) == "Globex"
    assert canonical_name(Counter({"Bo": 2, "Bob": 2})) == "Bob"
    assert canonical_name(Counter({"Abc": 1, "Abd": 1})) == "Abc"


def test_exact_resolution_merges_surface_forms_within_a_group():
    table = schema.from_rows([
        extraction("e1", "g", T1, [("Maria Lopez", "Person"), ("Globex", "Product")]),
        extraction("e2", "g", T2, [("maria lopez", "Person"), ("Globex", "Organization")]),
        extraction("e3", "h", T2, [("Maria Lopez", "Person")]),
    ], schema.EXTRACTIONS)
    mentions = mention_rows(table)
    resolved = resolve_entities(mentions, T2)
    entities = {(r["group_id"], r["normalized"]): r for r in resolved.to_pylist()}
    assert len(entities) == 3
    maria = entities[("g", "maria lopez")]
    assert maria["mention_count"] == 2
    assert maria["first_seen"] == T1 and maria["last_seen"] == T2
    assert maria["aliases"] == ["Maria Lopez", "maria lopez"]
    assert entities[("g", "globex")]["labels"] == ["Organization", "Product"]
    assert entities[("h", "maria lopez")]["entity_id"] != maria["entity_id"]
    aliases = alias_rows(resolved)
    assert set(aliases["evidence"].to_pylist()) == {"exact"}
    ids = {(r["group_id"], r["normalized"]): r["entity_id"] for r in resolved.to_pylist()}
    mapped = mentions.append_column("entity_id", pa.array(
        [ids[(g, n)] for g, n in zip(mentions["group_id"].to_pylist(),
                                     mentions["normalized"].to_pylist(), strict=True)]))
    assert episode_mentions(mapped).num_rows == 5


def test_same_fact_in_other_words_is_one_edge_with_both_episodes():
    table = schema.from_rows([
        extraction("e1", "g", T1, [("Ana", "Person"), ("Porto", "Location")],
                   [("Ana", "Porto", "LIVE_IN", "Ana lives in Porto.")]),
        extraction("e2", "g", T2, [("Ana", "Person"), ("Porto", "Location")],
                   [("ana", "Porto", "MOVE_TO", "Ana moved to Porto")]),
        extraction("e3", "g", T2, [("Ana", "Person"), ("Porto", "Location")],
                   [("Ana", "Porto", "WORK_IN", "Ana works in Porto.")]),
    ], schema.EXTRACTIONS)
    mentions = fact_mentions(table)
    assert mentions["source_normalized"].to_pylist() == ["ana"] * 3
    resolved = mentions.append_column(
        "source_entity_id", pa.array(["ana-id"] * 3)).append_column(
        "target_entity_id", pa.array(["porto-id"] * 3))
    rows = fact_rows(resolved, FactsConfig())
    assert rows["relation"].to_pylist() == ["LIVES_IN", "LIVES_IN", "WORK_IN"]
    assert len(set(rows["edge_id"].to_pylist())) == 2
    edges = {e["relation"]: e for e in merge_facts(rows, T2).to_pylist()}
    edge = edges["LIVES_IN"]
    assert edge["episode_ids"] == ["e1", "e2"]
    assert edge["valid_at"] == T1  # no date in the text: the earliest episode's time
    assert edge["fact"] == "Ana lives in Porto."
    assert edge["version"] == 1 and edge["expired_at"] is None
    assert edge["source_entity_id"] == "ana-id"


def _fact_rows_row_by_row(mentions: pa.Table, config: FactsConfig) -> pa.Table:
    """`facts.fact_rows` as it was written, a dict per row: what the columnar one must
    equal."""
    from tkg.pipeline.facts import claim_key, relation_class

    rows = []
    for row in mentions.to_pylist():
        source, target = row["source_entity_id"], row["target_entity_id"]
        if source == target and row.get("source_normalized") != row.get("target_normalized"):
            continue
        relation, cls, _ = relation_class(row["relation"], config)
        claim = claim_key(row["fact"]) if source == target and cls is None else None
        rows.append({
            "edge_id": schema.stable_id(row["group_id"], "fact", source, target, relation,
                                        *([claim] if claim else [])),
            "group_id": row["group_id"], "episode_id": row["episode_id"],
            "source_entity_id": source, "target_entity_id": target, "relation": relation,
            "fact": row["fact"], "valid_at": row["valid_at"], "invalid_at": row["invalid_at"],
            "target_key": row.get("target_key"),
        })
    return pa.Table.from_pylist(rows, schema=schema.FACT_ROWS)


def test_fact_rows_by_columns_equal_the_rows_one_by_one():
    """Self-loops resolution made are dropped, a fact said of one entity is keyed by its
    statement, relations are classed (synonyms, negations, endings), nulls of a name
    compare as Python's `==` does, and a block without rows (or columns) gives none."""
    config = FactsConfig()
    cases = [  # (source id, target id, source name, target name, relation, text)
        ("ana", "porto", "ana", "porto", "LIVE_IN", "Ana lives in Porto."),
        ("ana", "porto", "ana", "porto", "MOVE_TO", "Ana moved to Porto"),
        ("ana", "porto", "ana", "porto", "NOT_LIVE_IN", "Ana no longer lives in Porto"),
        ("ana", "porto", "ana", "porto", "LEAVE", "Ana left Porto"),
        ("ana", "ana", "ana", "ana maria", "IS", "Ana is Ana Maria"),  # made one: dropped
        ("ana", "ana", "ana", "ana", "CREATE", "Ana creates  a daily schedule."),
        ("ana", "ana", "ana", "ana", "CREATE", "ana creates a daily schedule"),
        ("ana", "ana", "ana", "ana", "LIVE_IN", "Ana lives in Ana"),  # classed: no claim
        ("ana", "ana", None, None, "SAY", "Ana says hi"),  # null names: equal
        ("ana", "ana", "ana", None, "SAY", "Ana says so"),  # a null and a name: dropped
        ("bob", "globex", "bob", "globex", "WORK_AT", "Bob works at Globex"),
    ]
    mentions = pa.table({
        "group_id": ["g"] * len(cases), "episode_id": [f"e{i}" for i in range(len(cases))],
        "source_entity_id": [c[0] for c in cases], "target_entity_id": [c[1] for c in cases],
        "source_normalized": pa.array([c[2] for c in cases], pa.string()),
        "target_normalized": pa.array([c[3] for c in cases], pa.string()),
        "relation": [c[4] for c in cases], "fact": [c[5] for c in cases],
        "valid_at": pa.array([T1] * len(cases), schema.TS),
        "invalid_at": pa.array([None] * len(cases), schema.TS),
        "target_key": pa.array([None, "EMP-2", *[None] * (len(cases) - 2)], pa.string())})
    expected = _fact_rows_row_by_row(mentions, config)
    assert fact_rows(mentions, config).equals(expected)
    assert expected.num_rows == len(cases) - 2
    unnamed = mentions.drop_columns(["source_normalized", "target_normalized", "target_key"])
    assert fact_rows(unnamed, config).equals(_fact_rows_row_by_row(unnamed, config))
    assert fact_rows(pa.table({}), config).equals(schema.FACT_ROWS.empty_table())


def test_merged_facts_by_columns_equal_the_edges_one_by_one():
    """`merge_facts` gives each edge what `merge_edge` gives its rows (the text that says
    the relation, then the longest, then the first in code point order; the earliest
    start and end; every episode once, in order), edges in id order; none of no rows."""
    from tkg.pipeline.facts import merge_edge

    texts = ["Ana lives in Porto.", "Ana moved to Porto", "Ana lived in Porto for years",
             "Ana's home is Porto", "Ana lives in Porto!", "Zé lives in Porto", "Ana mora"]
    rows = pa.table({
        "edge_id": ["b", "a", "b", "b", "a", "c", "b"],
        "group_id": ["g"] * 7, "episode_id": ["e3", "e1", "e2", "e3", "e9", "e4", "e0"],
        "source_entity_id": ["s"] * 7, "target_entity_id": ["t"] * 7,
        "relation": ["LIVES_IN", "MOVE_TO", "LIVES_IN", "LIVES_IN", "MOVE_TO", "LIVES_IN",
                     "LIVES_IN"], "fact": texts,
        "valid_at": pa.array([T2, None, T1, None, None, None, T2], schema.TS),
        "invalid_at": pa.array([None, T2, None, T2, T1, None, None], schema.TS),
        "target_key": pa.array([None] * 7, pa.string())})
    by_edge: dict[str, list[dict]] = {}
    for row in rows.to_pylist():
        by_edge.setdefault(row["edge_id"], []).append(row)
    expected = pa.Table.from_pylist([merge_edge(found, T2) for _, found in
                                     sorted(by_edge.items())], schema=schema.MERGED_FACTS)
    assert merge_facts(rows, T2).equals(expected)
    assert merge_facts(rows.slice(0, 0), T2).num_rows == 0
    assert merge_facts(pa.table({}), T2).equals(schema.MERGED_FACTS.empty_table())


def test_entity_summaries_list_the_best_attested_facts_that_still_hold():
    from tkg.pipeline.facts import entity_summaries, summary_sources

    t = datetime(2024, 1, 1, tzinfo=UTC)
    edges = pa.Table.from_pylist([
        {"edge_id": "e1", "group_id": "g", "source_entity_id": "dan", "target_entity_id": "globex",
         "fact": "Dan works at Globex", "episode_ids": ["x", "y"], "valid_at": t,
         "invalid_at": None},
        {"edge_id": "e2", "group_id": "g", "source_entity_id": "dan", "target_entity_id": "berlin",
         "fact": "Dan lived in Berlin.", "episode_ids": ["x"], "valid_at": t, "invalid_at": t},
        {"edge_id": "e3", "group_id": "g", "source_entity_id": "dan", "target_entity_id": "tea",
         "fact": "Dan likes tea.", "episode_ids": ["z"], "valid_at": None, "invalid_at": None},
    ], schema=schema.MERGED_FACTS)
    summaries = {r["entity_id"]: r["summary"] for r in
                 entity_summaries(summary_sources(edges), 3).to_pylist()}
    assert summaries["dan"] == "Dan works at Globex. Dan likes tea."
    assert summaries["globex"] == "Dan works at Globex."
    assert "berlin" not in summaries  # only facts that still hold


def test_entity_summaries_do_not_depend_on_the_order_facts_arrive():
    """Two facts with one text rank by the better attested of them, whichever arrives first
    (a shuffle delivers them in any order)."""
    from tkg.pipeline.facts import entity_summaries, summary_sources

    t = datetime(2024, 1, 1, tzinfo=UTC)

    def edge(edge_id: str, target: str, fact: str, episodes: list[str]) -> dict:
        return {"edge_id": edge_id, "group_id": "g", "source_entity_id": "dan",
                "target_entity_id": target, "fact": fact, "episode_ids": episodes,
                "valid_at": t, "invalid_at": None}

    rows = [edge("e1", "pm", "Dan is the new PM.", ["a"]),
            edge("e2", "acme", "Dan works at Acme.", ["a", "b"]),
            edge("e3", "pm2", "Dan is the new PM.", ["a", "b", "c"])]
    got = [entity_summaries(summary_sources(pa.Table.from_pylist(
               order, schema=schema.MERGED_FACTS)), 1).to_pylist()
           for order in (rows, rows[::-1])]
    assert got[0] == got[1]
    assert {r["entity_id"]: r["summary"] for r in got[0]}["dan"] == "Dan is the new PM."


def test_an_entity_keeps_its_strongest_label():
    """One label per entity by evidence: a company spaCy once tagged a place stays an
    organisation; of equal counts the latest wins; a generic label only when nothing else."""
    def labels_of(tagged: list[tuple[datetime, str]]) -> list[str]:
        rows = [{"group_id": "g", "episode_id": f"e{i}", "valid_at": when, "name": "Contoso",
                 "label": label, "attributes": None, "normalized": "contoso",
                 "entity_id": "contoso", "root": "contoso", "evidence": "exact", "score": 1.0}
                for i, (when, label) in enumerate(tagged)]
        return resolve_entities(pa.Table.from_pylist(rows), T2)["labels"].to_pylist()[0]

    assert labels_of([(T1, "Organization"), (T1, "Location"), (T2, "Organization"),
                      (T2, "Entity")]) == ["Organization"]
    assert labels_of([(T1, "Organization"), (T2, "Location")]) == ["Location"]
    assert labels_of([(T1, "Entity"), (T2, "Entity")]) == ["Entity"]


def test_changed_edges_are_the_new_ones_and_those_whose_belief_differs():
    """`changed_edges` keeps an edge the store lacks, or one whose stored open version
    differs in a versioned field (a null equal only to a null, a list to the same list),
    as comparing each pair field by field says."""
    from tkg.pipeline.facts import VERSIONED_FIELDS, changed_edges

    def same_belief(version: dict, current: dict) -> bool:
        return all(version[k] == current[k] for k in VERSIONED_FIELDS)

    def edge(edge_id: str, **given: object) -> dict:
        return {"edge_id": edge_id, "source_entity_id": "s", "target_entity_id": "t",
                "relation": "LIVES_IN", "fact": "s lives in t", "episode_ids": ["e1"],
                "valid_at": T1, "invalid_at": None, "invalidated_by": None, **given}

    stored = [edge("same"), edge("fact"), edge("ended"), edge("lists"), edge("nulls",
              episode_ids=None), edge("twice", fact="old"), edge("twice")]
    now = [edge("same"), edge("fact", fact="s moved to t"), edge("ended", invalid_at=T2),
           edge("lists", episode_ids=["e1", "e2"]), edge("nulls", episode_ids=[]),
           edge("twice"), edge("new")]
    table_schema = pa.schema([(name, pa.list_(pa.string()) if name == "episode_ids" else
                               pa.timestamp("us", tz="UTC") if name.endswith("_at")
                               else pa.string()) for name in ["edge_id", *VERSIONED_FIELDS]])
    got = changed_edges(pa.Table.from_pylist(now, schema=table_schema),
                        pa.Table.from_pylist(stored, schema=table_schema))
    before = {row["edge_id"]: row for row in stored}
    want = [row["edge_id"] for row in now
            if row["edge_id"] not in before or not same_belief(before[row["edge_id"]], row)]
    assert got["edge_id"].to_pylist() == want == ["fact", "ended", "lists", "nulls", "new"]
