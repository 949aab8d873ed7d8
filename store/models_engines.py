"""Typed rows for ``engine_health`` (``migrations/0006_engine_health.sql``) and
``rotation_request`` (``migrations/0015_rotation_requests.sql``), column for column.

Re-exported by :mod:`store.models`, so that ``SQLModel.metadata`` holds it for the drift test
(``tests/integration/test_migrations.py``). Reads and writes go through the named SQL of
``store/sql/engine_health.sql`` (:mod:`store.engine_health`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, CheckConstraint, Column, DateTime, Integer, Text, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import Field, SQLModel

__all__ = ["EngineHealthRow", "RotationRequestRow"]


def _timestamptz(*, nullable: bool, now: bool = False) -> Column[datetime]:
    default = text("now()") if now else None
    return Column(DateTime(timezone=True), nullable=nullable, server_default=default)


class EngineHealthRow(SQLModel, table=True):
    """``engine_health``: one row per engine: what it is, its capacity, its circuit."""

    __tablename__ = "engine_health"
    __table_args__ = (
        CheckConstraint(
            "NOT (capacity_state = 'CreditsExhausted' AND resets_at IS NOT NULL)",
            name="credits_never_have_a_deadline",
        ),
        CheckConstraint(
            "(capacity_state = 'WindowExhausted') = (resets_at IS NOT NULL)",
            name="resets_at_only_for_windows",
        ),
        CheckConstraint(
            "probe_kind IS DISTINCT FROM 'deadline' OR capacity_state = 'WindowExhausted'",
            name="deadline_probes_only_for_windows",
        ),
        CheckConstraint(
            "capacity_state IN "
            "('Available', 'WindowExhausted', 'CreditsExhausted', 'AuthenticationFailed')",
            name="engine_health_capacity_state",
        ),
        CheckConstraint(
            "circuit_state IN ('closed', 'open', 'half_open')", name="engine_health_circuit_state"
        ),
        CheckConstraint("probe_kind IN ('backoff', 'deadline')", name="engine_health_probe_kind"),
        CheckConstraint(
            "(circuit_state = 'closed') = (opened_at IS NULL)"
            " AND (circuit_state = 'closed') = (probe_kind IS NULL)"
            " AND (probe_kind IS NULL) = (probe_at IS NULL)",
            name="engine_health_open_circuit",
        ),
        CheckConstraint(
            "weight >= 0 AND consecutive_failures >= 0 AND probes >= 0",
            name="engine_health_counts",
        ),
        CheckConstraint(
            "authenticated_at IS NULL OR authenticated_at IS NOT DISTINCT FROM last_doctor_at",
            name="engine_health_authenticated_by_last_doctor",
        ),
    )

    engine_id: str = Field(sa_column=Column(Text, primary_key=True))
    installed: bool = Field(sa_column=Column(Boolean, nullable=False, server_default=text("false")))
    local: bool = Field(sa_column=Column(Boolean, nullable=False, server_default=text("false")))
    weight: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("1")))
    capabilities: list[str] = Field(
        sa_column=Column(ARRAY(Text), nullable=False, server_default=text("'{}'::text[]"))
    )
    last_doctor_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    authenticated_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    capacity_state: str = Field(
        sa_column=Column(Text, nullable=False, server_default=text("'Available'::text"))
    )
    resets_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    capacity_detail: str = Field(
        sa_column=Column(Text, nullable=False, server_default=text("''::text"))
    )
    circuit_state: str = Field(
        sa_column=Column(Text, nullable=False, server_default=text("'closed'::text"))
    )
    consecutive_failures: int = Field(
        sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    opened_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    probes: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    probe_kind: str | None = Field(sa_column=Column(Text, nullable=True))
    probe_at: datetime | None = Field(sa_column=_timestamptz(nullable=True))
    rotation_weight: int | None = Field(sa_column=Column(Integer, nullable=True))
    updated_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))


class RotationRequestRow(SQLModel, table=True):
    """``rotation_request`` (``migrations/0015_rotation_requests.sql``): an operator's
    ``vibey engine rotate <project>``, open until the project's next engine-driven attempt."""

    __tablename__ = "rotation_request"

    project_id: str = Field(sa_column=Column(Text, primary_key=True))
    away_from: str | None = Field(sa_column=Column(Text, nullable=True))
    requested_by: str = Field(sa_column=Column(Text, nullable=False))
    requested_at: datetime = Field(sa_column=_timestamptz(nullable=False, now=True))
