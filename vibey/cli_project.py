"""``vibey project ...``: which projects have dedicated queues (the project routes).

A project's pointers go to its dedicated queues (``<prefix>.jobs.<lane>.p.<project>``, served
by ``vibey worker --project P``) exactly when ``project_route`` holds it. Every publisher (the
workers' relays, the CLI, the reconciler) reads that table, so they all route alike.
``vibey worker --project P`` routes P when it starts; these commands do it by hand and undo it.
Changing a route resends the project's claimable pointers on the new route at once.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from cyclopts import App, Parameter

from vibey import render
from vibey.command_groups import help_of
from vibey.render import ExitCode
from vibey.settings import check_project_ids, load_settings

if TYPE_CHECKING:
    from actors.worker import WorkerConfig
    from store.db import Pool

project_app = App(name="project", help=help_of("project"))

Json = Annotated[bool, Parameter(name="--json", negative=())]
T = TypeVar("T")


def _with_pool(fn: Callable[[Pool], T], url: str | None = None) -> T:
    from store.pool import open_pool

    pg_url = url or load_settings().require_database_url()
    pool = open_pool(pg_url, min_size=1, max_size=1, name="vibey-cli")
    try:
        return fn(pool)
    finally:
        pool.close()


def _declare(project: str) -> list[str]:
    """Declare the project's dedicated queues (on the rabbitmq backend, when RabbitMQ
    answers), so its pointers wait there until a `vibey worker --project` serves them."""
    from actors.topology import QueueNames
    from workflows.dispatch import Lane

    settings = load_settings()
    names = QueueNames(settings.bus.prefix)
    queues = [names.work_queue(lane, project) for lane in Lane]
    if settings.queue.backend != "rabbitmq" or settings.bus.amqp_url is None:
        return queues
    from actors import amqp
    from actors.capabilities import detect
    from vibey.wiring import worker_config

    topology = worker_config(settings, projects=[project]).topology()
    try:
        connection = amqp.connect(settings.bus.amqp_url, timeout=5)
    except amqp.AMQPError:  # the first worker for it declares them
        return queues
    try:
        caps = detect(connection)
        for lane in topology.lanes:
            topology.declare_dedicated(connection.channel(), caps, lane, project)
    finally:
        connection.close()
    return queues


@project_app.command
def dedicate(project: str, /, *, json_output: Json = False) -> ExitCode:
    """Route PROJECT's pointers to its dedicated queues (served by `vibey worker --project`).

    Idempotent. Its claimable pointers are sent again on the new route at once. Until a
    `vibey worker --project PROJECT` runs, its steps wait (`vibey queue stats` says so).

    Parameters
    ----------
    project
        The project id.
    json_output
        {"project", "dedicated": true, "changed", "queues"}.
    """
    from vibey.client import read_client

    (project,) = check_project_ids([project], "fix the project id")
    by = f"vibey project dedicate@{socket.gethostname()}"
    queues = _declare(project)  # first: the resent pointers then have somewhere to wait
    with read_client(load_settings()) as client:
        changed = client.dedicate(project, by=by)
    if json_output:
        payload = {"project": project, "dedicated": True, "changed": changed, "queues": queues}
        render.dump(payload)
        return ExitCode.OK
    state = "now routed" if changed else "already routed"
    print(f"{project}: {state} to {', '.join(queues)} (served by vibey worker --project {project})")
    return ExitCode.OK


@project_app.command
def undedicate(project: str, /, *, json_output: Json = False) -> ExitCode:
    """Route PROJECT's pointers back to the shared lane queues (undoes `dedicate`).

    Idempotent. Its claimable pointers are sent again on the shared queues at once. A
    `vibey worker --project PROJECT` started later routes it to its dedicated queues again.

    Parameters
    ----------
    project
        The project id.
    json_output
        {"project", "dedicated": false, "changed"}.
    """
    from vibey.client import read_client

    (project,) = check_project_ids([project], "fix the project id")
    with read_client(load_settings()) as client:
        changed = client.undedicate(project)
    if json_output:
        render.dump({"project": project, "dedicated": False, "changed": changed})
        return ExitCode.OK
    state = "now routed" if changed else "already routed"
    print(f"{project}: {state} to the shared lane queues")
    return ExitCode.OK


@project_app.command(name="list")
def list_(*, json_output: Json = False) -> ExitCode:
    """The projects routed to dedicated queues, with when and by whom.

    Parameters
    ----------
    json_output
        {"routes": [{"project_id", "dedicated_at", "dedicated_by"}]}.
    """
    from dataclasses import asdict

    from vibey.client import read_client

    with read_client(load_settings()) as client:
        routes = client.routes()
    if json_output:
        render.dump({"routes": [asdict(r) for r in routes]})
        return ExitCode.OK
    for route in routes:
        print(
            f"{route.project_id:<24} since {route.dedicated_at:%Y-%m-%d %H:%M:%S} "
            f"by {route.dedicated_by}"
        )
    if not routes:
        print("no project has dedicated queues: every project's steps go to the shared lanes")
    return ExitCode.OK


def route_at_start(config: WorkerConfig) -> list[str]:
    """Route a starting worker's projects (``--project``, and ``dedicated_projects`` in the
    settings) to their dedicated queues; the ones that were not routed before."""
    from store.routes import dedicate as write

    wanted: Sequence[str] = tuple(
        dict.fromkeys((*config.projects, *config.queue.rabbitmq.dedicated_projects))
    )
    if config.queue.backend != "rabbitmq" or not wanted:
        return []
    by = f"vibey worker@{socket.gethostname()}"

    def route(pool: Any) -> list[str]:
        return [project for project in wanted if write(pool, project, by=by)]

    return _with_pool(route, config.pg_url)
