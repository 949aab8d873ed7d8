"""Typed rows for the tables the migrations create; the migrations are the schema's source.

These models mirror ``migrations/*.sql`` and the ``schema_migrations`` ledger
(``store/migrate.py``) column for column: types, nullability, server defaults, keys,
constraints by name and every index, partial ones included. They never create anything (the
enum types say ``create_type=False``; nothing calls ``create_all`` outside the drift test);
``tests/integration/test_migrations.py`` migrates an empty database and fails on any drift.

SQLModel gives typed rows and simple CRUD; claims, fenced settles and the reaper stay named SQL
(``store/sql/``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    Integer,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from workflows.engine import Status as WorkflowStatus
from workflows.job import FailureClass, JobState

# The PostgreSQL enum types of 0001 and 0004; their labels are the Python enums' values.
JOB_STATE = Enum(
    JobState,
    name="job_state",
    create_type=False,
    values_callable=lambda members: [m.value for m in members],
)
FAILURE_CLASS = Enum(
    FailureClass,
    name="failure_class",
    create_type=False,
    values_callable=lambda members: [m.value for m in members],
)
WORKFLOW_STATUS = Enum(
    WorkflowStatus,
    name="workflow_status",
    create_type=False,
    values_callable=lambda members: [m.value for m in members],
)

_NOW = text("now()")


def _timestamptz(*, nullable: bool, now: bool = False) -> Column[datetime]:
    return Column(DateTime(timezone=True), nullable=nullable, server_default=_NOW if now else None)


class JobRow(SQLModel, table=True):
    """``job``: one row per logical piece of work, for all time."""

    __tablename__ = "job"
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key", name="job_idempotency"),
        CheckConstraint("attempts >= 0 AND max_attempts >= 1", name="job_attempts_bounds"),
        CheckConstraint("lease_ms > 0", name="job_lease_positive"),
        CheckConstraint(
            "(state = 'leased') = (lease_owner IS NOT NULL)"
            " AND (state = 'leased') = (lease_token IS NOT NULL)"
            " AND (state = 'leased') = (lease_expires_at IS NOT NULL)",
            name="job_lease_fence",
        ),
        CheckConstraint("dispatch_seq >= 0", name="job_dispatch_seq_nonneg"),
        CheckConstraint("(workflow_id IS NULL) = (step IS NULL)", name="job_step_of_workflow"),
    )

    id: uuid.UUID = Field(sa_column=Column(Uuid, primary_key=True))
    project_id: str = Field(sa_column=Column(Text, nullable=False))
    cycle: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    kind: str = Field(sa_column=Column(Text, nullable=False))
    subject: str = Field(sa_column=Column(Text, nullable=False, server_default=text("''")))
    idempotency_key: str = Field(sa_column=Column(Text, nullable=False))
    state: JobState = Field(
        sa_column=Column(JOB_STATE, nullable=False, server_default=text("'ready'"))
    )
    priority: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    payload: dict[str, Any] = Field(
        sa_column=Column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    )
    result: dict[str, Any] | None = Field(sa_column=Column(JSONB, nullable=True))
    run_after: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    attempts: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    max_attempts: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("5")))
    lease_ms: int = Field(sa_column=Column(Integer, nullable=False))
    lease_owner: str | None = Field(sa_column=Column(Text, nullable=True))
    lease_token: uuid.UUID | None = Field(sa_column=Column(Uuid, nullable=True))
    lease_expires_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    engine_id: str | None = Field(sa_column=Column(Text, nullable=True))
    last_error: str | None = Field(sa_column=Column(Text, nullable=True))
    failure_class: FailureClass | None = Field(sa_column=Column(FAILURE_CLASS, nullable=True))
    created_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    updated_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    settled_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    # 0002_job_dispatch
    dispatch_seq: int = Field(
        sa_column=Column(BigInteger, nullable=False, server_default=text("0"))
    )
    dispatched_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    # 0004_workflows: a step names its workflow and its step name
    workflow_id: uuid.UUID | None = Field(
        sa_column=Column(Uuid, ForeignKey("workflow.id"), nullable=True)
    )
    step: str | None = Field(sa_column=Column(Text, nullable=True))
    lease_expired: bool = Field(
        sa_column=Column(Boolean, nullable=False, server_default=text("false"))
    )
    # 0014_sweep_backoff: the lost-dispatch sweep's resends since the job's last claim
    sweeps: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))


class JobDependencyRow(SQLModel, table=True):
    """``job_dependency``: ``job_id`` may not be claimed before ``depends_on`` succeeded."""

    __tablename__ = "job_dependency"
    __table_args__ = (CheckConstraint("job_id <> depends_on", name="job_dependency_not_self"),)

    job_id: uuid.UUID = Field(
        sa_column=Column(Uuid, ForeignKey("job.id", ondelete="CASCADE"), primary_key=True)
    )
    depends_on: uuid.UUID = Field(sa_column=Column(Uuid, ForeignKey("job.id"), primary_key=True))


class GateRow(SQLModel, table=True):
    """``gate``: a question a parked job or a workflow waits behind, until a person answers it."""

    __tablename__ = "gate"
    __table_args__ = (
        CheckConstraint(
            "(answer IS NULL) = (answered_at IS NULL) AND (answer IS NULL) = (answered_by IS NULL)",
            name="gate_answer_complete",
        ),
        CheckConstraint("name IS NULL OR workflow_id IS NOT NULL", name="gate_named_in_workflow"),
        CheckConstraint("name IS NULL OR job_id IS NULL", name="gate_owner"),
        CheckConstraint(
            "on_deadline IS NULL OR on_deadline IN ('answer', 'escalate', 'fail')",
            name="gate_on_deadline",
        ),
        CheckConstraint(
            "(deadline_at IS NULL) = (on_deadline IS NULL)", name="gate_deadline_complete"
        ),
        CheckConstraint(
            "on_deadline IS DISTINCT FROM 'answer' OR default_answer IS NOT NULL",
            name="gate_default_answer",
        ),
        CheckConstraint(
            "answer_source IS NULL OR answer_source IN ('person', 'default', 'closed')",
            name="gate_answer_source",
        ),
    )

    id: uuid.UUID = Field(sa_column=Column(Uuid, primary_key=True))
    project_id: str = Field(sa_column=Column(Text, nullable=False))
    job_id: uuid.UUID | None = Field(sa_column=Column(Uuid, ForeignKey("job.id"), nullable=True))
    kind: str = Field(sa_column=Column(Text, nullable=False))
    prompt: str = Field(sa_column=Column(Text, nullable=False))
    answers: list[str] = Field(
        sa_column=Column(JSONB, nullable=False, server_default=text("'[]'::jsonb"))
    )
    context: dict[str, Any] = Field(
        sa_column=Column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    )
    opened_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    answer: str | None = Field(sa_column=Column(Text, nullable=True))
    answered_by: str | None = Field(sa_column=Column(Text, nullable=True))
    answered_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    # 0004_workflows: a workflow's gate is named within it; a parked job's names no gate
    workflow_id: uuid.UUID | None = Field(
        sa_column=Column(Uuid, ForeignKey("workflow.id"), nullable=True)
    )
    name: str | None = Field(sa_column=Column(Text, nullable=True))
    schema_: dict[str, Any] = Field(
        sa_column=Column("schema", JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    )
    evidence: dict[str, Any] = Field(
        sa_column=Column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    )
    # 0011_events: a deadline, its default, reminders; who answered
    deadline_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    on_deadline: str | None = Field(sa_column=Column(Text, nullable=True))
    default_answer: str | None = Field(sa_column=Column(Text, nullable=True))
    reminders: list[int] = Field(
        sa_column=Column(JSONB, nullable=False, server_default=text("'[]'::jsonb"))
    )
    reminded: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    escalated_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    answer_source: str | None = Field(sa_column=Column(Text, nullable=True))


class JobOutboxRow(SQLModel, table=True):
    """``job_outbox``: dispatch pointers written with the transition, relayed after commit."""

    __tablename__ = "job_outbox"
    __table_args__ = (
        UniqueConstraint("key", name="job_outbox_key"),
        CheckConstraint(
            "(claimed_by IS NULL) = (claimed_at IS NULL)", name="job_outbox_claim_complete"
        ),
    )

    id: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
    key: str = Field(sa_column=Column(Text, nullable=False))
    job_id: uuid.UUID = Field(
        sa_column=Column(Uuid, ForeignKey("job.id", ondelete="CASCADE"), nullable=False)
    )
    project_id: str = Field(sa_column=Column(Text, nullable=False))
    dispatch_seq: int = Field(sa_column=Column(BigInteger, nullable=False))
    kind: str = Field(sa_column=Column(Text, nullable=False))
    not_before: datetime = Field(sa_column=_timestamptz(nullable=False))
    created_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    claimed_by: str | None = Field(sa_column=Column(Text, nullable=True))
    claimed_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    sent_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    # 0003_outbox_solo
    solo: bool = Field(sa_column=Column(Boolean, nullable=False, server_default=text("false")))
    # 0010_project_routes: filled from the job by a trigger
    priority: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    workflow_id: uuid.UUID | None = Field(sa_column=Column(Uuid, nullable=True))
    # 0017_outbox_traceparent: the W3C trace context the pointer continues (NULL: untraced)
    traceparent: str | None = Field(sa_column=Column(Text, nullable=True))


class WorkflowRow(SQLModel, table=True):
    """``workflow``: one row per run of a workflow definition, for all time."""

    __tablename__ = "workflow"
    __table_args__ = (
        CheckConstraint("0 <= applied_seq AND applied_seq <= last_seq", name="workflow_seq_order"),
        CheckConstraint(
            "(status = 'completed') = (completion_mode IS NOT NULL)",
            name="workflow_completion_mode",
        ),
        CheckConstraint(
            "(status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)",
            name="workflow_finished",
        ),
        CheckConstraint(
            "archived_at IS NULL OR finished_at IS NOT NULL", name="workflow_archived_finished"
        ),
    )

    id: uuid.UUID = Field(sa_column=Column(Uuid, primary_key=True))
    project_id: str = Field(sa_column=Column(Text, nullable=False))
    definition: str = Field(sa_column=Column(Text, nullable=False))
    version: int = Field(sa_column=Column(Integer, nullable=False))
    phase: str = Field(sa_column=Column(Text, nullable=False))
    cycle: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    status: WorkflowStatus = Field(
        sa_column=Column(WORKFLOW_STATUS, nullable=False, server_default=text("'running'"))
    )
    completion_mode: str | None = Field(sa_column=Column(Text, nullable=True))
    reason: str | None = Field(sa_column=Column(Text, nullable=True))
    input: dict[str, Any] = Field(
        sa_column=Column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    )
    state: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False))
    # history: events 1..last_seq are recorded, 1..applied_seq went through decide()
    last_seq: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    applied_seq: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    created_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    updated_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    finished_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    # 0016_workflow_retention: its jobs and gates deleted, its history in workflow_archive
    archived_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))


class WorkflowHistoryRow(SQLModel, table=True):
    """``workflow_history``: a workflow's events in order, append-only (a trigger refuses
    changes; ``commands`` is written once, when the event is applied)."""

    __tablename__ = "workflow_history"
    __table_args__ = (CheckConstraint("seq >= 1", name="workflow_history_seq_positive"),)

    workflow_id: uuid.UUID = Field(
        sa_column=Column(Uuid, ForeignKey("workflow.id"), primary_key=True)
    )
    seq: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    event: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False))
    # the commands decide() gave for this event; NULL while the event waits to be applied
    commands: list[dict[str, Any]] | None = Field(sa_column=Column(JSONB, nullable=True))
    recorded_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))


class SchemaMigrationRow(SQLModel, table=True):
    """``schema_migrations``: the ledger ``store.migrate`` keeps, one row per applied file."""

    __tablename__ = "schema_migrations"

    # A plain integer key: no sequence, the version comes from the file name.
    version: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    name: str = Field(sa_column=Column(Text, nullable=False))
    checksum: str = Field(sa_column=Column(Text, nullable=False))
    applied_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    # The oldest code level the migration serves (store.migrate; NULL: itself only).
    serves_from: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))


def _table(model: type[SQLModel]) -> Table:
    return SQLModel.metadata.tables[str(model.__tablename__)]


_job = _table(JobRow)
_gate = _table(GateRow)

# Indexes on expressions of their table's columns are declared after the tables exist.
Index(
    "job_claimable",
    _job.c.project_id,
    _job.c.priority.desc(),
    _job.c.run_after,
    _job.c.id,
    postgresql_where=_job.c.state.in_([JobState.READY, JobState.AWAITING_CAPACITY]),
)
Index("job_lease_expiry", _job.c.lease_expires_at, postgresql_where=_job.c.state == JobState.LEASED)
Index("job_project_cycle", _job.c.project_id, _job.c.cycle)
Index("job_dependency_depends_on", _table(JobDependencyRow).c.depends_on)
Index(
    "gate_one_open_per_job",
    _gate.c.job_id,
    unique=True,
    postgresql_where=_gate.c.answered_at.is_(None),
)
_open_gate = _gate.c.answered_at.is_(None)
# The list commands' keyset pages (migrations/0009_list_indexes.sql).
Index("gate_inbox", _gate.c.opened_at, _gate.c.id, postgresql_where=_open_gate)
Index(
    "gate_inbox_by_project",
    _gate.c.project_id,
    _gate.c.opened_at,
    _gate.c.id,
    postgresql_where=_open_gate,
)
Index(
    "gate_inbox_by_kind", _gate.c.kind, _gate.c.opened_at, _gate.c.id, postgresql_where=_open_gate
)
_outbox = _table(JobOutboxRow)
Index("job_outbox_sent", _outbox.c.sent_at, postgresql_where=_outbox.c.sent_at.is_not(None))
Index(
    "job_outbox_unsent",
    _outbox.c.created_at,
    _outbox.c.id,
    postgresql_where=_outbox.c.sent_at.is_(None),
)
Index(
    "job_workflow_step",
    _job.c.workflow_id,
    _job.c.step,
    unique=True,
    postgresql_where=_job.c.workflow_id.is_not(None),
)
Index(
    "gate_workflow_name",
    _gate.c.workflow_id,
    _gate.c.name,
    unique=True,
    postgresql_where=_gate.c.name.is_not(None),
)
Index(
    "gate_open_by_workflow",
    _gate.c.workflow_id,
    postgresql_where=_gate.c.answered_at.is_(None),
)
_workflow = _table(WorkflowRow)
_live = _workflow.c.status.in_([WorkflowStatus.RUNNING, WorkflowStatus.BLOCKED])
Index("workflow_one_live_per_project", _workflow.c.project_id, unique=True, postgresql_where=_live)
Index("workflow_by_project", _workflow.c.project_id, _workflow.c.created_at.desc())
Index("workflow_by_update", _workflow.c.updated_at, _workflow.c.id)
Index("workflow_by_status_update", _workflow.c.status, _workflow.c.updated_at, _workflow.c.id)
Index("workflow_by_project_update", _workflow.c.project_id, _workflow.c.updated_at, _workflow.c.id)
Index(
    "workflow_by_definition_update", _workflow.c.definition, _workflow.c.updated_at, _workflow.c.id
)
# Retention (migrations/0016_workflow_retention.sql): its scan, and what deleting jobs looks up.
Index(
    "workflow_to_archive",
    _workflow.c.finished_at,
    postgresql_where=_workflow.c.finished_at.is_not(None) & _workflow.c.archived_at.is_(None),
)
Index("job_outbox_by_job", _outbox.c.job_id)
Index("gate_by_job", _gate.c.job_id, postgresql_where=_gate.c.job_id.is_not(None))
Index("gate_by_workflow", _gate.c.workflow_id, postgresql_where=_gate.c.workflow_id.is_not(None))

Index(
    "gate_deadline_due",
    _gate.c.deadline_at,
    postgresql_where=text(
        "answered_at IS NULL AND deadline_at IS NOT NULL AND escalated_at IS NULL"
    ),
)
Index(
    "gate_reminder_due",
    _gate.c.opened_at,
    postgresql_where=text("answered_at IS NULL AND jsonb_array_length(reminders) > reminded"),
)

from store.models_engines import *  # noqa: E402,F403
from store.models_events import *  # noqa: E402,F403
from store.models_ledger import *  # noqa: E402,F403
from store.models_ops import *  # noqa: E402,F403
from store.models_routes import *  # noqa: E402,F403
