"""Retention for finished workflows on real PostgreSQL: past ``archive_after`` the reconciler
archives a finished workflow's history and deletes its jobs, their outbox rows and its gates,
in bounded batches; the history stays readable, live and recent workflows are untouched."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from actors.drive import reap_once
from store.jobs import PostgresJobRepository
from store.listings import Listings, PageSpec
from store.operations import OperationsStore
from store.retention import WorkflowRetention
from store.workflows import WorkflowStore
from tests import tiny_definition
from tests.acceptance.test_cli import clean_env, vibey
from tests.integration.test_workflow_store import claim_one, gate_id, succeed
from tests.tiny_definition import Tiny
from workflows.engine import Registry, Status

RETENTION = timedelta(days=30)


@pytest.fixture(autouse=True)
def working() -> None:
    tiny_definition.BROKEN["on"] = False


@pytest.fixture
def jobs(pool: ConnectionPool) -> PostgresJobRepository:
    return PostgresJobRepository(pool=pool, dispatch=True)  # every dispatch leaves an outbox row


@pytest.fixture
def store(pool: ConnectionPool, jobs: PostgresJobRepository) -> WorkflowStore:
    return WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny()]))


def finish(store: WorkflowStore, jobs: PostgresJobRepository, project: str) -> UUID:
    """A tiny workflow run to COMPLETED: a step, an answered gate, a timer."""
    wf = store.start(project, definition="tiny").workflow
    succeed(store, jobs, claim_one(jobs, project))
    store.answer(gate_id(store, project), "yes", by="ann")
    succeed(store, jobs, claim_one(jobs, project))
    assert store.get(wf.id).status is Status.COMPLETED
    return wf.id


def age(pool: ConnectionPool, workflow_id: UUID, days: int) -> None:
    with pool.connection() as conn:
        conn.execute(
            "UPDATE workflow SET finished_at = now() - make_interval(days => %s) WHERE id = %s",
            (days, workflow_id),
        )


def rows(pool: ConnectionPool, workflow_id: UUID) -> dict[str, int]:
    counts = {
        "job": "SELECT count(*) FROM job WHERE workflow_id = %(w)s",
        "outbox": "SELECT count(*) FROM job_outbox o JOIN job j ON j.id = o.job_id"
        " WHERE j.workflow_id = %(w)s",
        "gate": "SELECT count(*) FROM gate WHERE workflow_id = %(w)s",
        "history": "SELECT count(*) FROM workflow_history WHERE workflow_id = %(w)s",
        "archive": "SELECT count(*) FROM workflow_archive WHERE workflow_id = %(w)s",
    }
    with pool.connection() as conn:
        return {k: conn.execute(q, {"w": workflow_id}).fetchone()[0] for k, q in counts.items()}  # type: ignore[index]


def test_the_reconciler_archives_finished_workflows_past_the_retention_and_keeps_their_history(
    pool: ConnectionPool, store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    old, recent = finish(store, jobs, "old"), finish(store, jobs, "recent")
    live = store.start("live", definition="tiny").workflow.id
    age(pool, old, 31)
    age(pool, recent, 29)
    before = store.history(old)
    assert rows(pool, old) == {"job": 2, "outbox": 2, "gate": 1, "history": 4, "archive": 0}
    untouched = {w: rows(pool, w) for w in (recent, live)}

    retention = WorkflowRetention(pool, retention=RETENTION)
    reaped = reap_once(jobs, OperationsStore(pool), "t", retention)  # the reconcile pass
    assert reaped.requeued == 0

    assert rows(pool, old) == {"job": 0, "outbox": 0, "gate": 0, "history": 0, "archive": 1}
    assert {w: rows(pool, w) for w in (recent, live)} == untouched
    assert store.history(old) == before  # read through workflow_history_all
    page = Listings(pool).history(old, None, PageSpec(limit=None))
    assert [e.seq for e in page.items] == [1, 2, 3, 4] and page.total == 4
    assert [e.event["type"] for e in Listings(pool).history(old, "gate_answered", PageSpec()).items]
    assert store.verify(old).ok  # the archived history replays to the stored state
    kept = store.get(old)
    assert kept.status is Status.COMPLETED and kept.last_seq == 4
    heartbeat = OperationsStore(pool).latest_heartbeat()
    assert heartbeat is not None and heartbeat.report["archived"] == 1
    assert retention.archive().workflows == 0  # once only
    assert retention.archived_count() == 1


def test_archiving_runs_in_bounded_batches(
    pool: ConnectionPool, store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    finished = [finish(store, jobs, f"p{i}") for i in range(5)]
    for workflow_id in finished:
        age(pool, workflow_id, 40)
    retention = WorkflowRetention(pool, retention=RETENTION)
    first = retention.archive(batch=2, max_batches=2)
    assert (first.workflows, first.jobs) == (4, 8)
    assert retention.archive(batch=2, max_batches=2).workflows == 1
    assert retention.archive(batch=2, max_batches=2).workflows == 0


def test_a_finished_workflow_with_a_live_job_is_not_archived(
    pool: ConnectionPool, store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    workflow_id = finish(store, jobs, "p")
    age(pool, workflow_id, 40)
    with pool.connection() as conn:
        conn.execute("UPDATE job SET state = 'ready' WHERE workflow_id = %s", (workflow_id,))
    assert WorkflowRetention(pool, retention=RETENTION).archive().workflows == 0
    assert rows(pool, workflow_id)["job"] == 2


def test_history_still_refuses_a_delete_it_has_not_archived(
    pool: ConnectionPool, store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    workflow_id = finish(store, jobs, "p")
    with pool.connection() as conn, pytest.raises(psycopg.errors.RaiseException, match="append"):
        conn.execute("DELETE FROM workflow_history WHERE workflow_id = %s", (workflow_id,))


def test_vibey_workflow_history_reads_an_archived_workflow(
    pool: ConnectionPool,
    pg_url: str,
    store: WorkflowStore,
    jobs: PostgresJobRepository,
    tmp_path: Path,
) -> None:
    workflow_id = finish(store, jobs, "arch")
    age(pool, workflow_id, 40)
    assert WorkflowRetention(pool, retention=RETENTION).archive().workflows == 1
    env = clean_env(
        VIBEY_PG_URL=pg_url,
        VIBEY_QUEUE_BACKEND="postgres",
        VIBEY_WORKFLOW_DEFINITIONS="tests.tiny_definition:DEFINITIONS",
    )
    shown = json.loads(vibey("workflow", "history", "arch", "--json", cwd=tmp_path, env=env).stdout)
    assert [e["seq"] for e in shown["events"]] == [1, 2, 3, 4], shown


def test_published_domain_events_past_the_retention_are_pruned_and_the_rest_kept(
    pool: ConnectionPool, store: WorkflowStore, jobs: PostgresJobRepository
) -> None:
    old, recent = finish(store, jobs, "old"), finish(store, jobs, "recent")
    with pool.connection() as conn:
        count = "SELECT count(*) FROM domain_event WHERE correlation_id = %s"
        before = {w: conn.execute(count, (str(w),)).fetchone()[0] for w in (old, recent)}  # type: ignore[index]
        assert before[old] > 0 and before[recent] > 0
        conn.execute(  # the old workflow's events: 31 days old, all but one published
            "UPDATE domain_event SET occurred_at = now() - interval '31 days', published_at = now()"
            " WHERE correlation_id = %s",
            (str(old),),
        )
        conn.execute(
            "UPDATE domain_event SET published_at = NULL WHERE seq = (SELECT max(seq)"
            " FROM domain_event WHERE correlation_id = %s)",
            (str(old),),
        )
        conn.execute("UPDATE domain_event SET published_at = now() WHERE correlation_id = %s",
                     (str(recent),))  # fmt: skip
    pruned = WorkflowRetention(pool, retention=RETENTION).prune_events(batch=3)
    assert pruned == before[old] - 1  # in batches of 3; the unpublished one waits for its send
    with pool.connection() as conn:
        after = {w: conn.execute(count, (str(w),)).fetchone()[0] for w in (old, recent)}  # type: ignore[index]
    assert after == {old: 1, recent: before[recent]}
