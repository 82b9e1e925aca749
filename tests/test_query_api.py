"""`tkg.query.open` on a tiny hand-built store (no Ray): both timelines, tenancy, hostile input,
the JSON shape, snapshot switching, the context budget."""

from __future__ import annotations

import json
import shutil

import pytest
from tkg.query.search import Filters, make_scope, where
from tkg.query.snapshot import QueryError

from tests.query_store import T1, T2, build_store, eid

FACT_KEYS = ["edge_id", "fact", "relation", "source", "target", "valid_at", "invalid_at",
             "score", "episodes"]


@pytest.fixture(scope="module")
def embedder():
    from tkg.pipeline.config import TkgConfig
    from tkg.query.api import snapshot_embedder

    return snapshot_embedder({"config": TkgConfig().model_dump(), "embedding": {}})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, embedder):
    from tkg import query

    root = build_store(tmp_path_factory.mktemp("tiny-store"), embedder)
    return query.open(root)


def facts(result) -> dict[str, dict]:
    return {f.fact: f for f in result.facts}


def test_json_shape_is_exact(tiny):
    out = tiny.search("Where does Ana Silva live?", ["g1"], limit=5).to_dict()
    assert list(out) == ["facts", "entities", "communities", "episodes", "warnings"]
    assert out["warnings"] == []
    assert all(list(f) == FACT_KEYS for f in out["facts"])
    assert all(list(e) == ["entity_id", "name", "summary", "score"] for e in out["entities"])
    assert all(list(e) == ["episode_id", "source_id", "speaker", "content", "valid_at", "score"]
               for e in out["episodes"])
    assert out["communities"] == []
    json.dumps(out)  # plain JSON types only
    lisbon = next(f for f in out["facts"] if f["target"] == "Lisbon")
    assert lisbon == {**lisbon, "relation": "LIVES_IN", "source": "Ana Silva",
                      "valid_at": "2024-03-01T00:00:00+00:00", "invalid_at": None,
                      "episodes": ["m4"]}
    scores = [f["score"] for f in out["facts"]]
    assert scores == sorted(scores, reverse=True)


def test_as_of_before_and_after_the_move(tiny):
    before = facts(tiny.search("Where does Ana Silva live?", "g1", as_of="2024-02-01"))
    after = facts(tiny.search("Where does Ana Silva live?", "g1", as_of="2024-06-01"))
    now = facts(tiny.search("Where does Ana Silva live?", "g1"))
    assert "Ana Silva lives in Porto." in before
    assert "Ana Silva moved to Lisbon." not in before
    assert "Ana Silva moved to Lisbon." in after and "Ana Silva lives in Porto." not in after
    assert "Ana Silva lives in Porto." not in now
    assert before["Ana Silva lives in Porto."].invalid_at == "2024-03-01T00:00:00+00:00"


def test_known_at_returns_what_was_believed_then(tiny):
    between = T1.replace(month=3).isoformat()
    then = facts(tiny.search("Where does Ana Silva live?", "g1", known_at=between))
    assert then["Ana Silva lives in Porto."].invalid_at is None  # not yet corrected
    assert "Ana Silva moved to Lisbon." not in then  # not yet known
    assert [e.source_id for e in tiny.search("Lisbon", "g1", known_at=between).episodes
            if e.source_id == "m4"] == []
    before_anything = tiny.search("Ana Silva", "g1", known_at="2024-12-31")
    assert before_anything.to_dict() == {"facts": [], "entities": [], "communities": [],
                                         "episodes": [], "warnings": []}
    now = facts(tiny.search("Where does Ana Silva live?", "g1", known_at=T2.isoformat(),
                            as_of="2024-02-01"))
    assert now["Ana Silva lives in Porto."].invalid_at == "2024-03-01T00:00:00+00:00"


def _all_text(result) -> str:
    return json.dumps(result.to_dict())


@pytest.mark.parametrize("text", [
    "Secret Corp Nightingale",
    "' OR group_id = 'g2' --",
    'Nightingale" OR "1"="1',
    "text:Nightingale AND group_id:g2 (",
    "*", "", "   ", "\\", "Secret\x00Corp", "Nightingale~2^5 +Secret -Ana",
    "x" * 10_000,
])
def test_nothing_from_another_group_whatever_the_text(tiny, text):
    result = tiny.search(text, ["g1"], limit=20)
    dumped = _all_text(result)
    assert "Secret" not in dumped and "Nightingale" not in dumped
    assert "A different Ana" not in dumped


def test_the_other_tenant_sees_its_own_and_both_see_both(tiny):
    result = tiny.search("Ana Silva employer", ["g2"], limit=20)
    assert {f.fact for f in result.facts} == {"Ana Silva works at Secret Corp."}
    assert "Porto" not in _all_text(result) and "Initech" not in _all_text(result)
    both = tiny.search("Ana Silva works at", ["g1", "g2"], limit=20)
    assert {"Ana Silva works at Secret Corp.", "Ana Silva works at Initech."} <= set(facts(both))


@pytest.mark.parametrize("groups", [["g1' OR '1'='1"], ["g1", "g2)"], [""], ["g1\n"], [],
                                    ["a" * 129], [None]])
def test_invalid_group_ids_are_refused(tiny, groups):
    with pytest.raises(QueryError):
        tiny.search("Ana", groups)


def test_origins_and_centers_of_another_group_are_refused(tiny):
    with pytest.raises(QueryError, match="not an entity of the groups"):
        tiny.search("Ana", ["g1"], origins=[eid("g2", "Secret Corp")])
    with pytest.raises(QueryError, match="not an entity of the groups"):
        tiny.search("Ana", ["g1"], recipe="facts_node_distance", center=eid("g2", "Ana Silva"))


def test_bfs_from_given_origins_reaches_two_hops(tiny):
    result = tiny.search("colleague", ["g1"], recipe="combined_hybrid_rrf",
                         origins=[eid("g1", "Bruno Costa")], limit=10)
    # Bruno -> Initech (1 hop) -> Ana Silva (2 hops): Ana's employment fact is reached
    assert "Ana Silva works at Initech." in facts(result)


def test_node_distance_recipe_ranks_by_hops_from_center(tiny):
    result = tiny.search("works", ["g1"], recipe="facts_node_distance",
                         center=eid("g1", "Bruno Costa"))
    order = [f.fact for f in result.facts]
    assert order.index("Bruno Costa works at Initech.") < order.index(
        "Ana Silva works at Initech.")
    with pytest.raises(QueryError, match="center"):
        tiny.search("works", ["g1"], recipe="facts_node_distance")


@pytest.mark.parametrize("recipe", ["facts_hybrid_mmr", "facts_episode_mentions",
                                    "combined_cross_encoder", "entities_hybrid_rrf",
                                    "communities_hybrid_rrf", "episodes_flat_rrf"])
def test_every_recipe_runs_within_its_group(tiny, recipe):
    result = tiny.search("Where does Ana Silva work?", ["g1"], recipe=recipe)
    assert "Secret" not in _all_text(result)
    assert result.facts or result.entities or result.episodes or recipe.startswith("comm")


def test_filters_are_validated_and_applied(tiny):
    result = tiny.search("Ana Silva", ["g1"], filters=Filters(relations=("WORKS_AT",)))
    assert {f.relation for f in result.facts} == {"WORKS_AT"}
    with pytest.raises(QueryError):
        make_scope(["g1"], filters=Filters(relations=("WORKS_AT') OR ('1",)))
    with pytest.raises(QueryError):
        make_scope(["g1"], filters=Filters(labels=("Person'",)))
    with pytest.raises(QueryError, match="ISO-8601"):
        make_scope(["g1"], as_of="last tuesday")
    clause = where("facts", make_scope(["g1", "g2"], as_of="2024-01-01T00:00:00Z"))
    assert clause.startswith("group_id IN ('g1', 'g2') AND ")
    assert "valid_at_us <= 1704067200000000" in clause


def test_context_respects_the_budget_and_shows_date_ranges(tiny):
    text = tiny.context("Where does Ana Silva live?", ["g1"], as_of="2024-02-01")
    assert "Ana Silva lives in Porto. (Date range: 2024-01-05 - 2024-03-01)" in text
    assert "<EPISODES>" in text and "[m1, 2024-01-05] Ana Silva lives in Porto." in text
    now = tiny.context("Where does Ana Silva live?", ["g1"])
    assert "Ana Silva moved to Lisbon. (Date range: 2024-03-01 - present)" in now
    from tkg.query.context import tokens

    for budget in (60, 120, 400):
        small = tiny.context("Where does Ana Silva live?", ["g1"], max_tokens=budget)
        assert tokens(small) <= budget + 1


def test_a_new_snapshot_is_picked_up_without_reopening(tmp_path, embedder):
    from tkg.pipeline import store

    from tkg import query

    root = build_store(tmp_path / "s", embedder)
    retriever = query.open(root)
    assert retriever.snapshot().run_id == "tiny-1"
    first = retriever.snapshot()
    assert retriever.snapshot() is first  # unchanged CURRENT: nothing reopened
    shutil.copytree(root / "snapshots" / "tiny-1", root / "snapshots" / "tiny-2")
    manifest = store.read_manifest(root / "snapshots" / "tiny-2")
    store.write_manifest(root / "snapshots" / "tiny-2", {**manifest, "run_id": "tiny-2"})
    store.switch_current(root, "tiny-2")
    assert retriever.search("Ana", ["g1"]).run_id == "tiny-2"


def test_bfs_from_a_conversation_stays_in_its_groups(tiny):
    # g1's conversation mentions Ana Silva, Porto, Initech, Bruno Costa, Lisbon: their facts
    mine = tiny.search("anything", ["g1"], conversation_id="g1-c", recipe="entities_hybrid_rrf")
    assert {"Ana Silva", "Lisbon"} <= {e.name for e in mine.entities}
    # the other tenant's conversation id, asked from g1, seeds nothing of g2
    other = tiny.search("Nightingale", ["g1"], conversation_id="g2-c", limit=20)
    assert "Secret" not in _all_text(other) and "A different Ana" not in _all_text(other)


def test_label_filter(tiny):
    result = tiny.search("Ana Silva Initech Porto", ["g1"], recipe="entities_hybrid_rrf",
                         filters=Filters(labels=("Place",)))
    assert {e.name for e in result.entities} == {"Porto", "Lisbon"}  # BFS obeys it too


def test_cross_encoder_order_is_pinned(tiny):
    """The default cross-encoder (the bi-encoder second pass) through a whole search: the
    order and scores are pinned, and differ from RRF's (so a reranker that keeps the fused
    order fails)."""
    fused = tiny.search("Porto", ["g1"], recipe="combined_hybrid_rrf")
    result = tiny.search("Porto", ["g1"], recipe="combined_cross_encoder")
    assert [(f.fact, f.score) for f in result.facts] == [
        ("Ana Silva moved to Lisbon.", pytest.approx(0.4069, abs=1e-3)),
        ("Bruno Costa works at Initech.", pytest.approx(0.3556, abs=1e-3)),
        ("Ana Silva works at Initech.", pytest.approx(0.2339, abs=1e-3))]
    assert [e.name for e in result.entities] == [
        "Porto", "Lisbon", "Bruno Costa", "Initech", "Ana Silva"]
    assert fused.facts[0].fact == "Bruno Costa works at Initech."


def test_the_configured_recipe_reaches_search_and_eval(tiny, tmp_path, capsys):
    """`query.recipe` (facts only here) from the Python API and from `--config` of
    `tkg search` and `tkg eval`; without it the snapshot's own (combined) recipe."""
    from tkg.jobs.cli import main
    from tkg.pipeline.config import QueryConfig

    from tkg import query

    text = "Where does Ana Silva live?"
    facts_only = query.open(tiny.store, config=QueryConfig(recipe="facts_hybrid_rrf"))
    found = facts_only.search(text, ["g1"])
    assert found.facts and not found.entities
    assert tiny.search(text, ["g1"]).entities
    config = tmp_path / "facts.yaml"
    config.write_text("query:\n  recipe: facts_hybrid_rrf\n")
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"group_id": "g1", "question": text,
                                     "evidence": ["m4"]}) + "\n")
    capsys.readouterr()
    assert main(["search", "--store", str(tiny.store), "--group", "g1", "--query", text,
                 "--config", str(config), "--json"]) == 0
    searched = json.loads(capsys.readouterr().out)
    assert searched["facts"] and searched["entities"] == []
    assert main(["eval", "--store", str(tiny.store), "--questions", str(questions),
                 "--config", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["recipes"]) == ["facts_hybrid_rrf", "episodes_flat_rrf"]


def test_the_bge_reranker_is_reachable_from_config_and_cli(tiny, tmp_path, capsys):
    """`query.cross_encoder: bge` (FlagEmbedding, the tiny seeded model of test_rerank)
    ranks `cross_encoder` recipes, from the Python API and from `tkg search --cross-encoder`;
    the scores are the model's for each fact's passage."""
    from tkg.jobs.cli import main
    from tkg.pipeline.config import QueryConfig
    from tkg.query.rerank import BGEReranker

    from tests.test_rerank import tiny_bge_model
    from tkg import query

    model = tiny_bge_model(tmp_path / "bge")
    retriever = query.open(tiny.store, config=QueryConfig(cross_encoder="bge",
                                                          cross_encoder_model=model))
    text = "Where does Ana Silva work?"
    result = retriever.search(text, ["g1"], recipe="combined_cross_encoder")
    assert isinstance(retriever.cross_encoder, BGEReranker)
    passages = [f"{f.fact} ({f.source} - {f.target})" for f in result.facts]
    expected = retriever.cross_encoder.score(text, passages)
    assert [f.score for f in result.facts] == pytest.approx(expected.tolist(), abs=1e-5)
    assert [f.score for f in result.facts] == sorted((f.score for f in result.facts),
                                                     reverse=True)
    config = tmp_path / "bge.yaml"
    config.write_text(f"query:\n  cross_encoder_model: {model}\n")
    capsys.readouterr()
    assert main(["search", "--store", str(tiny.store), "--group", "g1", "--query", text,
                 "--recipe", "combined_cross_encoder", "--cross-encoder", "bge",
                 "--config", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["facts"] == result.to_dict()["facts"]


def test_an_unknown_search_method_is_an_error_never_bm25(tiny):
    """A method no entry of `methods.METHODS` has fails naming the known ones, both when a
    recipe names it and when a search meets it (a part built around the check), instead
    of running BM25 in its place (BM25 finds the turn naming Bruno)."""
    from dataclasses import replace

    from tkg.pipeline.registry import UnknownBackend
    from tkg.query.recipes import Part, get_recipe

    known = r"\(known: bfs, bm25, cosine, linked\)"
    with pytest.raises(UnknownBackend, match=rf"unknown search method 'grep' {known}"):
        Part(("grep",))
    flat = get_recipe("episodes_flat_rrf")
    assert [e.source_id for e in tiny.search(
        "Bruno", "g1", recipe=replace(flat, episodes=Part(("bm25",)))).episodes] == ["m3"]
    part = Part(("bm25",))
    object.__setattr__(part, "methods", ("grep",))  # past Part's own check
    with pytest.raises(UnknownBackend, match=known):
        tiny.search("Bruno", "g1", recipe=replace(flat, episodes=part))


def test_turns_next_to_a_hit_join_it(tiny):
    """The turn window: BM25 finds only the turn naming Bruno; the turns before and after
    it in the conversation follow at half its score."""
    from dataclasses import replace

    from tkg.query.recipes import Part, get_recipe

    bm25 = replace(get_recipe("episodes_flat_rrf"), episodes=Part(("bm25",)))
    assert [e.source_id for e in tiny.search("Bruno", "g1", recipe=bm25).episodes] == ["m3"]
    window = replace(bm25, turn_window=(0.5, 0.5))
    found = tiny.search("Bruno", "g1", recipe=window).episodes
    assert [e.source_id for e in found] == ["m3", "m2", "m4"]
    assert found[1].score == found[2].score < found[0].score


def test_the_question_time_words_favour_that_time(tiny):
    """"in January 2024" favours the January turns over the later one, unless the caller
    set a valid-time filter of their own (then theirs alone applies)."""
    from dataclasses import replace

    from tkg.query.recipes import get_recipe

    question = "What did Ana say about Lisbon in January 2024?"
    flat = get_recipe("episodes_flat_rrf")
    assert tiny.search(question, "g1", recipe=flat).episodes[0].source_id == "m4"
    boosted = replace(flat, time_boost=2.0)
    assert [e.source_id for e in tiny.search(question, "g1", recipe=boosted).episodes][:2] \
        == ["m1", "m2"]
    since = Filters(valid_from="2024-01-01")
    assert tiny.search(question, "g1", recipe=boosted, filters=since).episodes[0].source_id \
        == "m4"


def test_a_store_without_facts_answers_with_its_episodes(tmp_path):
    """A snapshot whose facts table has no rows (so no time arrays either) still answers:
    its episodes with their times, no facts."""
    from tkg.jobs.bench.query import synth_tables, write_store
    from tkg.pipeline.config import QueryConfig

    from tkg import query

    tables, _ = synth_tables(0, 32, 2, seed=0)
    write_store(tmp_path, tables, 32, QueryConfig(), seed=0)
    retriever = query.open(tmp_path)
    result = retriever.search("w1 w2 Entity2", ["g000"])
    assert result.to_dict()["facts"] == [] and result.episodes
    assert all(e.valid_at.endswith("+00:00") for e in result.episodes)
    assert retriever.search("w1 w2", ["g000"], recipe="facts_hybrid_rrf").facts == []


def test_turn_neighbours_are_those_of_asking_every_row(tiny):
    """`search.adjacent_turns` asks visibility only of the rows with a turn beside them in
    their conversation: the same neighbours as asking every row, at a conversation's ends,
    for rows out of range, another tenant's rows and a turn not known yet."""
    import numpy as np
    from tkg.query.search import adjacent_turns, visible_mask

    from tests.query_store import T1

    snap = tiny.snapshot()
    count, follows = snap.kinds["episodes"].meta.num_rows, snap.follows_turn
    rows = np.arange(-2, count + 2)
    linked = 0
    for scope in (make_scope("g1"), make_scope("g1", known_at=T1), make_scope("g2"),
                  make_scope(["g1", "g2"])):
        def seen(row: int, scope=scope) -> bool:
            return 0 <= row < count and bool(
                visible_mask(snap, "episodes", np.array([row]), scope)[0])

        before = [r - 1 if seen(r) and seen(r - 1) and follows[r] else -1
                  for r in rows.tolist()]
        after = [r + 1 if seen(r) and seen(r + 1) and follows[r + 1] else -1
                 for r in rows.tolist()]
        found = adjacent_turns(snap, scope)(rows)
        assert (found[0].tolist(), found[1].tolist()) == (before, after), scope
        linked += sum(r >= 0 for r in before)
    assert linked  # (some turns do have neighbours)


def _bfs_by_isin(snap, origins, scope, hops, max_edges):
    """`search.bfs` as it was written before it kept what was reached as flags by row."""
    import numpy as np
    from tkg.query.search import Expansion, entities_in_scope, live_facts

    reached = Expansion(entities={e: 0 for e in entities_in_scope(snap, origins, scope)})
    frontier = np.array(list(reached.entities), dtype=np.int64)
    for hop in range(1, max(hops, 0) + 1):
        if len(frontier) == 0:
            break
        edges = np.unique(snap.entity_facts.of_many(frontier))
        edges = live_facts(snap, edges[~np.isin(edges, list(reached.facts))], scope)
        edges = edges[np.argsort(-snap.fact_support[edges], kind="stable")[:max_edges]]
        reached.facts.update(dict.fromkeys(edges.tolist(), hop))
        ends = np.stack([snap.fact_src[edges], snap.fact_tgt[edges]], axis=1).ravel()
        ends = ends[(ends >= 0) & ~np.isin(ends, np.fromiter(reached.entities, np.int64))]
        _, first = np.unique(ends, return_index=True)
        frontier = ends[np.sort(first)]
        reached.entities.update(dict.fromkeys(frontier.tolist(), hop))
    return reached


def test_bfs_reaches_what_asking_by_isin_reached(tiny):
    """The graph expansion from every entity, alone and together, at each depth and edge
    bound, in both tenants and before the second run: the same facts and entities, with
    the same hops, in the same order."""
    from tkg.query.search import bfs

    from tests.query_store import T1

    snap = tiny.snapshot()
    every = list(range(snap.kinds["entities"].meta.num_rows))
    for scope in (make_scope("g1"), make_scope("g2"), make_scope("g1", known_at=T1),
                  make_scope("g1", as_of="2024-02-01")):
        for origins in [[e] for e in every] + [every, every[::-1]]:
            for hops in (0, 1, 2, 3):
                for max_edges in (1, 2, 400):
                    got = bfs(snap, origins, scope, hops, max_edges)
                    want = _bfs_by_isin(snap, origins, scope, hops, max_edges)
                    assert list(got.facts.items()) == list(want.facts.items())
                    assert list(got.entities.items()) == list(want.entities.items())
