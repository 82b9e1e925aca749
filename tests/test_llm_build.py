"""End to end: a small build with `extract.backend: llm` against the recorded test server
(tests/llm_server.py), with a 429, a 500, a timeout and malformed answers injected. The one
extra build of the suite: one conversation (9 messages) and 3 records, about a minute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_server import RecordedLLM, load_recorded
from llm_server import judgement_key as prompt_key

CORPUS = Path(__file__).resolve().parent / "corpus"

pytestmark = pytest.mark.timeout(1800)  # one small build; slow only on a crowded machine

CONVERSATION = "acme-conv-2024-01-15"
RECORDS = ("crm-cust-001", "crm-cust-002", "crm-cust-004")
TWICE_MALFORMED = "acme-conv-2024-01-15-m08"
SUMMARY_BATCH = 4  # items (central members + facts) per map call: bigger communities map
SUMMARIES = {
    prompt_key("summarize_map"): {"completion": '{"summary": "Daniel Okafor covers Europe."}'},
    prompt_key("summarize_reduce"): {"completion": '{"name": "Acme Europe team", '
                                                   '"summary": "Daniel Okafor covers Europe."}'},
}


def _slice(tmp_path):
    lines = [line for line in (CORPUS / "conversations.jsonl").read_text().splitlines()
             if json.loads(line).get("conversation_id") == CONVERSATION]
    lines += [line for line in (CORPUS / "records.jsonl").read_text().splitlines()
              if json.loads(line)["id"] in RECORDS]
    path = tmp_path / "slice.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, len(lines)


@pytest.fixture(scope="module")
def llm_build(ray_session, config, tmp_path_factory):
    from tkg.pipeline.build import build

    tmp = tmp_path_factory.mktemp("llm-build")
    inputs, count = _slice(tmp)
    with RecordedLLM({**load_recorded("acme_conv.json"), **SUMMARIES}) as server:
        llm = config.llm.model_copy(update={
            "backend": "openai", "endpoints": tuple(server.urls), "model": "recorded",
            "timeout_s": 5.0, "backoff_s": 0.01, "concurrency": 4, "max_retries": 3,
            "summary_batch_size": SUMMARY_BATCH,
        })
        cfg = config.model_copy(update={
            "extract": config.extract.model_copy(update={"backend": "llm"}),
            "facts": config.facts.model_copy(update={"invalidation_judge": "llm"}),
            "communities": config.communities.model_copy(update={"summarizer": "llm"}),
            "llm": llm})
        result = build(cfg, [str(inputs)], tmp / "store", run_id="llm-1")
        yield result, server, count


def _query(result, sql, *params):
    from tkg.pipeline.store import open_catalog

    with open_catalog(result.snapshot) as con:
        return con.execute(sql, list(params)).fetchall()


def test_build_finishes_and_counts_llm_usage(llm_build):
    result, server, count = llm_build
    summary = result.summary
    assert summary["episodes_in"] == count == 12
    assert summary["episodes"] == 12
    # 9 messages -> 9 calls, plus one retry-with-the-error for each malformed episode, plus
    # one invalidation judgement (COVERS "European customers", then COVERS "Europe": no rule
    # knows whether COVERS holds one value at a time).
    # Community summaries: one map call per SUMMARY_BATCH items of a bigger community, one
    # reduce call per community (the summarizer's own test checks the split).
    communities = sum(e["key"] in SUMMARIES for e in server.log)
    assert communities > 0
    assert summary["llm_calls"] == 12 + communities
    assert summary["llm_calls_by_stage"] == {"extract": 11, "facts": 1,
                                             "communities": communities}
    assert summary["llm_retries"] == 3  # the 429, the 500 and the timeout
    assert summary["llm_prompt_tokens"] == server.prompt_tokens
    assert summary["llm_completion_tokens"] == server.completion_tokens
    assert summary["llm_tokens"] == server.prompt_tokens + server.completion_tokens
    assert summary["llm_calls_per_episode"] == 1.0  # 12 calls / 12 episodes (budget 1.2;
    # communities excluded)
    assert summary["extract_failed"] == 1
    assert {e["action"] for e in server.log} == {"answer", "429", "500", "timeout", "malformed"}
    assert len({e["port"] for e in server.log}) == 2  # both endpoints served
    runs = _query(result, "SELECT llm_calls, llm_prompt_tokens, llm_completion_tokens "
                          "FROM runs WHERE run_id = 'llm-1'")
    assert runs == [(12 + communities, server.prompt_tokens, server.completion_tokens)]


def test_llm_summarizer_names_every_community(llm_build):
    """communities.summarizer: llm runs in the communities stage: one reduce call per
    community, map calls for communities of more than llm.summary_batch_size items, and the
    recorded name and summary stored for each."""
    result, server, _ = llm_build
    stored = _query(result, "SELECT name, summary FROM communities")
    calls = [e["key"] for e in server.log if e["key"] in SUMMARIES]
    assert stored and calls.count(prompt_key("summarize_reduce")) == len(stored)
    assert calls.count(prompt_key("summarize_map")) > 0
    assert set(stored) == {("Acme Europe team", "Daniel Okafor covers Europe.")}


def test_twice_malformed_episode_is_kept_and_rejected_with_raw_output(llm_build):
    from llm_server import MALFORMED

    result, _, _ = llm_build
    episode = _query(result, "SELECT episode_id FROM episodes WHERE source_id = ?",
                     TWICE_MALFORMED)
    assert len(episode) == 1
    rejects = _query(result, "SELECT stage, episode_id, reason, payload FROM rejects")
    assert len(rejects) == 1
    stage, episode_id, reason, payload = rejects[0]
    assert (stage, episode_id) == ("extract", episode[0][0])
    assert reason.startswith("invalid LLM output") and "after one retry" in reason
    assert payload == MALFORMED[1]
    mentions = _query(result, "SELECT count(*) FROM mentions WHERE episode_id = ?",
                      episode[0][0])
    assert mentions == [(0,)]


def test_recorded_facts_are_in_the_graph(llm_build):
    result, _, _ = llm_build
    facts = _query(result, """
        SELECT s.name, f.relation, t.name, f.valid_at
        FROM facts f JOIN entities s ON s.entity_id = f.source_entity_id
                     JOIN entities t ON t.entity_id = f.target_entity_id
        WHERE f.expired_at IS NULL""")
    by_triple = {(s, r, t): v for s, r, t, v in facts}
    assert ("Robert Kim", "CTO_OF", "Globex Corporation") in by_triple
    # "moved"/"lives" relations are canonicalised by the facts stage, as for spaCy.
    lives = [v for (s, r, t), v in by_triple.items()
             if (s, r, t) == ("Daniel Okafor", "LIVES_IN", "Berlin")]
    assert len(lives) == 1 and lives[0].isoformat().startswith("2024-01-15T09:04")
    opened = [v for (s, r, _t), v in by_triple.items() if r == "OPENED_TICKETS_WITH"]
    assert [v.isoformat()[:10] for v in opened] == ["2024-01-08"]  # "last week", resolved
    renewed = [v for (_s, r, _t), v in by_triple.items() if r == "RENEWED_SEATS_WITH"]
    assert [v.isoformat()[:10] for v in renewed] == ["2023-12-01"]  # behind <think> + fence
    # The judge said COVERS Europe does not end COVERS European customers: both current.
    covers = sorted(t for (s, r, t) in by_triple if (s, r) == ("Daniel Okafor", "COVERS"))
    assert covers == ["Europe", "European customers"]
    ended = _query(result, "SELECT count(*) FROM facts WHERE invalid_at IS NOT NULL")
    assert ended == [(0,)]
    # Records still go through the record mapping, without a call.
    assert any(r == "ACCOUNT_OWNER" for (_s, r, _t) in by_triple)
