"""``vibey events tail``, ``vibey tenant ...`` and ``vibey notify``: the domain events.

Events are read from PostgreSQL (their record), so ``events tail`` works on either backend and
shows what the ``vibey.events`` exchange carries. ``notify`` runs the webhooks of
``[notify.webhooks.<name>]`` as an events consumer (docs/events.md).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import TYPE_CHECKING, Annotated

from cyclopts import App, Parameter

from vibey import render
from vibey.command_groups import help_of
from vibey.render import CommandError, ExitCode

if TYPE_CHECKING:
    from workflows.events import DomainEvent

events_app = App(name="events", help=help_of("events"))
tenant_app = App(name="tenant", help=help_of("tenant"))
Json = Annotated[bool, Parameter(name="--json", negative=())]


@events_app.command
def tail(
    *,
    project: str | None = None,
    tenant: str | None = None,
    type_: Annotated[str | None, Parameter(name="--type")] = None,
    limit: int = 20,
    follow: Annotated[bool, Parameter(name=["--follow", "-f"], negative=())] = False,
    json_output: Json = False,
) -> ExitCode:
    """The newest domain events, oldest first; with --follow, then each new one as it commits.

    JSON: one event envelope a line (NDJSON), as the vibey.events exchange carries it but with
    its payload inline: ``{"version", "event_id", "event_type", "timestamp", "tenant_id",
    "project_id", "correlation_id", "causation_id", "payload", "payload_ref"}``.

    Parameters
    ----------
    project
        Only this project's events.
    tenant
        Only the events of this tenant's projects.
    type_
        Only events of this type (gate.opened) or family (gate).
    limit
        How many of the newest to show first.
    follow
        Keep printing new events until Ctrl-C.
    json_output
        Print NDJSON.
    """
    from vibey.client import read_client
    from vibey.settings import load_settings

    stop = threading.Event()
    if follow:
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with read_client(load_settings()) as client:
        last = 0
        for seq, event in client.events(
            limit=limit, tenant=tenant, project=project, event_type=type_
        ):
            _print(event, json_output)
            last = seq
        while follow and not stop.is_set():
            for seq, event in client.events(
                limit=500,
                after=last,
                newest=False,
                tenant=tenant,
                project=project,
                event_type=type_,
            ):
                _print(event, json_output)
                last = seq
            stop.wait(0.5)
    return ExitCode.OK


def _print(event: DomainEvent, json_output: bool) -> None:
    from workflows.events import to_json

    if json_output:
        print(json.dumps(to_json(event), ensure_ascii=False), flush=True)
        return
    who = f"{event.tenant_id}/{event.project_id or '-'}"
    workflow = f"  workflow {event.correlation_id[:8]}" if event.correlation_id else ""
    payload = render.short(json.dumps(dict(event.payload), ensure_ascii=False), 160)
    print(
        f"{render.clock(event.timestamp)}  {who:<24} {event.event_type.value:<22}"
        f"{workflow}  {payload}",
        flush=True,
    )


@tenant_app.command(name="set")
def set_(project: str, tenant: str, /) -> ExitCode:
    """Put PROJECT in TENANT: its events carry it and `--tenant` filters find it.

    A tenant is lowercase letters, digits, '-' and '_'. The events written before keep the
    tenant they were written with.
    """
    import re

    from vibey.client import read_client
    from vibey.settings import load_settings

    if re.fullmatch(r"[a-z0-9][a-z0-9_-]*", tenant) is None:
        raise CommandError(
            f"{tenant!r} is not a tenant name: lowercase letters, digits, '-' and '_'",
            ExitCode.USAGE,
        )
    with read_client(load_settings()) as client:
        client.set_tenant(project, tenant)
    print(f"project {project} belongs to tenant {tenant}")
    return ExitCode.OK


@tenant_app.command
def show(project: str, /) -> ExitCode:
    """Print the tenant PROJECT belongs to."""
    from vibey.client import read_client
    from vibey.settings import load_settings

    with read_client(load_settings()) as client:
        print(client.tenant(project))
    return ExitCode.OK


def notify(*, once: Annotated[bool, Parameter(name="--once", negative=())] = False) -> ExitCode:
    """Run the webhooks of [notify.webhooks.<name>] until SIGTERM or SIGINT.

    An events consumer (queue vibey.notify.webhooks on the vibey.events exchange): each event a
    webhook wants becomes one delivery, POSTed signed (X-Vibey-Timestamp, X-Vibey-Signature:
    sha256=HMAC(secret, "<timestamp>." + body)), retried with backoff; every attempt is
    recorded in PostgreSQL. A dead endpoint delays nothing but its own deliveries.

    Parameters
    ----------
    once
        Start, deliver what is due for a few seconds, stop (a smoke test).
    """
    from actors.webhooks import WebhookService
    from store.pool import open_pool
    from vibey.settings import load_settings
    from workflows.events import exchange_for

    settings = load_settings()
    if not settings.webhooks:
        raise CommandError(
            "no webhooks are configured: add a [notify.webhooks.<name>] table (url, events, "
            "secret) to vibey.toml"
        )
    pool = open_pool(settings.require_database_url(), max_size=4, name="vibey-notify")
    service = WebhookService(
        amqp_url=settings.require_amqp_url(),
        pool=pool,
        specs=settings.webhooks,
        exchange=exchange_for(settings.bus.prefix),
        queue=f"{settings.bus.prefix}.notify.webhooks",
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    names = ", ".join(spec.name for spec in settings.webhooks)
    print(f"vibey notify: webhooks {names}; SIGTERM or Ctrl-C stops it", flush=True)
    service.start()
    try:
        if once:
            time.sleep(3)
        else:
            stop.wait()
    finally:
        service.stop()
        pool.close()
    return ExitCode.OK
