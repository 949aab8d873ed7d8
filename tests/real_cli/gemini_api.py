"""A scripted local Gemini API for the real Gemini CLI.

:class:`GeminiApi` serves on 127.0.0.1 (a free port, a thread of the test process) what
``gemini`` 0.61 calls once ``GOOGLE_GEMINI_BASE_URL`` points at it (API-key auth,
``x-goog-api-key``): ``POST /v1beta/models/<model>:streamGenerateContent?alt=sse`` (the chat
turns, server-sent events), ``POST /v1beta/models/<model>:generateContent`` (its side calls:
the model router's classifier, the next-speaker check, each asking for JSON by a
``responseJsonSchema``) and ``POST /v1beta/models/<model>:countTokens``. Every request is
recorded (:attr:`GeminiApi.requests`).

It plays a script:

* **the step** (no fault, or once the faults given are used up): a conversation whose user
  text names a vibey plan (``<dir>/.vibey/plans/<job>.json``) is answered turn by turn with
  real function calls — ``write_file`` of the step's file (build.implement:
  ``src/<item>.txt``, as the scripted engine writes it; an absolute path, as the model is told
  the workspace), then ``run_shell_command`` (``git status --short``), then the step's result
  as a fenced JSON block, computed by the scripted engine (:func:`tests.agents.fake_cli.plan_of`
  reads the plan, :class:`ScriptedEngine` answers). Any other conversation gets a short text.
  A side call asking for JSON gets the smallest object its schema allows (an enum's ``user``
  when it has one: the next speaker is the user, the turn ends).
* **faults** (:data:`FAULTS`): each is the status and body the real API sends — a Google RPC
  ``{"error": {code, message, status, details}}`` —: ``rate_limit_reset`` (429, a per-minute
  quota, ``RetryInfo.retryDelay`` "4s" and "Please retry in 4.035955417s."), ``rate_limit``
  (429 "Resource has been exhausted (e.g. check quota).", nothing to say when),
  ``daily_quota`` (429, a per-day quota: the CLI's ``TerminalQuotaError``), ``credits`` (429,
  the prepayment credits are depleted), ``auth`` (400 ``API_KEY_INVALID``) and
  ``server_error`` (500). ``faults`` are answered one per model request (any of the three
  calls), in order; ``fault`` is answered to every one (with ``kinds``, to the chat turns of
  the steps of those kinds only).

Only the Python standard library: a ``ThreadingHTTPServer`` writes SSE with plain writes.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from actors.agents import EngineTask, ScriptedEngine
from tests.agents.fake_cli import fenced, plan_of

PLAN = re.compile(r"\S+/\.vibey/plans/\S+\.json")
ROUTE = re.compile(r"^/v1(?:beta|alpha)?/models/(?P<model>[^:/]+):(?P<method>\w+)$")
USAGE = {"promptTokenCount": 1800, "candidatesTokenCount": 120, "totalTokenCount": 1920}
RETRY_SECONDS = 4
JSON_TYPE = "application/json; charset=UTF-8"
METRIC = "generativelanguage.googleapis.com/generate_content_free_tier_requests"


@dataclass(frozen=True, slots=True)
class Fault:
    """One error answer of the real API: its HTTP status and its Google RPC error."""

    status: int
    message: str
    rpc_status: str
    details: tuple[Mapping[str, Any], ...] = ()

    def body(self) -> bytes:
        error = {"code": self.status, "message": self.message, "status": self.rpc_status}
        if self.details:
            error["details"] = list(self.details)
        return json.dumps({"error": error}, indent=2).encode()


_HELP = {
    "@type": "type.googleapis.com/google.rpc.Help",
    "links": [
        {
            "description": "Learn more about Gemini API quotas",
            "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
        }
    ],
}
_QUOTA = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. "
    "To monitor your current usage, head to: https://ai.dev/usage?tab=rate-limit. \n"
    "* Quota exceeded for metric: generativelanguage.googleapis.com/"
    "generate_content_free_tier_requests, limit: {limit}, model: gemini-2.5-pro"
)


def _violation(quota_id: str, limit: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
            {
                "quotaMetric": METRIC,
                "quotaId": quota_id,
                "quotaDimensions": {"location": "global", "model": "gemini-2.5-pro"},
                "quotaValue": limit,
            }
        ],
    }


def _retry(seconds: int) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{seconds}s"}


FAULTS: Mapping[str, Fault] = {
    "rate_limit_reset": Fault(
        429,
        _QUOTA.format(limit=2) + f"\nPlease retry in {RETRY_SECONDS}.035955417s.",
        "RESOURCE_EXHAUSTED",
        (
            _violation("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "2"),
            _HELP,
            _retry(RETRY_SECONDS),
        ),
    ),
    "rate_limit": Fault(
        429, "Resource has been exhausted (e.g. check quota).", "RESOURCE_EXHAUSTED"
    ),
    "daily_quota": Fault(
        429,
        _QUOTA.format(limit=50) + "\nPlease retry in 31.5s.",
        "RESOURCE_EXHAUSTED",
        (
            _violation("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "50"),
            _HELP,
            _retry(31),
        ),
    ),
    "credits": Fault(
        429,
        "Your prepayment credits are depleted. Please go to AI Studio at "
        "https://ai.studio/projects to manage your project and billing. Learn more at "
        "https://ai.google.dev/gemini-api/docs/billing#prepay. ",
        "RESOURCE_EXHAUSTED",
    ),
    "auth": Fault(
        400,
        "API key not valid. Please pass a valid API key.",
        "INVALID_ARGUMENT",
        (
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            },
            {
                "@type": "type.googleapis.com/google.rpc.LocalizedMessage",
                "locale": "en-US",
                "message": "API key not valid. Please pass a valid API key.",
            },
        ),
    ),
    "server_error": Fault(500, "Internal error encountered.", "INTERNAL"),
}


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]

    @property
    def call(self) -> str:
        """``streamGenerateContent``, ``generateContent``, ``countTokens`` (or the path)."""
        match = ROUTE.match(self.path.split("?")[0])
        return match.group("method") if match else self.path


@dataclass
class GeminiApi:
    """The server (see the module docstring); a context manager that starts and stops it."""

    faults: Sequence[str] = ()
    fault: str | None = None
    kinds: Sequence[str] = ()
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = [f for f in (*self.faults, self.fault) if f is not None and f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {sorted(FAULTS)}")
        self._pending = list(self.faults)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> GeminiApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def calls(self, method: str = "streamGenerateContent") -> list[Recorded]:
        """The requests of one call kind received, in order."""
        with self._lock:
            return [r for r in self.requests if r.call == method]

    # -- the script ------------------------------------------------------------------------

    def record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)

    def next_fault(self, body: Mapping[str, Any]) -> Fault | None:
        """The fault this request gets: the next of ``faults``, else ``fault`` (only for the
        steps of ``kinds`` when it names some)."""
        with self._lock:
            if self._pending:
                return FAULTS[self._pending.pop(0)]
        if self.fault is None:
            return None
        if self.kinds:
            contents = [c for c in body.get("contents") or [] if isinstance(c, Mapping)]
            plan = _plan(contents)
            if plan is None or plan_of(str(plan))["kind"] not in self.kinds:
                return None
        return FAULTS[self.fault]

    def answer(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The model's parts for this chat request."""
        contents = [c for c in body.get("contents") or [] if isinstance(c, Mapping)]
        plan = _plan(contents)
        if plan is None:
            return [{"text": "ok"}]
        turn = sum(1 for c in contents if c.get("role") == "model")
        return _step_turn(plan, turn)


def _texts(contents: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(
        str(part.get("text", ""))
        for content in contents
        if content.get("role") == "user"
        for part in content.get("parts") or []
        if isinstance(part, Mapping)
    )


def _plan(contents: Sequence[Mapping[str, Any]]) -> Path | None:
    """The plan file the conversation's user text names (one that exists)."""
    for match in PLAN.finditer(_texts(contents)):
        path = Path(match.group(0).strip("`'\"(),."))
        if path.is_file():
            return path
    return None


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


def _step_turn(plan: Path, turn: int) -> list[dict[str, Any]]:
    """Turn ``turn`` of the step: its files' ``write_file`` calls one per turn, a
    ``run_shell_command`` call, then the result; each call said first in a line of text."""
    workdir = plan.parents[2]
    result, files = step_work(plan_of(str(plan)))
    calls: list[tuple[str, dict[str, Any]]] = [
        ("write_file", {"file_path": str(workdir / path), "content": content})
        for path, content in sorted(files.items())
    ]
    calls.append(("run_shell_command", {"command": "git status --short", "description": "Show"}))
    if turn < len(calls):
        name, args = calls[turn]
        said = f"Next: {name} {args.get('file_path') or args.get('command')}\n"
        return [{"text": said}, {"functionCall": {"name": name, "args": args}}]
    return [{"text": fenced(result)}]


def from_schema(schema: Any) -> Any:
    """The smallest value ``schema`` (a Gemini ``responseJsonSchema``) allows: an enum's
    ``user`` when it has one, else its first value; 1 for numbers; every required key."""
    if not isinstance(schema, Mapping):
        return {}
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return "user" if "user" in enum else enum[0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        props = schema.get("properties") or {}
        return {key: from_schema(props[key]) for key in props}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return False
    return "simple"


# -- the wire --------------------------------------------------------------------------------


def _handler(api: GeminiApi) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"api": api})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: GeminiApi

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

    def do_GET(self) -> None:
        self.api.record(Recorded(self.command, self.path, dict(self.headers), {}))
        self._error(404, f"{self.path} is not served here", "NOT_FOUND")

    def do_POST(self) -> None:
        body = self._body()
        self.api.record(Recorded(self.command, self.path, dict(self.headers), body))
        match = ROUTE.match(self.path.split("?")[0])
        if match is None:
            self._error(404, f"{self.path} is not served here", "NOT_FOUND")
            return
        fault = self.api.next_fault(body)
        if fault is not None:
            self._send(fault.status, fault.body(), JSON_TYPE)
            return
        model, method = match.group("model"), match.group("method")
        if method == "countTokens":
            self._send(200, json.dumps({"totalTokens": USAGE["promptTokenCount"]}).encode())
        elif method == "generateContent":
            self._send(200, json.dumps(_response(model, _side_parts(body))).encode(), JSON_TYPE)
        elif method == "streamGenerateContent":
            chunks = _chunks(model, self.api.answer(body))
            events = b"".join(f"data: {json.dumps(c)}\r\n\r\n".encode() for c in chunks)
            self._send(200, events, "text/event-stream")
        else:
            self._error(404, f"method {method} is not served here", "NOT_FOUND")

    def _error(self, status: int, message: str, rpc_status: str) -> None:
        self._send(status, Fault(status, message, rpc_status).body(), JSON_TYPE)

    def _send(self, status: int, payload: bytes, kind: str = JSON_TYPE) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()


def _side_parts(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    config = body.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    if schema is not None:
        return [{"text": json.dumps(from_schema(schema))}]
    return [{"text": "ok"}]


def _response(model: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    candidate = {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
    return {"candidates": [candidate], "usageMetadata": dict(USAGE), "modelVersion": model}


def _chunks(model: str, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stream of one answer: its text first (as the API streams text), then the function
    calls and the finish reason with the usage in the last chunk."""
    texts = [p for p in parts if "text" in p]
    rest = [p for p in parts if "text" not in p]
    chunks = []
    for text in texts:
        content = {"role": "model", "parts": [text]}
        chunks.append({"candidates": [{"content": content, "index": 0}], "modelVersion": model})
    last = _response(model, rest or [{"text": ""}])
    chunks.append(last)
    return chunks
