"""Gates people can live with: deadlines, defaults, reminders (swept, never held in memory).

A workflow gate opened with a deadline (``OpenGate(deadline=…, on_deadline=…)``) keeps it in
its row. :meth:`GateDeadlines.sweep` (the event service's, every second or so; several at once
are harmless) finds the gates whose deadline passed and, one transaction each, with the
workflow and then the gate locked (the order every answer takes, so an answer racing the
deadline is applied exactly once: whichever commits first, the other finds the gate answered):

* ``answer``: records the gate's default through the same validator and transaction as a
  person's answer (``WorkflowStore.answer_txn``), answered by
  :data:`workflows.events.DEFAULT_BY` and marked ``answer_source = 'default'``; the workflow
  resumes, its ledger records the answer as the default's;
* ``escalate``: marks the gate escalated and reports it (``gate.escalated``); it waits on;
* ``fail``: records ``GateExpired``, which fails the workflow.

Each writes ``gate.expired`` (or ``gate.escalated``) with it. Reminders: a gate past its next
reminder age gets one ``gate.reminded`` event per age, counted in the row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from store.db import Pool, fetch_all, fetch_one, transaction
from store.event_spans import Attributes, traced_unit
from store.events import emit_on
from store.sql import load
from store.unit_of_work import UnitOfWork
from store.workflows import WorkflowStore
from workflows.engine import ON_DEADLINE_ANSWER, ON_DEADLINE_ESCALATE, GateExpired
from workflows.events import DEFAULT_BY, Draft, EventType
from workflows.queue import AnswerStatus

Q = load("gate_deadlines.sql")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SweepReport:
    expired: int = 0
    escalated: int = 0
    reminded: int = 0


class GateDeadlines:
    def __init__(
        self,
        *,
        pool: Pool,
        workflows: WorkflowStore,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        limit: int = 100,
    ) -> None:
        self._pool = pool
        self._workflows = workflows
        self._units = workflows.jobs.units
        self._clock = clock
        self._limit = limit

    def sweep(self) -> SweepReport:
        now = self._clock()
        with transaction(self._pool) as conn:
            due = [
                r["id"] for r in fetch_all(conn, Q["due_gates"], {"now": now, "limit": self._limit})
            ]
        expired = escalated = 0
        for gate_id in due:
            outcome = self.expire(gate_id, now)
            expired += outcome == "expired"
            escalated += outcome == "escalated"
        return SweepReport(expired, escalated, self.remind(now))

    def expire(self, gate_id: UUID, now: datetime) -> str:
        """One gate's deadline in its own transaction, a span ``gate deadline`` in its
        workflow's trace (``store.event_spans``): the steps it releases are its children."""
        found: dict[str, Any] = {}

        def trace_of(outcome: str) -> tuple[UUID, Attributes] | None:
            if not outcome:
                return None
            workflow_id = found["workflow_id"]
            kind = EventType.GATE_ESCALATED if outcome == "escalated" else EventType.GATE_EXPIRED
            attributes = {"vibey.workflow.id": str(workflow_id), "vibey.event.type": kind.value}
            return workflow_id, attributes | {"vibey.gate.on_deadline": found["on_deadline"]}

        return traced_unit(
            self._units.begin,
            self._workflows.events,
            "gate deadline",
            {"vibey.gate.id": str(gate_id)},
            lambda unit: self.expire_txn(unit, gate_id, now, found=found),
            trace_of,
        )

    def expire_txn(
        self, unit: UnitOfWork, gate_id: UUID, now: datetime, *, found: dict[str, Any] | None = None
    ) -> str:
        """Carry out one gate's deadline: ``expired``, ``escalated``, or ``""`` when someone
        answered it first (or it is not due)."""
        conn = unit.conn
        locked = fetch_one(conn, Q["lock_workflow_of_gate"], {"gate_id": gate_id})
        gate = fetch_one(conn, Q["lock_due_gate"], {"gate_id": gate_id, "now": now})
        if locked is None or gate is None:
            return ""
        if found is not None:  # what the caller's span says of the gate
            found.update(workflow_id=gate["workflow_id"], on_deadline=gate["on_deadline"])
        facts: dict[str, Any] = {
            "gate_id": str(gate_id),
            "gate": gate["name"],
            "kind": gate["kind"],
            "on_deadline": gate["on_deadline"],
            "deadline_at": gate["deadline_at"].isoformat(),
        }
        action = gate["on_deadline"]
        if action == ON_DEADLINE_ESCALATE:
            conn.execute(Q["escalate_gate"].encode(), {"gate_id": gate_id, "now": now})
            self._emit(conn, gate, Draft(EventType.GATE_ESCALATED, facts))
            return "escalated"
        self._emit(
            conn, gate, Draft(EventType.GATE_EXPIRED, facts | {"default": gate["default_answer"]})
        )
        if action == ON_DEADLINE_ANSWER:
            answered = self._workflows.answer_txn(
                unit, gate_id, gate["default_answer"], by=DEFAULT_BY, source="default"
            )
            if answered.status is not AnswerStatus.ANSWERED:  # a default that is not an answer
                log.warning("gate %s: its default was refused (%s)", gate_id, answered.detail)
            return "expired"
        self._workflows.record_txn(unit, gate["workflow_id"], GateExpired(gate=gate["name"]))
        return "expired"

    def remind(self, now: datetime) -> int:
        with transaction(self._pool) as conn:
            rows = fetch_all(conn, Q["remind_gates"], {"now": now, "limit": self._limit})
            for row in rows:
                payload = {
                    "gate_id": str(row["id"]),
                    "gate": row["name"],
                    "kind": row["kind"],
                    "reminder": row["reminded"],
                    "age_s": row["age_s"],
                    "deadline_at": None
                    if row["deadline_at"] is None
                    else row["deadline_at"].isoformat(),
                }
                self._emit(conn, row, Draft(EventType.GATE_REMINDED, payload))
        return len(rows)

    def _emit(self, conn: Any, gate: Any, draft: Draft) -> None:
        workflow = gate["workflow_id"]
        emit_on(
            conn,
            gate["project_id"],
            [draft],
            correlation_id=None if workflow is None else str(workflow),
            causation_id=f"gate:{gate['id']}",
        )
