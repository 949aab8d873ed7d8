"""Claude Code (``claude``) headless: ``claude -p PROMPT --output-format stream-json --verbose
--permission-mode acceptEdits [effort flags] [args]``.

Its stream is NDJSON: ``system/init`` (the session), ``system/api_retry`` (a failed API call
it will retry: ``error``, ``error_status``, ``retry_delay_ms``), ``assistant`` messages
(``tool_use`` blocks are the tools it ran; ``Edit``/``Write``/``MultiEdit`` name the files it
edited; an API error's message carries ``error``: ``rate_limit``, ``billing_error``,
``authentication_failed``, ``server_error``, …), ``rate_limit_event`` (``status: rejected``
with ``resetsAt``: a subscription's window) and last a ``result`` (``is_error``,
``num_turns``, ``result`` — the final text —, ``total_cost_usd``, ``usage``,
``api_error_status``). Its exit codes are not documented: it is judged by the events.

Capacity is read from the error channel only — the ``error`` and ``api_error_status`` fields
of its events, the text of an API error, stderr with paths taken out — never from the model's
words, file names or prompts. An ``api_retry`` of a failed login or spent credits decides the
run at once (``Reading.decided``): Claude Code retries a 401 ten times over about three
minutes, and no retry brings a key back; an overloaded or failing server's retry does not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from actors.agents import limits
from actors.agents.base import EngineTask
from actors.agents.cli import CliAdapter, Reading, json_lines
from actors.agents.plans import Plan
from workflows.capacity import AuthenticationFailed, CreditsExhausted, Exhausted

EDIT_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
AUTH_ERRORS = frozenset({"authentication_failed", "oauth_org_not_allowed"})
CREDIT_ERRORS = frozenset({"billing_error"})
DECISIVE_STATUS = {401: "authentication_failed", 402: "billing_error"}  # retried in vain
_PATH = re.compile(r"\S*[/\\]\S*")


class ClaudeCodeAdapter(CliAdapter):
    adapter = "claude-code"

    def invocation(self, task: EngineTask, plan: Plan, prompt: str) -> list[str]:
        head = ["-p", prompt, "--output-format", "stream-json", "--verbose"]
        head += ["--permission-mode", "acceptEdits"]
        return [*head, *self.spec.effort_args(task.effort), *self.spec.args]

    def read(self, stdout: str, stderr: str, returncode: int) -> Reading:
        reading = Reading()
        final: Mapping[str, Any] | None = None
        events = json_lines(stdout)
        if isinstance(events, str):
            reading.malformed = events
            return reading
        for event in events:
            kind = event.get("type")
            if kind == "system":
                reading.session = event.get("session_id") or reading.session
                if event.get("subtype") == "api_retry":
                    _retry(reading, event)
            elif kind == "assistant":
                _assistant(reading, event)
            elif kind == "rate_limit_event":
                _rate_limit(reading, event)
            elif kind == "result":
                final = event
        if final is None:
            reading.capacity = reading.capacity or limits.from_text(_PATH.sub("<path>", stderr))
            if reading.capacity is None:
                reading.malformed = "the stream ended without a result event"
            return reading
        _result(reading, final)
        return reading


def _capacity(error: Any, text: str, reset: Any = None) -> Exhausted | None:
    """The capacity state an API error's ``error`` names (``text``: its message)."""
    if error in CREDIT_ERRORS:
        return CreditsExhausted(detail=f"{error}: {text}"[:300])
    if error in AUTH_ERRORS:
        return AuthenticationFailed(detail=f"{error}: {text}"[:300])
    if error == "rate_limit":
        return limits.window(f"rate_limit: {text}", limits.reset_time(reset or text))
    return None


def _retry(reading: Reading, event: Mapping[str, Any]) -> None:
    """A ``system/api_retry``: a failed login or spent credits decides the run (the CLI
    would retry it for minutes); any other retry is the CLI's own business."""
    error, status = event.get("error"), event.get("error_status")
    if error not in AUTH_ERRORS | CREDIT_ERRORS:
        error = DECISIVE_STATUS.get(status) if isinstance(status, int) else None
    if error is None:
        return
    tries = f"retry {event.get('attempt')} of {event.get('max_retries')}"
    reading.capacity = _capacity(error, f"HTTP {status}, {tries}; stopped at the first")
    reading.decided = True


def _assistant(reading: Reading, event: Mapping[str, Any]) -> None:
    message = event.get("message") or {}
    text = ""
    for block in message.get("content") or []:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            name = str(block.get("name"))
            reading.tools.append(name)
            path = (block.get("input") or {}).get("file_path")
            if name in EDIT_TOOLS and isinstance(path, str):
                reading.files.append(path)
        elif isinstance(block, dict) and block.get("type") == "text":
            text = reading.text = str(block.get("text", ""))
    error = event.get("error") or message.get("error")
    if error is None:
        return
    if error != "rate_limit" or reading.capacity is None:  # a rate_limit_event's reset wins
        info = event.get("rate_limit_info") or {}
        reading.capacity = _capacity(error, text, info.get("resetsAt"))
    if reading.capacity is None:
        status = event.get("api_error_status")
        reading.error = f"{error}{f' (HTTP {status})' if status else ''}: {text[:300]}"


def _rate_limit(reading: Reading, event: Mapping[str, Any]) -> None:
    info = event.get("rate_limit_info") or event
    if info.get("status") != "rejected":
        return
    reset = next((info[k] for k in ("resetsAt", "resets_at", "reset_at") if k in info), None)
    limit = info.get("rateLimitType") or info.get("type") or "rate limit"
    reading.capacity = limits.window(f"{limit} limit reached", limits.reset_time(reset))


def _result(reading: Reading, final: Mapping[str, Any]) -> None:
    reading.text = str(final.get("result") or reading.text)
    reading.turns = int(final.get("num_turns") or 0)
    usage = final.get("usage") or {}
    reading.input_tokens = int(usage.get("input_tokens") or 0)
    reading.output_tokens = int(usage.get("output_tokens") or 0)
    cost = final.get("total_cost_usd")
    reading.dollars = float(cost) if isinstance(cost, int | float) else None
    if not final.get("is_error") or reading.capacity is not None:
        reading.error = None if not final.get("is_error") else reading.error
        return
    if reading.error is None and final.get("api_error_status") is not None:
        # an API error the assistant events did not name (an older CLI): its message
        reading.capacity = limits.from_text(reading.text)
    if reading.capacity is None:
        said = "; ".join(map(str, final.get("errors") or [])) or reading.text[:300]
        reading.error = reading.error or f"{final.get('subtype', 'error')}: {said}"
