"""The postgres backend's cross-project claim and the KEDA trigger's SQL, bound together.

The trigger's query (rendered with literals, as KEDA runs it) must count exactly what the
claim would take, plus what is leased, for every lane and project filter the manifests use.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from store.drive import (
    Work,
    build_kinds,
    claim_next,
    claimable_count,
    scaler_count,
    scaler_query,
)
from store.jobs import PostgresJobRepository
from workflows.engine import Registry
from workflows.protocol import DEFINITIONS
from workflows.queue import EnqueueRequest

BUILD = build_kinds(Registry(DEFINITIONS).kinds)


def _enqueue(repo, project, kind, **extra):
    return repo.enqueue(EnqueueRequest(project_id=project, kind=kind, **extra)).job


def _sql_count(pool, query: str) -> int:
    with pool.connection() as conn:
        return int(conn.execute(query.encode()).fetchone()[0])


@pytest.fixture
def mixed(pool):
    """Jobs in every state, in two projects and both lanes; returns the claimable ids."""
    repo = PostgresJobRepository(pool=pool)
    ready = {
        _enqueue(repo, "a", "design.interview", subject="1").id,
        _enqueue(repo, "a", "build.implement", subject="2").id,
        _enqueue(repo, "b", "review.demo", subject="3").id,
        _enqueue(repo, "b", "build.verify", subject="4").id,
    }
    capacity = _enqueue(repo, "a", "build.decompose", subject="5")
    parent = _enqueue(repo, "a", "design.spec", subject="6")
    ready.add(parent.id)
    _enqueue(repo, "a", "design.research", subject="7", depends_on=(parent.id,))  # blocked
    _enqueue(repo, "b", "build.integrate", subject="8", delay=timedelta(hours=1))  # not due
    parked = _enqueue(repo, "a", "deploy.demo", subject="9")
    done = _enqueue(repo, "b", "deploy.spec", subject="10")
    with pool.connection() as conn:
        conn.execute("UPDATE job SET state = 'awaiting_capacity' WHERE id = %s", (capacity.id,))
        conn.execute("UPDATE job SET state = 'awaiting_human' WHERE id = %s", (parked.id,))
        conn.execute(
            "UPDATE job SET state = 'succeeded', settled_at = now() WHERE id = %s", (done.id,)
        )
    ready.add(capacity.id)
    return ready


FILTERS = [
    Work.for_lanes(["interactive", "build"], build_kinds=BUILD),
    Work.for_lanes(["build"], build_kinds=BUILD),
    Work.for_lanes(["interactive"], build_kinds=BUILD),
    Work.for_lanes(["interactive", "build"], projects=["a"], build_kinds=BUILD),
    Work.for_lanes(["build"], projects=["b"], build_kinds=BUILD),
    Work.for_lanes(["interactive"], projects=["a", "b"], build_kinds=BUILD),
]


@pytest.mark.parametrize("work", FILTERS, ids=repr)
def test_the_trigger_counts_what_the_claim_takes_then_keeps_counting_it_while_leased(
    pool, mixed, work
):
    query = scaler_query(work)
    before = _sql_count(pool, query)
    assert before == scaler_count(pool, work) == claimable_count(pool, work)
    taken = claim_next(pool, work, owner="t", limit=100)
    assert len(taken) == before
    assert {job.id for job in taken} <= mixed
    assert claim_next(pool, work, owner="t", limit=100) == []
    assert _sql_count(pool, query) == before  # leased: the pods running them stay
    assert claimable_count(pool, work) == 0


def test_the_lanes_split_the_work_and_together_cover_it(pool, mixed):
    both = scaler_count(pool, Work.for_lanes(["interactive", "build"], build_kinds=BUILD))
    build = scaler_count(pool, Work.for_lanes(["build"], build_kinds=BUILD))
    interactive = scaler_count(pool, Work.for_lanes(["interactive"], build_kinds=BUILD))
    assert both == len(mixed) == build + interactive
    assert build == 3  # build.implement, build.verify, build.decompose (awaiting capacity)


def test_an_ack_releasing_a_dependent_makes_it_count(pool, mixed):
    work = Work.for_lanes(["interactive"], projects=["a"], build_kinds=BUILD)
    taken = claim_next(pool, work, owner="t", limit=100)
    repo = PostgresJobRepository(pool=pool)
    for job in taken:
        assert repo.ack(job.lease).applied
    # design.research was blocked behind design.spec: now it alone is claimable in a/interactive
    assert _sql_count(pool, scaler_query(work)) == 1
    assert [job.kind for job in claim_next(pool, work, owner="t", limit=100)] == ["design.research"]


def test_the_literal_sql_quotes_project_ids():
    query = scaler_query(Work.of(projects=["it's"]))
    assert "'{it''s}'::text[]" in query
    assert "%(" not in query
