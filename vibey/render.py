"""What the ``vibey`` command prints: exit codes, one-line errors, JSON shapes, human text.

Exit codes (:class:`ExitCode`, the only place they are defined)::

    0  OK           done; for ``doctor``: healthy; for ``worker``: stopped by SIGTERM or SIGINT
    1  FAILURE      the command ran and found a problem (a store error, an unhealthy doctor,
                    an unknown project or gate, a gate already answered, a replay divergence)
    2  USAGE        a bad argument or a bad configuration (a SettingsError, an answer a gate
                    does not take, a malformed script file, a gate id that is not a UUID)
    3  UNAVAILABLE  a service did not answer (PostgreSQL)

The JSON shapes (``--json``; times are ISO 8601 with their offset, durations seconds):

* workflow: ``{"id", "project", "definition", "version", "phase", "cycle", "status",
  "completion_mode", "reason", "describe", "last_seq", "created_at", "updated_at",
  "finished_at"}``
* gate: ``{"id", "project", "workflow_id", "name", "kind", "question", "answers", "schema",
  "context", "evidence", "opened_at", "waited_s", "answer", "answered_by", "answered_at",
  "job_id", "deadline_at", "on_deadline", "default_answer", "answer_source"}`` (``workflow_id``
  and ``name`` are null for a parked job's gate, ``job_id`` for a workflow's question;
  ``waited_s``: until it was answered, or until now; ``answer_source``: person, default (its
  deadline answered it) or closed (its workflow finished))
* step: ``{"step", "kind", "item", "state", "attempts", "max_attempts"}``
* history event: ``{"seq", "at", "event", "commands"}`` (``event`` and ``commands`` as stored:
  tagged objects, ``{"type": ..., ...}``; ``commands`` is null for an event not yet applied)
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `import vibey.cli` loads no store nor psycopg: see vibey.cli
    from store.cost import CostLine, WorkflowCost
    from store.workflow_reads import HistoryEntry, Workflow
    from workflows.queue import Gate


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2
    UNAVAILABLE = 3


class CommandError(Exception):
    """A problem a command reports in one line (``vibey: <message>``), exiting ``code``."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.code = code


PHASE_DIAGRAM = (
    "INTAKE → DESIGN → [VISUAL_DESIGN] → BUILD ⇄ REVIEW → "
    "[DEPLOY_DESIGN → DEPLOY_EXECUTE → DEPLOY_REVIEW] → DONE"
)
QUESTION_CHARS = 60


def dump(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def when(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def clock(at: datetime) -> str:
    """A moment for people: UTC, to the second."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def duration(seconds: float) -> str:
    """``45s``, ``3m12s``, ``2h05m``, ``3d04h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def short(text: str, limit: int = QUESTION_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# --- JSON ------------------------------------------------------------------------------------


def workflow_json(workflow: Workflow, describe: str) -> dict[str, Any]:
    return {
        "id": str(workflow.id),
        "project": workflow.project_id,
        "definition": workflow.definition,
        "version": workflow.version,
        "phase": workflow.phase,
        "cycle": workflow.cycle,
        "status": workflow.status.value,
        "completion_mode": workflow.completion_mode,
        "reason": workflow.reason,
        "describe": describe,
        "last_seq": workflow.last_seq,
        "created_at": when(workflow.created_at),
        "updated_at": when(workflow.updated_at),
        "finished_at": when(workflow.finished_at),
    }


def waited(gate: Gate, now: datetime) -> float:
    """Seconds the gate waited: until it was answered, or until ``now``."""
    return ((gate.answered_at or now) - gate.opened_at).total_seconds()


def gate_json(gate: Gate, waited_s: float) -> dict[str, Any]:
    return {
        "id": str(gate.id),
        "project": gate.project_id,
        "workflow_id": None if gate.workflow_id is None else str(gate.workflow_id),
        "name": gate.name,
        "kind": gate.kind,
        "question": gate.prompt,
        "answers": list(gate.answers),
        "schema": dict(gate.schema),
        "context": dict(gate.context),
        "evidence": dict(gate.evidence),
        "opened_at": when(gate.opened_at),
        "waited_s": round(waited_s, 3),
        "answer": gate.answer,
        "answered_by": gate.answered_by,
        "answered_at": when(gate.answered_at),
        "job_id": None if gate.job_id is None else str(gate.job_id),
        "deadline_at": when(gate.deadline_at),
        "on_deadline": gate.on_deadline,
        "default_answer": gate.default_answer,
        "answer_source": gate.answer_source,
    }


def step_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "step": row["step"],
        "kind": row["kind"],
        "item": row["item"] or None,
        "state": row["state"],
        "attempts": row["attempts"],
        "max_attempts": row["max_attempts"],
    }


def history_event_json(entry: HistoryEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "at": when(entry.recorded_at),
        "event": entry.event,
        "commands": entry.commands,
    }


def history_json(workflow: Workflow, entries: Iterable[HistoryEntry]) -> dict[str, Any]:
    return {"workflow_id": str(workflow.id), "events": [history_event_json(e) for e in entries]}


# --- people ----------------------------------------------------------------------------------


def diagram(phase: str) -> str | None:
    """The protocol's phase diagram with ``phase`` marked ``*LIKE_THIS*``; None when the
    phase is not one of the protocol's (another definition)."""
    from workflows.phases import Phase

    if phase not in {p.value for p in Phase}:
        return None
    return re.sub(rf"\b{phase.upper()}\b", f"*{phase.upper()}*", PHASE_DIAGRAM)


def dispatch_note(rows: int, published: int, *, tried: bool) -> str:
    """What became of the step pointers a command committed (``vibey.client_graph.Dispatch``)."""
    steps = "step" if rows == 1 else "steps"
    if published == rows:
        return f"{rows} {steps} dispatched"
    if not tried:
        return f"{rows} {steps} committed; the workers' reconcilers dispatch them"
    return (
        f"{rows} {steps} committed, {published} dispatched now; the workers' reconcilers "
        "dispatch the others (RabbitMQ did not take them now)"
    )


def print_workflow(workflow: Workflow, describe: str) -> None:
    from workflows.engine import Status

    print(
        f"workflow {workflow.id}  project {workflow.project_id}  "
        f"{workflow.definition} v{workflow.version}"
    )
    status = workflow.status.value
    if workflow.completion_mode:
        status += f" ({workflow.completion_mode})"
    print(f"  status:  {status}, cycle {workflow.cycle}, {workflow.last_seq} events")
    print(f"  phase:   {diagram(workflow.phase) or workflow.phase}")
    print(f"  now:     {describe}")
    if workflow.reason and workflow.status is not Status.BLOCKED:  # describe says it
        print(f"  reason:  {workflow.reason}")


def answers_text(gate: Gate) -> str:
    if gate.answers:
        return ", ".join(gate.answers)
    if gate.schema.get("type") == "integer":
        low, high = gate.schema.get("minimum"), gate.schema.get("maximum")
        if low is None and high is None:
            return "an integer"
        return f"an integer {'' if low is None else low}..{'' if high is None else high}"
    return str(gate.schema.get("description") or "any text")  # a pattern's says what matches


def answer_command(gate: Gate) -> str:
    """The exact command that answers ``gate`` (its first answer, when it lists them)."""
    if gate.answers:
        command = f"vibey gate answer {gate.id} {_shell_word(gate.answers[0])}"
        others = gate.answers[1:]
        return command + (f"   (or: {', '.join(others)})" if others else "")
    if gate.schema.get("type") == "integer":
        return f"vibey gate answer {gate.id} N"
    return f'vibey gate answer {gate.id} "..."'


def _shell_word(text: str) -> str:
    return text if re.fullmatch(r"[\w@%+=:,./-]+", text) else "'" + text.replace("'", "'\\''") + "'"


def print_gate_lines(items: Sequence[tuple[Gate, float]], *, indent: str = "") -> None:
    for gate, waited_s in items:
        label = gate.name or f"job {gate.job_id}"
        print(
            f"{indent}{gate.id}  {gate.kind}  {label}  waited {duration(waited_s)}: "
            f"{short(gate.prompt)}"
        )
        print(f"{indent}  {answer_command(gate)}")


def print_gate_table(items: Sequence[tuple[Gate, float]]) -> None:
    if not items:
        print("nothing is waiting")
        return
    rows = [
        (
            str(gate.id),
            gate.project_id,
            gate.kind,
            duration(waited_s),
            short(answers_text(gate), 24),
            short(f"{gate.name}: {gate.prompt}" if gate.name else gate.prompt),
        )
        for gate, waited_s in items
    ]
    header = ("GATE", "PROJECT", "KIND", "WAITED", "ANSWERS", "QUESTION")
    _table(header, rows)


def print_gate(gate: Gate, waited_s: float) -> None:
    state = "open" if gate.open else "answered"
    print(f"gate {gate.id}  {state}, waited {duration(waited_s)}")
    where = (
        f"workflow {gate.workflow_id}, gate {gate.name}"
        if gate.workflow_id is not None
        else f"parked job {gate.job_id}"
    )
    rows: list[tuple[str, str]] = [
        ("project", gate.project_id),
        ("for", where),
        ("kind", gate.kind),
        ("question", " ".join(gate.prompt.split())),
        ("answers", answers_text(gate)),
        ("opened", clock(gate.opened_at)),
    ]
    if gate.context:
        rows.append(("context", _compact(gate.context)))
    if gate.evidence:
        rows.append(("evidence", _compact(gate.evidence)))
    if gate.deadline_at is not None:
        then = f"{gate.on_deadline}" + (
            f" {gate.default_answer!r}" if gate.on_deadline == "answer" else ""
        )
        rows.append(("deadline", f"{clock(gate.deadline_at)}, then {then}"))
    if gate.answered_at is not None:
        rows.append(
            ("answered", f"{gate.answer} by {gate.answered_by} at {clock(gate.answered_at)}")
        )
        if gate.answer_source == "default":
            rows.append(("source", "the gate's default, at its deadline (not a person)"))
    for label, value in rows:
        print(f"  {label + ':':<10}{value}")
    if gate.open:
        print(f"  answer:   {answer_command(gate)}")


def _compact(value: Mapping[str, Any], limit: int = 300) -> str:
    return short(json.dumps(dict(value), ensure_ascii=False, default=str), limit)


def print_steps(rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        print("steps: none yet")
        return
    print(f"steps ({len(rows)}):")
    table = [
        (
            row["step"],
            row["kind"],
            row["item"] or "-",
            row["state"],
            f"{row['attempts']}/{row['max_attempts']}",
        )
        for row in rows
    ]
    _table(("STEP", "KIND", "ITEM", "STATE", "TRIES"), table, indent="  ")


def print_workflow_table(items: Sequence[tuple[Workflow, str]]) -> None:
    if not items:
        print("no workflows")
        return
    rows = [
        (
            wf.project_id,
            wf.status.value,
            f"{wf.phase}/{wf.cycle}",
            clock(wf.updated_at),
            str(wf.id),
            short(describe, 50),
        )
        for wf, describe in items
    ]
    _table(("PROJECT", "STATUS", "PHASE/CYCLE", "UPDATED", "WORKFLOW", "NOW"), rows)


def print_history(
    workflow: Workflow, entries: Sequence[HistoryEntry], *, total: int | None = None
) -> None:
    """The events, under a line with how many there are (``total``: on every page)."""
    count = len(entries) if total is None else total
    print(f"workflow {workflow.id}  project {workflow.project_id}: {count} events")
    for entry in entries:
        print(f"  #{entry.seq:<4} {clock(entry.recorded_at)}  {event_summary(entry.event)}")
        print(f"        → {commands_summary(entry.commands)}")


def event_summary(event: Mapping[str, Any]) -> str:
    kind = event.get("type")
    if kind == "started":
        engine = event.get("input", {}).get("engine", {})
        name = engine.get("name") if isinstance(engine, Mapping) else None
        return "started" + (f" (engine {name})" if name else "")
    if kind == "step_succeeded":
        return f"step {event.get('step')} succeeded"
    if kind == "step_failed":
        detail = short(str(event.get("detail", "")), 60)
        return f"step {event.get('step')} failed ({event.get('failure_class')}): {detail}"
    if kind == "gate_answered":
        return f"gate {event.get('gate')} answered {event.get('answer')!r} by {event.get('by')}"
    if kind == "timer_fired":
        return f"timer {event.get('timer')} fired"
    if kind == "cancel_requested":
        reason = event.get("reason")
        return f"cancel requested by {event.get('by')}" + (f": {reason}" if reason else "")
    return str(kind)


def commands_summary(commands: Sequence[Mapping[str, Any]] | None) -> str:
    if commands is None:
        return "not applied (the workflow is blocked)"
    if not commands:
        return "no commands"
    return ", ".join(_command(c) for c in commands)


def _command(command: Mapping[str, Any]) -> str:
    kind = command.get("type")
    if kind == "schedule_step":
        return f"schedule {command.get('step')}"
    if kind == "open_gate":
        return f"ask {command.get('gate')}"
    if kind == "start_timer":
        return f"timer {command.get('timer')}"
    if kind == "transition_phase":
        return f"phase {command.get('phase')}/{command.get('cycle')}"
    if kind == "complete":
        return f"complete ({command.get('mode')})"
    if kind == "fail":
        return f"fail: {short(str(command.get('reason', '')), 60)}"
    return str(kind)


def print_cost(cost: WorkflowCost) -> None:
    """``vibey workflow cost``: the total, then by engine, phase and step, and the budget."""
    total = cost.total
    print(
        f"workflow {cost.workflow_id} of project {cost.project_id}: {total.price} · "
        f"{total.tokens:,} tokens · {total.turns:g} turns ({total.events} BudgetSpent events)"
    )
    print(cost.budget.summary)
    if not total.events:
        return
    head = ("TURNS", "TOKENS", "IN", "OUT", "DOLLARS")
    print("by engine:")
    _table(
        ("ENGINE", *head), [(ln.engine or "-", *_figures(ln)) for ln in cost.engines], indent="  "
    )
    print("by phase:")
    _table(("PHASE", *head), [(ln.phase or "?", *_figures(ln)) for ln in cost.phases], indent="  ")
    print("by step:")
    rows = [(ln.phase or "?", ln.step or "?", *_figures(ln)) for ln in cost.steps]
    _table(("PHASE", "STEP", *head), rows, indent="  ")


def _figures(line: CostLine) -> tuple[str, ...]:
    return (
        f"{line.turns:g}",
        f"{line.tokens:,}",
        f"{line.input_tokens:,}",
        f"{line.output_tokens:,}",
        line.price,
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str = "") -> None:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        print(indent + "  ".join(cells).rstrip())
