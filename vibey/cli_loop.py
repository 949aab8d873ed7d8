"""``vibey loop-service --engine <id>``: one engine's long-lived loop service (docs/engines.md)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from vibey.render import CommandError, ExitCode
from vibey.settings import SettingsError, load_settings


def loop_service(
    *,
    engine: Annotated[str, Parameter(name="--engine")],
    drain_grace: Annotated[float, Parameter(name="--drain-grace")] = 60.0,
) -> ExitCode:
    """Serve one engine's runs from RabbitMQ until SIGTERM or SIGINT, then drain.

    Consumes vibey.runs.ENGINE with the engine's prefetch ([engines.ENGINE] prefetch, 1-64)
    and answers its probes on vibey.runs.ENGINE.probe, even while a run is in progress.
    Runs only the engine's own binary, in directories under the engine workspace
    ([engine] workspace), with the engine's own environment. Needs VIBEY_AMQP_URL. With
    VIBEY_METRICS_PORT set, serves /metrics and /healthz on it.

    Parameters
    ----------
    engine
        The engine's id: an [engines.ENGINE] table of vibey.toml.
    drain_grace
        Seconds the runs in progress get to finish on SIGTERM before they are stopped.
    """
    from actors.agents.service import build_service

    settings = load_settings()
    try:
        (spec,) = settings.roster([engine])
    except SettingsError as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    if not spec.as_service:
        print(f'vibey: engine {engine} has invocation = "subprocess"; its steps do not come here')
    root = Path(settings.engine.workspace).resolve()
    root.mkdir(parents=True, exist_ok=True)
    for name in ("vibey.loop_service", "vibey.run_client"):  # supersedes, refusals, reconnects
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        service = build_service(
            spec,
            amqp_url=settings.require_amqp_url(),
            prefix=settings.bus.prefix,
            root=root,
            agent_env=settings.agent_env,
            state_dir=root / ".state",
            drain_grace=drain_grace,
        )
    except ValueError as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(
        f"vibey loop-service: engine {engine}, prefetch {spec.prefetch}, root {root}; "
        "SIGTERM or Ctrl-C drains it",
        flush=True,
    )
    health = None
    if settings.metrics.port is not None:  # /healthz: the pod's liveness and startup probes
        from actors.metrics import MetricsServer

        health = MetricsServer(port=settings.metrics.port).start()
    try:
        service.run(stop)
    finally:
        if health is not None:
            health.stop()
    return ExitCode.OK
