"""Claude Code (``claude``) headless: ``claude -p PROMPT --output-format stream-json --verbose
--permission-mode acceptEdits [effort flags] [args]``.

Its stream is NDJSON: ``system/init`` (the session), ``assistant`` messages (``tool_use``
blocks are the tools it ran; ``Edit``/``Write``/``MultiEdit`` name the files it edited; an
``error`` of ``rate_limit``, ``billing_error`` or ``authentication_failed`` is a capacity
signal), ``rate_limit_event`` (``status: rejected`` with a reset time is a window limit), and
last a ``result`` (``is_error``, ``num_turns``, ``result`` — the final text —,
``total_cost_usd``, ``usage``). Its exit codes are not documented: it is judged by the events.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.agents import limits
from actors.agents.base import EngineTask
from actors.agents.cli import CliAdapter, Reading, json_lines
from actors.agents.plans import Plan
from workflows.capacity import AuthenticationFailed, CreditsExhausted

EDIT_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})


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
                reading.session = event.get("session_id")
            elif kind == "assistant":
                _assistant(reading, event)
            elif kind == "rate_limit_event":
                _rate_limit(reading, event)
            elif kind == "result":
                final = event
        if final is None:
            if reading.capacity is None:
                reading.malformed = "the stream ended without a result event"
            reading.capacity = reading.capacity or limits.from_text(stderr)
            return reading
        _result(reading, final)
        return reading


def _assistant(reading: Reading, event: Mapping[str, Any]) -> None:
    message = event.get("message") or {}
    for block in message.get("content") or []:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            name = str(block.get("name"))
            reading.tools.append(name)
            path = (block.get("input") or {}).get("file_path")
            if name in EDIT_TOOLS and isinstance(path, str):
                reading.files.append(path)
        elif isinstance(block, dict) and block.get("type") == "text":
            reading.text = str(block.get("text", ""))
    error = event.get("error") or message.get("error")
    if error == "billing_error":
        reading.capacity = CreditsExhausted(detail="billing_error: the account is out of credits")
    elif error == "authentication_failed":
        reading.capacity = AuthenticationFailed(detail="authentication_failed")
    elif error == "rate_limit" and reading.capacity is None:
        reading.capacity = limits.window("rate_limit", limits.reset_time(reading.text))


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
    if final.get("is_error") and reading.capacity is None:
        reading.capacity = limits.from_text(reading.text)
        if reading.capacity is None:
            reading.error = f"{final.get('subtype', 'error')}: {reading.text[:300]}"
