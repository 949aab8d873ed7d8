"""Operations commands: ``vibey reconcile`` (the reconciler alone), ``vibey queue stats`` and
``vibey queue dead``.

The ``actors`` modules (pika, Dramatiq) are imported by the commands that use them.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import asdict
from typing import Annotated, Any

from cyclopts import App, Parameter

from vibey.command_groups import help_of
from vibey.render import ExitCode
from vibey.settings import Settings, SettingsError, load_settings


def reconcile(*, once: Annotated[bool, Parameter(name="--once", negative=())] = False) -> ExitCode:
    """Run the reconciler alone until SIGTERM or SIGINT (or one pass with --once).

    Every reconcile_interval_seconds: on the rabbitmq backend, reap expired leases with a
    redispatch, sweep lost dispatches, drain the outbox and park dead letters; on the postgres
    backend, reap expired leases. Consumes no queue, so it keeps an autoscaled fleet that KEDA
    scaled to zero correct. Several at once are harmless. Needs VIBEY_PG_URL (and
    VIBEY_AMQP_URL on the rabbitmq backend).

    Parameters
    ----------
    once
        One pass, print what it found, exit (1 if the pass failed).
    """
    from actors.reconcile_service import ReconcileService
    from vibey.wiring import worker_config

    config = worker_config(load_settings())
    service = ReconcileService(config)
    stop = threading.Event()
    if once:
        stop.set()
    else:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        from store.pool import redact

        where = redact(config.pg_url if config.queue.backend == "postgres" else config.amqp_url)
        print(
            f"vibey reconcile: every {config.queue.rabbitmq.reconcile_interval_seconds:g} s "
            f"({config.queue.backend} backend, {where}); SIGTERM or Ctrl-C stops it",
            flush=True,
        )
    failures = service.run(stop, report=_report if once else _log_findings)
    if once and failures:
        print(f"vibey: the reconcile pass failed ({service.last_error})", file=sys.stderr)
        return ExitCode.FAILURE
    return ExitCode.OK


def _report(found: Any) -> None:
    print(f"reconcile: {found}", flush=True)


def _log_findings(found: Any) -> None:
    if any(getattr(found, name, 0) for name in getattr(found, "__dataclass_fields__", {})):
        print(f"reconcile: {found}", flush=True)


queue_app = App(name="queue", help=help_of("queue"))


@queue_app.command
def stats(
    *, json_output: Annotated[bool, Parameter(name="--json", negative=())] = False
) -> ExitCode:
    """Each queue's ready messages and consumers, the jobs leased per lane (each holds its
    delivery unacknowledged), the dead letters (in the dead-letter queue, and kept), the
    outbox's unsent rows and the age of the oldest, the projects routed to dedicated queues,
    and the claimable job waiting longest. A queue holding pointers that no consumer serves
    says "waiting for a worker on <queue>: none is consuming"; then each problem (a queue
    nobody consumes, a stale outbox) with the command that fixes it.

    On the postgres backend a lane's queue is its claimable rows. Exits 3 when PostgreSQL or
    RabbitMQ does not answer.

    Parameters
    ----------
    json_output
        One JSON object: {"backend", "queues": [{"name", "lane", "project", "exists",
        "ready", "consumers"}], "leased_by_lane", "dead_queue", "dead_kept",
        "outbox_unsent", "outbox_oldest_s", "oldest_ready", "routed" (project ids),
        "waiting" (queues holding pointers that no consumer serves),
        "problems": [{"what", "fix"}]}.
    """
    from vibey.client import read_client
    from vibey.wiring import worker_config

    settings = load_settings()
    worker_config(settings)  # the fleet's settings hold before anything connects
    with read_client(settings) as client:
        found = client.queue_stats()
    if json_output:
        print(json.dumps(asdict(found), indent=2, default=str))
        return ExitCode.OK
    from actors.queue_stats import waiting_line

    for row in found.queues:
        where = f"{row.ready} ready" if row.exists else "MISSING (start a worker to declare it)"
        consumers = "" if row.consumers is None else f", {row.consumers} consumers"
        waiting = f" ({waiting_line(row.name)})" if row.unserved else ""
        print(f"{row.name:<40} {where}{consumers}{waiting}")
    leased = ", ".join(f"{lane} {n}" for lane, n in found.leased_by_lane.items())
    print(f"{'leased (running) jobs':<40} {leased or 'none'}")
    dead = "" if found.dead_queue is None else f"{found.dead_queue} in the dead-letter queue, "
    print(f"{'dead letters':<40} {dead}{found.dead_kept} kept (vibey queue dead)")
    print(f"{'outbox':<40} {found.outbox_unsent} unsent, oldest {found.outbox_oldest_s:.1f} s")
    routed = ", ".join(found.routed) or "none (every project uses the shared lanes)"
    print(f"{'dedicated projects':<40} {routed}")
    if found.oldest_ready:
        ready = found.oldest_ready
        print(
            f"{'oldest claimable job':<40} {ready['kind']} of {ready['project_id']} "
            f"({ready['id']}), due {ready['waited_s']:.1f} s ago"
        )
    for problem in found.problems:
        print(f"PROBLEM: {problem.what}; fix: {problem.fix}")
    if found.problems:
        print(f"next: {found.problems[0].fix}")
    return ExitCode.OK


@queue_app.command
def dead(
    *,
    after: int | None = None,
    limit: int = 50,
    json_output: Annotated[bool, Parameter(name="--json", negative=())] = False,
) -> ExitCode:
    """List the dead letters kept: messages the dead-letter queue held that name no job
    (malformed bodies, pointers rejected with their reason), oldest first.

    Parameters
    ----------
    after
        Only those with an id above this (the next page).
    limit
        At most this many (1..1000).
    json_output
        {"dead_letters": [{"id", "queue", "routing_key", "reason", "detail", "body",
        "headers", "message_id", "received_at"}]} (body as text, undecodable bytes replaced).
    """
    if not 1 <= limit <= 1000:
        raise SettingsError(f"--limit must be 1..1000, got {limit}")
    from vibey.client import read_client
    from vibey.wiring import worker_config

    settings = load_settings()
    worker_config(settings)  # the fleet's settings hold before anything connects
    with read_client(settings) as client:
        rows = client.dead_letters(after=after, limit=limit)
    if json_output:
        shown = [{**asdict(r), "body": r.body.decode("utf-8", "replace")} for r in rows]
        print(json.dumps({"dead_letters": shown}, indent=2, default=str))
        return ExitCode.OK
    for row in rows:
        body = row.body[:80].decode("utf-8", "replace")
        print(f"{row.id:>6} {row.received_at:%Y-%m-%d %H:%M:%S} {row.reason}: {body!r}")
    if not rows:
        print("no dead letters kept")
    return ExitCode.OK


def stack_checks(settings: Settings, caps: Any) -> list[dict[str, Any]]:
    """``vibey doctor``'s whole-stack checks as dicts (:mod:`actors.doctor`)."""
    from actors.doctor import stack_checks as run_checks
    from store.pool import open_pool
    from vibey.wiring import longest_lease, worker_config

    try:
        config = worker_config(settings)
    except SettingsError as exc:
        return [{"name": "settings", "status": "problem", "detail": str(exc), "fix": None}]
    longest = longest_lease(settings)
    pool = open_pool(config.pg_url, min_size=1, max_size=2, name="vibey-doctor")
    try:
        return [asdict(check) for check in run_checks(config, pool, caps, longest)]
    finally:
        pool.close()
