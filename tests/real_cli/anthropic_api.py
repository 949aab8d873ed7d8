"""A scripted local Anthropic Messages API for the real Claude Code.

:class:`AnthropicApi` serves on 127.0.0.1 (a free port, a thread of the test process) what
``claude`` 2.1 calls once ``ANTHROPIC_BASE_URL`` points at it: ``HEAD /api/hello`` (its
connectivity probe), ``POST /v1/messages`` (streamed as server-sent events, or one JSON
message when the request says ``"stream": false``), ``POST /v1/messages/count_tokens`` and
``GET /v1/models``. Every request is recorded (:attr:`AnthropicApi.requests`).

It plays a script:

* **the step** (no fault, or once the faults given are used up): a conversation whose first
  user message names a vibey plan (``<dir>/.vibey/plans/<job>.json``) is answered turn by
  turn with real tool calls — ``Write`` of the step's file (build.implement: ``src/<item>.txt``,
  as the scripted engine writes it), then ``Bash`` (``git status --short``), then the step's
  result as a fenced JSON block, computed by the scripted engine
  (:func:`tests.agents.fake_cli.plan_of` reads the plan, :class:`ScriptedEngine` answers).
  Any other conversation (a title, a side question) gets a short text answer.
* **faults** (:data:`FAULTS`): each is the status, body and headers the real API sends —
  ``rate_limit_reset`` (429 with ``retry-after`` and the reset headers; ``RESET`` is the
  reset's epoch), ``subscription_limit`` (429 with the unified five-hour limit's headers, as a
  subscription's limit comes), ``rate_limit`` (429, no reset), ``credits`` (400, the credit
  balance is too low), ``auth`` (401, invalid x-api-key), ``overloaded`` (529) and
  ``server_error`` (500). ``faults`` are answered one per ``/v1/messages`` request, in order;
  ``fault`` is answered to every one (with ``kinds``, to the steps of those kinds only).

Only the Python standard library: a ``ThreadingHTTPServer`` streams SSE with plain writes.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from actors.agents import EngineTask, ScriptedEngine
from tests.agents.fake_cli import fenced, plan_of

RESET = 1_900_000_000  # 2030-03-17T17:46:40Z: a reset time the tests can recognise
RESET_ISO = datetime.fromtimestamp(RESET, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
PLAN = re.compile(r"\S+/\.vibey/plans/\S+\.json")
USAGE = {"input_tokens": 1200, "output_tokens": 340}


@dataclass(frozen=True, slots=True)
class Fault:
    """One error answer of the real API: its status, its JSON body, its headers."""

    status: int
    type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def body(self, request_id: str) -> bytes:
        error = {"type": "error", "error": {"type": self.type, "message": self.message}}
        return json.dumps({**error, "request_id": request_id}).encode()


_RATE = (
    "This request would exceed the rate limit for your organization "
    "(8c1e5b2c-7a51-4a3c-9d70-1f4e8b6f2a10) of 50 requests per minute. For details, refer to: "
    "https://docs.claude.com/en/api/rate-limits. You can see the response headers for current "
    "usage. Please reduce the prompt length or the maximum tokens requested, or try again "
    "later. You may also contact sales at https://www.anthropic.com/contact-sales to discuss "
    "your options for a rate limit increase."
)
FAULTS: Mapping[str, Fault] = {
    "rate_limit_reset": Fault(
        429,
        "rate_limit_error",
        _RATE,
        {
            "retry-after": "3600",
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": RESET_ISO,
        },
    ),
    "subscription_limit": Fault(
        429,
        "rate_limit_error",
        "Error",
        {
            "anthropic-ratelimit-unified-status": "rejected",
            "anthropic-ratelimit-unified-reset": str(RESET),
            "anthropic-ratelimit-unified-representative-claim": "five_hour",
        },
    ),
    "rate_limit": Fault(429, "rate_limit_error", _RATE),
    "credits": Fault(
        400,
        "invalid_request_error",
        "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
        "Billing to upgrade or purchase credits.",
    ),
    "auth": Fault(401, "authentication_error", "invalid x-api-key"),
    "overloaded": Fault(529, "overloaded_error", "Overloaded"),
    "server_error": Fault(500, "api_error", "Internal server error"),
}


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]


class AnthropicApi:
    """The server (see the module docstring); a context manager that starts and stops it."""

    def __init__(
        self, *, faults: Sequence[str] = (), fault: str | None = None, kinds: Sequence[str] = ()
    ) -> None:
        unknown = [f for f in (*faults, fault) if f is not None and f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {sorted(FAULTS)}")
        self._faults = list(faults)
        self._fault = fault
        self._kinds = frozenset(kinds)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.requests: list[Recorded] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> AnthropicApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def messages(self) -> list[Recorded]:
        """The ``/v1/messages`` requests received, in order."""
        return [r for r in self.requests if r.path.split("?")[0] == "/v1/messages"]

    # -- the script ------------------------------------------------------------------------

    def record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)

    def next_fault(self, body: Mapping[str, Any]) -> Fault | None:
        """The fault this request gets: the next of ``faults``, else ``fault`` (only for the
        steps of ``kinds`` when it names some)."""
        with self._lock:
            if self._faults:
                return FAULTS[self._faults.pop(0)]
        if self._fault is None:
            return None
        if self._kinds:
            prompt = _prompt(list(body.get("messages") or []))
            if prompt is None or plan_of(prompt)["kind"] not in self._kinds:
                return None
        return FAULTS[self._fault]

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):04d}{uuid.uuid4().hex[:20]}"

    def answer(self, body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
        """The assistant's content blocks for this request, and its stop reason."""
        messages = list(body.get("messages") or [])
        prompt = _prompt(messages)
        if prompt is None:
            return [{"type": "text", "text": "ok"}], "end_turn"
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return _step_turn(prompt, turn, self.new_id("toolu"))


def _prompt(messages: list[Mapping[str, Any]]) -> str | None:
    """The conversation's first user message when it names a vibey plan."""
    first = next((m for m in messages if m.get("role") == "user"), None)
    text = _text(first.get("content")) if first is not None else ""
    return text if PLAN.search(text) else None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def step_work(plan: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The step's result as the scripted engine answers it, and the files (worktree-relative
    path → content) the step writes: build.implement writes ``src/<item>.txt``."""
    kind = plan["kind"]
    task = EngineTask(
        kind,
        plan["project"],
        plan["cycle"],
        plan["subject"],
        plan["attempt"],
        plan["input"],
        None,
        effort=plan.get("effort"),
    )
    verdict = ScriptedEngine().run(task)
    if verdict.status == "failed":
        return {"status": "failed", "detail": verdict.detail}, {}
    item = plan["input"].get("item")
    files: dict[str, str] = {}
    if kind == "build.implement" and isinstance(item, Mapping):
        title = str(item.get("title", item["id"]))
        files[f"src/{item['id']}.txt"] = f"{title}\ncycle {plan['cycle']}\n"
    return dict(verdict.result), files


def _step_turn(prompt: str, turn: int, tool_id: str) -> tuple[list[dict[str, Any]], str]:
    """Turn ``turn`` of the step the prompt names: its files' ``Write`` calls one per turn
    (absolute paths, as Claude Code's tools take them), a ``Bash`` call, then the result; each
    call said first in a line of text, as a model does."""
    match = PLAN.search(prompt)
    assert match is not None
    workdir = Path(match.group(0)).parents[2]
    result, files = step_work(plan_of(prompt))
    calls: list[tuple[str, dict[str, Any]]] = [
        ("Write", {"file_path": str(workdir / path), "content": content})
        for path, content in sorted(files.items())
    ]
    calls.append(("Bash", {"command": "git status --short", "description": "Show changes"}))
    if turn < len(calls):
        name, arguments = calls[turn]
        said = f"Next: {name} {arguments.get('file_path') or arguments.get('command')}"
        use = {"type": "tool_use", "id": tool_id, "name": name, "input": arguments}
        return [{"type": "text", "text": said}, use], "tool_use"
    return [{"type": "text", "text": fenced(result)}], "end_turn"


# -- the wire --------------------------------------------------------------------------------


def _handler(api: AnthropicApi) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"api": api})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: AnthropicApi

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"raw": raw.decode("utf-8", errors="replace")}
        return parsed if isinstance(parsed, dict) else {"raw": parsed}

    def _record(self, body: dict[str, Any]) -> None:
        self.api.record(Recorded(self.command, self.path, dict(self.headers), body))

    def do_HEAD(self) -> None:
        self._record({})
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._record({})
        if self.path.split("?")[0] == "/v1/models":
            model = {"type": "model", "id": "claude-opus-5-5", "display_name": "Opus"}
            self._json(200, {"data": [model], "has_more": False})
        else:
            self._json(404, _not_found(self.path))

    def do_POST(self) -> None:
        body = self._body()
        self._record(body)
        route = self.path.split("?")[0]
        if route == "/v1/messages/count_tokens":
            self._json(200, {"input_tokens": USAGE["input_tokens"]})
        elif route == "/v1/messages":
            self._messages(body)
        else:
            self._json(404, _not_found(self.path))

    def _messages(self, body: dict[str, Any]) -> None:
        request_id = self.api.new_id("req")
        fault = self.api.next_fault(body)
        if fault is not None:
            self._send(
                fault.status,
                fault.body(request_id),
                "application/json",
                {"request-id": request_id, **fault.headers},
            )
            return
        content, stop = self.api.answer(body)
        message = {
            "id": self.api.new_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-opus-5-5"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": dict(USAGE),
        }
        if not body.get("stream"):
            self._send(
                200,
                json.dumps(message).encode(),
                "application/json",
                {"request-id": request_id},
            )
            return
        events = b"".join(_sse(kind, data) for kind, data in _stream(message))
        self._send(200, events, "text/event-stream", {"request-id": request_id})

    def _json(self, status: int, data: Mapping[str, Any]) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", {})

    def _send(self, status: int, payload: bytes, kind: str, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()


def _not_found(path: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "not_found_error", "message": f"{path}"}}


def _sse(kind: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _stream(message: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The Messages API's event stream of ``message``: message_start, each block's start,
    deltas and stop, message_delta (stop reason, output tokens), message_stop."""
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {**USAGE, "output_tokens": 1}
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        if block["type"] == "tool_use":
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": opened,
            },
        )
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": USAGE["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}
