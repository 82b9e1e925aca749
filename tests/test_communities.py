"""Communities: pure unit tests on hand-built Arrow tables, and the sample corpus (the
session `corpus_build`, which runs the communities stage; no extra Ray build here)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from tkg.pipeline import communities as C
from tkg.pipeline import schema
from tkg.pipeline.config import CommunitiesConfig, TkgConfig

TS = pa.timestamp("us", tz="UTC")
NOW = datetime(2024, 11, 1, tzinfo=UTC)
CONFIG = CommunitiesConfig()


def tables(edges: list[tuple[str, str]], *, names: dict[str, str] | None = None,
           extra: list[str] = (), invalid: set[tuple[str, str]] = frozenset(),
           mentions: dict[str, list[str]] | None = None) -> dict[str, pa.Table]:
    """Entities (every endpoint plus `extra`), one current fact per edge, mentions."""
    ids = sorted({e for pair in edges for e in pair} | set(extra))
    names = names or {}
    entities = pa.table({"entity_id": ids, "name": [names.get(i, i.title()) for i in ids],
                         "mention_count": [1] * len(ids)})
    n = len(edges)
    facts = pa.table({
        "source_entity_id": pa.array([a for a, _ in edges], pa.string()),
        "target_entity_id": pa.array([b for _, b in edges], pa.string()),
        "fact": pa.array([f"{names.get(a, a)} works with {names.get(b, b)}" for a, b in edges],
                         pa.string()),
        "episode_ids": pa.array([["ep"]] * n, pa.list_(pa.string())),
        "expired_at": pa.nulls(n, TS),
        "invalid_at": pa.array([NOW if e in invalid else None for e in edges], TS),
    })
    rows = [(ep, e) for ep, ents in (mentions or {}).items() for e in ents]
    mention_table = pa.table({"episode_id": pa.array([r[0] for r in rows], pa.string()),
                              "entity_id": pa.array([r[1] for r in rows], pa.string())})
    return {"entities": entities, "facts": facts, "mentions": mention_table}


def graph_of(t: dict[str, pa.Table], config: CommunitiesConfig = CONFIG) -> C.Graph:
    return C.build_graph("g", t["entities"], t["facts"], t["mentions"], config)


def clique(prefix: str, size: int) -> list[tuple[str, str]]:
    return [(f"{prefix}{i}", f"{prefix}{j}") for i in range(size) for j in range(i + 1, size)]


def partition(result: C.GroupResult) -> dict[str, str]:
    """entity -> community id"""
    return {e: row["community_id"] for row in result.rows.to_pylist() for e in row["members"]}


def refresh(graph: C.Graph, previous: C.Previous | None = None) -> C.GroupResult:
    return C.group_communities(graph, previous or C.Previous.empty(), CONFIG, NOW, "refresh")


def as_previous(result: C.GroupResult) -> C.Previous:
    return C.Previous(result.rows, C.member_rows(result.rows))


# --- graph --------------------------------------------------------------------------------


def test_graph_weights_facts_invalidated_and_comentions():
    t = tables([("a", "b"), ("b", "a"), ("b", "c"), ("c", "c")], invalid={("b", "c")},
               extra=["z"], mentions={"e1": ["a", "c", "a"], "e2": ["a", "c"]})
    g = graph_of(t)
    edges = {(g.entity_ids[int(lo)].as_py(), g.entity_ids[int(hi)].as_py()): w
             for lo, hi, w in zip(g.lo, g.hi, g.weight, strict=True)}
    # two facts a-b (either direction); b-c invalidated: half; a-c two co-mentioning
    # episodes (a repeated in e1 counts once); the self-loop c-c is no edge.
    assert edges == {("a", "b"): 2.0, ("b", "c"): 0.5, ("a", "c"): 0.5}
    assert g.n == 4  # a, b, c and the isolated z


def test_expired_versions_and_foreign_endpoints_are_ignored():
    t = tables([("a", "b"), ("a", "c")])
    facts = t["facts"]
    expired = pa.array([None, NOW], TS)
    t["facts"] = facts.set_column(facts.schema.get_field_index("expired_at"), "expired_at",
                                  expired)
    t["entities"] = t["entities"].filter(pa.array([True, True, True]))
    g = graph_of(t)
    assert len(g.weight) == 1 and g.weight[0] == 1.0
    t2 = tables([("a", "b"), ("a", "x")])
    t2["entities"] = t2["entities"].filter(pa.array([i != "x" for i in ["a", "b", "x"]]))
    assert len(graph_of(t2).weight) == 1  # a fact to an entity of no group's table


def test_comention_cap_skips_rosters():
    config = CommunitiesConfig(max_comention_entities=3)
    t = tables([], extra=list("abcd"), mentions={"roster": list("abcd"), "pair": ["a", "b"]})
    g = graph_of(t, config)
    assert len(g.weight) == 1 and g.weight[0] == config.comention_weight


# --- label propagation, ids, min size -----------------------------------------------------


def test_two_cliques_and_a_singleton():
    edges = [*clique("a", 5), *clique("b", 5), ("a0", "b0")]
    result = refresh(graph_of(tables(edges, extra=["lonely"])))
    members = sorted(sorted(r["members"]) for r in result.rows.to_pylist())
    assert members == [[f"a{i}" for i in range(5)], [f"b{i}" for i in range(5)]]
    assert "lonely" not in partition(result)  # below min_size: no community
    assert result.rows["size"].to_pylist() == [5, 5]


def test_rerun_is_identical():
    rng = np.random.default_rng(7)
    edges = [*clique("a", 6), *clique("b", 6), *clique("c", 4)]
    edges += [(f"a{rng.integers(6)}", f"b{rng.integers(6)}") for _ in range(3)]
    t = tables(edges)
    first, second = refresh(graph_of(t)), refresh(graph_of(t))
    assert first.rows.equals(second.rows)


def test_ids_persist_when_membership_mostly_persists():
    before = refresh(graph_of(tables([*clique("a", 5), *clique("b", 5)])))
    # a4 leaves its clique and joins b's; a new entity joins a's.
    moved = [e for e in clique("a", 5) if "a4" not in e] + [("a9", f"a{i}") for i in range(4)]
    after = refresh(graph_of(tables([*moved, *clique("b", 5),
                                     *[("a4", f"b{i}") for i in range(5)]])),
                    as_previous(before))
    old, new = partition(before), partition(after)
    assert new["a0"] == old["a0"] and new["b0"] == old["b0"]
    assert new["a4"] == old["b0"] and new["a9"] == old["a0"]
    created = dict(zip(after.rows["community_id"].to_pylist(),
                       after.rows["created_at"].to_pylist(), strict=True))
    assert created[old["a0"]] == NOW  # a kept id keeps its creation time


def test_unmatched_cluster_gets_a_fresh_id_from_its_smallest_member():
    result = refresh(graph_of(tables(clique("a", 3))))
    # stable_id("g", "community", "a0"), pinned: the id must not change between versions
    assert result.rows["community_id"].to_pylist() == ["225d3191-a73e-5fd3-88aa-86c65d120186"]


# --- dynamic extension --------------------------------------------------------------------


def test_extension_places_new_entities_where_a_refresh_would():
    """Two dense groups; new entities are tied to one of them by most of their weight (one
    via another new entity). Extension and a full refresh agree on every placement."""
    base = [*clique("a", 6), *clique("b", 6), ("a0", "b0")]
    before = refresh(graph_of(tables(base)))
    new_edges = [("n1", "a1"), ("n1", "a2"), ("n1", "a3"), ("n1", "b1"),
                 ("n2", "b2"), ("n2", "b3"), ("n2", "b4"),
                 ("n3", "n2"), ("n3", "b5"), ("n3", "b4")]
    graph = graph_of(tables([*base, *new_edges]))
    extended = C.group_communities(graph, as_previous(before), CONFIG, NOW, "extend")
    refreshed = refresh(graph, as_previous(before))
    placed = partition(extended)
    assert {e: placed[e] for e in ("n1", "n2", "n3")} == {
        "n1": partition(before)["a0"], "n2": partition(before)["b0"],
        "n3": partition(before)["b0"]}
    assert placed == partition(refreshed)
    assert extended.placed == 3 and sum(extended.rows["placed"].to_pylist()) == 3
    drift = C.drift(extended.assign, refreshed.assign)
    assert drift["nmi"] == 1.0 and drift["ari"] == 1.0


def test_extension_rounds_are_capped_and_unchanged_text_is_kept():
    before = refresh(graph_of(tables(clique("a", 4))))
    chain = [("a0", "c1"), ("c1", "c2"), ("c2", "c3")]
    graph = graph_of(tables([*clique("a", 4), *chain]))
    one_round = CommunitiesConfig(max_iterations=1)
    result = C.group_communities(graph, as_previous(before), one_round, NOW, "extend")
    assert sorted(partition(result)) == ["a0", "a1", "a2", "a3", "c1"]
    assert C.group_communities(graph, as_previous(before), CONFIG, NOW, "extend").placed == 3
    untouched = C.group_communities(graph_of(tables(clique("a", 4))), as_previous(before),
                                    CONFIG, NOW, "extend")
    assert untouched.rows.select(["name", "summary"]).equals(
        before.rows.select(["name", "summary"]))


def test_extend_without_previous_communities_refreshes():
    graph = graph_of(tables(clique("a", 4)))
    extended = C.group_communities(graph, C.Previous.empty(), CONFIG, NOW, "extend")
    assert extended.rows.equals(refresh(graph).rows)


def test_stage_block_extends_previous_communities_per_group():
    """The stage's glue without Ray: every input as COMMUNITY_INPUT rows of two groups in one
    block, the previous snapshot's communities among them, extended group by group."""
    base = [*clique("a", 4), *clique("b", 4)]
    before = refresh(graph_of(tables(base)))
    now = tables([*base, ("n1", "a0"), ("n1", "a1")])

    def rows(group: str, table: pa.Table, kind: str) -> pa.Table:
        table = table.append_column("group_id", pa.array([group] * table.num_rows, pa.string()))
        return C.input_rows(table, kind)

    previous_rows = before.rows.set_column(1, "group_id", pa.array(["g"] * 2, pa.string()))
    block = pa.concat_tables([
        *(rows(group, now["entities"], "entity") for group in ("g", "h")),
        *(rows(group, now["facts"], "fact") for group in ("g", "h")),
        rows("g", C.member_rows(previous_rows).drop_columns(["group_id"]), "member"),
        rows("g", previous_rows.drop_columns(["group_id"]), "community"),
    ])
    out = C.community_block(block, TkgConfig(), NOW, "extend")
    by_group = {g: out.filter(pc.equal(out["group_id"], g)) for g in ("g", "h")}
    assert sum(by_group["g"]["placed"].to_pylist()) == 1  # n1 joined a's community
    assert by_group["g"]["community_id"].to_pylist() == before.rows["community_id"].to_pylist()
    assert sum(by_group["h"]["placed"].to_pylist()) == 0  # no previous: refreshed
    assert sorted(map(sorted, by_group["h"]["members"].to_pylist())) == [
        ["a0", "a1", "a2", "a3", "n1"], ["b0", "b1", "b2", "b3"]]


def test_stage_block_summaries_do_not_depend_on_the_order_rows_arrive():
    """A shuffle delivers a group's rows in any order; facts that tie on every ranking key
    (all current, one episode each) are chosen for the key facts by edge id, so the
    summaries come out the same whatever the order (they once followed arrival order)."""
    t = tables(clique("a", 6))
    facts = t["facts"].append_column(
        "edge_id", pa.array([f"e{i:02d}" for i in range(t["facts"].num_rows)], pa.string()))

    def block(order: slice) -> pa.Table:
        parts = [C.input_rows(table.append_column(
                     "group_id", pa.array(["g"] * table.num_rows, pa.string())), kind)
                 for table, kind in ((t["entities"], "entity"), (facts, "fact"))]
        return pa.concat_tables(parts).take(pa.array(list(range(sum(
            p.num_rows for p in parts)))[order]))

    config = TkgConfig(communities=CommunitiesConfig(summary_facts=3))
    summaries = [C.community_block(block(order), config, NOW, "refresh")["summary"].to_pylist()
                 for order in (slice(None), slice(None, None, -1))]
    assert summaries[0] == summaries[1]


# --- drift --------------------------------------------------------------------------------


def test_partition_scores_match_scikit_learn():
    rng = np.random.default_rng(3)
    for _ in range(5):
        a, b = rng.integers(0, 6, 200), rng.integers(0, 4, 200)
        b[:120] = a[:120]
        assert C.adjusted_rand_index(a, b) == pytest.approx(adjusted_rand_score(a, b))
        assert C.normalized_mutual_info(a, b) == pytest.approx(
            normalized_mutual_info_score(a, b))
    assert C.adjusted_rand_index(np.arange(5), np.arange(5) + 7) == 1.0


# --- names and summaries ------------------------------------------------------------------


def test_extractive_name_and_summary():
    names = {"r": "Robert Kim", "g": "Globex Corporation", "m": "Maria Lopez",
             "t": "Ticket T-17", "i": "Initech Inc.", "k": "Kevin Brooks", "f": "Finance"}
    edges = [("r", "g"), ("m", "g"), ("t", "g"), ("r", "t"), ("m", "r"),
             ("k", "i"), ("f", "i"), ("k", "f")]
    result = refresh(graph_of(tables(edges, names=names)))
    rows = {tuple(sorted(r["members"])): r for r in result.rows.to_pylist()}
    globex = rows[("g", "m", "r", "t")]
    # the most distinctive terms, each shown as the most central member name holding it
    # (Maria Lopez and Ticket T-17 are equally central: the term order breaks the tie)
    assert globex["name"] == "Globex Corporation, Robert Kim, Maria Lopez"
    assert globex["summary"].startswith("4 members, most central: Globex Corporation, Robert Kim")
    assert "Key facts: Robert Kim works with Globex Corporation." in globex["summary"]
    assert sorted(rows[("f", "i", "k")]["name"].split(", ")) == [
        "Finance", "Initech Inc.", "Kevin Brooks"]


def test_distinctive_terms_prefer_terms_of_one_community():
    def doc(*names: str) -> list[tuple[str, float, bool]]:
        return [(n, 1.0, True) for n in names] + [("Acme sells seats", 1.0, False)]

    top = C.distinctive_terms([doc("Globex", "Acme Sales"), doc("Initech Inc.", "Acme Sales")],
                              2)
    # "globex" / "initech" are in one community each; "acme" in both but said twice in each
    # (a name and the fact); "inc" is a legal suffix, "sales", "sells", "seats" said once.
    assert top == [["Globex", "Acme Sales"], ["Initech Inc.", "Acme Sales"]]


def test_member_rows_flatten():
    result = refresh(graph_of(tables(clique("a", 3))))
    members = C.member_rows(result.rows)
    assert members.schema == schema.COMMUNITY_MEMBERS
    assert members["entity_id"].to_pylist() == ["a0", "a1", "a2"]


# --- the sample corpus (built once per session, with the communities stage) --------------


def community_of(db, group: str) -> dict[str, str]:
    rows = db.execute(
        "SELECT e.name, m.community_id FROM community_members m "
        "JOIN entities e USING (entity_id, group_id) WHERE m.group_id = ?", [group]).fetchall()
    return dict(rows)


def test_corpus_storylines_come_out_as_communities(corpus_db):
    """tests/corpus/EXPECTED.md: in acme, each customer account is a storyline with its own
    people (Globex: its CTO Robert Kim, ticket T-17 and Sam Patel, who owns it; Initech: Kevin
    Brooks and account owner Alice Chen; Hooli: Priya Nair and Daniel Okafor, who owns the
    rollout; Massive Dynamic: Nina Sharp, records only); household is one family."""
    acme = community_of(corpus_db, "acme")
    globex = {acme[n] for n in ("Globex Corporation", "Robert Kim", "Ticket T-17", "Sam Patel")}
    initech = {acme[n] for n in ("Initech Inc.", "Kevin Brooks", "Alice Chen")}
    hooli = {acme[n] for n in ("Hooli", "Priya Nair", "Daniel Okafor")}
    massive = {acme[n] for n in ("Massive Dynamic", "Nina Sharp")}
    assert all(len(c) == 1 for c in (globex, initech, hooli, massive))
    assert len(globex | initech | hooli | massive) == 4  # four distinct accounts
    household = community_of(corpus_db, "household")
    assert len({household[n] for n in ("Tom Walker", "Alice Walker", "Helen Walker",
                                       "Mark Walker", "Riverside Elementary")}) == 1
    names = dict(corpus_db.execute(
        "SELECT community_id, name FROM communities WHERE group_id = 'acme'").fetchall())
    assert names[acme["Globex Corporation"]].startswith("Globex Corporation")
    assert names[acme["Initech Inc."]].startswith("Initech Inc.")


def test_corpus_communities_are_consistent_and_within_their_group(corpus_build, corpus_db):
    bad = corpus_db.execute("""
        SELECT count(*) FROM community_members m
        JOIN communities c USING (community_id)
        LEFT JOIN entities e ON e.entity_id = m.entity_id AND e.group_id = m.group_id
        WHERE e.entity_id IS NULL OR c.group_id <> m.group_id""").fetchone()[0]
    assert bad == 0  # every member is an entity of the community's own group
    sizes = corpus_db.execute("""
        SELECT c.size, count(m.entity_id) FROM communities c
        JOIN community_members m USING (community_id) GROUP BY c.community_id, c.size
        """).fetchall()
    assert sizes and all(size == members >= CONFIG.min_size for size, members in sizes)
    assert corpus_db.execute("SELECT count(*) - count(DISTINCT entity_id) "
                             "FROM community_members").fetchone()[0] == 0
    summary = corpus_build.summary
    assert summary["communities"] == len(sizes) and summary["communities_extended"] == 0
    vectors = corpus_db.execute("SELECT count(*) FROM communities "
                                "WHERE name_embedding IS NULL OR name = ''").fetchone()[0]
    assert vectors == 0  # every name embedded (searchable)


def test_refresh_drift_from_the_tables_is_that_of_the_computed_partitions():
    """`refresh_drift` reads the partitions off the before and after tables; its figures are
    those of the assignments label propagation computed, per group and over all, exactly."""
    before = refresh(graph_of(tables([*clique("a", 5), *clique("b", 5)])))
    moved = [e for e in clique("a", 5) if "a4" not in e] + [("a9", f"a{i}") for i in range(4)]
    now = {"g": tables([*moved, *clique("b", 5), *[("a4", f"b{i}") for i in range(5)]]),
           "h": tables(clique("c", 4))}
    results = {
        "g": refresh(graph_of(now["g"]), as_previous(before)),
        "h": refresh(C.build_graph("h", now["h"]["entities"], now["h"]["facts"],
                                   now["h"]["mentions"], CONFIG)),  # nothing before
    }
    entities = pa.concat_tables([
        t["entities"].select(["entity_id"]).append_column(
            "group_id", pa.array([g] * t["entities"].num_rows, pa.string()))
        for g, t in now.items()])
    after = pa.concat_tables([r.rows for r in results.values()])
    report = C.refresh_drift(entities, (before.rows, C.member_rows(before.rows)),
                             (after, C.member_rows(after)))
    offset = np.array([0, results["g"].graph.n])
    shifted = {name: np.concatenate([np.where(getattr(r, name) >= 0, getattr(r, name) + o, -1)
                                     for r, o in zip(results.values(), offset, strict=True)])
               for name in ("previous_assign", "assign")}
    assert report == {
        "groups": {g: {"communities_before": before.rows.num_rows if g == "g" else 0,
                       "communities": r.rows.num_rows, **C.drift(r.previous_assign, r.assign)}
                   for g, r in results.items()},
        "overall": C.drift(shifted["previous_assign"], shifted["assign"])}
    assert report["groups"]["g"]["nmi"] < 1.0 and report["groups"]["h"]["nmi"] is None


def test_corpus_refresh_gives_identical_communities(corpus_build, tmp_path):
    """The refresh (the communities stage's full run over the published tables) gives the
    build's communities exactly: same ids, members, names and summaries; no drift. Twice:
    a refresh of a refreshed snapshot too."""
    import shutil

    from tkg.jobs.refresh_communities import refresh_store

    copy = tmp_path / "store"
    shutil.copytree(corpus_build.snapshot.parents[1], copy, copy_function=os.link,
                    ignore=shutil.ignore_patterns("work"))
    columns = ["community_id", "group_id", "name", "summary", "size"]

    def published(snapshot: Path, table: str, columns: list[str]) -> pa.Table:
        files = sorted(snapshot.glob(f"{table}/**/*.parquet"))
        return pa.concat_tables(pq.read_table(f, columns=columns, partitioning=None)
                                for f in files).sort_by(columns[0])

    built = corpus_build.snapshot
    for run in ("refresh-1", "refresh-2"):
        summary = refresh_store(copy, run_id=run)
        assert summary["drift"]["nmi"] == 1.0 and summary["drift"]["ari"] == 1.0
        snapshot = copy / "snapshots" / run
        assert published(snapshot, "communities", columns).equals(
            published(built, "communities", columns))
        members = ["community_id", "entity_id", "group_id"]
        assert sorted(published(snapshot, "community_members", members).to_pylist(),
                      key=str) == sorted(published(built, "community_members", members
                                                   ).to_pylist(), key=str)


def test_refresh_job_publishes_a_new_snapshot(corpus_build, tmp_path):
    """`tkg communities refresh` on a copy of the corpus store: a new snapshot, the other
    tables hard-linked, the same communities (nothing drifted), CURRENT switched."""
    import shutil

    from tkg.jobs.cli import main
    from tkg.pipeline import store

    copy = tmp_path / "store"
    shutil.copytree(corpus_build.snapshot.parents[1], copy, copy_function=os.link,
                    ignore=shutil.ignore_patterns("work"))
    old = store.current_snapshot(copy)
    assert main(["communities", "refresh", "--store", str(copy), "--run-id", "refresh-1",
                 "--json"]) == 0
    new = store.current_snapshot(copy)
    assert new.name == "refresh-1" and store.read_manifest(new)["refreshed_from"] == old.name
    summary = store.read_manifest(new)["summary"]
    assert summary["drift"]["nmi"] == 1.0 and summary["drift"]["ari"] == 1.0
    assert summary["communities"] == corpus_build.summary["communities"]
    # the refresh keeps the facts: its manifest references the old snapshot's files
    old_facts = store.read_manifest(old)["files"]["facts"]
    assert store.read_manifest(new)["files"]["facts"] == [
        f"../{old.name}/{path}" for path in old_facts if not path.endswith(store.EMPTY_PART)]
    assert not (new / "facts").exists()
    with store.connect(copy) as con:
        refreshed = sorted(con.execute("SELECT community_id, name, size FROM communities"
                                       ).fetchall())
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    with store.connect(corpus_build.snapshot.parents[1]) as con:
        assert refreshed == sorted(con.execute("SELECT community_id, name, size "
                                               "FROM communities").fetchall())
