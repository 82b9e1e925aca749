"""The OpenAI-compatible HTTP backend and the LLM extractor, against the small real HTTP
server of tests/llm_server.py (recorded completions, injected faults). No Ray, no model."""

from __future__ import annotations

import json
import socket
import time

import pytest
from llm_server import MALFORMED, RecordedLLM, load_recorded
from test_llm_parse import corpus_messages
from tkg.pipeline.config import LlmConfig, TkgConfig
from tkg.pipeline.extract.llm import LlmExtractor
from tkg.pipeline.llm.base import ChatRequest
from tkg.pipeline.llm.openai import OpenAIChat

KEY = "Good morning team. Let's plan the Q1 accounts today."


def llm_config(urls, **overrides) -> LlmConfig:
    values = {"backend": "openai", "endpoints": tuple(urls), "model": "recorded",
              "timeout_s": 5, "backoff_s": 0.01, "max_backoff_s": 0.05, "concurrency": 4}
    return LlmConfig(**{**values, **overrides})


def ask(n: int = 1) -> list[ChatRequest]:
    return [ChatRequest(messages=({"role": "user", "content": f"Current episode:\n{KEY}"},))
            for _ in range(n)]


def test_extractor_over_a_conversation_with_faults():
    episodes = corpus_messages("acme-conv-2024-01-15")
    # The injected timeout is never answered; 5 s is generous for the answered ones.
    with RecordedLLM(load_recorded("acme_conv.json")) as server:
        config = TkgConfig(extract={"backend": "llm"},
                           llm=llm_config(server.urls, timeout_s=5))
        extractor = LlmExtractor(config)
        results = extractor.extract(episodes)
    usage = extractor.llm.usage
    assert (usage.calls, usage.retries, usage.failures) == (11, 3, 0)
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        server.prompt_tokens, server.completion_tokens)
    assert sum(r.llm_calls for r in results) == 11
    assert sum(r.llm_retries for r in results) == 3
    assert sum(r.llm_prompt_tokens for r in results) == server.prompt_tokens
    failed = [(e.source_id, r.raw_output) for e, r in zip(episodes, results, strict=True)
              if r.error]
    assert failed == [("acme-conv-2024-01-15-m08", MALFORMED[1])]
    assert results[7].error == ('invalid LLM output: "entities" must be a list, got str '
                                "(after one retry with the error)")
    assert results[7].entities == [] and results[7].facts == []
    facts = {(f.source, f.relation, f.target) for r in results for f in r.facts}
    assert facts == {
        ("Sam Patel", "REPORTS_SUPPORT_NUMBERS_TO", "Alice Chen"),
        ("Initech Inc.", "RENEWED_SEATS_WITH", "Alice Chen"),
        ("Daniel Okafor", "LIVES_IN", "Berlin"), ("Daniel Okafor", "COVERS", "European customers"),
        ("Daniel Okafor", "COVERS", "Europe"),
        ("Globex Corporation", "OPENED_TICKETS_WITH", "Sam Patel"),
        ("Bob", "UNHAPPY_WITH", "dashboard"), ("Robert Kim", "CTO_OF", "Globex Corporation"),
        ("Sam Patel", "OWNS", "Globex tickets"), ("Daniel Okafor", "OWNS", "Hooli rollout"),
    }
    # Every answered request carried the schema; retries went to the other endpoint.
    assert all(e["structured"] for e in server.log)
    assert len({e["port"] for e in server.log}) == 2
    assert [e["messages"] for e in server.log if e["key"].startswith("Right.")] == [2, 4]


def test_records_cost_no_call():
    from datetime import UTC, datetime

    from tkg.pipeline.extract.base import EpisodeInput

    record = EpisodeInput("r", "acme", "json", '{"customer_id": "CUST-001", "name": "Initech"}',
                          datetime(2024, 1, 2, tzinfo=UTC), source="crm.customers")
    with RecordedLLM({}) as server:
        [found] = LlmExtractor(TkgConfig(extract={"backend": "llm"},
                                         llm=llm_config(server.urls))).extract([record])
    assert server.log == [] and found.llm_calls == 0
    assert [(e.name, json.loads(e.attributes)) for e in found.entities] == [
        ("Initech", {"customer_id": "CUST-001", "record": "Customer CUST-001"})]


def test_client_errors_are_not_retried():
    with RecordedLLM({}) as server:
        llm = OpenAIChat(llm_config(server.urls))
        [completion] = llm.complete(ask())
    assert completion.text is None and completion.attempts == 1
    assert completion.error.startswith("HTTP 400 from http://127.0.0.1:")
    assert "check llm.model" in completion.error
    assert (llm.usage.calls, llm.usage.failures, llm.usage.retries) == (1, 1, 0)


def test_gives_up_after_max_retries():
    recorded = {KEY: {"plan": ["429", "500", "429", "429"], "completion": "{}"}}
    with RecordedLLM(recorded) as server:
        [completion] = OpenAIChat(llm_config(server.urls, max_retries=2)).complete(ask())
    assert completion.text is None and completion.attempts == 3
    assert completion.error.startswith("gave up after 3 attempts: HTTP 429 from")
    assert [e["action"] for e in server.log] == ["429", "500", "429"]


def test_concurrency_is_bounded_and_rate_is_limited():
    # Requests are held in pairs: two must be in flight together for any to be answered.
    recorded = {KEY: {"plan": ["pair"] * 6, "completion": '{"entities": [], "facts": []}'}}
    with RecordedLLM(recorded) as server:
        llm = OpenAIChat(llm_config(server.urls, concurrency=2, timeout_s=150))
        completions = llm.complete(ask(6))
    assert all(c.text for c in completions)
    assert server.max_in_flight == 2
    with RecordedLLM(recorded | {KEY: {"completion": "{}"}}) as server:
        started = time.monotonic()
        OpenAIChat(llm_config(server.urls, requests_per_second=20, timeout_s=10)).complete(
            ask(5))
        took = time.monotonic() - started
    # 5 starts, 1/20 s apart: a lower bound, which a slower machine only exceeds
    assert took >= 4 * 0.05 and len(server.log) == 5


def test_a_dead_endpoint_is_skipped():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    recorded = {KEY: {"completion": '{"entities": [], "facts": []}'}}
    with RecordedLLM(recorded, endpoints=1) as server:
        llm = OpenAIChat(llm_config([dead, *server.urls]))
        completions = llm.complete(ask(4))
    assert all(c.text == '{"entities": [], "facts": []}' for c in completions)
    assert llm.usage.retries == sum(c.attempts - 1 for c in completions) >= 1


def test_servers_without_structured_outputs_get_the_prompt_alone():
    recorded = {KEY: {"plan": ["reject_schema"], "completion": "{}"}}
    with RecordedLLM(recorded) as server:
        llm = OpenAIChat(llm_config(server.urls))
        llm.complete([ChatRequest(messages=ask()[0].messages, schema={"type": "object"})])
    assert [(e["action"], e["structured"]) for e in server.log] == [
        ("reject_schema", True), ("answer", False)]


def test_api_key_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("TKG_LLM_API_KEY", "sk-test-123")
    with RecordedLLM({KEY: {"completion": "{}"}}) as server:
        OpenAIChat(llm_config(server.urls)).complete(ask())
    assert server.log[0]["auth"] == "Bearer sk-test-123"
    assert "sk-test" not in TkgConfig(llm=llm_config(server.urls)).model_dump_json()


def test_unset_environment_says_what_to_export(monkeypatch):
    monkeypatch.delenv("TKG_LLM_BASE_URL", raising=False)
    monkeypatch.setenv("TKG_LLM_MODEL", "qwen3-8b")
    config = LlmConfig(backend="openai", endpoints="${TKG_LLM_BASE_URL}",
                       model="${TKG_LLM_MODEL}")
    assert config.model == "qwen3-8b"
    with pytest.raises(ValueError, match="export TKG_LLM_BASE_URL"):
        OpenAIChat(config)
    monkeypatch.setenv("TKG_LLM_BASE_URL", "http://a:8000/v1, http://b:8000/v1")
    assert LlmConfig(endpoints="${TKG_LLM_BASE_URL}").endpoints == (
        "http://a:8000/v1", "http://b:8000/v1")


def test_openai_yaml_uses_the_environment(monkeypatch):
    from pathlib import Path

    from tkg.pipeline.config import load_config

    monkeypatch.setenv("TKG_LLM_BASE_URL", "http://gpu-box:8000/v1")
    monkeypatch.setenv("TKG_LLM_MODEL", "Qwen/Qwen3-8B")
    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "openai.yaml")
    assert (config.extract.backend, config.llm.backend) == ("llm", "openai")
    assert config.llm.endpoints == ("http://gpu-box:8000/v1",)
    assert config.llm.model == "Qwen/Qwen3-8B" and config.llm.api_key_env == "TKG_LLM_API_KEY"


def test_llm_extraction_needs_an_llm_backend():
    with pytest.raises(ValueError, match=r"set llm\.backend"):
        TkgConfig(extract={"backend": "llm"})


def test_reflexion_adds_what_was_missed():
    episode = corpus_messages("acme-conv-2024-02-06")[6]  # Maria Lopez: "Please send it ..."
    first = {"entities": [{"name": "Kevin Brooks", "label": "Person"}], "facts": [
        {"source": "Kevin Brooks", "target": "Initech", "relation": "FINANCE_LEAD_OF",
         "fact": "Kevin Brooks is the finance lead of Initech.", "valid_at": None,
         "invalid_at": None, "date_text": None, "undated": False}]}
    missed = {"entities": [{"name": "Alice Chen", "label": "Person"}], "facts": [
        first["facts"][0],
        {"source": "Maria Lopez", "target": "Alice Chen", "relation": "ASKED_QUOTE_FROM",
         "fact": "Maria Lopez asks Alice Chen to send the quote to her and Kevin Brooks.",
         "valid_at": None, "invalid_at": None, "date_text": None, "undated": False}]}
    recorded = {episode.content: {"completion": json.dumps(first)},
                f"reflexion:{episode.content}": {"completion": json.dumps(missed)}}
    with RecordedLLM(recorded) as server:
        config = TkgConfig(extract={"backend": "llm"},
                           llm=llm_config(server.urls, reflexion=True))
        [found] = LlmExtractor(config).extract([episode])
    assert [e["key"].startswith("reflexion:") for e in server.log] == [False, True]
    assert [e.name for e in found.entities] == [
        "Maria Lopez", "Kevin Brooks", "Initech", "Alice Chen"]
    assert [f.relation for f in found.facts] == ["FINANCE_LEAD_OF", "ASKED_QUOTE_FROM"]
    assert found.llm_calls == 2 and found.error is None
