"""Values the tests build often: a leased job as a claim would return it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from workflows.job import JobState
from workflows.queue import Job


def leased_job(
    kind: str,
    payload: dict[str, Any],
    *,
    project_id: str = "demo",
    subject: str = "",
    cycle: int = 0,
    attempts: int = 1,
    max_attempts: int = 5,
) -> Job:
    """A job of ``kind`` held by owner ``test`` under a fresh lease token."""
    now = datetime.now(UTC)
    return Job(
        id=uuid.uuid4(),
        project_id=project_id,
        cycle=cycle,
        kind=kind,
        subject=subject,
        idempotency_key="k",
        state=JobState.LEASED,
        priority=0,
        payload=payload,
        result=None,
        run_after=now,
        attempts=attempts,
        max_attempts=max_attempts,
        lease_timeout=timedelta(minutes=2),
        lease_owner="test",
        lease_token=uuid.uuid4(),
        lease_expires_at=now + timedelta(minutes=2),
        engine_id=None,
        last_error=None,
        failure_class=None,
        created_at=now,
        updated_at=now,
        settled_at=None,
    )
