"""The job-queue contract on RabbitMQ: PostgreSQL stays the record, RabbitMQ carries pointers.

Every write goes to PostgreSQL exactly as on the PostgreSQL backend, with dispatch generations
and the outbox on: a transition that starts a new dispatch episode writes its pointer in the
same transaction, and the relay publishes it after the commit. ``claim`` takes the project's
buffered deliveries and makes the fenced pointer claim for each; a miss goes through
``workflows.dispatch.decide_miss`` (drop, or re-delay through a wait tier). A claimed job's
delivery is held until its settle commits, then acknowledged, whether or not the settle
applied (a refused settle means the delivery was stale).

``claim`` serves projects with dedicated queues (``projects``); the default fleet's Dramatiq
actors serve the shared lane queues.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from actors.deliveries import Delivery, ProjectDeliveries
from actors.miss import plan_miss
from actors.reconcile import Reconciler
from actors.relay import Relay
from actors.topology import QueueNames
from store.dispatch import DispatchRecords
from store.jobs import PostgresJobRepository
from workflows.dispatch import DispatchEnvelope, EnvelopeError, Lane, WaitTiers, decode
from workflows.job import FailureClass, JobState
from workflows.queue import (
    AnswerOutcome,
    Enqueued,
    EnqueueRequest,
    Gate,
    GateRequest,
    Job,
    JsonObject,
    Lease,
    ReapResult,
    Settled,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RabbitMqQueueOptions:
    prefetch: int = 16
    first_claim_wait: timedelta = timedelta(seconds=2)
    redispatch_after: timedelta = timedelta(minutes=2)
    reclaim_after: timedelta = timedelta(seconds=30)


class RabbitMqJobRepository:
    """The RabbitMQ backend of :class:`workflows.queue.JobRepository`."""

    def __init__(
        self,
        *,
        jobs: PostgresJobRepository,
        records: DispatchRecords,
        relay: Relay,
        url: str,
        names: QueueNames,
        tiers: WaitTiers,
        projects: Collection[str],
        options: RabbitMqQueueOptions | None = None,
    ) -> None:
        if not jobs.dispatching:
            raise ValueError("the RabbitMQ backend needs a job repository with dispatch on")
        self._jobs = jobs
        self._records = records
        self._relay = relay
        self._url = url
        self._names = names
        self._tiers = tiers
        self._projects = frozenset(projects)
        self._options = options or RabbitMqQueueOptions()
        self._consumers: dict[str, ProjectDeliveries] = {}
        self._held: dict[tuple[UUID, UUID], tuple[ProjectDeliveries, Delivery]] = {}
        self._reconciler = Reconciler(
            jobs=jobs,
            records=records,
            relay=relay,
            url=url,
            names=names,
            redispatch_after=self._options.redispatch_after,
            reclaim_after=self._options.reclaim_after,
        )
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            consumers, self._consumers = list(self._consumers.values()), {}
        for consumer in consumers:
            consumer.stop()
        self._reconciler.stop()

    # -- deliveries ------------------------------------------------------------------------

    def deliveries(self, project_id: str) -> ProjectDeliveries:
        """The project's consumer, started on first use (then waiting ``first_claim_wait``
        so a fresh consumer does not report "nothing ready" before the broker pushed)."""
        with self._lock:
            consumer = self._consumers.get(project_id)
            fresh = consumer is None
            if consumer is None:
                if project_id not in self._projects:
                    raise ValueError(
                        f"project {project_id!r} has no dedicated queues here; the default "
                        "fleet's actors serve it (or add it to the dedicated projects)"
                    )
                queues = [self._names.work_queue(lane, project_id) for lane in Lane]
                consumer = ProjectDeliveries(
                    url=self._url, queues=queues, prefetch=self._options.prefetch
                )
                consumer.start()
                self._consumers[project_id] = consumer
        if fresh:
            consumer.wait(self._options.first_claim_wait.total_seconds())
        return consumer

    def claim(
        self, project_id: str, *, owner: str, limit: int = 1, kinds: Collection[str] | None = None
    ) -> list[Job]:
        consumer = self.deliveries(project_id)
        wanted = None if kinds is None else set(kinds)
        claimed: list[Job] = []
        skipped: list[Delivery] = []
        while len(claimed) < limit and (delivery := consumer.take()) is not None:
            envelope = self._envelope(consumer, delivery, project_id)
            if envelope is None:
                continue
            if wanted is not None and envelope.kind not in wanted:
                skipped.append(delivery)
                continue
            job = self._records.claim_pointer(
                job_id=envelope.job_id,
                project_id=project_id,
                seq=envelope.dispatch_seq,
                owner=owner,
            )
            if job is None:
                self._missed(consumer, delivery, envelope)
                continue
            self._hold(job, consumer, delivery)
            claimed.append(job)
        consumer.put_back(skipped)
        claimed.sort(key=lambda j: (-j.priority, j.run_after, j.id))
        return claimed

    def _envelope(
        self, consumer: ProjectDeliveries, delivery: Delivery, project_id: str
    ) -> DispatchEnvelope | None:
        try:
            envelope = decode(delivery.body)
        except EnvelopeError as exc:
            self._reject(consumer, delivery, str(exc.reason), str(exc))
            return None
        if envelope.project_id != project_id:
            self._reject(consumer, delivery, "wrong_project", f"{envelope.project_id!r} here")
            return None
        return envelope

    def _reject(
        self, consumer: ProjectDeliveries, delivery: Delivery, reason: str, detail: str
    ) -> None:
        log.warning("rejected a delivery (%s): %s", reason, detail)
        consumer.reject(
            delivery, reason=reason, detail=detail, dead_exchange=self._names.dead_exchange
        )

    def _missed(
        self, consumer: ProjectDeliveries, delivery: Delivery, envelope: DispatchEnvelope
    ) -> None:
        hop = plan_miss(self._records, self._names, self._tiers, envelope)
        if hop is None:
            consumer.ack(delivery)
            return
        consumer.republish(
            delivery,
            exchange=hop.exchange,
            body=hop.body,
            message_id=hop.message_id,
            content_type="application/json",
        )

    def _hold(self, job: Job, consumer: ProjectDeliveries, delivery: Delivery) -> None:
        token = job.lease_token
        assert token is not None
        with self._lock:
            superseded = [key for key in self._held if key[0] == job.id]
            released = [self._held.pop(key) for key in superseded]
            self._held[(job.id, token)] = (consumer, delivery)
        for old_consumer, old_delivery in released:  # an older lease's delivery: stale now
            old_consumer.ack(old_delivery)

    def _release(self, lease: Lease) -> None:
        with self._lock:
            held = self._held.pop((lease.job_id, lease.token), None)
        if held is not None:
            consumer, delivery = held
            consumer.ack(delivery)

    # -- settles: the record first, then the held delivery ---------------------------------

    def ack(self, lease: Lease, *, result: JsonObject | None = None) -> Settled:
        settled = self._jobs.ack(lease, result=result)
        self._release(lease)
        return settled

    def nack(
        self,
        lease: Lease,
        *,
        error: str,
        failure_class: FailureClass,
        retry_in: timedelta | None = None,
    ) -> Settled:
        settled = self._jobs.nack(
            lease, error=error, failure_class=failure_class, retry_in=retry_in
        )
        self._release(lease)
        return settled

    def defer(
        self, lease: Lease, *, delay: timedelta, reason: str, capacity: bool = False
    ) -> Settled:
        settled = self._jobs.defer(lease, delay=delay, reason=reason, capacity=capacity)
        self._release(lease)
        return settled

    def park(self, lease: Lease, gate: GateRequest) -> Settled:
        settled = self._jobs.park(lease, gate)
        self._release(lease)
        return settled

    def heartbeat(self, lease: Lease) -> Settled:
        return self._jobs.heartbeat(lease)

    def grant(self, lease: Lease, *, max_attempts: int) -> Settled:
        return self._jobs.grant(lease, max_attempts=max_attempts)

    def assign(self, lease: Lease, *, engine_id: str) -> Settled:
        return self._jobs.assign(lease, engine_id=engine_id)

    # -- the rest is the record's ------------------------------------------------------------

    def enqueue(self, request: EnqueueRequest) -> Enqueued:
        return self._jobs.enqueue(request)

    def enqueue_batch(self, requests: Sequence[EnqueueRequest]) -> list[Enqueued]:
        return self._jobs.enqueue_batch(requests)

    def answer_gate(
        self, gate_id: UUID, *, answer: str, answered_by: str, grant_attempts: int = 0
    ) -> AnswerOutcome:
        return self._jobs.answer_gate(
            gate_id, answer=answer, answered_by=answered_by, grant_attempts=grant_attempts
        )

    def reap(self) -> ReapResult:
        """Reconcile: reap expired leases (with a redispatch), sweep lost dispatches, drain
        the outbox, and park what the dead-letter queue holds."""
        report = self._reconciler.run_once()
        return ReapResult(
            requeued=report.requeued, parked=report.parked + report.dead_letters_parked
        )

    def get(self, job_id: UUID) -> Job | None:
        return self._jobs.get(job_id)

    def get_gate(self, gate_id: UUID) -> Gate | None:
        return self._jobs.get_gate(gate_id)

    def open_gates(self, project_id: str | None = None) -> list[Gate]:
        return self._jobs.open_gates(project_id)

    def count_unsettled(
        self,
        project_id: str,
        *,
        cycle: int | None = None,
        kinds: Collection[str] | None = None,
        exclude: UUID | None = None,
    ) -> int:
        return self._jobs.count_unsettled(project_id, cycle=cycle, kinds=kinds, exclude=exclude)

    def queue_depth(self, project_id: str) -> Mapping[JobState, int]:
        return self._jobs.queue_depth(project_id)

    def list_for_cycle(self, project_id: str, cycle: int) -> list[Job]:
        return self._jobs.list_for_cycle(project_id, cycle)


class RabbitMqJobWakeup:
    """Wakes when a delivery for the project is buffered (the same idle tick remains)."""

    def __init__(self, repository: RabbitMqJobRepository) -> None:
        self._repository = repository

    def wait(self, project_id: str, timeout: float) -> bool:
        return self._repository.deliveries(project_id).wait(timeout)

    def close(self) -> None:
        """The repository owns the consumers."""
