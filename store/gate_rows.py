"""A gate's row as a :class:`workflows.queue.Gate`: kept apart from :mod:`store.jobs` so that a
read command (``vibey gate list``) loads the row mapping, not the job queue's writes."""

from __future__ import annotations

from psycopg.rows import DictRow

from workflows.queue import Gate


def gate_from_row(row: DictRow) -> Gate:
    return Gate(
        id=row["id"],
        project_id=row["project_id"],
        job_id=row["job_id"],
        kind=row["kind"],
        prompt=row["prompt"],
        answers=tuple(row["answers"]),
        context=row["context"],
        opened_at=row["opened_at"],
        answer=row["answer"],
        answered_by=row["answered_by"],
        answered_at=row["answered_at"],
        workflow_id=row.get("workflow_id"),
        name=row.get("name"),
        schema=row.get("schema") or {},
        evidence=row.get("evidence") or {},
        deadline_at=row.get("deadline_at"),
        on_deadline=row.get("on_deadline"),
        default_answer=row.get("default_answer"),
        answer_source=row.get("answer_source"),
    )
