"""The step runner (actors/steps.py) on the in-memory fakes: claim → handler → settle, with
no PostgreSQL and no RabbitMQ (tests/integration/test_step_actor.py runs it on both); the
harness, ``h``, is tests/step_harness.py's."""

from __future__ import annotations

import uuid
from datetime import timedelta

from actors.steps import StepResult
from store.errors import DatabaseUnavailable
from store.memory_records import StepEvent
from tests.step_harness import NAMES, Harness, P, ok
from workflows.dispatch import DEFAULT_WAIT_TIERS, decode, tier_name
from workflows.job import FailureClass, JobState
from workflows.queue import GateRequest, Job
from workflows.steps import Failure, Outcome, Park, Short, Success


def test_a_pointer_is_claimed_handled_and_acked(h: Harness) -> None:
    job = h.enqueue()
    assert job.dispatch_seq == 1 and [p.dispatch_seq for p in h.broker.submitted] == [1]
    runner = h.runner(ok)
    try:
        assert h.run(runner, job, 1) is StepResult.SUCCEEDED
    finally:
        runner.close()
    [claimed] = h.seen  # the handler saw the job as its claim leased it
    assert (claimed.state, claimed.attempts, claimed.lease_owner) == (
        JobState.LEASED,
        1,
        "worker-1",
    )
    done = h.now(job)
    assert (done.state, done.result, done.lease_token) == (JobState.SUCCEEDED, {"answer": 42}, None)


def test_a_pointer_of_an_older_generation_is_dropped_without_running(h: Harness) -> None:
    job = h.enqueue()
    taken = h.records.claim_pointer(job_id=job.id, project_id=P, seq=1, owner="other")
    assert taken is not None
    h.jobs.defer(taken.lease, delay=timedelta(0), reason="again")  # generation 2
    runner = h.runner(ok)
    try:
        assert h.run(runner, job, 1) is StepResult.DROPPED
        assert h.seen == [] and h.broker.published == []
        assert (h.now(job).state, h.now(job).attempts) == (JobState.READY, 0)
        assert h.run(runner, job, 2) is StepResult.SUCCEEDED  # the current one runs
    finally:
        runner.close()
    assert len(h.seen) == 1 and h.now(job).state is JobState.SUCCEEDED


def test_a_pointer_that_came_early_waits_in_a_tier(h: Harness) -> None:
    job = h.enqueue()
    taken = h.records.claim_pointer(job_id=job.id, project_id=P, seq=1, owner="other")
    assert taken is not None
    h.jobs.defer(taken.lease, delay=timedelta(seconds=30), reason="later")
    runner = h.runner(ok)
    try:
        assert h.run(runner, job, 2) is StepResult.REDELAYED
    finally:
        runner.close()
    assert h.seen == []
    [hop] = h.broker.published
    tier = DEFAULT_WAIT_TIERS.route(timedelta(seconds=30)) or DEFAULT_WAIT_TIERS.smallest
    assert hop.exchange == NAMES.tier_exchange(tier_name(tier))
    envelope = decode(hop.body)
    assert (envelope.job_id, envelope.dispatch_seq) == (job.id, 2)
    assert envelope.not_before == h.clock.now + timedelta(seconds=30)


def test_a_handler_that_raises_is_a_recorded_vibey_failure(h: Harness) -> None:
    def boom(job: Job) -> Outcome:
        raise RuntimeError("the handler broke")

    job = h.enqueue(max_attempts=2)
    runner = h.runner(boom)
    try:
        assert h.run(runner, job, 1) is StepResult.FAILED
        again = h.now(job)
        assert (again.state, again.attempts, again.failure_class) == (
            JobState.READY,
            1,
            FailureClass.VIBEY,
        )
        assert again.last_error == "RuntimeError: the handler broke"
        assert again.dispatch_seq == 2 and h.broker.submitted[-1].dispatch_seq == 2
        h.clock.advance(hours=1)  # past the backoff
        assert h.run(runner, job, 2) is StepResult.FAILED
    finally:
        runner.close()
    spent = h.now(job)
    assert (spent.state, spent.attempts) == (JobState.FAILED, 2)
    assert len(h.broker.submitted) == 2  # a failed job is dispatched no more


def test_a_database_outage_inside_the_handler_defers_without_spending_an_attempt(
    h: Harness,
) -> None:
    def unavailable(job: Job) -> Outcome:
        raise DatabaseUnavailable("PostgreSQL did not answer")

    job = h.enqueue()
    runner = h.runner(unavailable)
    try:
        assert h.run(runner, job, 1) is StepResult.DEFERRED
    finally:
        runner.close()
    after = h.now(job)
    assert (after.state, after.attempts, after.dispatch_seq) == (JobState.READY, 0, 2)


def test_a_settle_after_the_lease_was_lost_is_stale_and_changes_nothing(h: Harness) -> None:
    job = h.enqueue()

    def slow(claimed: Job) -> Outcome:
        h.clock.advance(seconds=claimed.lease_timeout.total_seconds() + 1)
        h.jobs.reap()  # the lease expired: back to ready, generation 2
        taken = h.records.claim_pointer(job_id=job.id, project_id=P, seq=2, owner="other")
        assert taken is not None
        return Success({"late": True})

    runner = h.runner(slow)
    try:
        assert h.run(runner, job, 1) is StepResult.STALE
    finally:
        runner.close()
    held = h.now(job)
    assert (held.state, held.lease_owner, held.result) == (JobState.LEASED, "other", None)


def test_a_handler_that_parks_opens_its_gate(h: Harness) -> None:
    def ask(job: Job) -> Outcome:
        return Park(GateRequest("handoff", "retry or cancel?", ("retry", "cancel")))

    job = h.enqueue()
    runner = h.runner(ask)
    try:
        assert h.run(runner, job, 1) is StepResult.PARKED
    finally:
        runner.close()
    [gate] = h.jobs.open_gates(P)
    assert (gate.job_id, gate.kind, gate.answers) == (job.id, "handoff", ("retry", "cancel"))
    assert h.now(job).state is JobState.AWAITING_HUMAN


def test_a_short_step_claims_runs_and_settles_in_one_commit(h: Harness) -> None:
    job = h.enqueue()
    runner = h.runner(Short(ok))
    commits = h.jobs.commits
    try:
        assert h.run(runner, job, 1) is StepResult.SUCCEEDED
    finally:
        runner.close()
    assert h.jobs.commits == commits + 1
    assert h.now(job).state is JobState.SUCCEEDED and len(h.seen) == 1


def test_a_short_step_whose_handler_raises_leaves_the_claim_and_settle_together(
    h: Harness,
) -> None:
    def boom(job: Job) -> Outcome:
        raise ValueError("bad input")

    job = h.enqueue()
    runner = h.runner(Short(boom))
    try:
        assert h.run(runner, job, 1) is StepResult.FAILED
    finally:
        runner.close()
    after = h.now(job)
    assert (after.state, after.attempts, after.last_error) == (
        JobState.READY,
        1,
        "ValueError: bad input",
    )


def test_a_job_whose_last_lease_expired_runs_again_alone(h: Harness) -> None:
    job = h.enqueue()
    dead = h.records.claim_pointer(job_id=job.id, project_id=P, seq=1, owner="dead-worker")
    assert dead is not None
    h.clock.advance(seconds=dead.lease_timeout.total_seconds() + 1)
    assert h.jobs.reap().requeued == 1
    runner = h.runner(ok)
    try:
        assert h.run(runner, job, 2) is StepResult.DEFERRED
        assert h.seen == []  # not run beside others
        pointer = h.broker.submitted[-1]
        assert (pointer.dispatch_seq, pointer.solo) == (3, True)
        assert h.run(runner, job, 3, solo=True) is StepResult.SUCCEEDED
    finally:
        runner.close()
    assert len(h.seen) == 1 and h.now(job).state is JobState.SUCCEEDED


def test_a_workflow_step_reports_what_it_settled_to_its_workflow(h: Harness) -> None:
    workflow = uuid.uuid4()
    passed = h.enqueue(workflow_id=workflow, step="interview")
    failed = h.enqueue(workflow_id=workflow, step="review", max_attempts=1)
    plain = h.enqueue()

    def outcome(job: Job) -> Outcome:
        if job.step == "review":
            return Failure(FailureClass.WORK, "the review found a bug")
        return Success({"answer": 42})

    runner = h.runner(outcome, workflows=True)
    try:
        for job in (passed, failed, plain):
            h.run(runner, job, 1)
    finally:
        runner.close()
    assert h.workflows.events == [
        StepEvent(passed.id, "interview", JobState.SUCCEEDED, {"answer": 42}, None, None),
        StepEvent(
            failed.id,
            "review",
            JobState.FAILED,
            {},
            (FailureClass.WORK, "the review found a bug"),
            None,
        ),
    ]
    assert h.now(plain).state is JobState.SUCCEEDED  # a plain job has no workflow to tell
