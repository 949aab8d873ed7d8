"""Row model of ``project_route`` (migrations/0010_project_routes.sql).

Re-exported by :mod:`store.models`, so that ``SQLModel.metadata`` holds it for the drift test.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Column, DateTime, Text, text
from sqlmodel import Field, SQLModel

__all__ = ["ProjectRouteRow"]


class ProjectRouteRow(SQLModel, table=True):
    """``project_route``: a project whose pointers go to its dedicated queues."""

    __tablename__ = "project_route"
    __table_args__ = (CheckConstraint("project_id <> ''", name="project_route_project_id"),)

    project_id: str = Field(sa_column=Column(Text, primary_key=True))
    dedicated_at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=text("now()"))
    )
    dedicated_by: str = Field(sa_column=Column(Text, nullable=False))
