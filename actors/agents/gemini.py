"""Gemini CLI headless: ``gemini -p PROMPT --output-format stream-json --yolo --skip-trust
[effort flags] [args]``, with ``GEMINI_CLI_HOME`` set to the engine's own home
(:mod:`actors.agents.gemini_home` writes its settings: the auth type, the CLI's own retries).

``--skip-trust``: 0.61 refuses a headless run in a folder the user has not trusted, whatever
``--yolo`` says (exit 55, "Gemini CLI is not running in a trusted directory"); every step
directory is new, so every run trusts its own for that session only.

Its stream is JSONL: ``init`` (the session), ``message`` (the user's prompt, then the
assistant's text in deltas), ``tool_use`` / ``tool_result``, ``error`` (a warning or an error
of the run, ``severity``), and ``result`` (``stats`` with token counts, no cost; ``status``
``error`` with ``error: {type, message}`` when the run failed). Its exit codes: 0 success, 1
a general error, 41 authentication not set up, 42 an input error, 44 a sandbox error, 52 a
configuration error, 53 the turn limit, 54 a tool failed fatally, 55 an untrusted folder, 130
cancelled; an API error exits with its HTTP status modulo 256 (429 → 173, 400 → 144).

**How a failed run is read**, from its error channel only (the result's error, the ``error``
events, the error records it writes on stderr), never from prompts, paths or tool output:
the API error that ended the run (:class:`ApiError`) is built from the stderr record
``Error when talking to Gemini API … <Class>: <message>`` with its ``retryDelayMs`` and
``status``, and from the result's ``[API Error: <message>]`` (a Google RPC error body when
the CLI passes one through: ``ErrorInfo.reason``, ``QuotaFailure`` quota ids,
``RetryInfo.retryDelay``). Then, structured parts before words (:func:`capacity_of`):

* a refused key (``API_KEY_INVALID``, ``UNAUTHENTICATED``, 401) → AuthenticationFailed;
  exit 41 too (the CLI's auth is not set up: the detail says what it missed);
* a quota: a per-day quota id or "exhausted your daily quota", depleted prepayment credits,
  or a ``TerminalQuotaError`` without a retry time → CreditsExhausted; a retry time
  (``RetryableQuotaError``'s ``retryDelayMs``, ``RetryInfo``, "Please retry in 4.0s") →
  WindowExhausted at the result's time plus that delay; a per-minute quota id → a 60 s window
  (the CLI's own rule); any other 429 → a window of unknown reset. "please check your plan
  and billing details", which the per-minute 429 also says, decides nothing;
* anything else → a failure whose detail is one clean line (exit 55 named as the untrusted
  folder it is).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from actors.agents import limits
from actors.agents.base import EngineTask, EngineVerdict
from actors.agents.cli import CliAdapter, Context, Launch, Reading, Streamed, json_lines
from actors.agents.gemini_home import engine_environment
from actors.agents.plans import Plan
from actors.agents.process import Exit
from actors.agents.roster import AgentSpec
from workflows.capacity import AuthenticationFailed, CreditsExhausted, Exhausted

EXIT_MEANING = {
    1: "a general or API error",
    41: "its authentication is not set up: give the engine GEMINI_API_KEY in its env, or a "
    "GEMINI_CLI_HOME whose settings select an auth type",
    42: "an input error",
    44: "a sandbox error",
    52: "a configuration error",
    53: "the turn limit",
    54: "a tool failed fatally",
    55: "the folder is not trusted: vibey passes --skip-trust; a CLI that ignores it needs "
    "GEMINI_CLI_TRUST_WORKSPACE=true in the engine's env",
    130: "cancelled",
}
AUTH_EXIT = 41
QUOTA_KINDS = ("RetryableQuotaError", "TerminalQuotaError")
AUTH_REASONS = ("API_KEY_INVALID", "API_KEY_EXPIRED", "UNAUTHENTICATED")
CREDITS = re.compile(r"credits are depleted|prepayment credits|INSUFFICIENT_G1_CREDITS", re.I)
DAILY = re.compile(r"exhausted your daily quota", re.I)
CAPACITY = re.compile(r"exhausted your capacity|capacity exceeded|MODEL_CAPACITY_EX", re.I)
KEY_REFUSED = re.compile(r"API key not valid|API Key not found", re.I)
_RECORD = re.compile(
    r"^(?:Error when talking to Gemini API|Error generating content via API)\b.*?"
    r"(?P<kind>\b_?(?:[A-Z]\w*)?(?:Error|Exception)): (?P<message>.*)$"
)
_MAIN = "Error when talking to Gemini API"
_PROPERTY = re.compile(r"^  (?P<name>[A-Za-z_]\w*): (?P<value>\d+),?$")
_RETRY_TEXT = re.compile(
    r"(?:Please retry in|Suggested retry after) (?P<n>\d+(?:\.\d+)?)(?P<unit>ms|s)\b"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NOISE = re.compile(
    r"^(?:YOLO mode is enabled|Approval mode overridden|Warning: |Ripgrep is not available|"
    r"\[STARTUP\]|Loaded cached credentials|Data collection is disabled)"
)


@dataclass(frozen=True, slots=True)
class ApiError:
    """The API error that ended a run, as the CLI reported it."""

    kind: str = ""  # the CLI's class: RetryableQuotaError, TerminalQuotaError, ApiError, …
    message: str = ""  # the API's message
    status: int | None = None  # the HTTP status
    retry_seconds: float | None = None  # when the CLI or the API says to retry
    reason: str = ""  # ErrorInfo.reason, else the RPC status (RESOURCE_EXHAUSTED, …)
    quota_ids: tuple[str, ...] = field(default_factory=tuple)

    @property
    def detail(self) -> str:
        """One clean line: the class, the status, the message."""
        said = [str(self.status)] if self.status is not None else []
        if self.retry_seconds is not None:
            said.append(f"retry in {self.retry_seconds:g}s")
        head = self.kind or "API error"
        return one_line(
            f"{head} ({', '.join(said)}): {self.message}" if said else f"{head}: {self.message}"
        )

    @property
    def quota(self) -> bool:
        return self.kind in QUOTA_KINDS or self.status == 429 or self.reason == "RESOURCE_EXHAUSTED"


class GeminiAdapter(CliAdapter):
    adapter = "gemini"

    def __init__(
        self,
        spec: AgentSpec,
        *,
        worker_env: Mapping[str, str],
        transcripts: Path,
        context: Context | None = None,
        grace: float = 2.0,
        launch: Launch | None = None,
    ) -> None:
        super().__init__(
            spec,
            worker_env=worker_env,
            transcripts=transcripts,
            context=context,
            grace=grace,
            launch=launch,
        )
        self._env = engine_environment(self._env, transcripts.parent, spec.id)

    def invocation(self, task: EngineTask, plan: Plan, prompt: str) -> list[str]:
        head = ["-p", prompt, "--output-format", "stream-json", "--yolo", "--skip-trust"]
        return [*head, *self.spec.effort_args(task.effort), *self.spec.args]

    def judge(
        self,
        task: EngineTask,
        plan: Plan,
        done: Exit,
        reading: Reading,
        changed: list[str],
        transcript: Path,
        streamed: Streamed | None = None,
    ) -> EngineVerdict:
        """As every CLI is judged, except that an exit past 128 which the CLI chose (an API
        error's HTTP status, as ``read`` found it) is not called a signal."""
        verdict = super().judge(task, plan, done, reading, changed, transcript, streamed)
        chose = f"exit {done.returncode} (an API error"
        if verdict.engine_fault and reading.error and reading.error.startswith(chose):
            return replace(verdict, detail=f"engine {self.spec.id}: {reading.error}")
        return verdict

    def read(self, stdout: str, stderr: str, returncode: int) -> Reading:
        reading = Reading()
        events = json_lines(stdout)
        if isinstance(events, str):
            reading.malformed = events
            return reading
        texts: list[str] = []
        for event in events:
            _event(reading, event, texts)
        reading.text = "".join(texts)
        end = next((e for e in reversed(events) if e.get("type") == "result"), None)
        failed = end is not None and end.get("status") == "error"
        if returncode == 0 and not failed:
            return reading
        api = api_error(stderr, _result_message(end))
        reading.capacity = capacity_of(api, _time_of(end)) if api is not None else None
        if reading.capacity is None and returncode == AUTH_EXIT:
            reading.capacity = AuthenticationFailed(detail=_exit_detail(returncode, stderr))
        if reading.capacity is None:
            reading.error = _failure(returncode, api, events, stderr)
        return reading


def _event(reading: Reading, event: Mapping[str, Any], texts: list[str]) -> None:
    kind = event.get("type")
    if kind == "init":
        reading.session = event.get("session_id")
    elif kind == "message" and event.get("role", "assistant") == "assistant":
        content = str(event.get("content", ""))
        if event.get("delta"):
            texts.append(content)
        else:
            texts[:] = [content]
    elif kind == "tool_use":
        name = str(event.get("tool_name") or event.get("name") or "tool")
        reading.tools.append(name)
        path = (event.get("parameters") or {}).get("file_path")
        if isinstance(path, str) and name in ("write_file", "replace", "edit"):
            reading.files.append(path)
    elif kind == "result":
        stats = event.get("stats") or {}
        reading.turns = int(stats.get("turns") or stats.get("tool_calls") or 1)
        reading.input_tokens = int(stats.get("input_tokens") or 0)
        reading.output_tokens = int(stats.get("output_tokens") or 0)


# -- the API error ---------------------------------------------------------------------------


def api_error(stderr: str, result_message: str | None) -> ApiError | None:
    """The API error that ended the run: the CLI's last stderr record of the chat turn (the
    router's side calls only when there is none), with what the result's message adds; None
    when the run did not end on an API error."""
    records = stderr_records(stderr)
    main = [r for r in records if r[0] == _MAIN]
    from_result = _from_result(result_message) if result_message else None
    if not (main or records):
        return from_result
    merged = (main or records)[-1][1]
    if from_result is not None:
        merged = ApiError(
            kind=merged.kind or from_result.kind,
            message=merged.message or from_result.message,
            status=merged.status if merged.status is not None else from_result.status,
            retry_seconds=_first(merged.retry_seconds, from_result.retry_seconds),
            reason=merged.reason or from_result.reason,
            quota_ids=merged.quota_ids or from_result.quota_ids,
        )
    return merged


def stderr_records(stderr: str) -> list[tuple[str, ApiError]]:
    """The API error records the CLI wrote on stderr, in order: ``Error when talking to
    Gemini API`` (the chat turn) and ``Error generating content via API`` (a side call), each
    with its class, its message (up to the stack), and its ``retryDelayMs`` and ``status``."""
    lines = _ANSI.sub("", stderr).splitlines()
    records: list[tuple[str, ApiError]] = []
    index = 0
    while index < len(lines):
        match = _RECORD.match(lines[index])
        index += 1
        if match is None:
            continue
        message = [match.group("message")]
        while index < len(lines) and not _record_end(lines[index]):
            message.append(lines[index])
            index += 1
        props: dict[str, int] = {}
        while index < len(lines) and lines[index] != "}" and not _RECORD.match(lines[index]):
            prop = _PROPERTY.match(lines[index])
            if prop is not None:
                props[prop.group("name")] = int(prop.group("value"))
            index += 1
        origin = _MAIN if match.group(0).startswith(_MAIN) else "side"
        text = "\n".join(message)
        parsed = _parsed(text, match.group("kind").lstrip("_"))
        delay = props.get("retryDelayMs")
        records.append(
            (
                origin,
                ApiError(
                    kind=parsed.kind,
                    message=parsed.message,
                    status=props.get("status", parsed.status),
                    retry_seconds=_first(delay / 1000 if delay else None, parsed.retry_seconds),
                    reason=parsed.reason,
                    quota_ids=parsed.quota_ids,
                ),
            )
        )
    return records


def _record_end(line: str) -> bool:
    return (
        line.startswith("    at ")
        or line == "{"
        or bool(_PROPERTY.match(line))
        or (line.startswith("  ") and line.rstrip().endswith("{"))
    )


def _from_result(message: str) -> ApiError | None:
    """The result's ``[API Error: <message>]<hint>`` (None when it is another failure)."""
    text = message.strip()
    prefix = "[API Error: "
    if not text.startswith(prefix) or "]" not in text:
        return None
    inner = text[len(prefix) : text.rfind("]")]
    status = re.search(r"\(Status: (\w+)\)$", inner)
    if status:
        inner = inner[: status.start()].rstrip()
    return _parsed(inner, "")


def _parsed(text: str, kind: str) -> ApiError:
    """An error message, read: a Google RPC error body when it is one (its code, message,
    status and details), else the text with the retry time it states."""
    body = _rpc(text)
    if body is None:
        return ApiError(kind=kind, message=one_line(text), retry_seconds=_retry_text(text))
    details = [d for d in body.get("details") or [] if isinstance(d, Mapping)]
    reason = next(
        (str(d["reason"]) for d in details if d.get("@type", "").endswith("ErrorInfo")), ""
    )
    quota_ids = tuple(
        str(v.get("quotaId", ""))
        for d in details
        if d.get("@type", "").endswith("QuotaFailure")
        for v in d.get("violations") or []
        if isinstance(v, Mapping)
    )
    retry = next(
        (
            _duration(str(d.get("retryDelay", "")))
            for d in details
            if d.get("@type", "").endswith("RetryInfo")
        ),
        None,
    )
    message = str(body.get("message", ""))
    code = body.get("code")
    return ApiError(
        kind=kind or "ApiError",
        message=one_line(message),
        status=code if isinstance(code, int) else None,
        retry_seconds=_first(retry, _retry_text(message)),
        reason=reason or str(body.get("status", "")),
        quota_ids=quota_ids,
    )


def _rpc(text: str) -> Mapping[str, Any] | None:
    """The ``error`` object of a Google RPC error body (``{"error": …}`` or a list of one)."""
    start = text.find("{")
    bracket = text.find("[")
    if start < 0:
        return None
    if 0 <= bracket < start:
        start = bracket
    try:
        parsed = json.loads(text[start:])
    except ValueError:
        return None
    if isinstance(parsed, list) and parsed:
        parsed = parsed[0]
    error = parsed.get("error") if isinstance(parsed, Mapping) else None
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        inner = _rpc(error["message"])  # an SDK error wraps the API's body in its message
        return inner if inner is not None else error
    return None


def _retry_text(text: str) -> float | None:
    match = _RETRY_TEXT.search(text)
    if match is None:
        return None
    return _duration(match.group("n") + match.group("unit"))


def _duration(text: str) -> float | None:
    """A protobuf duration ("4s", "4.035955417s", "500ms") in seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)", text.strip())
    if match is None:
        return None
    value = float(match.group(1))
    return value / 1000 if match.group(2) == "ms" else value


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


# -- the verdict -----------------------------------------------------------------------------


def capacity_of(error: ApiError, at: datetime) -> Exhausted | None:
    """What ``error`` says of the engine's capacity (the module docstring's rules), reset
    times counted from ``at`` (when the CLI reported it)."""
    text = f"{error.message} {error.reason}"
    if error.reason in AUTH_REASONS or error.status == 401 or KEY_REFUSED.search(text):
        return AuthenticationFailed(detail=error.detail)
    if not error.quota:
        return None
    daily = any("PerDay" in q or "Daily" in q for q in error.quota_ids) or DAILY.search(text)
    if daily or CREDITS.search(text):
        return CreditsExhausted(detail=error.detail)
    if error.retry_seconds is not None:
        return limits.window(error.detail, at + timedelta(seconds=error.retry_seconds))
    if any("PerMinute" in q for q in error.quota_ids):
        return limits.window(error.detail, at + timedelta(seconds=60))
    if error.kind == "TerminalQuotaError" and not CAPACITY.search(text):
        return CreditsExhausted(detail=error.detail)
    return limits.window(error.detail, None)


def _failure(
    returncode: int, api: ApiError | None, events: Sequence[Mapping[str, Any]], stderr: str
) -> str:
    """Why the run failed, one line: the API error, the result's error, the error events, or
    the CLI's last words on stderr; named by its exit code."""
    meaning = _meaning(returncode)
    if returncode > 128 and api is not None and api.status is not None:
        meaning = f"exit {returncode} (an API error, HTTP {api.status})"
    said = api.detail if api is not None else ""
    if not said:
        said = _said(events) or _last_words(stderr)
    return one_line(f"{meaning}: {said}" if said else meaning)


def _said(events: Sequence[Mapping[str, Any]]) -> str:
    """The run's own error words: the result's error message, else its error events."""
    end = next((e for e in reversed(events) if e.get("type") == "result"), None)
    message = _result_message(end)
    if message:
        return message
    errors = [
        str(e.get("message", ""))
        for e in events
        if e.get("type") == "error" and e.get("severity", "error") == "error"
    ]
    return "; ".join(e for e in errors if e)


def _exit_detail(returncode: int, stderr: str) -> str:
    return one_line(f"{_meaning(returncode)}: {_last_words(stderr)}")


def _meaning(returncode: int) -> str:
    meaning = EXIT_MEANING.get(returncode)
    return f"exit {returncode} ({meaning})" if meaning else f"exit {returncode}"


def _last_words(stderr: str) -> str:
    """What the CLI said last on stderr, its startup notices left out (the fatal message of
    an exit 41 or 55)."""
    lines = [ln.strip() for ln in _ANSI.sub("", stderr).splitlines()]
    words = [ln for ln in lines if ln and not _NOISE.match(ln) and not ln.startswith("at ")]
    return " ".join(words[-3:])


def _result_message(end: Mapping[str, Any] | None) -> str | None:
    if end is None or end.get("status") != "error":
        return None
    error = end.get("error")
    if isinstance(error, Mapping):
        return str(error.get("message") or error.get("type") or "the result says error")
    return str(error or "the result says error")


def _time_of(end: Mapping[str, Any] | None) -> datetime:
    """When the CLI reported its end (the result's timestamp), else now."""
    stamp = end.get("timestamp") if end is not None else None
    at = limits.reset_time(stamp) if isinstance(stamp, str) else None
    return at or limits.now()


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, its whitespace collapsed, at most ``limit`` characters."""
    flat = " ".join(_ANSI.sub("", text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
