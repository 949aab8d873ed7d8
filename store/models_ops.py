"""Row models of the operations tables (migrations/0008_operations.sql)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Text,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

__all__ = ["DeadLetterRow", "ReconcileHeartbeatRow", "WorkflowArchiveRow"]


class ReconcileHeartbeatRow(SQLModel, table=True):
    __tablename__ = "reconcile_heartbeat"
    __table_args__ = (
        CheckConstraint("duration_ms >= 0", name="reconcile_heartbeat_duration"),
        CheckConstraint(
            "jsonb_typeof(report) = 'object'", name="reconcile_heartbeat_report_object"
        ),
    )

    owner: str = Field(sa_column=Column(Text, primary_key=True))
    at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=text("now()"))
    )
    duration_ms: int = Field(sa_column=Column(Integer, nullable=False))
    report: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False))


class DeadLetterRow(SQLModel, table=True):
    __tablename__ = "dead_letter"

    id: int | None = Field(default=None, sa_column=Column(BigInteger, primary_key=True))
    queue: str = Field(sa_column=Column(Text, nullable=False))
    routing_key: str = Field(sa_column=Column(Text, nullable=False))
    reason: str = Field(sa_column=Column(Text, nullable=False))
    detail: str | None = Field(sa_column=Column(Text, nullable=True))
    body: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    headers: dict[str, Any] = Field(
        sa_column=Column(JSONB, nullable=False, server_default=text("'{}'"))
    )
    message_id: str | None = Field(sa_column=Column(Text, nullable=True))
    received_at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=text("now()"))
    )


_dead = SQLModel.metadata.tables["dead_letter"]
Index("dead_letter_received", _dead.c.received_at, _dead.c.id)


class WorkflowArchiveRow(SQLModel, table=True):
    """``workflow_archive`` (0016_workflow_retention): a finished workflow's history, events
    1..last_seq as one JSON array, once its jobs and gates were deleted."""

    __tablename__ = "workflow_archive"
    __table_args__ = (
        CheckConstraint("jsonb_typeof(history) = 'array'", name="workflow_archive_history_array"),
        CheckConstraint("last_seq >= 0 AND jobs >= 0", name="workflow_archive_counts"),
    )

    workflow_id: uuid.UUID = Field(
        sa_column=Column(Uuid, ForeignKey("workflow.id"), primary_key=True)
    )
    last_seq: int = Field(sa_column=Column(Integer, nullable=False))
    history: list[dict[str, Any]] = Field(sa_column=Column(JSONB, nullable=False))
    jobs: int = Field(sa_column=Column(Integer, nullable=False))
    archived_at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=text("now()"))
    )
