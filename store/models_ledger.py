"""Typed rows for the ledger's tables (``migrations/0005_ledger.sql``), column for column.

Re-exported by :mod:`store.models`, so that ``SQLModel.metadata`` holds them for the drift
test (``tests/integration/test_migrations.py``). The triggers that make ``ledger_event``
append-only and ``ledger_head`` forward-only live in the migration alone.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Column, DateTime, Index, Text, Uuid, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

__all__ = ["LedgerEventRow", "LedgerHeadRow"]


class LedgerHeadRow(SQLModel, table=True):
    """``ledger_head``: a project's last assigned ``seq``, moved in the writing transaction."""

    __tablename__ = "ledger_head"
    __table_args__ = (CheckConstraint("last_seq >= 1", name="ledger_head_last_seq_positive"),)

    project_id: str = Field(sa_column=Column(Text, primary_key=True))
    last_seq: int = Field(sa_column=Column(BigInteger, nullable=False))


class LedgerEventRow(SQLModel, table=True):
    """``ledger_event``: one row per event, for all time (UPDATE and DELETE are refused)."""

    __tablename__ = "ledger_event"
    __table_args__ = (
        CheckConstraint("seq >= 1", name="ledger_event_seq_positive"),
        CheckConstraint("digest ~ '^[0-9a-f]{64}$'", name="ledger_event_digest_sha256"),
        CheckConstraint("kind ~ '^[A-Z][A-Za-z0-9]{0,99}$'", name="ledger_event_kind_name"),
        CheckConstraint("jsonb_typeof(payload) = 'object'", name="ledger_event_payload_object"),
    )

    project_id: str = Field(sa_column=Column(Text, primary_key=True))
    seq: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    kind: str = Field(sa_column=Column(Text, nullable=False))
    payload: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False))
    digest: str = Field(sa_column=Column(Text, nullable=False))
    causation_id: str | None = Field(sa_column=Column(Text, nullable=True))
    correlation_id: str | None = Field(sa_column=Column(Text, nullable=True))
    job_id: uuid.UUID | None = Field(sa_column=Column(Uuid, nullable=True))
    workflow_id: uuid.UUID | None = Field(sa_column=Column(Uuid, nullable=True))
    recorded_at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=text("now()"))
    )


_event = SQLModel.metadata.tables[str(LedgerEventRow.__tablename__)]
Index(
    "ledger_event_by_workflow",
    _event.c.workflow_id,
    _event.c.seq,
    postgresql_where=_event.c.workflow_id.is_not(None),
)
Index("ledger_event_by_job", _event.c.job_id, postgresql_where=_event.c.job_id.is_not(None))
# ledger show --kind (migrations/0009_list_indexes.sql)
Index("ledger_event_by_kind", _event.c.project_id, _event.c.kind, _event.c.seq)
