"""Gemini CLI headless: ``gemini -p PROMPT --output-format stream-json --yolo [effort
flags] [args]``.

Its stream is JSONL: ``init`` (the session), ``message`` (the assistant's text, possibly in
deltas), ``tool_use`` / ``tool_result``, ``error``, and ``result`` (``stats`` with token
counts; no cost). Its exit codes are documented: 0 success, 1 a general or API error, 42 an
input error, 53 the turn limit. A quota error prints ``TerminalQuotaError`` /
``RESOURCE_EXHAUSTED`` on stderr: with a ``retryDelay`` it is a window, without one credits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.agents import limits
from actors.agents.base import EngineTask
from actors.agents.cli import CliAdapter, Reading, json_lines
from actors.agents.plans import Plan
from workflows.capacity import CreditsExhausted

EXIT_MEANING = {1: "a general or API error", 42: "an input error", 53: "the turn limit"}
QUOTA = ("TerminalQuotaError", "RESOURCE_EXHAUSTED")


class GeminiAdapter(CliAdapter):
    adapter = "gemini"

    def invocation(self, task: EngineTask, plan: Plan, prompt: str) -> list[str]:
        head = ["-p", prompt, "--output-format", "stream-json", "--yolo"]
        return [*head, *self.spec.effort_args(task.effort), *self.spec.args]

    def read(self, stdout: str, stderr: str, returncode: int) -> Reading:
        reading = Reading()
        texts: list[str] = []
        errors: list[str] = []
        events = json_lines(stdout)
        if isinstance(events, str):
            reading.malformed = events
            return reading
        for event in events:
            if isinstance(event, dict):
                _event(reading, event, texts, errors)
        reading.text = "".join(texts)
        if any(marker in stderr for marker in QUOTA):
            reset = limits.reset_time(stderr)
            detail = next((ln for ln in stderr.splitlines() if any(q in ln for q in QUOTA)), "")
            reading.capacity = (
                limits.window(detail, reset) if reset else CreditsExhausted(detail=detail[:300])
            )
        elif errors or returncode != 0:
            said = "\n".join(errors) or stderr
            reading.capacity = limits.from_text(said)
            if reading.capacity is None:
                meaning = EXIT_MEANING.get(returncode, f"exit {returncode}")
                reading.error = f"{meaning}: {said.strip()[-300:]}"
        return reading


def _event(reading: Reading, event: Mapping[str, Any], texts: list[str], errors: list[str]) -> None:
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
    elif kind == "error":
        errors.append(str(event.get("message", "")))
    elif kind == "result":
        stats = event.get("stats") or {}
        reading.turns = int(stats.get("turns") or stats.get("tool_calls") or 1)
        reading.input_tokens = int(stats.get("input_tokens") or 0)
        reading.output_tokens = int(stats.get("output_tokens") or 0)
        if event.get("status") == "error":
            errors.append(str(event.get("error") or "the result says error"))
