"""Row models of the domain-event tables (``migrations/0011_events.sql``), column for column.

Re-exported by :mod:`store.models` for the drift test. Reads and writes go through the named
SQL of ``store/sql/events.sql`` (:mod:`store.events`, :mod:`store.event_inbox`,
:mod:`store.webhooks`).
"""

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
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

__all__ = [
    "DomainEventRow",
    "EventConsumedRow",
    "ProjectTenantRow",
    "WebhookAttemptRow",
    "WebhookDeliveryRow",
]


def _timestamptz(*, nullable: bool, now: bool = False) -> Column[datetime]:
    default = text("now()") if now else None
    return Column(DateTime(timezone=True), nullable=nullable, server_default=default)


class ProjectTenantRow(SQLModel, table=True):
    """``project_tenant``: the tenant a project belongs to (none: ``default``)."""

    __tablename__ = "project_tenant"
    __table_args__ = (
        CheckConstraint("tenant_id ~ '^[a-z0-9][a-z0-9_-]*$'", name="project_tenant_name"),
    )

    project_id: str = Field(sa_column=Column(Text, primary_key=True))
    tenant_id: str = Field(sa_column=Column(Text, nullable=False, server_default=text("'default'")))
    created_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))


class DomainEventRow(SQLModel, table=True):
    """``domain_event``: the record of every domain event, and the events' outbox."""

    __tablename__ = "domain_event"
    __table_args__ = (
        UniqueConstraint("event_id", name="domain_event_id"),
        CheckConstraint("jsonb_typeof(payload) = 'object'", name="domain_event_payload_object"),
    )

    seq: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
    event_id: uuid.UUID = Field(sa_column=Column(Uuid, nullable=False))
    event_type: str = Field(sa_column=Column(Text, nullable=False))
    version: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("1")))
    occurred_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    tenant_id: str = Field(sa_column=Column(Text, nullable=False))
    project_id: str = Field(sa_column=Column(Text, nullable=False))
    correlation_id: str | None = Field(sa_column=Column(Text, nullable=True))
    causation_id: str | None = Field(sa_column=Column(Text, nullable=True))
    payload: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False))
    published_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))


class EventConsumedRow(SQLModel, table=True):
    """``event_consumed``: the events a consumer has applied (its effect committed with it)."""

    __tablename__ = "event_consumed"

    consumer: str = Field(sa_column=Column(Text, primary_key=True))
    event_id: uuid.UUID = Field(sa_column=Column(Uuid, primary_key=True))
    consumed_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))


class WebhookDeliveryRow(SQLModel, table=True):
    """``webhook_delivery``: one event to one webhook, until delivered or given up."""

    __tablename__ = "webhook_delivery"
    __table_args__ = (
        UniqueConstraint("webhook", "event_id", name="webhook_delivery_once"),
        CheckConstraint(
            "state IN ('pending', 'delivered', 'failed')", name="webhook_delivery_state"
        ),
        CheckConstraint(
            "(state = 'pending') = (finished_at IS NULL)", name="webhook_delivery_finished"
        ),
    )

    id: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
    webhook: str = Field(sa_column=Column(Text, nullable=False))
    event_id: uuid.UUID = Field(sa_column=Column(Uuid, nullable=False))
    event_type: str = Field(sa_column=Column(Text, nullable=False))
    url: str = Field(sa_column=Column(Text, nullable=False))
    body: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    state: str = Field(sa_column=Column(Text, nullable=False, server_default=text("'pending'")))
    attempts: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    next_attempt_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    created_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    finished_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))


class WebhookAttemptRow(SQLModel, table=True):
    """``webhook_attempt``: every POST of a delivery, its status or error."""

    __tablename__ = "webhook_attempt"
    __table_args__ = (UniqueConstraint("delivery_id", "attempt", name="webhook_attempt_once"),)

    id: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
    delivery_id: int = Field(
        sa_column=Column(
            BigInteger, ForeignKey("webhook_delivery.id", ondelete="CASCADE"), nullable=False
        )
    )
    attempt: int = Field(sa_column=Column(Integer, nullable=False))
    at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
    status_code: int | None = Field(sa_column=Column(Integer, nullable=True))
    error: str | None = Field(sa_column=Column(Text, nullable=True))
    duration_ms: int = Field(sa_column=Column(Integer, nullable=False))


_event = SQLModel.metadata.tables["domain_event"]
Index("domain_event_unpublished", _event.c.seq, postgresql_where=_event.c.published_at.is_(None))
Index("domain_event_by_project", _event.c.project_id, _event.c.seq)
Index("domain_event_by_type", _event.c.event_type, _event.c.seq)
_delivery = SQLModel.metadata.tables["webhook_delivery"]
Index(
    "webhook_delivery_due",
    _delivery.c.next_attempt_at,
    postgresql_where=text("state = 'pending'"),
)
