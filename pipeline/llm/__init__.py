"""The LLM behind extraction and the batched judgements: one protocol, shared prompts,
output schemas and parsing, and backends (OpenAI-compatible HTTP; vLLM through ray.data.llm)."""

from __future__ import annotations

from collections.abc import Callable

from tkg.pipeline.config import LlmConfig
from tkg.pipeline.llm.base import LLM, ChatRequest, Completion, Usage

__all__ = ["BACKENDS", "LLM", "ChatRequest", "Completion", "Usage", "build_llm"]


def _openai(config: LlmConfig) -> LLM:
    from tkg.pipeline.llm.openai import OpenAIChat

    return OpenAIChat(config)


def _vllm(config: LlmConfig) -> LLM:
    from tkg.pipeline.llm.vllm import VllmBatchLLM

    return VllmBatchLLM(config)


BACKENDS: dict[str, Callable[[LlmConfig], LLM]] = {"openai": _openai, "vllm": _vllm}


def build_llm(config: LlmConfig) -> LLM:
    """The configured backend; `none` is an error the user can fix in the config."""
    if config.backend not in BACKENDS:
        raise ValueError(f"llm.backend is {config.backend!r}: set it to one of "
                         f"{sorted(BACKENDS)} to use an LLM (see configs/openai.yaml)")
    return BACKENDS[config.backend](config)
