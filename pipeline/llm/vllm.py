"""vLLM in-process on GPU actors through `ray.data.llm` (cluster mode).

The processor is `build_processor(vLLMEngineProcessorConfig(...))` with prefix caching on
(every extraction prompt shares the long system prompt), one engine replica per GPU
(`concurrency`), tensor/pipeline parallel settings passed through, and structured outputs
per row (`sampling_params.structured_outputs.json` = the extraction schema). Prompt building
and parsing are the shared functions of the HTTP path: only the model call differs.

Rows keep the episode's columns through the engine; entities and facts come back as JSON
text and are decoded into the `extractions` schema at the end, so blocks with and without
facts never disagree on types. Unusable answers get one more pass with the error.

vLLM needs CUDA: none of this runs on CPU machines. The configuration, preprocess and
postprocess are tested on real rows; the engine only runs on a GPU cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from tkg.pipeline import schema
from tkg.pipeline.config import LlmConfig, RecordsConfig, TkgConfig
from tkg.pipeline.episode_kinds import episode_kind, mapped_extractions
from tkg.pipeline.extract.base import EPISODE_COLUMNS, EpisodeInput, Extraction
from tkg.pipeline.llm.base import ChatRequest, Completion, Usage
from tkg.pipeline.llm.parse import ParseError, parse_extraction
from tkg.pipeline.llm.prompting import extraction_request, retry_request


def processor_config(config: LlmConfig):
    """The `vLLMEngineProcessorConfig` of the configured model and GPUs."""
    from ray.data.llm import vLLMEngineProcessorConfig

    v = config.vllm
    model = v.model_source or config.model
    if not model:
        raise ValueError("llm.vllm.model_source (or llm.model) must name the model folder "
                         "or id the GPU workers load; see configs/cluster.yaml")
    return vLLMEngineProcessorConfig(
        model_source=model,
        engine_kwargs={
            "enable_prefix_caching": True,
            "tensor_parallel_size": v.tensor_parallel_size,
            "pipeline_parallel_size": v.pipeline_parallel_size,
            "max_model_len": v.max_model_len,
            "gpu_memory_utilization": v.gpu_memory_utilization,
            **v.engine_kwargs,
        },
        concurrency=v.gpus,
        batch_size=v.batch_size,
        should_continue_on_error=True,  # one bad row never fails the run
    )


def sampling_params(config: LlmConfig, json_schema: dict | None) -> dict[str, Any]:
    """Per-row sampling; the schema travels as JSON text (Arrow-friendly)."""
    params: dict[str, Any] = {"temperature": config.temperature,
                              "max_tokens": config.max_tokens}
    if json_schema is not None and config.structured_output:
        params["structured_outputs"] = {"json": json.dumps(json_schema)}
    return params


def preprocess_row(row: dict[str, Any], config: TkgConfig) -> dict[str, Any]:
    """Episode row -> chat messages and sampling params; a row with `retry_error` asks again
    with its previous answer and the error (the one retry)."""
    request = extraction_request(EpisodeInput.of(row), config.extract.context_messages,
                                 config.facts, config.ontology)
    if row.get("retry_error"):
        request = retry_request(request, row.get("raw_output"), row["retry_error"])
    return {"messages": [dict(m) for m in request.messages],
            "sampling_params": sampling_params(config.llm, request.schema)}


def _extraction_json(found: Extraction) -> tuple[str, str]:
    def when(value: datetime | None) -> str | None:
        return value.astimezone(UTC).isoformat() if value else None

    entities = [vars(e) for e in found.entities]
    facts = [{**vars(f), "valid_at": when(f.valid_at), "invalid_at": when(f.invalid_at)}
             for f in found.facts]
    return json.dumps(entities), json.dumps(facts)


def postprocess_row(row: dict[str, Any]) -> dict[str, Any]:
    """Engine output row -> the episode's columns, its extraction as JSON text, its usage,
    and `retry_error` when the answer could not be used."""
    text = row.get("generated_text")
    out = {name: row.get(name) for name in EPISODE_COLUMNS}
    calls = int(row.get("llm_calls") or 0) + 1
    out.update(
        raw_output=text, llm_calls=calls,
        llm_prompt_tokens=int(row.get("llm_prompt_tokens") or 0)
        + int(row.get("num_input_tokens") or 0),
        llm_completion_tokens=int(row.get("llm_completion_tokens") or 0)
        + int(row.get("num_generated_tokens") or 0),
        llm_retries=0,
    )
    try:
        found, _ = parse_extraction(text, EpisodeInput.of(row))
        out["entities_json"], out["facts_json"] = _extraction_json(found)
        out["error"] = out["retry_error"] = None
    except ParseError as exc:
        out["entities_json"] = out["facts_json"] = "[]"
        out["retry_error"] = str(exc)
        out["error"] = f"invalid LLM output: {exc}" + (
            " (after one retry with the error)" if calls > 1 else "")
    return out


def to_extractions(batch: pa.Table) -> pa.Table:
    """Decoded rows in the `extractions` schema (dates back to UTC datetimes)."""
    rows = []
    for row in batch.to_pylist():
        facts = json.loads(row.get("facts_json") or "[]")
        for fact in facts:
            for key in ("valid_at", "invalid_at"):
                fact[key] = datetime.fromisoformat(fact[key]) if fact[key] else None
        error = row.get("error")
        if row.get("__inference_error__"):
            error = f"no answer from the LLM: {row['__inference_error__']}"
        rows.append({
            "episode_id": row["episode_id"], "group_id": row["group_id"],
            "valid_at": row["valid_at"], "entities": json.loads(row.get("entities_json") or "[]"),
            "facts": facts, "error": error, "raw_output": row.get("raw_output"),
            **{k: row.get(k) or 0 for k in ("llm_calls", "llm_prompt_tokens",
                                            "llm_completion_tokens", "llm_retries")},
        })
    return schema.from_rows(rows, schema.EXTRACTIONS)


def mapped_rows(batch: pa.Table, max_depth: int, records: RecordsConfig) -> pa.Table:
    """Kinds with a fixed mapping (JSON records) keep it: exact, and no call."""
    episodes = batch.select(list(EPISODE_COLUMNS)).to_pylist()
    found_all, _ = mapped_extractions([EpisodeInput.of(row) for row in episodes], max_depth,
                                      records)
    rows = []
    for row, found in zip(episodes, found_all, strict=True):
        rows.append({"episode_id": row["episode_id"], "group_id": row["group_id"],
                     "valid_at": row["valid_at"], "entities": [vars(e) for e in found.entities],
                     "facts": [vars(f) for f in found.facts], "error": found.error,
                     **dict.fromkeys(("llm_calls", "llm_prompt_tokens", "llm_completion_tokens",
                                      "llm_retries"), 0)})
    return schema.from_rows(rows, schema.EXTRACTIONS)


def _by_model(row: dict[str, Any]) -> bool:
    """Whether the row's kind goes through the engine (it has no fixed mapping)."""
    return episode_kind(row["kind"]).mapping is None


def build_extract_processor(config: TkgConfig):
    from ray.data.llm import build_processor

    return build_processor(
        processor_config(config.llm),
        preprocess=lambda row: preprocess_row(row, config),
        postprocess=postprocess_row,
    )


def vllm_extract(episodes, config: TkgConfig, processor: Callable | None = None):
    """Episodes dataset -> extractions dataset: kinds with a fixed mapping (records) mapped,
    the others through the engine, failed answers through it once more with the error."""
    processor = processor or build_extract_processor(config)
    depth = config.extract.record_fact_depth
    records = episodes.filter(lambda r: not _by_model(r)).map_batches(
        mapped_rows, batch_format="pyarrow", fn_args=(depth, config.records))
    texts = episodes.filter(_by_model).select_columns(list(EPISODE_COLUMNS))
    first = processor(texts).materialize()
    ok = first.filter(lambda r: not r.get("retry_error"))
    again = processor(first.filter(lambda r: bool(r.get("retry_error"))))
    decoded = [ds.map_batches(to_extractions, batch_format="pyarrow") for ds in (ok, again)]
    return records.union(*decoded)


class VllmBatchLLM:
    """The LLM protocol over the same processor, for the driver-side batched judgements:
    one dataset per batch of requests (engine start-up is paid per call, so judgements
    are sent in as few batches as possible). Extraction on it runs on the whole dataset
    (`dataset_extract`) instead of per batch of episodes."""

    dataset_extract = staticmethod(vllm_extract)

    def __init__(self, config: LlmConfig) -> None:
        self.config = config
        self.usage = Usage()
        self._processor = None

    def complete(self, requests: Sequence[ChatRequest], kind: str = "call"
                 ) -> list[Completion]:
        import ray.data
        from ray.data.llm import build_processor

        if not requests:
            return []
        if self._processor is None:
            self._processor = build_processor(
                processor_config(self.config),
                preprocess=lambda row: {"messages": json.loads(row["messages_json"]),
                                        "sampling_params": json.loads(row["params_json"])},
                postprocess=lambda row: {"index": row["index"],
                                         "text": row.get("generated_text"),
                                         "prompt": row.get("num_input_tokens") or 0,
                                         "completion": row.get("num_generated_tokens") or 0},
            )
        items = [{"index": i, "messages_json": json.dumps(list(r.messages)),
                  "params_json": json.dumps(sampling_params(self.config, r.schema))}
                 for i, r in enumerate(requests)]
        rows = self._processor(ray.data.from_items(items)).take_all()
        by_index = {row["index"]: row for row in rows if "index" in row}
        out = []
        for i in range(len(requests)):
            row = by_index.get(i)
            completion = (Completion(text=row["text"], prompt_tokens=int(row["prompt"]),
                                     completion_tokens=int(row["completion"]))
                          if row and row.get("text") is not None
                          else Completion(text=None, error="no answer from the vLLM engine"))
            self.usage.add(completion, kind)
            out.append(completion)
        return out
