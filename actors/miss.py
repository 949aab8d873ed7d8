"""What a consumer does with a pointer whose fenced claim missed: drop it, or hop it through a
wait tier (``workflows.dispatch.decide_miss`` decides, on the database clock)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from actors.topology import QueueNames
from store.ports import PointerClaims
from workflows.dispatch import (
    DispatchEnvelope,
    Drop,
    RowSnapshot,
    WaitTiers,
    decide_miss,
    encode,
    tier_name,
)


@dataclass(frozen=True, slots=True)
class Hop:
    """Publish ``body`` to ``exchange`` with the pointer's own routing key, then ack it."""

    exchange: str
    body: bytes
    message_id: str


def plan_miss(
    records: PointerClaims, names: QueueNames, tiers: WaitTiers, envelope: DispatchEnvelope
) -> Hop | None:
    """None to drop the pointer; else the hop that re-delays it."""
    row = records.snapshot(job_id=envelope.job_id, project_id=envelope.project_id)
    now = row.now if row is not None else datetime.now(UTC)
    snapshot = None
    if row is not None:
        snapshot = RowSnapshot(
            state=row.state,
            dispatch_seq=row.dispatch_seq,
            run_after=row.run_after,
            lease_expires_at=row.lease_expires_at,
            deps_met=row.deps_met,
        )
    decision = decide_miss(snapshot, envelope.dispatch_seq, now)
    if isinstance(decision, Drop):
        return None
    # Never straight back to the work queue: even a raced pointer waits the smallest tier.
    tier = tiers.route(decision.until - now) or tiers.smallest
    later = DispatchEnvelope(
        job_id=envelope.job_id,
        project_id=envelope.project_id,
        dispatch_seq=envelope.dispatch_seq,
        kind=envelope.kind,
        not_before=decision.until,
    )
    return Hop(names.tier_exchange(tier_name(tier)), encode(later), later.message_id)
