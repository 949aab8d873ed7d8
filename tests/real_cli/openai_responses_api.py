"""A scripted local model server for the OpenAI Responses API (``POST /v1/responses``, SSE), as
the real ``codex`` 0.171 calls it through a ``[model_providers.<id>]`` table with
``wire_api = "responses"``.

It records every request (:attr:`ResponsesApi.requests`), refuses what the real API refuses
(a bearer key other than its own: 401 ``invalid_api_key``; a ``json_schema`` text format with
``strict: true`` outside the strict subset: 400 ``invalid_json_schema``, the checker being
:func:`workflows.strict_schema.strict_problem`), and plays :attr:`ResponsesApi.mode`:

``step``         does the step the prompt's plan names: build.implement adds
                 ``src/<item>.txt`` through the ``apply_patch`` custom tool (turn 1), runs
                 ``cat`` on it through the ``exec_command`` function (turn 2), then answers the
                 kind's result (tests/agents/fake_cli.py's :func:`work` for the other kinds),
                 shaped to the strict schema it was sent, with ``response.completed``'s usage
``usage_limit``  429 ``usage_limit_reached`` with ``resets_at`` / ``resets_in_seconds`` (the
                 ChatGPT backend's body; Codex says "You've hit your usage limit. Try again at
                 8:15 AM.")
``rate_limit``   429 ``rate_limit_exceeded`` ("… Please try again in 20s."), ``retry-after``
``rate_limit_stream`` a 200 stream that ends in ``response.failed`` with
                 ``rate_limit_exceeded`` (the API's mid-stream rate limit; Codex reads its
                 "Please try again in 20s." and retries ``stream_max_retries`` times)
``quota``        429 ``insufficient_quota`` ("You exceeded your current quota, please check
                 your plan and billing details. …")

The error bodies are the API's own (https://platform.openai.com/docs/guides/error-codes; the
usage-limit body as codex-rs's ``UsageErrorResponse`` reads it: ``type``, ``plan_type``,
``resets_at``). The SSE events are those codex-rs's ``process_sse`` parses:
``response.created``, ``response.output_item.added`` / ``.done``, ``response.output_text.delta``
and ``response.completed`` (``usage`` with ``input_tokens_details`` and
``output_tokens_details``).

It runs on 127.0.0.1 and a free port, in a thread of the test process (:func:`serve`).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from tests.agents.fake_cli import work
from workflows.strict_schema import encode, strict_problem, with_failure_report

API_KEY = "sk-vibey-test-0123456789"
PLAN = re.compile(r"(/\S+/\.vibey/plans/[^\s)`'\"]+\.json)")
RATE_LIMITED = (
    "Rate limit reached for gpt-5.5 in organization org-vibeytest on tokens per min (TPM): "
    "Limit 30000, Used 29500, Requested 1500. Please try again in 20s. Visit "
    "https://platform.openai.com/account/rate-limits to learn more."
)
USAGE = {
    "input_tokens": 1200,
    "input_tokens_details": {"cached_tokens": 200},
    "output_tokens": 300,
    "output_tokens_details": {"reasoning_tokens": 40},
    "total_tokens": 1500,
}


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ResponsesApi:
    """The server's state: what it plays, what it got."""

    mode: str = "step"
    api_key: str = API_KEY
    resets_at: int = 0  # usage_limit: the epoch its body names
    requests: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, recorded: Recorded) -> None:
        with self.lock:
            self.requests.append(recorded)

    def turns(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/responses")]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_POST(self) -> None:
        api = self.server.api
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        api.record(Recorded(self.path, dict(self.headers.items()), body))
        if not self.path.endswith("/responses"):
            self._json(404, {"error": {"message": f"Unknown path {self.path}", "code": None}})
            return
        refused = _refusal(api, self.headers.get("authorization", ""), body)
        if refused is not None:
            self._json(*refused)
            return
        if api.mode == "rate_limit_stream":
            self._stream(_failed(RATE_LIMITED, "rate_limit_exceeded"))
            return
        self._stream(_step(body))

    def _json(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("x-request-id", "req_vibey_test")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("x-request-id", "req_vibey_test")
        self.send_header("connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: ResponsesApi


@contextmanager
def serve(api: ResponsesApi | None = None) -> Iterator[tuple[ResponsesApi, str]]:
    """The server on 127.0.0.1 and a free port, in a thread; yields its state and its base URL
    (``http://127.0.0.1:<port>/v1``)."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.api = api or ResponsesApi()
    thread = threading.Thread(target=server.serve_forever, name="responses-api", daemon=True)
    thread.start()
    try:
        yield server.api, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- what the real API refuses ---------------------------------------------------------------


def _refusal(
    api: ResponsesApi, authorization: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any], dict[str, str]] | None:
    key = authorization.removeprefix("Bearer ").strip()
    if key != api.api_key:
        shown = f"{key[:3]}{'*' * max(0, len(key) - 7)}{key[-4:]}" if key else ""
        message = (
            f"Incorrect API key provided: {shown}. You can find your API key at "
            "https://platform.openai.com/account/api-keys."
        )
        return 401, _error(message, "invalid_request_error", "invalid_api_key"), {}
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema" and fmt.get("strict"):
        found = strict_problem(fmt.get("schema"))
        if found is not None:
            message = f"Invalid schema for response_format '{fmt.get('name')}': {found}"
            error = _error(message, "invalid_request_error", "invalid_json_schema")
            error["error"]["param"] = "text.format.schema"
            return 400, error, {}
    return _fault(api)


def _fault(api: ResponsesApi) -> tuple[int, dict[str, Any], dict[str, str]] | None:
    if api.mode == "usage_limit":
        body = {
            "error": {
                "type": "usage_limit_reached",
                "message": "The usage limit has been reached",
                "plan_type": "plus",
                "resets_at": api.resets_at,
                "resets_in_seconds": 0,
            }
        }
        return 429, body, {}
    if api.mode == "rate_limit":
        headers = {"retry-after": "20", "x-ratelimit-reset-tokens": "20s"}
        return 429, _error(RATE_LIMITED, "tokens", "rate_limit_exceeded"), headers
    if api.mode == "quota":
        message = (
            "You exceeded your current quota, please check your plan and billing details. For "
            "more information on this error, read the docs: "
            "https://platform.openai.com/docs/guides/error-codes/api-errors."
        )
        return 429, _error(message, "insufficient_quota", "insufficient_quota"), {}
    return None


def _error(message: str, type_: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


# -- the step --------------------------------------------------------------------------------


def _step(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE events of one turn: a tool call while the step's work is not done, then the
    result."""
    plan = _plan(body)
    done = sum(
        1
        for item in body.get("input") or []
        if item.get("type") in ("function_call_output", "custom_tool_call_output")
    )
    item = (plan or {}).get("input", {}).get("item") or {}
    if plan is not None and plan.get("kind") == "build.implement" and item:
        if done == 0:
            path = f"src/{item['id']}.txt"
            patch = (
                f"*** Begin Patch\n*** Add File: {path}\n+{item.get('title', '')}\n"
                f"+cycle {plan.get('cycle', 0)}\n*** End Patch\n"
            )
            call = {"type": "custom_tool_call", "call_id": "call_patch", "name": "apply_patch"}
            return _turn([{**call, "id": "ctc_1", "status": "completed", "input": patch}])
        if done == 1:
            arguments = json.dumps({"cmd": f"cat src/{item['id']}.txt"})
            call = {"type": "function_call", "call_id": "call_cat", "name": "exec_command"}
            return _turn([{**call, "id": "fc_1", "arguments": arguments}])
    return _turn([_message(_answer(plan, body))])


def _plan(body: dict[str, Any]) -> dict[str, Any] | None:
    for item in body.get("input") or []:
        for part in item.get("content") or [] if isinstance(item.get("content"), list) else []:
            match = PLAN.search(str(part.get("text", "")))
            if match and Path(match.group(1)).is_file():
                plan: dict[str, Any] = json.loads(Path(match.group(1)).read_text())
                return plan
    return None


def _answer(plan: dict[str, Any] | None, body: dict[str, Any]) -> str:
    """The step's result, shaped to the strict schema the request carries."""
    if plan is None:
        return "No plan was named."
    if plan["kind"] == "build.implement":
        result: dict[str, Any] = {"status": "done"}
    else:
        result, _files = work(plan)
    declared = plan.get("result_schema") or {"type": "object"}
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") != "json_schema":
        return json.dumps(result)
    answer = encode(result, with_failure_report(declared))
    Draft202012Validator(fmt["schema"]).validate(answer)  # a strict model answers only this
    return json.dumps(answer)


def _failed(message: str, code: str) -> list[dict[str, Any]]:
    """A stream the API ends with ``response.failed``."""
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    error = {"code": code, "message": message}
    failed = {**response, "status": "failed", "error": error}
    return [
        {"type": "response.created", "response": response},
        {"type": "response.failed", "response": failed},
    ]


def _message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _turn(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": response}]
    for index, item in enumerate(items):
        added = {**item, "content": []} if item["type"] == "message" else item
        events.append({"type": "response.output_item.added", "output_index": index, "item": added})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": text,
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    completed = {**response, "status": "completed", "output": items, "usage": USAGE}
    events.append({"type": "response.completed", "response": completed})
    return events
