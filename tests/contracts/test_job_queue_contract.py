"""The job-queue contract, written once and run against every backend (see conftest.py).

Each test states one promise of :mod:`workflows.queue` and checks it against the record store.
A claim is a worker's: the job its step runner took; a settle is that step's outcome
(``tests/contracts/fleet.py``). A lease runs out only when its worker stops beating
(:func:`stall`): a worker that runs keeps its leases however long its steps take.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from tests.contracts.conftest import Backend, claim_n, claim_none
from workflows.job import FailureClass, JobState, LeasePolicy
from workflows.queue import (
    DELIVERY_EXHAUSTED,
    AnswerStatus,
    EnqueueRequest,
    GateRequest,
    JobRepository,
    Lease,
    UnknownDependencyError,
)

P = "proj-a"
OTHER = "proj-b"
SHORT = LeasePolicy(default=timedelta(milliseconds=300), by_kind={})


def req(
    subject: str = "s", *, project: str = P, kind: str = "design.interview", **kw
) -> EnqueueRequest:
    return EnqueueRequest(project_id=project, kind=kind, subject=subject, **kw)


def stall(backend: Backend, owner: str, lease_policy: LeasePolicy = SHORT) -> None:
    """The worker ``owner`` freezes (its heartbeat stops) until its leases ran out."""
    backend.stall(owner)
    time.sleep(lease_policy.default.total_seconds() + 0.15)


# -- enqueue -------------------------------------------------------------------------------


def test_enqueue_creates_a_ready_job(backend: Backend) -> None:
    repo = backend.repo()
    enqueued = repo.enqueue(req("one", payload={"x": 1}, priority=3, max_attempts=4))
    job = enqueued.job
    assert enqueued.created
    assert (job.state, job.attempts, job.max_attempts, job.priority) == (JobState.READY, 0, 4, 3)
    assert job.payload == {"x": 1}
    assert repo.get(job.id) == job


def test_enqueue_is_idempotent_by_project_cycle_kind_and_subject(backend: Backend) -> None:
    # (An alias is resolved to its kind by the definition's kinds before a step is enqueued:
    # tests/unit/test_kinds.py.)
    repo = backend.repo()
    first = repo.enqueue(req("plan", kind="build.decompose"))
    again = repo.enqueue(req("plan", kind="build.decompose", payload={"ignored": True}))
    other = repo.enqueue(req("plan", kind="build.decompose", cycle=1))
    another_kind = repo.enqueue(req("plan", kind="orders.charge"))
    assert not again.created and again.job.id == first.job.id
    assert again.job.kind == "build.decompose" and again.job.payload == first.job.payload
    assert other.created and other.job.id != first.job.id
    assert another_kind.created and another_kind.job.id not in (first.job.id, other.job.id)


def test_enqueue_after_completion_returns_the_same_job(backend: Backend) -> None:
    repo = backend.repo()
    job = repo.enqueue(req("done")).job
    (held,) = claim_n(repo, P, owner="w")
    assert repo.ack(held.lease).applied
    again = repo.enqueue(req("done"))
    assert not again.created
    assert again.job.id == job.id and again.job.state is JobState.SUCCEEDED
    assert claim_none(repo, P, owner="w") == []


def test_unknown_dependency_writes_nothing(backend: Backend) -> None:
    repo = backend.repo()
    ghost = uuid.uuid4()
    with pytest.raises(UnknownDependencyError) as err:
        repo.enqueue_batch([req("a"), req("b", depends_on=(ghost,))])
    assert str(ghost) in str(err.value)
    assert sum(repo.queue_depth(P).values()) == 0


def test_dependency_in_another_project_is_unknown(backend: Backend) -> None:
    repo = backend.repo()
    foreign = repo.enqueue(req("x", project=OTHER)).job
    with pytest.raises(UnknownDependencyError):
        repo.enqueue(req("y", depends_on=(foreign.id,)))
    assert sum(repo.queue_depth(P).values()) == 0


def test_batch_may_depend_on_earlier_requests_and_on_duplicates(backend: Backend) -> None:
    repo = backend.repo()
    existing = repo.enqueue(req("root")).job
    root_again, child_id = uuid.uuid4(), uuid.uuid4()
    results = repo.enqueue_batch(
        [
            req("root", job_id=root_again),  # a duplicate: stands for `existing`
            req("child", job_id=child_id, depends_on=(root_again,)),
            req("grandchild", depends_on=(child_id,)),
        ]
    )
    assert [r.created for r in results] == [False, True, True]
    assert results[0].job.id == existing.id and results[1].job.id == child_id
    (held,) = claim_n(repo, P, owner="w", n=3, timeout=1.0)
    assert held.id == existing.id  # the children wait for it


# -- claim -----------------------------------------------------------------------------------


def test_claim_is_scoped_ordered_and_counts_attempts(backend: Backend) -> None:
    repo = backend.repo()
    low = repo.enqueue(req("low", priority=0)).job
    high = repo.enqueue(req("high", priority=5)).job
    repo.enqueue(req("elsewhere", project=OTHER, priority=9))
    assert backend.dispatched(P, 2)  # one claim sees both (the order is within a claim)
    held = claim_n(repo, P, owner="w", n=2)
    assert [j.id for j in held] == [high.id, low.id]
    assert all(j.state is JobState.LEASED and j.attempts == 1 for j in held)
    assert all(j.lease_owner == "w" and j.lease_expires_at is not None for j in held)
    assert len({j.lease_token for j in held}) == 2
    assert claim_none(repo, P, owner="w") == []


def test_claim_by_kind(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("d", kind="design.spec"))
    build = repo.enqueue(req("b", kind="build.decompose")).job
    (held,) = claim_n(repo, P, owner="w", kinds=["build.decompose"])
    assert held.id == build.id


def test_delayed_job_is_claimable_only_when_due(backend: Backend) -> None:
    repo = backend.repo()
    job = repo.enqueue(req("later", delay=timedelta(seconds=1))).job
    assert claim_none(repo, P, owner="w", settle=0.4) == []
    (held,) = claim_n(repo, P, owner="w", timeout=5.0)
    assert held.id == job.id


def test_each_job_is_held_by_one_claimer(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue_batch([req(f"j{i}") for i in range(40)])
    claimed: list[uuid.UUID] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        while got := repo.claim(P, owner=name, limit=3):
            with lock:
                claimed.extend(j.id for j in got)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, [f"w{i}" for i in range(8)]))
    claimed += [j.id for j in claim_n(repo, P, owner="late", n=40 - len(claimed), timeout=3)]
    assert len(claimed) == len(set(claimed)) == 40


# -- dependencies --------------------------------------------------------------------------


def test_dependents_wait_for_every_dependency_to_succeed(backend: Backend) -> None:
    repo = backend.repo()
    a, b = repo.enqueue(req("a")).job, repo.enqueue(req("b")).job
    child = repo.enqueue(req("child", depends_on=(a.id, b.id))).job
    held = {j.id: j for j in claim_n(repo, P, owner="w", n=2)}
    assert set(held) == {a.id, b.id}
    assert repo.ack(held[a.id].lease).applied
    assert claim_none(repo, P, owner="w") == []
    assert repo.ack(held[b.id].lease).applied
    (released,) = claim_n(repo, P, owner="w")
    assert released.id == child.id


def test_a_failed_dependency_keeps_dependents_blocked(backend: Backend) -> None:
    repo = backend.repo()
    parent = repo.enqueue(req("parent", max_attempts=1)).job
    repo.enqueue(req("child", depends_on=(parent.id,)))
    (held,) = claim_n(repo, P, owner="w")
    result = repo.nack(held.lease, error="no", failure_class=FailureClass.WORK)
    assert result.applied and result.state is JobState.FAILED
    assert claim_none(repo, P, owner="w") == []


# -- heartbeat and fencing -----------------------------------------------------------------


def test_heartbeat_extends_the_lease(backend: Backend) -> None:
    repo = backend.repo(leases=SHORT)
    repo.enqueue(req("hb"))
    (held,) = claim_n(repo, P, owner="w")
    for _ in range(4):
        time.sleep(0.15)
        beat = repo.heartbeat(held.lease)
        assert beat.applied and beat.lease_expires_at is not None
    assert repo.reap().requeued == 0
    assert repo.ack(held.lease).applied  # 0.6 s after the claim, on a 0.3 s lease


def test_a_running_worker_keeps_its_lease_however_long_its_step_takes(backend: Backend) -> None:
    repo = backend.repo(leases=SHORT)
    repo.enqueue(req("long"))
    (held,) = claim_n(repo, P, owner="w")
    time.sleep(SHORT.default.total_seconds() * 3)  # no beat from the test: the worker's own
    assert repo.reap().requeued == 0
    job = repo.get(held.id)
    assert job is not None and job.lease_expires_at is not None
    assert held.lease_expires_at is not None and job.lease_expires_at > held.lease_expires_at
    assert repo.ack(held.lease).applied


def test_every_fenced_write_refuses_a_wrong_token(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("fenced"))
    (held,) = claim_n(repo, P, owner="w")
    forged = Lease(job_id=held.id, owner="w", token=uuid.uuid4())
    imposter = Lease(job_id=held.id, owner="x", token=held.lease.token)
    for lease in (forged, imposter):
        assert_all_writes_refused(repo, lease)
    assert repo.get(held.id) == held


def test_every_fenced_write_refuses_an_expired_lease(backend: Backend) -> None:
    repo = backend.repo(leases=SHORT)
    repo.enqueue(req("expired"))
    (held,) = claim_n(repo, P, owner="w")
    stall(backend, "w")
    assert_all_writes_refused(repo, held.lease)
    after = repo.get(held.id)
    assert after is not None and after.state is JobState.LEASED and after.max_attempts == 5


def test_a_reclaimed_job_refuses_its_previous_holder_even_with_the_same_owner(
    backend: Backend,
) -> None:
    repo = backend.repo(leases=SHORT)
    repo.enqueue(req("aba"))
    (first,) = claim_n(repo, P, owner="w")
    stall(backend, "w")
    assert repo.reap().requeued == 1
    (second,) = claim_n(repo, P, owner="w")  # the same owner name (restarted), a new grant
    assert second.id == first.id and second.attempts == 2
    assert not repo.ack(first.lease, result={"from": "first"}).applied
    assert repo.ack(second.lease, result={"from": "second"}).applied
    final = repo.get(first.id)
    assert final is not None and final.result == {"from": "second"}


def assert_all_writes_refused(repo: JobRepository, lease: Lease) -> None:
    gate = GateRequest(kind="question", prompt="?")
    writes = {
        "heartbeat": lambda: repo.heartbeat(lease),
        "assign": lambda: repo.assign(lease, engine_id="e"),
        "grant": lambda: repo.grant(lease, max_attempts=50),
        "park": lambda: repo.park(lease, gate),
        "defer": lambda: repo.defer(lease, delay=timedelta(0), reason="r"),
        "nack": lambda: repo.nack(lease, error="e", failure_class=FailureClass.WORK),
        "ack": lambda: repo.ack(lease),
    }
    applied = [name for name, write in writes.items() if write().applied]
    assert applied == []
    assert repo.open_gates(P) == []


# -- settles ---------------------------------------------------------------------------------


def test_ack_stores_the_result_once(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("ack"))
    (held,) = claim_n(repo, P, owner="w")
    done = repo.ack(held.lease, result={"answer": 42})
    assert done.applied and done.state is JobState.SUCCEEDED
    assert not repo.ack(held.lease, result={"answer": 0}).applied
    job = repo.get(held.id)
    assert job is not None and job.result == {"answer": 42} and job.settled_at is not None
    assert job.lease_owner is None and job.lease_token is None


def test_nack_backs_off_then_fails_at_max_attempts(backend: Backend) -> None:
    repo = backend.repo()
    job = repo.enqueue(req("flaky", max_attempts=2)).job
    (held,) = claim_n(repo, P, owner="w")
    first = repo.nack(held.lease, error="boom", failure_class=FailureClass.ENGINE)
    assert first.applied and first.state is JobState.READY
    backed_off = repo.get(job.id)
    assert backed_off is not None and backed_off.failure_class is FailureClass.ENGINE
    assert backed_off.last_error == "boom"
    assert backed_off.run_after - backed_off.updated_at >= timedelta(seconds=3)
    assert claim_none(repo, P, owner="w") == []
    # The explicit retry_in overrides the backoff.
    backend.make_due(job.id)
    (again,) = claim_n(repo, P, owner="w")
    last = repo.nack(
        again.lease, error="boom", failure_class=FailureClass.WORK, retry_in=timedelta(0)
    )
    assert last.applied and last.state is JobState.FAILED
    failed = repo.get(job.id)
    assert failed is not None and failed.attempts == 2 and failed.settled_at is not None


def test_nack_with_retry_in_zero_is_claimable_at_once(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("retry"))
    (held,) = claim_n(repo, P, owner="w")
    assert repo.nack(
        held.lease, error="e", failure_class=FailureClass.WORK, retry_in=timedelta(0)
    ).applied
    (again,) = claim_n(repo, P, owner="w")
    assert again.id == held.id and again.attempts == 2


def test_defer_burns_no_attempt(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("wait", max_attempts=1))
    (held,) = claim_n(repo, P, owner="w")
    deferred = repo.defer(held.lease, delay=timedelta(milliseconds=400), reason="verify later")
    assert deferred.applied and deferred.state is JobState.READY
    job = repo.get(held.id)
    assert job is not None and job.attempts == 0
    assert claim_none(repo, P, owner="w", settle=0.2) == []
    (again,) = claim_n(repo, P, owner="w")
    assert again.attempts == 1  # max_attempts=1 and still claimable: nothing was burned


def test_capacity_defer_waits_as_awaiting_capacity(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("busy"))
    (held,) = claim_n(repo, P, owner="w")
    deferred = repo.defer(
        held.lease, delay=timedelta(milliseconds=400), reason="429", capacity=True
    )
    assert deferred.applied and deferred.state is JobState.AWAITING_CAPACITY
    job = repo.get(held.id)
    assert job is not None and job.failure_class is FailureClass.CAPACITY and job.attempts == 0
    assert repo.queue_depth(P)[JobState.AWAITING_CAPACITY] == 1
    (again,) = claim_n(repo, P, owner="w")
    assert again.id == held.id


def test_park_opens_a_gate_and_holds_nothing(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("ask"))
    (held,) = claim_n(repo, P, owner="w")
    parked = repo.park(
        held.lease,
        GateRequest(kind="question", prompt="Ship it?", answers=("yes", "no"), context={"k": 1}),
    )
    assert parked.applied and parked.state is JobState.AWAITING_HUMAN and parked.gate_id
    job = repo.get(held.id)
    assert job is not None and job.state is JobState.AWAITING_HUMAN and job.lease_token is None
    (gate,) = repo.open_gates(P)
    assert (gate.id, gate.job_id, gate.kind, gate.prompt) == (
        parked.gate_id,
        held.id,
        "question",
        "Ship it?",
    )
    assert gate.answers == ("yes", "no") and gate.context == {"k": 1} and gate.open
    assert repo.open_gates(OTHER) == [] and repo.get_gate(gate.id) == gate
    assert claim_none(repo, P, owner="w") == []


def test_answering_a_gate_re_readies_the_job_once(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("ask"))
    (held,) = claim_n(repo, P, owner="w")
    gate_id = repo.park(
        held.lease, GateRequest(kind="question", prompt="?", answers=("yes", "no"))
    ).gate_id
    assert gate_id is not None
    invalid = repo.answer_gate(gate_id, answer="maybe", answered_by="ann")
    assert invalid.status is AnswerStatus.INVALID_ANSWER and invalid.gate is not None
    assert invalid.gate.answers == ("yes", "no") and repo.get_gate(gate_id).open  # type: ignore[union-attr]
    ok = repo.answer_gate(gate_id, answer="yes", answered_by="ann")
    assert ok.applied and ok.gate is not None and ok.gate.answer == "yes"
    twice = repo.answer_gate(gate_id, answer="no", answered_by="bob")
    assert twice.status is AnswerStatus.ALREADY_ANSWERED
    assert twice.gate is not None and twice.gate.answered_by == "ann" and twice.gate.answered_at
    assert (
        repo.answer_gate(uuid.uuid4(), answer="yes", answered_by="ann").status
        is AnswerStatus.UNKNOWN_GATE
    )
    (again,) = claim_n(repo, P, owner="w")
    assert again.id == held.id and repo.open_gates(P) == []


def test_grant_widens_and_never_narrows(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("ladder", max_attempts=2))
    (held,) = claim_n(repo, P, owner="w")
    assert not repo.grant(held.lease, max_attempts=2).applied
    assert not repo.grant(held.lease, max_attempts=1).applied
    assert repo.grant(held.lease, max_attempts=6).applied
    job = repo.get(held.id)
    assert job is not None and job.max_attempts == 6


def test_assign_records_the_engine(backend: Backend) -> None:
    repo = backend.repo()
    repo.enqueue(req("engine"))
    (held,) = claim_n(repo, P, owner="w")
    assert repo.assign(held.lease, engine_id="scripted").applied
    job = repo.get(held.id)
    assert job is not None and job.engine_id == "scripted" and job.state is JobState.LEASED


# -- reap ------------------------------------------------------------------------------------


def test_reap_returns_expired_leases_and_spares_live_ones(backend: Backend) -> None:
    short, long_ = backend.repo(leases=SHORT), backend.repo()
    short.enqueue(req("dies"))
    long_.enqueue(req("lives", kind="build.implement"))
    held = claim_n(short, P, owner="w", n=2)
    assert len(held) == 2
    stall(backend, "w")
    result = short.reap()
    assert (result.requeued, result.parked) == (1, 0)
    states = {j.subject: j.state for j in (short.get(h.id) for h in held) if j is not None}
    assert states == {"dies": JobState.READY, "lives": JobState.LEASED}


def test_reap_parks_a_job_whose_deliveries_are_spent_and_each_answer_buys_one(
    backend: Backend,
) -> None:
    repo = backend.repo(leases=SHORT)
    job = repo.enqueue(req("poison", max_attempts=2)).job
    for attempt in (1, 2):
        (held,) = claim_n(repo, P, owner=f"w{attempt}")
        assert held.attempts == attempt
        stall(backend, f"w{attempt}")
        result = repo.reap()
        assert (result.requeued, result.parked) == ((1, 0) if attempt == 1 else (0, 1))
    parked = repo.get(job.id)
    assert parked is not None and parked.state is JobState.AWAITING_HUMAN
    (gate,) = repo.open_gates(P)
    assert gate.kind == DELIVERY_EXHAUSTED and gate.job_id == job.id
    assert repo.answer_gate(gate.id, answer="retry", answered_by="ops").applied
    (third,) = claim_n(repo, P, owner="w3")
    assert third.attempts == 3
    stall(backend, "w3")
    assert repo.reap().parked == 1  # exactly one more delivery was bought
    assert len(repo.open_gates(P)) == 1


def test_a_parked_jobs_gate_and_its_answer_are_ledgered(backend: Backend) -> None:
    repo = backend.repo()
    job = repo.enqueue(req("ask")).job
    (held,) = claim_n(repo, P, owner="w")
    gate_id = repo.park(held.lease, GateRequest(kind="spend", prompt="More?", answers=("yes",)))
    assert gate_id.gate_id is not None
    asked = {
        "id": f"gate:{gate_id.gate_id}",
        "kind": "spend",
        "question": "More?",
        "answers": ["yes"],
        "job_id": str(job.id),
    }
    assert backend.ledger(job.id) == [("QuestionAsked", asked)]
    assert repo.answer_gate(gate_id.gate_id, answer="maybe", answered_by="ann").status is (
        AnswerStatus.INVALID_ANSWER
    )
    assert len(backend.ledger(job.id)) == 1  # a refused answer writes nothing
    assert repo.answer_gate(gate_id.gate_id, answer="yes", answered_by="ann").applied
    answer = {"closes": f"gate:{gate_id.gate_id}", "answer": "yes", "by": "ann"}
    assert backend.ledger(job.id) == [("QuestionAsked", asked), ("AnswerGiven", answer)]


def test_a_gate_the_reaper_opens_is_announced_and_ledgered(backend: Backend) -> None:
    repo = backend.repo(leases=SHORT)
    job = repo.enqueue(req("poison", max_attempts=1)).job
    claim_n(repo, P, owner="w")
    stall(backend, "w")
    assert repo.reap().parked == 1
    (gate,) = repo.open_gates(P)
    assert backend.gate_events(gate.id) == ["gate.opened"]
    ((kind, payload),) = backend.ledger(job.id)
    assert kind == "QuestionAsked" and payload["id"] == f"gate:{gate.id}"
    assert payload["kind"] == DELIVERY_EXHAUSTED
    assert repo.answer_gate(gate.id, answer="retry", answered_by="ops").applied
    assert [k for k, _ in backend.ledger(job.id)] == ["QuestionAsked", "AnswerGiven"]


# -- reads -----------------------------------------------------------------------------------


def test_reads(backend: Backend) -> None:
    repo = backend.repo()
    a = repo.enqueue(req("a", cycle=1, kind="build.implement")).job
    b = repo.enqueue(req("b", cycle=1, kind="build.verify")).job
    c = repo.enqueue(req("c", cycle=2, kind="build.implement")).job
    repo.enqueue(req("d", cycle=1, project=OTHER))
    assert repo.get(uuid.uuid4()) is None and repo.get_gate(uuid.uuid4()) is None
    assert [j.id for j in repo.list_for_cycle(P, 1)] == [a.id, b.id]
    assert [j.id for j in repo.list_for_cycle(P, 2)] == [c.id]
    assert repo.count_unsettled(P) == 3
    assert repo.count_unsettled(P, cycle=1) == 2
    assert repo.count_unsettled(P, cycle=1, kinds=["build.implement"]) == 1
    assert repo.count_unsettled(P, cycle=1, exclude=a.id) == 1
    held = claim_n(repo, P, owner="w", kinds=["build.verify"])
    assert repo.ack(held[0].lease).applied
    assert repo.count_unsettled(P, cycle=1) == 1
    depth = repo.queue_depth(P)
    assert set(depth) == set(JobState)
    assert (depth[JobState.READY], depth[JobState.SUCCEEDED], sum(depth.values())) == (2, 1, 3)


# -- concurrency and wakeup ------------------------------------------------------------------


def test_idempotent_enqueue_under_concurrency(backend: Backend) -> None:
    repo = backend.repo()
    keys, repeats, threads = 200, 5, 16
    start = threading.Barrier(threads)

    def client(n: int) -> dict[str, uuid.UUID]:
        start.wait()
        seen: dict[str, uuid.UUID] = {}
        for r in range(repeats):
            order = range(keys) if (n + r) % 2 else reversed(range(keys))
            for k in order:
                seen[f"k{k}"] = repo.enqueue(req(f"k{k}")).job.id
        return seen

    with ThreadPoolExecutor(threads) as pool:
        views = list(pool.map(client, range(threads)))
    assert all(view == views[0] for view in views)
    assert len(set(views[0].values())) == keys
    assert backend.job_count(P) == keys


def test_enqueue_wakes_a_waiting_worker(backend: Backend) -> None:
    repo, notifier = backend.repo(), backend.notifier()
    assert notifier.wait(P, timeout=0.2) is False
    timer = threading.Timer(0.2, lambda: repo.enqueue(req("wake")))
    started = time.monotonic()
    timer.start()
    assert notifier.wait(P, timeout=5.0) is True
    assert time.monotonic() - started < 2.0
    timer.join()


def test_a_wakeup_for_another_project_does_not_wake(backend: Backend) -> None:
    repo, notifier = backend.repo(), backend.notifier()
    notifier.wait(P, timeout=0.05)
    repo.enqueue(req("elsewhere", project=OTHER))
    assert notifier.wait(P, timeout=0.5) is False


def test_releasing_a_dependent_wakes_a_waiting_worker(backend: Backend) -> None:
    repo, notifier = backend.repo(), backend.notifier()
    parent = repo.enqueue(req("parent")).job
    repo.enqueue(req("child", depends_on=(parent.id,)))
    (held,) = claim_n(repo, P, owner="w")
    notifier.wait(P, timeout=0.05)  # listening, and drained of the enqueue's wakeups
    notifier.wait(P, timeout=0.3)
    assert repo.ack(held.lease).applied
    assert notifier.wait(P, timeout=5.0) is True
