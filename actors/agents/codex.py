"""OpenAI Codex CLI headless: ``codex exec --json --sandbox workspace-write
--skip-git-repo-check --output-schema SCHEMA -o VERDICT [effort flags] [args] PROMPT``.

The result schema of the step's kind goes to ``--output-schema``, and ``-o`` writes the last
message to the plan's verdict file. Its stream is JSONL: ``thread.started``, ``turn.started``,
``item.completed`` (``agent_message`` text, ``command_execution``, ``file_change`` with its
``changes``, ``mcp_tool_call``), ``turn.completed`` (``usage``: tokens; Codex reports no
cost), ``turn.failed`` / ``error`` (a usage limit "… try again at <time>" is a window; "Quota
exceeded. Check your plan and billing details." is credits). ``exec`` has been seen not to
exit after answering: the timeout is always enforced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from actors.agents import limits
from actors.agents.base import EngineTask
from actors.agents.cli import CliAdapter, Reading, json_lines
from actors.agents.plans import Plan


class CodexAdapter(CliAdapter):
    adapter = "codex"

    def invocation(self, task: EngineTask, plan: Plan, prompt: str) -> list[str]:
        schema = plan.json_file.with_suffix(".schema.json")
        schema.write_text(
            json.dumps(plan.data.get("result_schema") or {"type": "object"}), encoding="utf-8"
        )
        head = ["exec", "--json", "--sandbox", "workspace-write", "--skip-git-repo-check"]
        head += ["--output-schema", str(schema), "-o", str(plan.verdict_file)]
        return [*head, *self.spec.effort_args(task.effort), *self.spec.args, prompt]

    def read(self, stdout: str, stderr: str, returncode: int) -> Reading:
        reading = Reading()
        failures: list[str] = []
        events = json_lines(stdout)
        if isinstance(events, str):
            reading.malformed = events
            return reading
        for event in events:
            if isinstance(event, dict):
                _event(reading, event, failures)
        if failures:
            text = "\n".join(failures)
            reading.capacity = limits.from_text(text)
            if reading.capacity is None:
                reading.error = text[:500]
        elif not stdout.strip():
            reading.capacity = limits.from_text(stderr)
            if reading.capacity is None:
                reading.malformed = "no events on stdout"
        return reading


def _event(reading: Reading, event: Mapping[str, Any], failures: list[str]) -> None:
    kind = event.get("type")
    if kind == "thread.started":
        reading.session = event.get("thread_id")
    elif kind == "turn.completed":
        usage = event.get("usage") or {}
        reading.turns += 1
        reading.input_tokens += int(usage.get("input_tokens") or 0)
        reading.output_tokens += int(usage.get("output_tokens") or 0)
    elif kind == "item.completed":
        _item(reading, event.get("item") or {})
    elif kind == "turn.failed":
        error = event.get("error") or {}
        failures.append(str(error.get("message", error) if isinstance(error, dict) else error))
    elif kind == "error":
        failures.append(str(event.get("message", "")))


def _item(reading: Reading, item: Mapping[str, Any]) -> None:
    kind = item.get("type")
    if kind == "agent_message":
        reading.text = str(item.get("text", ""))
    elif kind == "command_execution":
        reading.tools.append(f"shell: {str(item.get('command', ''))[:200]}")
    elif kind == "mcp_tool_call":
        reading.tools.append(str(item.get("tool", "mcp")))
    elif kind == "file_change":
        for change in item.get("changes") or []:
            if isinstance(change, dict) and isinstance(change.get("path"), str):
                reading.files.append(change["path"])
