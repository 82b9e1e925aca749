"""Any OpenAI-compatible chat endpoint (a vLLM server, llama.cpp's server, a hosted API).

One batch of requests runs concurrently on an asyncio loop: at most `concurrency` in flight,
request starts spaced to `requests_per_second`, requests spread round-robin over the
endpoint URLs, and 429 / 5xx / timeouts / connection errors retried with exponential
backoff (honouring Retry-After) on the next endpoint. A request that still fails comes back
as a Completion with `error` set; it never raises, so one bad call never ends a run.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time
from collections.abc import Sequence
from typing import Any

import httpx
from tkg.pipeline.config import LlmConfig
from tkg.pipeline.llm.base import ChatRequest, Completion, Usage

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_ERROR_CHARS = 300


class RateLimiter:
    """Spaces request starts at least 1/rate seconds apart (per worker)."""

    def __init__(self, per_second: float | None) -> None:
        self.interval = 1.0 / per_second if per_second else 0.0
        self.next_start = 0.0
        self.lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self.interval:
            return
        async with self.lock:
            now = time.monotonic()
            delay = self.next_start - now
            self.next_start = max(now, self.next_start) + self.interval
        if delay > 0:
            await asyncio.sleep(delay)


class OpenAIChat:
    """The OpenAI-compatible HTTP backend of the LLM protocol."""

    def __init__(self, config: LlmConfig) -> None:
        unresolved = [v for v in (*config.endpoints, config.model) if v.startswith("${")]
        if not config.endpoints or not config.model or unresolved:
            raise ValueError(
                "llm.endpoints and llm.model must be set for the openai backend; with "
                "configs/openai.yaml export TKG_LLM_BASE_URL (e.g. http://localhost:8000/v1, "
                "several separated by commas) and TKG_LLM_MODEL"
                + (f" (unresolved: {', '.join(unresolved)})" if unresolved else "")
            )
        self.config = config
        self.endpoints = [u.rstrip("/") for u in config.endpoints]
        self.api_key = os.environ.get(config.api_key_env, "")
        self.usage = Usage()
        self.structured = config.structured_output
        self._turn = itertools.count()

    def complete(self, requests: Sequence[ChatRequest], kind: str = "call") -> list[Completion]:
        if not requests:
            return []
        completions = asyncio.run(self._complete_all(list(requests)))
        for completion in completions:
            self.usage.add(completion, kind)
        return completions

    async def _complete_all(self, requests: list[ChatRequest]) -> list[Completion]:
        limits = httpx.Limits(max_connections=self.config.concurrency,
                              max_keepalive_connections=self.config.concurrency)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        gate = asyncio.Semaphore(self.config.concurrency)
        limiter = RateLimiter(self.config.requests_per_second)
        async with httpx.AsyncClient(timeout=self.config.timeout_s, limits=limits,
                                     headers=headers) as client:
            return await asyncio.gather(*(self._one(client, gate, limiter, r) for r in requests))

    def _payload(self, request: ChatRequest) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.config.model, "messages": list(request.messages),
            "temperature": self.config.temperature, "max_tokens": self.config.max_tokens,
        }
        if self.structured and request.schema is not None:
            payload["response_format"] = {"type": "json_schema", "json_schema": {
                "name": request.schema_name, "schema": request.schema, "strict": True}}
        return payload

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.config.max_backoff_s)
            except ValueError:
                pass
        base = min(self.config.backoff_s * 2 ** attempt, self.config.max_backoff_s)
        return base * random.uniform(0.5, 1.0)  # jitter: retries of a burst spread out

    async def _one(self, client: httpx.AsyncClient, gate: asyncio.Semaphore,
                   limiter: RateLimiter, request: ChatRequest) -> Completion:
        attempts = 0
        error = "not sent"
        async with gate:
            for attempt in range(self.config.max_retries + 1):
                attempts += 1
                await limiter.wait()
                url = self.endpoints[next(self._turn) % len(self.endpoints)]
                retry_after = None
                try:
                    response = await client.post(f"{url}/chat/completions",
                                                 json=self._payload(request))
                except httpx.TimeoutException:
                    error = f"timed out after {self.config.timeout_s}s at {url}"
                except httpx.TransportError as exc:
                    error = f"{type(exc).__name__} at {url}: {exc}"[:MAX_ERROR_CHARS]
                else:
                    if response.status_code == 200:
                        try:
                            return _completion(response.json(), attempts)
                        except (ValueError, KeyError, IndexError, TypeError) as exc:
                            error = f"unreadable response from {url}: {exc}"[:MAX_ERROR_CHARS]
                    elif response.status_code == 400 and self._drop_schema(response, request):
                        continue  # the server cannot take the constraint; ask without it
                    elif response.status_code in RETRY_STATUS:
                        error = f"HTTP {response.status_code} from {url}"
                        retry_after = response.headers.get("retry-after")
                    else:
                        body = response.text[:MAX_ERROR_CHARS]
                        return Completion(text=None, attempts=attempts, error=(
                            f"HTTP {response.status_code} from {url}: {body}; check "
                            "llm.model, the API key variable and the endpoint URL"))
                if attempt < self.config.max_retries:
                    await asyncio.sleep(self._backoff(attempt, retry_after))
        return Completion(text=None, attempts=attempts,
                          error=f"gave up after {attempts} attempts: {error}")

    def _drop_schema(self, response: httpx.Response, request: ChatRequest) -> bool:
        """A 400 that names response_format: stop sending the schema (the prompt still
        asks for the JSON object, and parsing validates it either way)."""
        if self.structured and request.schema is not None and "response_format" in (
                response.text or "").lower():
            self.structured = False
            return True
        return False


def _completion(body: dict[str, Any], attempts: int) -> Completion:
    choice = body["choices"][0]
    message = choice.get("message") or {}
    text = message.get("content")
    if text is None and isinstance(choice.get("text"), str):  # completions-style servers
        text = choice["text"]
    usage = body.get("usage") or {}
    return Completion(
        text=text if isinstance(text, str) else "",
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        attempts=attempts, finish_reason=choice.get("finish_reason"),
    )
