"""Batched LLM judgements against the recorded test server: ambiguous entity pairs (through
the adjudicator hook of pipeline.adjudicate), invalidation candidates the relation rules
cannot decide (pipeline.facts), and map-reduce community summaries. One call per batch."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

import pyarrow as pa
from llm_server import RecordedLLM
from llm_server import judgement_key as key
from tkg.pipeline import facts, schema
from tkg.pipeline.config import FactsConfig, TkgConfig


def config_for(server, **llm) -> TkgConfig:
    return TkgConfig.model_validate({
        "resolve": {"adjudicator": "llm", "adjudicate_batch": 2},
        "llm": {"backend": "openai", "endpoints": server.urls, "model": "recorded",
                "timeout_s": 10, "backoff_s": 0.01, **llm}})


def test_ambiguous_pairs_are_judged_in_batches():
    from tkg.pipeline.adjudicate import adjudicate, build_judge

    answer = {"decisions": [{"id": 0, "same": True}, {"id": 1, "same": False}]}
    recorded = {key("judge_pairs"): {"completion": json.dumps(answer)}}
    pairs = pa.Table.from_pylist([
        {"group_id": "acme", "a": "globex", "b": "globex corporation", "evidence": "exact",
         "score": 1.0, "merge": True},
        {"group_id": "acme", "a": "bob", "b": "robert kim", "evidence": "embedding",
         "score": 0.87, "merge": False},
        {"group_id": "acme", "a": "sam patel", "b": "sam peterson", "evidence": "minhash",
         "score": 0.6, "merge": False},
        {"group_id": "acme", "a": "initech", "b": "initrode", "evidence": "embedding",
         "score": 0.86, "merge": False},
    ], schema=schema.RESOLUTION_PAIRS)
    with RecordedLLM(recorded) as server:
        judge = build_judge(config_for(server))
        judged, calls = adjudicate(pairs, judge, batch_size=2)
    assert calls == 2 and judge.usage.calls == 2 and len(server.log) == 2
    assert [(r["a"], r["merge"], r["evidence"]) for r in judged.to_pylist()] == [
        ("globex", True, "exact"), ("bob", True, "llm"), ("sam patel", False, "minhash"),
        ("initech", True, "llm")]  # the recorded answer says "same" for id 0 of each batch
    prompt = server.log[0]
    assert prompt["structured"] and prompt["messages"] == 2


def edge(edge_id, target, relation, valid, fact, invalid=None, by=None):
    return {"edge_id": edge_id, "version": 1, "group_id": "acme", "source_entity_id": "dan",
            "target_entity_id": target, "relation": relation, "fact": fact,
            "episode_ids": ["e"], "valid_at": valid, "invalid_at": invalid,
            "created_at": datetime(2024, 3, 1, tzinfo=UTC), "expired_at": None,
            "invalidated_by": by}


def test_invalidation_candidates_and_judged_endings():
    jan, feb, mar = (datetime(2024, m, 1, tzinfo=UTC) for m in (1, 2, 3))
    edges = pa.Table.from_pylist([
        edge("a", "hooli", "MANAGES_ACCOUNT", jan, "Daniel manages the Hooli account"),
        edge("b", "initech", "MANAGES_ACCOUNT", feb, "Daniel manages the Initech account"),
        edge("c", "globex", "MANAGES_ACCOUNT", mar, "Daniel manages the Globex account"),
        edge("d", "berlin", "LIVES_IN", jan, "Daniel lives in Berlin", feb, "e"),
        edge("e", "munich", "LIVES_IN", feb, "Daniel lives in Munich"),
        edge("f", "jazz", "LIKES", None, "Daniel likes jazz"),
        edge("g", "rock", "LIKES", feb, "Daniel likes rock"),
    ], schema=schema.MERGED_FACTS)
    candidates = facts.undecided_candidates(edges, FactsConfig()).to_pylist()
    # Rules decide LIVES_IN (a class); LIKES has an undated edge; MANAGES_ACCOUNT is open.
    assert [(c["old_edge_id"], c["new_edge_id"]) for c in candidates] == [("a", "b"),
                                                                        ("b", "c")]
    answer = {"decisions": [{"id": 0, "ends": True}, {"id": 1, "ends": False}]}
    with RecordedLLM({key("judge_invalidation"): {"completion": json.dumps(answer)}}) as server:
        from tkg.pipeline.llm.judges import LlmInvalidationJudge

        judge = LlmInvalidationJudge(config_for(server, judge_batch_size=20))
        ends = judge.ends([{"older": {"fact": c["old_fact"]}, "newer": {"fact": c["new_fact"]}}
                           for c in candidates])
    assert ends == [True, False] and judge.usage.calls == 1
    ended = {c["old_edge_id"]: (c["new_valid_at"], c["new_edge_id"])
             for c, yes in zip(candidates, ends, strict=True) if yes}
    out = {r["edge_id"]: (r["invalid_at"], r["invalidated_by"])
           for r in facts.apply_judged(edges, ended).to_pylist()}
    assert out["a"] == (feb, "b") and out["b"] == (None, None)
    assert out["d"] == (feb, "e")  # the rule's ending is untouched


def test_unusable_judgement_decides_nothing():
    recorded = {key("judge_invalidation"): {"plan": ["malformed", "malformed"],
                                            "completion": "{}"}}
    with RecordedLLM(recorded) as server:
        from tkg.pipeline.llm.judges import LlmInvalidationJudge

        judge = LlmInvalidationJudge(config_for(server))
        assert judge.ends([{"older": {}, "newer": {}}]) == [None]
    assert judge.usage.calls == 2  # asked once more with the error, then given up


def digest(cid, names, facts_):
    from tkg.pipeline.communities import CommunityDigest, MemberDigest

    members = tuple(MemberDigest(n.lower(), n, None, 1.0) for n in names)
    values = {"community_id": cid, "group_id": "acme", "size": len(names),
              "central": members, "facts": tuple(facts_), "member_names": tuple(names),
              "member_strength": tuple(1.0 for _ in names)}
    known = {f.name for f in dataclasses.fields(CommunityDigest)}
    return CommunityDigest(**{k: v for k, v in values.items() if k in known})


def test_community_summaries_map_reduce():
    from tkg.pipeline.llm.judges import LlmSummarizer

    small = digest("c1", ["Robert Kim", "Globex Corporation"],
                   ["Robert Kim is the CTO of Globex Corporation."])
    big = digest("c2", ["Daniel Okafor", "Hooli", "Priya Nair", "Berlin", "Munich"],
                 ["Daniel Okafor lives in Berlin.", "Priya Nair works at Hooli."])
    recorded = {
        key("summarize_map"): {"completion": '{"summary": "Daniel Okafor runs the Hooli '
                                             'rollout from Berlin."}'},
        key("summarize_reduce"): {"completion": '{"name": "Hooli rollout team", "summary": '
                                                '"Daniel Okafor and Priya Nair run Hooli."}'},
    }
    with RecordedLLM(recorded) as server:
        summarizer = LlmSummarizer(config_for(server, summary_batch_size=4))
        texts = summarizer.summarize([small, big], [small, big])
    # c1 has 3 items (one chunk): reduce only; c2 has 7 items: 2 map calls + 1 reduce.
    assert summarizer.usage.calls == 4
    assert sorted(e["key"] == key("summarize_map") for e in server.log) == [
        False, False, True, True]
    assert [(t.name, t.summary) for t in texts] == [
        ("Hooli rollout team", "Daniel Okafor and Priya Nair run Hooli.")] * 2


def test_unusable_community_summary_keeps_the_extractive_text():
    from tkg.pipeline.communities import ExtractiveSummarizer
    from tkg.pipeline.llm.judges import LlmSummarizer

    good = digest("c1", ["Robert Kim", "Globex Corporation"], ["Robert Kim is the CTO."])
    recorded = {key("summarize_reduce"): {"plan": ["malformed", "malformed"],
                                          "completion": "{}"}}
    with RecordedLLM(recorded) as server:
        config = config_for(server)
        texts = LlmSummarizer(config).summarize([good], [good])
    assert texts == ExtractiveSummarizer(config.communities).summarize([good], [good])
    assert texts[0].name and "Robert Kim" in texts[0].summary


def test_usage_of_judges_in_actors_reaches_the_run_counters(ray_session):
    """AdjudicateBatch runs in a Ray actor: its judge's calls come back as `llm_*` columns
    on the pairs and the stage counts and drops them (pipeline.llm.usage)."""
    import ray.data
    from tkg.pipeline.llm.base import Completion, Usage
    from tkg.pipeline.llm.usage import take_usage, usage_snapshot, with_usage

    class Owner:
        usage = Usage()

    owner = Owner()
    before = usage_snapshot(owner)
    owner.usage.add(Completion(text="{}", prompt_tokens=120, completion_tokens=9, attempts=2))
    owner.usage.add(Completion(text="{}", prompt_tokens=100, completion_tokens=7))
    table = with_usage(pa.table({"a": ["x", "y"]}), before, usage_snapshot(owner))
    counters: dict[str, int] = {}

    class Ctx:
        def count(self, name, value):
            counters[name] = counters.get(name, 0) + value

    ds = ray.data.from_arrow([table, with_usage(pa.table({"a": ["z"]}), {}, {
        "llm_calls": 1, "llm_prompt_tokens": 50, "llm_completion_tokens": 5,
        "llm_retries": 0, "llm_failures": 0})]).materialize()
    out = take_usage(Ctx(), ds, "resolve")
    assert out.schema().names == ["a"] and out.count() == 3
    assert counters == {"llm_calls": 3, "llm_prompt_tokens": 270, "llm_completion_tokens": 21,
                        "llm_retries": 1, "llm_failures": 0, "llm_calls_resolve": 3}
