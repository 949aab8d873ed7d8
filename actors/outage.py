"""What the step actor does when PostgreSQL does not answer: it never drops the pointer.

The store seam already retried what was safe (``store.retry``). What reaches here is one of:

* ``CommitUnknown`` on the claim or the settle: the connection broke while the commit was in
  flight. It is resolved by reading the fenced row (:func:`adopt_claim`,
  :func:`settle_resolved`): does this lease hold the row (owner, token, state, dispatch
  generation)? The actor continues from what is true.
  The read that resolves it waits for PostgreSQL as a settle does: a claim that landed holds
  a lease nobody else can take until it expires (two minutes by default), so giving up on the
  read would leave the step standing that long after PostgreSQL answers again.
* ``DatabaseUnavailable`` past the retries. A settle keeps trying while its lease could still
  be good (the work is done; only the commit is missing); past that, or for a claim or a miss,
  the pointer goes back through the smallest wait tier at the same generation
  (:func:`wait_out`), so the step resumes within one tier once PostgreSQL answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar
from uuid import UUID

from actors.stub_broker import Publisher
from actors.topology import QueueNames
from store.errors import CommitUnknown, DatabaseUnavailable
from store.ports import SettlingJobRepository
from workflows.dispatch import DispatchEnvelope, WaitTiers, encode, tier_name
from workflows.job import JobState
from workflows.queue import Job

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a finished step keeps trying to commit its settle while PostgreSQL does not answer
# (never past its lease, after which the fence would refuse it anyway), and how often.
SETTLE_PATIENCE = timedelta(minutes=5)
SETTLE_PAUSE_S = 1.0

# The states a settle leaves its row in, by what it was (StepResult's values).
_LANDED_STATES = {
    "succeeded": {JobState.SUCCEEDED},
    "failed": {JobState.READY, JobState.FAILED},
    "deferred": {JobState.READY, JobState.AWAITING_CAPACITY},
    "parked": {JobState.AWAITING_HUMAN},
}


def adopt_claim(jobs: SettlingJobRepository, *, job_id: UUID, seq: int, owner: str) -> Job | None:
    """After a claim whose commit was cut off: the job if the claim landed (the row is leased
    to ``owner`` at generation ``seq`` and the lease is live), else None (a miss). The read
    waits for PostgreSQL (:func:`patiently`); past ``SETTLE_PATIENCE`` it raises
    ``DatabaseUnavailable``, by when a lease that landed has expired or nearly."""
    deadline = time.monotonic() + SETTLE_PATIENCE.total_seconds()
    row = patiently(lambda: jobs.get(job_id), deadline, f"job {job_id}: the cut-off claim")
    now = datetime.now(UTC)  # after the read, however long it waited
    landed = (
        row is not None
        and row.state is JobState.LEASED
        and row.lease_owner == owner
        and row.dispatch_seq == seq
        and row.lease_expires_at is not None
        and row.lease_expires_at > now
    )
    log.warning(
        "job %s: the claim's commit was cut off; the row says it %s",
        job_id,
        "landed: running it" if landed else "did not land: a miss",
    )
    return row if landed else None


def settle_resolved(
    jobs: SettlingJobRepository, job: Job, label: str, settle: Callable[[], str]
) -> str | None:
    """Run ``settle`` (the fenced write) until it commits or its outcome is known. Returns
    its result, ``label`` when a cut-off commit turned out to have landed, or None when the
    lease was lost meanwhile. Raises ``DatabaseUnavailable`` once the lease is past saving."""
    patience = min(job.lease_timeout, SETTLE_PATIENCE).total_seconds()
    deadline = time.monotonic() + patience
    while True:
        try:
            return patiently(settle, deadline, f"job {job.id}: the settle")
        except CommitUnknown:
            row = patiently(lambda: jobs.get(job.id), deadline, f"job {job.id}: the cut-off settle")
            if (
                row is not None
                and row.state is JobState.LEASED
                and row.lease_token == job.lease_token
            ):
                log.warning(
                    "job %s: the settle's commit was cut off before it landed; again", job.id
                )
                continue
            landed = row is not None and row.state in _LANDED_STATES.get(label, set())
            log.warning(
                "job %s: the settle's commit was cut off; the row says %s",
                job.id,
                "it landed" if landed else "the lease was lost",
            )
            return label if landed else None


def patiently(call: Callable[[], T], deadline: float, what: str) -> T:
    """``call`` again every ``SETTLE_PAUSE_S`` while PostgreSQL does not answer, until the
    ``deadline`` (``time.monotonic``), past which its ``DatabaseUnavailable`` is raised. A
    ``CommitUnknown`` is the caller's to resolve: it is raised at once, never called again."""
    while True:
        try:
            return call()
        except CommitUnknown:
            raise
        except DatabaseUnavailable as exc:
            if time.monotonic() + SETTLE_PAUSE_S > deadline:
                raise
            log.warning("%s waits for PostgreSQL (%s)", what, exc)
            time.sleep(SETTLE_PAUSE_S)


def wait_out(
    broker: Publisher,
    names: QueueNames,
    tiers: WaitTiers,
    *,
    job_id: UUID,
    project_id: str,
    seq: int,
    kind: str,
    routing_key: str,
) -> None:
    """Publish the pointer (same generation) to the smallest wait tier; the caller acks it.
    Should the broker refuse too, the error reaches Dramatiq, which dead-letters the delivery:
    the reconciler dispatches it again from the dead-letter queue (``park_dead_letter``)."""
    tier = tiers.smallest
    later = DispatchEnvelope(
        job_id=job_id,
        project_id=project_id,
        dispatch_seq=seq,
        kind=kind,
        not_before=datetime.now(UTC) + tier,
    )
    broker.publish(
        exchange=names.tier_exchange(tier_name(tier)),
        routing_key=routing_key,
        body=encode(later),
        message_id=later.message_id,
    )
