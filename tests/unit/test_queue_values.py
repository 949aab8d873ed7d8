"""The values of the job-queue contract (workflows/queue.py): validation and small properties."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.job import JobState, idempotency_key
from workflows.queue import (
    NOT_APPLIED,
    AnswerOutcome,
    AnswerStatus,
    EnqueueRequest,
    Gate,
    InvalidEnqueueError,
    Job,
    Lease,
    QueueError,
    Settled,
    UnknownDependencyError,
)

ALIASES = {
    "build.plan": "build.decompose",
    "deploy.accept": "deploy.spec",
    "deploy.graph": "deploy.execute",
}
kinds = st.sampled_from(
    sorted(
        {
            "design.interview",
            "build.decompose",
            "build.implement",
            "build.verify",
            "build.integrate",
            "review.triage",
            "deploy.spec",
            "deploy.execute",
            "deploy.route",
            *ALIASES,
        }
    )
)
projects = st.text(min_size=1)
cycles = st.integers(min_value=0, max_value=10**9)
NOW = datetime(2026, 9, 15, 12, 0, tzinfo=UTC)


# --- EnqueueRequest ----------------------------------------------------------------------


@given(projects, kinds)
def test_enqueue_request_keeps_the_kind_it_is_given(project: str, kind: str) -> None:
    # The queue is generic: a kind's meaning (and an alias's target) is its definition's, and
    # the engine resolves an alias before a step is enqueued.
    assert EnqueueRequest(project_id=project, kind=kind).kind == kind


@pytest.mark.parametrize("kind", ["", "Build.plan", "build.", "build plan", "x" * 101, "1x"])
def test_enqueue_request_rejects_what_is_not_a_kind_name(kind: str) -> None:
    with pytest.raises(InvalidEnqueueError, match="not a kind name"):
        EnqueueRequest(project_id="p", kind=kind)


def test_enqueue_request_takes_a_kind_no_protocol_declares() -> None:
    request = EnqueueRequest(project_id="p", kind="orders.charge", lease=timedelta(seconds=9))
    assert (request.kind, request.lease) == ("orders.charge", timedelta(seconds=9))
    with pytest.raises(InvalidEnqueueError, match="positive"):
        EnqueueRequest(project_id="p", kind="orders.charge", lease=timedelta(0))


@given(kinds)
def test_enqueue_request_rejects_an_empty_project(kind: str) -> None:
    with pytest.raises(InvalidEnqueueError, match="project_id"):
        EnqueueRequest(project_id="", kind=kind)


@given(st.integers(max_value=0))
def test_enqueue_request_rejects_max_attempts_below_one(max_attempts: int) -> None:
    with pytest.raises(InvalidEnqueueError, match="max_attempts"):
        EnqueueRequest(project_id="p", kind="build.verify", max_attempts=max_attempts)


@given(st.integers(min_value=1, max_value=10**6))
def test_enqueue_request_accepts_max_attempts_from_one(max_attempts: int) -> None:
    request = EnqueueRequest(project_id="p", kind="build.verify", max_attempts=max_attempts)
    assert request.max_attempts == max_attempts


@given(st.timedeltas(max_value=-timedelta(microseconds=1)))
def test_enqueue_request_rejects_a_negative_delay(delay: timedelta) -> None:
    with pytest.raises(InvalidEnqueueError, match="delay"):
        EnqueueRequest(project_id="p", kind="build.verify", delay=delay)


@given(st.timedeltas(min_value=timedelta(0)))
def test_enqueue_request_accepts_a_non_negative_delay(delay: timedelta) -> None:
    assert EnqueueRequest(project_id="p", kind="build.verify", delay=delay).delay == delay


@given(st.integers(max_value=-1))
def test_enqueue_request_rejects_a_negative_cycle(cycle: int) -> None:
    with pytest.raises(InvalidEnqueueError, match="cycle"):
        EnqueueRequest(project_id="p", kind="build.verify", cycle=cycle)


@given(st.uuids(), st.lists(st.uuids(), max_size=5), st.data())
def test_enqueue_request_rejects_depending_on_itself(
    job_id: UUID, others: list[UUID], data: st.DataObject
) -> None:
    at = data.draw(st.integers(min_value=0, max_value=len(others)))
    depends_on = (*others[:at], job_id, *others[at:])
    with pytest.raises(InvalidEnqueueError, match="itself"):
        EnqueueRequest(project_id="p", kind="build.verify", job_id=job_id, depends_on=depends_on)


@given(st.uuids(), st.lists(st.uuids(), max_size=5))
def test_enqueue_request_accepts_other_dependencies(job_id: UUID, others: list[UUID]) -> None:
    depends_on = tuple(u for u in others if u != job_id)
    request = EnqueueRequest(
        project_id="p", kind="build.verify", job_id=job_id, depends_on=depends_on
    )
    assert request.depends_on == depends_on
    # Without a job id there is nothing to depend on itself.
    assert EnqueueRequest(project_id="p", kind="build.verify", depends_on=depends_on).job_id is None


def test_invalid_enqueue_is_a_queue_error() -> None:
    assert issubclass(InvalidEnqueueError, QueueError)
    assert issubclass(UnknownDependencyError, QueueError)


@given(projects, cycles, kinds, st.text())
def test_enqueue_request_key_is_the_domain_key_of_its_parts(
    project: str, cycle: int, kind: str, subject: str
) -> None:
    request = EnqueueRequest(project_id=project, kind=kind, subject=subject, cycle=cycle)
    assert request.idempotency_key == idempotency_key(project, cycle, kind, subject)


@given(
    projects,
    cycles,
    kinds,
    st.text(),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.integers(min_value=-100, max_value=100),
    st.integers(min_value=1, max_value=20),
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=1)),
)
def test_enqueue_request_key_ignores_everything_but_its_four_parts(
    project: str,
    cycle: int,
    kind: str,
    subject: str,
    payload: dict[str, int],
    priority: int,
    max_attempts: int,
    delay: timedelta,
) -> None:
    plain = EnqueueRequest(project_id=project, kind=kind, subject=subject, cycle=cycle)
    dressed = EnqueueRequest(
        project_id=project,
        kind=kind,
        subject=subject,
        cycle=cycle,
        payload=payload,
        priority=priority,
        max_attempts=max_attempts,
        delay=delay,
        job_id=uuid4(),
    )
    assert plain.idempotency_key == dressed.idempotency_key


def test_enqueue_request_is_frozen() -> None:
    request = EnqueueRequest(project_id="p", kind="build.plan")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.kind = "build.plan"  # type: ignore[misc]
    assert dataclasses.replace(request, subject="s").kind == "build.plan"


# --- Job.lease ---------------------------------------------------------------------------


def make_job(**changes: object) -> Job:
    job = Job(
        id=UUID(int=7),
        project_id="p",
        cycle=0,
        kind="build.verify",
        subject="",
        idempotency_key=idempotency_key("p", 0, "build.verify", ""),
        state=JobState.READY,
        priority=0,
        payload={},
        result=None,
        run_after=NOW,
        attempts=0,
        max_attempts=5,
        lease_timeout=timedelta(hours=2),
        lease_owner=None,
        lease_token=None,
        lease_expires_at=None,
        engine_id=None,
        last_error=None,
        failure_class=None,
        created_at=NOW,
        updated_at=NOW,
        settled_at=None,
    )
    return dataclasses.replace(job, **changes)  # type: ignore[arg-type]


@given(
    st.sampled_from(list(JobState)),
    st.one_of(st.none(), st.text()),
    st.one_of(st.none(), st.uuids()),
)
def test_job_lease_needs_both_owner_and_token(
    state: JobState, owner: str | None, token: UUID | None
) -> None:
    job = make_job(state=state, lease_owner=owner, lease_token=token)
    if owner is None or token is None:
        with pytest.raises(ValueError, match=re.escape(str(job.id))):
            _ = job.lease
    else:
        lease = job.lease
        assert (lease.job_id, lease.owner, lease.token) == (job.id, owner, token)


@given(st.uuids(), st.text(), st.uuids(), st.integers(min_value=1, max_value=50))
def test_job_lease_is_the_fence_of_this_job(
    job_id: UUID, owner: str, token: UUID, attempts: int
) -> None:
    job = make_job(
        id=job_id,
        attempts=attempts,
        state=JobState.LEASED,
        lease_owner=owner,
        lease_token=token,
        lease_expires_at=NOW + timedelta(hours=2),
    )
    lease = job.lease
    assert isinstance(lease, Lease)
    assert (lease.job_id, lease.owner, lease.token) == (job_id, owner, token)
    # The attempt rides along (it sizes a nack's backoff) but is not part of the fence.
    assert lease.attempt == job.attempts


# --- Settled, AnswerOutcome, Gate --------------------------------------------------------


def test_not_applied_is_an_empty_unapplied_settle() -> None:
    assert NOT_APPLIED.applied is False
    assert NOT_APPLIED.state is None
    assert NOT_APPLIED.gate_id is None
    assert NOT_APPLIED.lease_expires_at is None
    assert Settled(applied=False) == NOT_APPLIED
    assert Settled(applied=True) != NOT_APPLIED
    with pytest.raises(dataclasses.FrozenInstanceError):
        NOT_APPLIED.applied = True  # type: ignore[misc]


@given(st.sampled_from(list(JobState)), st.one_of(st.none(), st.uuids()))
def test_settled_keeps_what_it_was_given(state: JobState, gate_id: UUID | None) -> None:
    settled = Settled(applied=True, state=state, gate_id=gate_id, lease_expires_at=NOW)
    assert settled.applied
    assert (settled.state, settled.gate_id, settled.lease_expires_at) == (state, gate_id, NOW)
    assert settled != NOT_APPLIED


@pytest.mark.parametrize("status", list(AnswerStatus))
def test_answer_outcome_is_applied_only_when_answered(status: AnswerStatus) -> None:
    assert AnswerOutcome(status=status).applied == (status is AnswerStatus.ANSWERED)


def test_answer_statuses_are_the_five_outcomes() -> None:
    assert {s.value for s in AnswerStatus} == {
        "answered",
        "already_answered",
        "invalid_answer",
        "unknown_gate",
        "not_open",
    }


@given(st.one_of(st.none(), st.datetimes(timezones=st.just(UTC))))
def test_gate_is_open_until_answered(answered_at: datetime | None) -> None:
    gate = Gate(
        id=uuid4(),
        project_id="p",
        job_id=None,
        kind="delivery_exhausted",
        prompt="?",
        answers=(),
        context={},
        opened_at=NOW,
        answer=None if answered_at is None else "yes",
        answered_by=None if answered_at is None else "me",
        answered_at=answered_at,
    )
    assert gate.open == (answered_at is None)


# --- UnknownDependencyError --------------------------------------------------------------


@given(st.lists(st.uuids(), min_size=1, max_size=6, unique=True))
def test_unknown_dependency_error_lists_every_missing_id(missing: list[UUID]) -> None:
    error = UnknownDependencyError(missing)
    message = str(error)
    for job_id in missing:
        assert str(job_id) in message
    assert error.missing == frozenset(missing)
    assert "nothing was enqueued" in message
    listed = re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", message)
    assert listed == sorted(str(m) for m in missing)
