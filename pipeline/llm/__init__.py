"""The LLM behind extraction and the batched judgements: one protocol, shared prompts,
output schemas and parsing, and backends (OpenAI-compatible HTTP; vLLM through ray.data.llm)
registered by name; `llm.backend` in pipeline/config.py lists the names a config may pick."""

from __future__ import annotations

from tkg.pipeline.config import LlmConfig
from tkg.pipeline.llm.base import LLM, ChatRequest, Completion, Usage
from tkg.pipeline.registry import Registry

LLMS: Registry[LLM] = Registry("llm backend")
LLMS.register("openai", "tkg.pipeline.llm.openai:OpenAIChat")
LLMS.register("vllm", "tkg.pipeline.llm.vllm:VllmBatchLLM")

__all__ = ["LLM", "LLMS", "ChatRequest", "Completion", "Usage", "build_llm"]


def build_llm(config: LlmConfig) -> LLM:
    """The configured backend; `none` is an error the user can fix in the config."""
    if config.backend not in LLMS:
        raise ValueError(f"llm.backend is {config.backend!r}: set it to one of "
                         f"{LLMS.names()} to use an LLM (see configs/openai.yaml)")
    return LLMS.build(config.backend, config)
