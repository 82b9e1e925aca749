"""The retry policy every LLM step shares: one batch of calls, then one retry of the
unusable answers with the error, then give up (the caller keeps the raw answer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tkg.pipeline.llm.base import LLM, ChatRequest
from tkg.pipeline.llm.parse import ParseError
from tkg.pipeline.llm.prompting import retry_request

T = TypeVar("T")


@dataclass
class Outcome(Generic[T]):
    """A parsed value, or the error and raw answer of the last attempt."""

    value: T | None
    raw: str | None
    error: str | None = None
    repaired: bool = False
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0


def complete_parsed(llm: LLM, requests: Sequence[ChatRequest],
                    parse: Callable[[int, str | None], tuple[T, bool]],
                    kind: str = "call") -> list[Outcome[T]]:
    """Every request answered and parsed with `parse(index, text) -> (value, repaired)`;
    answers that raise ParseError are asked again once, with the error, in one batch."""
    outcomes: list[Outcome[T]] = [Outcome(None, None) for _ in requests]
    pending = list(range(len(requests)))
    current = list(requests)
    for round_ in range(2):
        completions = llm.complete([current[i] for i in pending], kind=kind)
        failed: list[int] = []
        for index, completion in zip(pending, completions, strict=True):
            outcome = outcomes[index]
            outcome.calls += 1
            outcome.prompt_tokens += completion.prompt_tokens
            outcome.completion_tokens += completion.completion_tokens
            outcome.retries += max(completion.attempts - 1, 0)
            outcome.raw = completion.text
            if completion.text is None:  # transport gave up: a retry would fail the same
                outcome.error = f"no answer from the LLM: {completion.error}"
                continue
            try:
                outcome.value, outcome.repaired = parse(index, completion.text)
                outcome.error = None
            except ParseError as exc:
                outcome.error = f"invalid LLM output: {exc}"
                if round_ == 0:
                    current[index] = retry_request(current[index], completion.text, str(exc))
                    failed.append(index)
        pending = failed
        if not pending:
            break
    for outcome in outcomes:
        if outcome.error and outcome.value is None and outcome.calls > 1:
            outcome.error += " (after one retry with the error)"
    return outcomes
