"""OpenAI Codex CLI headless: ``codex exec --json --sandbox workspace-write
--skip-git-repo-check --output-schema SCHEMA -o ANSWER [effort flags] [args] PROMPT``.

**The result schema.** Codex sends ``--output-schema`` to the Responses API as a ``json_schema``
format with ``strict: true``, and the API refuses any schema outside its strict subset
(``invalid_json_schema``). So ``SCHEMA`` is the step kind's declared result schema, widened to
admit the failure report (:func:`workflows.strict_schema.with_failure_report`) and projected to
the strict subset (:func:`~workflows.strict_schema.project`); ``-o`` writes Codex's last message
(the answer, of that projected shape) to ``<job>.answer.json`` beside the verdict file, and
the adapter maps it back to the declared shape (:func:`~workflows.strict_schema.decode`) into
the plan's verdict file before the run is judged. An answer that is not of the projected shape
fails the attempt as the engine's.

**The stream** is JSONL: ``thread.started``, ``turn.started``, ``item.completed``
(``agent_message`` text, ``command_execution``, ``file_change`` with its ``changes``,
``mcp_tool_call``; an ``error`` item is a warning), ``turn.completed`` (``usage``: tokens;
Codex reports no cost), ``turn.failed`` / ``error``.

**Capacity** is read from the error channel only: the messages of ``error`` and ``turn.failed``
events (of a run whose turn did not complete), and, when stdout has no events, stderr's error
lines; never from agent messages, commands or file names, and never from the ``url: …`` and
``request id: …`` Codex appends to an HTTP error. The messages of codex 0.171 (codex-rs
``CodexErr``):

=========================================================  =====================================
"You've hit your usage limit. … Try again at 8:15 AM."     window, reset at that local time
("… or try again at Dec 4th, 2026 8:15 AM."; "Try again    (:func:`limits.clock_reset`, in the
later." has none)                                          engine's ``TZ`` or the worker's zone)
"exceeded retry limit, last status: 429 Too Many …"        window, reset unknown (a 429 that is
                                                           not a usage limit, retried out)
"Quota exceeded. Check your plan and billing details.",    credits
"Your workspace is out of credits …", "You hit your
spend cap …", "To use Codex with your ChatGPT plan,
upgrade to Plus …"
"unexpected status 401 Unauthorized: …", a token that      authentication
could not be refreshed
=========================================================  =====================================

``exec`` has been seen not to exit after answering, and it reconnects for ever to a server it
cannot reach ("Reconnecting... waiting for network"): the timeout is always enforced. A
``CODEX_HOME`` under the temporary directory is refused before the run (:meth:`home_problem`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from actors.agents import limits
from actors.agents.base import EngineTask, EngineVerdict
from actors.agents.cli import CliAdapter, Reading, Streamed, fault, json_lines
from actors.agents.plans import Plan
from actors.agents.process import Exit
from actors.agents.roster import AgentSpec
from workflows.capacity import AuthenticationFailed, CreditsExhausted, Exhausted
from workflows.strict_schema import StrictAnswerError, decode, project, with_failure_report

_TRAILER = re.compile(r",? (?:url|request id|cf-ray): \S+", re.IGNORECASE)
_USAGE_LIMIT = re.compile(r"you['’]ve hit your usage limit", re.IGNORECASE)
_RETRIED_429 = re.compile(r"exceeded retry limit, last status: 429\b", re.IGNORECASE)
_CREDITS = re.compile(
    r"quota exceeded\. check your plan and billing details|workspace is out of credits|"
    r"you hit your spend cap|to use codex with your chatgpt plan, upgrade",
    re.IGNORECASE,
)
_AUTH = re.compile(
    r"unexpected status 401\b|could not be refreshed|sign in again|not logged in",
    re.IGNORECASE,
)
_STDERR_ERROR = re.compile(r"^\s*(?:error|fatal)\b|^\s*\S*error:", re.IGNORECASE)


class CodexAdapter(CliAdapter):
    adapter = "codex"

    def __init__(self, spec: AgentSpec, *, worker_env: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(spec, worker_env=worker_env, **kwargs)
        if "TZ" not in self._env and worker_env.get("TZ"):
            self._env = {**self._env, "TZ": worker_env["TZ"]}  # Codex prints its resets in it

    def run(self, task: EngineTask) -> EngineVerdict:
        problem = self.home_problem()
        if problem is not None:
            return fault(f"engine {self.spec.id}: {problem}")
        return super().run(task)

    def home_problem(self) -> str | None:
        """Why the engine's ``CODEX_HOME`` cannot work: Codex 0.171 does not set up its
        sandbox helper (``codex-linux-sandbox``) in a home under the temporary directory, and
        then every tool call fails ("bwrap: execvp codex-linux-sandbox: No such file")."""
        home = self.environment.get("CODEX_HOME")
        if not home:
            return None
        temporary = Path(self.environment.get("TMPDIR") or "/tmp").resolve()
        if not Path(home).resolve().is_relative_to(temporary):
            return None
        return (
            f"CODEX_HOME {home} is under the temporary directory {temporary}: Codex runs no "
            "tool from there; move it (or set the engine's TMPDIR elsewhere)"
        )

    def invocation(self, task: EngineTask, plan: Plan, prompt: str) -> list[str]:
        schema = plan.json_file.with_suffix(".schema.json")
        schema.write_text(json.dumps(project(_reportable(plan))), encoding="utf-8")
        # Inside vibey's own confinement (actors.agents.confine) Codex's sandbox would nest a
        # second one, which the first forbids (its tools then fail silently): vibey's is the
        # wall, as a container's would be.
        confined = self.confinement.mechanism.kind != "none"
        sandbox = "danger-full-access" if confined else "workspace-write"
        head = ["exec", "--json", "--sandbox", sandbox, "--skip-git-repo-check"]
        head += ["--output-schema", str(schema), "-o", str(_answer_file(plan))]
        return [*head, *self.spec.effort_args(task.effort), *self.spec.args, prompt]

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
        """The answer mapped back to the kind's declared shape (into the verdict file), then
        judged as every CLI's run is."""
        refused = None if reading.capacity is not None else _map_answer(plan, reading)
        verdict = super().judge(task, plan, done, reading, changed, transcript, streamed)
        if refused is None or verdict.status != "ok":
            return verdict
        return fault(f"engine {self.spec.id}: {refused}", verdict.evidence)

    def read(self, stdout: str, stderr: str, returncode: int) -> Reading:
        reading = Reading()
        events = json_lines(stdout)
        if isinstance(events, str):
            reading.malformed = events
            return reading
        failures: list[str] = []
        ended = ""
        for event in events:
            ended = _event(reading, event, failures) or ended
        if failures and ended != "completed":
            text = "\n".join(dict.fromkeys(failures))
            reading.capacity = self.capacity(text)
            if reading.capacity is None:
                reading.error = text[:500]
        elif not stdout.strip():
            errors = "\n".join(line for line in stderr.splitlines() if _STDERR_ERROR.search(line))
            reading.capacity = self.capacity(errors) if errors else None
            if reading.capacity is None:
                reading.malformed = "no events on stdout"
        return reading

    def capacity(self, message: str) -> Exhausted | None:
        """The capacity state one of Codex's error messages names, if any."""
        text = _TRAILER.sub("", message)
        if _USAGE_LIMIT.search(text):
            at = limits.clock_reset(text, zone=self._zone()) or limits.reset_time(text)
            return limits.window(_first_line(text, _USAGE_LIMIT), at)
        if _RETRIED_429.search(text):
            return limits.window(_first_line(text, _RETRIED_429), None)
        if _CREDITS.search(text):
            return CreditsExhausted(detail=_first_line(text, _CREDITS))
        if _AUTH.search(text):
            return AuthenticationFailed(detail=_first_line(text, _AUTH))
        return limits.from_text(text)

    def _zone(self) -> tzinfo | None:
        """The zone Codex prints its local times in: its ``TZ``, else this worker's zone."""
        name = self.environment.get("TZ", "").lstrip(":")
        if not name:
            return None
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            return None


def _reportable(plan: Plan) -> dict[str, Any]:
    """The kind's declared result schema, widened to admit the failure report."""
    declared = plan.data.get("result_schema") or {"type": "object"}
    return with_failure_report(declared)


def _answer_file(plan: Plan) -> Path:
    return plan.verdict_file.with_suffix(".answer.json")


def _map_answer(plan: Plan, reading: Reading) -> str | None:
    """Writes Codex's answer (``-o``'s file, else its final message), in the declared shape, to
    the verdict file; why it could not when the answer is JSON but not of the projected shape.
    Prose is left to the shared judgement (it reports no result)."""
    source = _answer_file(plan)
    text = source.read_text(encoding="utf-8", errors="replace") if source.is_file() else ""
    try:
        answer = json.loads(text or reading.text)
    except ValueError:
        return None
    try:
        result = decode(answer, _reportable(plan))
    except StrictAnswerError as exc:
        return f"answered outside its result schema: {exc}"
    if not isinstance(result, dict):
        return f"answered {type(result).__name__}, not a JSON object"
    plan.verdict_file.parent.mkdir(parents=True, exist_ok=True)
    plan.verdict_file.write_text(json.dumps(result), encoding="utf-8")
    return None


def _first_line(text: str, pattern: re.Pattern[str]) -> str:
    match = pattern.search(text)
    start = text.rfind("\n", 0, match.start()) + 1 if match else 0
    end = text.find("\n", start)
    return text[start : end if end >= 0 else len(text)].strip()[:300]


def _event(reading: Reading, event: Mapping[str, Any], failures: list[str]) -> str | None:
    """Reads one event into ``reading``; ``completed`` / ``failed`` when it ends a turn."""
    kind = event.get("type")
    if kind == "thread.started":
        reading.session = event.get("thread_id")
    elif kind == "turn.completed":
        usage = event.get("usage") or {}
        reading.turns += 1
        reading.input_tokens += int(usage.get("input_tokens") or 0)
        reading.output_tokens += int(usage.get("output_tokens") or 0)
        return "completed"
    elif kind == "item.completed":
        _item(reading, event.get("item") or {})
    elif kind == "turn.failed":
        error = event.get("error") or {}
        failures.append(str(error.get("message", error) if isinstance(error, dict) else error))
        return "failed"
    elif kind == "error":
        failures.append(str(event.get("message", "")))
    return None


def _item(reading: Reading, item: Mapping[str, Any]) -> None:
    kind = item.get("type")
    if kind == "agent_message":
        reading.text = str(item.get("text", ""))
    elif kind == "command_execution":
        reading.tools.append(f"shell: {str(item.get('command', ''))[:200]}")
    elif kind == "mcp_tool_call":
        reading.tools.append(str(item.get("tool", "mcp")))
    elif kind == "file_change" and item.get("status") != "failed":
        for change in item.get("changes") or []:
            if isinstance(change, dict) and isinstance(change.get("path"), str):
                reading.files.append(change["path"])  # absolute: cli.edited relativises
