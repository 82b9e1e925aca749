"""What every LLM backend takes and returns, and the usage it counts.

Backends differ only in how a chat request reaches a model (HTTP to an OpenAI-compatible
server, or vLLM in-process on GPU actors); prompts, the output schema, parsing and retries
with the error are shared, so the CPU and GPU paths agree on everything but the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion: messages, and the JSON schema its answer must follow."""

    messages: tuple[dict[str, str], ...]
    schema: dict[str, Any] | None = None
    schema_name: str = "output"


@dataclass
class Completion:
    """A model's answer; `text` is None when the request failed after every retry."""

    text: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 1
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class Usage:
    """Calls and tokens of one worker; stages turn these into run counters (`llm_*`)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0  # extra HTTP attempts after 429, 5xx, timeouts
    failures: int = 0  # calls that got no answer after every retry
    by_kind: dict[str, int] = field(default_factory=dict)

    def add(self, completion: Completion, kind: str = "call") -> None:
        self.calls += 1
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.completion_tokens
        self.retries += max(completion.attempts - 1, 0)
        self.failures += completion.text is None
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def counters(self) -> dict[str, int]:
        """Run counters, named as in the build summary."""
        return {
            "llm_calls": self.calls, "llm_prompt_tokens": self.prompt_tokens,
            "llm_completion_tokens": self.completion_tokens, "llm_retries": self.retries,
            "llm_failures": self.failures,
        }

    def merge(self, other: Usage) -> None:
        for name in ("calls", "prompt_tokens", "completion_tokens", "retries", "failures"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for kind, count in other.by_kind.items():
            self.by_kind[kind] = self.by_kind.get(kind, 0) + count


class LLM(Protocol):
    """A batch of chat requests in, one completion per request out, in order. Never raises
    for a failed request: its completion carries `error` and no text."""

    usage: Usage

    def complete(self, requests: Sequence[ChatRequest], kind: str = "call"
                 ) -> list[Completion]: ...
