"""A small real OpenAI-compatible HTTP server for the tests: it answers chat completions with
recorded completions and injects faults, so the HTTP backend runs end to end (sockets,
concurrency, retries, backoff, several endpoints) without a model.

A request is matched to a recording by the episode in its prompt (the text after
"Current episode:"), or else by the first line of its system prompt (judgements). Each key
has a `plan` of faults served on its first requests, in order, before the recorded answer:
`429` (with Retry-After: 0), `500`, `timeout` (no answer until the client hangs up, so it
times out whatever its timeout and however slow the machine), `malformed` (200 with prose
instead of JSON; a second `malformed` is JSON of wrong types), `pair` (held until a second
`pair` request is in flight too, then both answer `PAIR_HOLD_S` later: two requests overlap
however slow the machine, and a client over its bound sends more meanwhile),
`reject_schema` (a 400 naming response_format, as servers without structured outputs
answer). It also records the most requests it ever had in flight at once and the
Authorization header it saw.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PAIR_HOLD_S = 0.2
HELD_S = 120.0  # longest a `timeout` or `pair` request is held: a broken client fails, never hangs

RECORDED = Path(__file__).resolve().parent / "llm_recorded"
EPISODE_MARK = "Current episode:"
REFLEXION_MARK = "Extraction so far:"
MALFORMED = (
    "Sure! Robert Kim wants the fix before February, so the entities are Robert Kim and "
    "the dashboard.",
    '{"entities": "Robert Kim", "facts": "a fix before February"}',
)


def judgement_key(template: str) -> str:
    """The recording key of a judgement template: its system prompt's first line."""
    from tkg.pipeline.llm.prompting import load_prompt

    return load_prompt(template).system.strip().splitlines()[0]


def load_recorded(name: str) -> dict[str, dict]:
    """Recordings by key: episodes by content, judgements by their system prompt's line."""
    data = json.loads((RECORDED / name).read_text())
    return {**data.get("episodes", {}), **data.get("judgements", {})}


def request_key(messages: list[dict[str, str]]) -> str:
    for message in messages:
        content = message.get("content") or ""
        if message.get("role") == "user" and EPISODE_MARK in content:
            episode = content.split(EPISODE_MARK, 1)[1]
            if REFLEXION_MARK in episode:  # the reflexion pass: recorded as "reflexion:<text>"
                return "reflexion:" + episode.split(REFLEXION_MARK, 1)[0].strip()
            return episode.strip()
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    return system.strip().splitlines()[0] if system.strip() else ""


class RecordedLLM:
    """Start with `with RecordedLLM(recorded) as server:`; `server.urls` are the base URLs."""

    def __init__(self, recorded: dict[str, dict], endpoints: int = 2) -> None:
        self.recorded = recorded
        self.endpoints = endpoints
        self.pairs = threading.Barrier(2, timeout=HELD_S)
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}
        self.log: list[dict[str, Any]] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.servers: list[ThreadingHTTPServer] = []

    # --- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> RecordedLLM:
        handler = self._handler()
        for _ in range(self.endpoints):
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers.append(server)
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{s.server_address[1]}/v1" for s in self.servers]

    # --- answers ----------------------------------------------------------------------

    def _next_action(self, key: str) -> tuple[str, int]:
        with self.lock:
            count = self.seen.get(key, 0)
            self.seen[key] = count + 1
        plan = (self.recorded.get(key) or {}).get("plan", [])
        return (plan[count] if count < len(plan) else "answer"), count

    def respond(self, body: dict[str, Any], port: int, auth: str | None = None,
                connection: socket.socket | None = None) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for one request; also what the tests assert on."""
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return self._respond(body, port, auth, connection)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _respond(self, body: dict[str, Any], port: int, auth: str | None,
                 connection: socket.socket | None) -> tuple[int, dict[str, str], bytes]:
        messages = body.get("messages") or []
        key = request_key(messages)
        action, count = self._next_action(key)
        entry = {"key": key, "action": action, "port": port, "n": count, "auth": auth,
                 "structured": "response_format" in body, "messages": len(messages),
                 "at": time.monotonic()}
        with self.lock:
            self.log.append(entry)
        if key not in self.recorded:
            return 400, {}, json.dumps({"error": f"no recording for {key[:80]!r}"}).encode()
        if action == "429":
            return 429, {"Retry-After": "0"}, b'{"error": "rate limited"}'
        if action == "500":
            return 500, {}, b'{"error": "internal error"}'
        if action == "reject_schema":
            return 400, {}, b'{"error": "response_format json_schema is not supported"}'
        if action == "timeout" and connection is not None:
            _wait_for_hang_up(connection)
        if action == "pair":
            self.pairs.wait()
            time.sleep(PAIR_HOLD_S)
        malformed = sum(1 for e in self.log[:-1] if e["key"] == key and e["action"] ==
                        "malformed")
        text = (MALFORMED[min(malformed, 1)] if action == "malformed"
                else self.recorded[key]["completion"])
        prompt = sum(len(m.get("content") or "") for m in messages) // 4 + 1
        completion = len(text) // 4 + 1
        if action != "timeout":  # the client gave up on that one: it never saw the usage
            with self.lock:
                self.prompt_tokens += prompt
                self.completion_tokens += completion
        answer = {
            "id": f"rec-{len(self.log)}", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        }
        return 200, {}, json.dumps(answer).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if not self.path.endswith("/chat/completions"):
                    self.send_error(404)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self.send_error(400, "request body is not JSON")
                    return
                status, headers, payload = server.respond(
                    body, self.server.server_address[1], self.headers.get("Authorization"),
                    self.connection)
                try:
                    self.send_response(status)
                    for name, value in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _wait_for_hang_up(connection: socket.socket) -> None:
    """Until the client closes the connection (it timed out): its whole request was read, so
    the socket turns readable only at end of file."""
    select.select([connection], [], [], HELD_S)
