"""Workflow rows and the read side of the workflow store: values, reads, replay checks.

:class:`store.workflows.WorkflowStore` inherits :class:`WorkflowReads`; everything here only
reads (``verify``'s blocking half lives with the writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import DictRow

from store.db import Conn, Pool, fetch_all, fetch_one, transaction
from store.errors import StoreError
from store.gate_rows import gate_from_row
from store.retry import retried
from store.sql import load
from workflows.engine import (
    Definition,
    Header,
    NonDeterminismError,
    Recorded,
    Registry,
    Status,
    WorkflowError,
    decode_commands,
    decode_event,
    replay,
)
from workflows.queue import AnswerStatus, Gate, JsonObject

Q = load("workflows.sql")


class WorkflowNotFound(StoreError):
    pass


@dataclass(frozen=True, slots=True)
class Workflow:
    id: UUID
    project_id: str
    definition: str
    version: int
    phase: str
    cycle: int
    status: Status
    completion_mode: str | None
    reason: str | None
    input: JsonObject
    state: JsonObject
    last_seq: int
    applied_seq: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @property
    def header(self) -> Header:
        return Header(self.phase, self.cycle, self.status, self.completion_mode, self.reason)


@dataclass(frozen=True, slots=True)
class StartOutcome:
    workflow: Workflow
    created: bool


@dataclass(frozen=True, slots=True)
class GateAnswerOutcome:
    status: AnswerStatus
    gate: Gate | None = None
    detail: str = ""  # why an answer was refused


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    seq: int
    event: JsonObject
    commands: list[JsonObject] | None
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class Verification:
    workflow: Workflow
    replayed: int
    divergence: str | None  # None: replay reproduces the stored state

    @property
    def ok(self) -> bool:
        return self.divergence is None


class WorkflowReads:
    _pool: Pool
    _registry: Registry

    def _history(self, conn: Conn, workflow_id: UUID, *, after: int = 0) -> list[DictRow]:
        return fetch_all(conn, Q["history"], {"workflow_id": workflow_id, "after": after})

    # -- reads -----------------------------------------------------------------------------

    @retried("read a workflow", idempotent=True)
    def get(self, workflow_id: UUID) -> Workflow:
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["get_workflow"], {"id": workflow_id})
        if row is None:
            raise WorkflowNotFound(f"no workflow {workflow_id}")
        return workflow_from_row(row)

    @retried("read a project's workflow", idempotent=True)
    def for_project(self, project_id: str) -> Workflow:
        """The project's live workflow, else its most recent one."""
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["latest_for_project"], {"project_id": project_id})
        if row is None:
            raise WorkflowNotFound(
                f"project {project_id!r} has no workflow; start one with "
                f"`vibey workflow start {project_id}`"
            )
        return workflow_from_row(row)

    @retried("list workflows", idempotent=True)
    def listing(
        self, *, status: Status | None = None, project_id: str | None = None, limit: int = 100
    ) -> list[Workflow]:
        params = {
            "status": None if status is None else status.value,
            "project_id": project_id,
            "limit": limit,
        }
        with transaction(self._pool) as conn:
            return [workflow_from_row(r) for r in fetch_all(conn, Q["list_workflows"], params)]

    @retried("read a workflow's history", idempotent=True)
    def history(self, workflow_id: UUID) -> list[HistoryEntry]:
        with transaction(self._pool) as conn:
            rows = self._history(conn, workflow_id)
        return [HistoryEntry(r["seq"], r["event"], r["commands"], r["recorded_at"]) for r in rows]

    @retried("read a workflow's steps", idempotent=True)
    def steps(self, workflow_id: UUID) -> list[DictRow]:
        with transaction(self._pool) as conn:
            return fetch_all(conn, Q["workflow_steps"], {"workflow_id": workflow_id})

    @retried("read the open gates", idempotent=True)
    def inbox(self, project_id: str | None = None) -> list[tuple[Gate, float]]:
        """Every open gate (workflow questions and parked jobs), oldest first, with how many
        seconds it has waited by the database's clock."""
        with transaction(self._pool) as conn:
            rows = fetch_all(conn, Q["open_gates_inbox"], {"project_id": project_id})
        return [(gate_from_row(r), (r["now"] - r["opened_at"]).total_seconds()) for r in rows]

    def describe(self, workflow: Workflow) -> str:
        return describe(self._registry, workflow)

    def _get(self, conn: Conn, workflow_id: UUID) -> Workflow:
        row = fetch_one(conn, Q["get_workflow"], {"id": workflow_id})
        if row is None:
            raise WorkflowNotFound(f"no workflow {workflow_id}")
        return workflow_from_row(row)

    def _diverges(self, workflow: Workflow, history: Iterable[DictRow]) -> str | None:
        try:
            definition = self._registry.get(workflow.definition, workflow.version)
            recorded = [_recorded(r) for r in history]
            replayed = replay(definition, recorded, upto=workflow.applied_seq)
        except NonDeterminismError as exc:
            return str(exc)
        except WorkflowError as exc:
            return str(exc)
        if replayed.applied != workflow.applied_seq:
            return f"history ends at #{replayed.applied}, the row says #{workflow.applied_seq}"
        return _compare(definition, workflow, replayed.header, replayed.state)


class WorkflowLookup(WorkflowReads):
    """The reads on ``pool`` that need no definition (a workflow, its steps, its history, the
    open gates): what a read command's client asks, with no job repository built. Describing
    and verifying need the definitions: :class:`store.workflows.WorkflowStore` does both."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool


def describe(registry: Registry, workflow: Workflow) -> str:
    """What the workflow is doing or waits on, in its definition's words."""
    if workflow.status is Status.BLOCKED:
        return f"blocked: {workflow.reason}"
    try:
        definition = registry.get(workflow.definition, workflow.version)
        return definition.describe(definition.decode_state(workflow.state))
    except WorkflowError as exc:
        return str(exc)


def _compare(
    definition: Definition[Any], workflow: Workflow, header: Header, state: Any
) -> str | None:
    encoded = dict(definition.encode_state(state))
    if encoded != dict(workflow.state):
        keys = sorted(
            k for k in set(encoded) | set(workflow.state) if encoded.get(k) != workflow.state.get(k)
        )
        return f"replayed state differs from the stored state in: {', '.join(keys)}"
    stored = workflow.header
    if (header.phase, header.cycle) != (stored.phase, stored.cycle):
        return f"replayed phase {header.phase}/{header.cycle}, stored {stored.phase}/{stored.cycle}"
    settled = workflow.applied_seq == workflow.last_seq and stored.status is not Status.BLOCKED
    if settled and (header.status, header.completion_mode) != (
        stored.status,
        stored.completion_mode,
    ):
        return f"replayed status {header.status}, stored {stored.status}"
    return None


def _recorded(row: Mapping[str, Any]) -> Recorded:
    commands = row["commands"]
    return Recorded(
        seq=row["seq"],
        event=decode_event(row["event"]),
        at=row["recorded_at"],
        commands=None if commands is None else decode_commands(commands),
    )


def workflow_from_row(row: Mapping[str, Any], prefix: str = "") -> Workflow:
    """The workflow of a ``workflow`` row; ``prefix``: its columns' names start with it
    (a row of another table's, with the workflow's beside it)."""
    if prefix:
        row = {name: row[prefix + name] for name in _COLUMNS}
    return Workflow(
        id=row["id"],
        project_id=row["project_id"],
        definition=row["definition"],
        version=row["version"],
        phase=row["phase"],
        cycle=row["cycle"],
        status=Status(row["status"]),
        completion_mode=row["completion_mode"],
        reason=row["reason"],
        input=row["input"],
        state=row["state"],
        last_seq=row["last_seq"],
        applied_seq=row["applied_seq"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
    )


# What workflow_from_row reads of a row.
_COLUMNS = (
    "id", "project_id", "definition", "version", "phase", "cycle", "status", "completion_mode",
    "reason", "input", "state", "last_seq", "applied_seq", "created_at", "updated_at",
    "finished_at",
)  # fmt: skip
