"""The whole-stack checks of ``vibey doctor``, after PostgreSQL, the migrations and the broker.

In order: the topology as declared (every queue the settings route to exists), consumers on
every lane queue, the reconcile heartbeat (some process reconciled recently), the outbox's lag
(nothing unsent for long), ``consumer_timeout`` against the longest lease, and the dead
letters. Each :class:`Check` says what it found and, when it found a problem, the command that
fixes it; ``vibey doctor`` prints the first such command.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from actors import amqp
from actors.capabilities import BrokerCapabilities
from actors.queue_stats import PROBE_TIMEOUT_S, expected_queues, stale_after
from actors.topology import CONSUMER_TIMEOUT_FIX, consumer_timeout_problem
from actors.worker import WorkerConfig
from store.db import Pool
from store.operations import OperationsStore
from store.routes import read_routes

OK, PROBLEM, INFO = "ok", "problem", "info"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # ok, problem or info
    detail: str
    fix: str | None = None


def stack_checks(
    config: WorkerConfig, pool: Pool, caps: BrokerCapabilities | None, longest_lease: timedelta
) -> list[Check]:
    ops = OperationsStore(pool)
    checks: list[Check] = []
    if config.queue.backend == "rabbitmq":
        checks += _broker_checks(config, read_routes(pool).projects)
    stale = stale_after(config)
    checks.append(_heartbeat(ops, stale))
    if config.queue.backend == "rabbitmq":
        checks.append(_outbox(ops, stale))
        checks.append(_consumer_timeout(config, caps, longest_lease))
    checks.append(_dead_letters(ops))
    return checks


def _broker_checks(config: WorkerConfig, routed: frozenset[str]) -> list[Check]:
    try:
        connection = amqp.connect(config.amqp_url, timeout=PROBE_TIMEOUT_S)
    except amqp.AMQPError as exc:
        return [Check("topology", PROBLEM, f"RabbitMQ did not answer ({exc!r})", None)]
    missing: list[str] = []
    idle: list[tuple[str, str | None, str | None]] = []
    try:
        for name, lane, project in expected_queues(config, routed):
            channel = connection.channel()
            try:
                method = channel.queue_declare(name, passive=True).method
            except amqp.ChannelClosedByBroker:
                missing.append(name)
                continue
            if lane is not None and method.consumer_count == 0:
                idle.append((name, lane, project))
            channel.close()
    finally:
        connection.close()
    checks = [
        Check("topology", PROBLEM, f"missing: {', '.join(missing)}", "vibey worker")
        if missing
        else Check("topology", OK, "every queue the settings route to exists")
    ]
    if idle:
        name, lane, project = idle[0]
        flags = f" --lanes {lane}" + (f" --project {project}" if project else "")
        checks.append(
            Check(
                "consumers",
                PROBLEM,
                f"no consumer on {', '.join(q for q, _, _ in idle)}: their jobs wait",
                f"vibey worker{flags}",
            )
        )
    elif not missing:
        checks.append(Check("consumers", OK, "every lane queue has a consumer"))
    return checks


def _heartbeat(ops: OperationsStore, stale: timedelta) -> Check:
    beat = ops.latest_heartbeat()
    fix = "vibey reconcile (or vibey worker: every worker reconciles)"
    if beat is None:
        return Check("reconcile", PROBLEM, "no reconcile pass was ever recorded", fix)
    if beat.age_s > stale.total_seconds():
        return Check(
            "reconcile",
            PROBLEM,
            f"the newest reconcile pass ({beat.owner}) was {beat.age_s:.0f} s ago",
            fix,
        )
    return Check("reconcile", OK, f"last pass {beat.age_s:.0f} s ago by {beat.owner}")


def _outbox(ops: OperationsStore, stale: timedelta) -> Check:
    unsent, oldest = ops.outbox_lag()
    if unsent and oldest > stale.total_seconds():
        return Check(
            "outbox",
            PROBLEM,
            f"{unsent} dispatches unsent, the oldest for {oldest:.0f} s",
            "vibey reconcile --once",
        )
    return Check("outbox", OK, f"{unsent} unsent, the oldest for {oldest:.0f} s")


def _consumer_timeout(
    config: WorkerConfig, caps: BrokerCapabilities | None, longest_lease: timedelta
) -> Check:
    lease_s = longest_lease.total_seconds()
    if caps is not None and caps.per_queue_consumer_timeout:
        queue_timeout = config.topology().consumer_timeout
        wrong = consumer_timeout_problem(queue_timeout, longest_lease)
        if wrong is not None:
            detail = f"the work queues' x-consumer-timeout: {wrong}"
            return Check("consumer_timeout", PROBLEM, detail, CONSUMER_TIMEOUT_FIX)
        return Check(
            "consumer_timeout",
            OK,
            f"work queues carry x-consumer-timeout {queue_timeout}, above the longest "
            f"lease ({lease_s:.0f} s)",
        )
    return Check(
        "consumer_timeout",
        INFO,
        "this broker applies only its node-wide consumer_timeout, which AMQP does not show: "
        f"it must be above the longest lease ({lease_s:.0f} s); ops/rabbitmq/rabbitmq.conf "
        "sets 3 h",
    )


def _dead_letters(ops: OperationsStore) -> Check:
    kept = ops.dead_letter_count()
    if kept:
        return Check(
            "dead letters",
            INFO,
            f"{kept} kept: messages that named no job (malformed, or rejected with a reason)",
            "vibey queue dead",
        )
    return Check("dead letters", OK, "none kept")
