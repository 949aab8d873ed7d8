"""``vibey loop-service --engine <id>``: one engine's long-lived loop service (docs/engines.md).

By default two processes: a watchdog (:mod:`actors.agents.watchdog`) that serves ``/healthz``
and restarts the service it starts as its child when that child crashes or its heartbeat
goes stale; ``--no-watchdog`` serves in this process alone.
"""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from vibey.render import CommandError, ExitCode
from vibey.settings import Settings, SettingsError, load_settings


def loop_service(
    *,
    engine: Annotated[str, Parameter(name="--engine")],
    drain_grace: Annotated[float | None, Parameter(name="--drain-grace")] = None,
    stale_after: Annotated[float, Parameter(name="--stale-after")] = 60.0,
    progress_every: Annotated[float, Parameter(name="--progress-every")] = 1.0,
    no_watchdog: Annotated[bool, Parameter(name="--no-watchdog", negative=())] = False,
    watched_by: Annotated[int | None, Parameter(name="--watched-by", show=False)] = None,
    heartbeat: Annotated[Path | None, Parameter(name="--heartbeat", show=False)] = None,
) -> ExitCode:
    """Serve one engine's runs from RabbitMQ until SIGTERM or SIGINT, then drain.

    Consumes vibey.runs.ENGINE with the engine's prefetch ([engines.ENGINE] prefetch, 1-64)
    and answers its probes on vibey.runs.ENGINE.probe, even while a run is in progress.
    Runs only the engine's own binary, in directories under the engine workspace
    ([engine] workspace), with the engine's own environment. Needs VIBEY_AMQP_URL.

    A watchdog process runs the service as its child and starts it again (backing off from
    1 s to 30 s, each restart logged) when it exits abnormally or its heartbeat is older than
    --stale-after seconds (a wedged service: its process group and its runs' get SIGTERM,
    then SIGKILL). With VIBEY_METRICS_PORT set, serves /metrics and /healthz on it; /healthz
    answers 503 while the heartbeat is stale (the pod's liveness probe).

    Parameters
    ----------
    engine
        The engine's id: an [engines.ENGINE] table of vibey.toml.
    drain_grace
        Seconds the runs in progress get to finish on SIGTERM before they are stopped
        (default: the longest of the leases and the engine's timeout_seconds, the number
        the Kubernetes manifests give a loop-service pod).
    stale_after
        Seconds without a heartbeat after which the service counts as wedged.
    progress_every
        Seconds between a run's progress messages to its caller (its new output lines); 0
        sends none.
    no_watchdog
        Serve in this process, without the supervising watchdog.
    """
    settings = load_settings()
    try:
        (spec,) = settings.roster([engine])
    except SettingsError as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    if drain_grace is None:
        from vibey.wiring import service_drain_grace

        drain_grace = service_drain_grace(settings, spec).total_seconds()
    if stale_after <= 0:
        raise CommandError("--stale-after must be more than 0 seconds", ExitCode.USAGE)
    if progress_every < 0:
        raise CommandError("--progress-every must be 0 (none) or more seconds", ExitCode.USAGE)
    if not spec.as_service and watched_by is None:
        print(f'vibey: engine {engine} has invocation = "subprocess"; its steps do not come here')
    if watched_by is None and not no_watchdog:
        return _watchdog(settings, engine, drain_grace, stale_after, progress_every)
    if watched_by is not None:
        from actors.agents.watchdog import die_with_parent

        die_with_parent(watched_by)
    return _serve(
        settings, spec, drain_grace, heartbeat, progress_every, metrics=watched_by is None
    )


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _watchdog(
    settings: Settings, engine: str, drain_grace: float, stale_after: float, progress_every: float
) -> ExitCode:
    import os

    from actors.agents.watchdog import Watchdog

    logging.getLogger("vibey.loop_service").setLevel(logging.INFO)
    state = Path(tempfile.mkdtemp(prefix=f"vibey-loop-{engine}-"))

    def command(beat: Path) -> list[str]:
        return [
            sys.executable, "-m", "vibey", "loop-service", f"--engine={engine}",
            f"--drain-grace={drain_grace:g}", f"--progress-every={progress_every:g}",
            f"--watched-by={os.getpid()}", f"--heartbeat={beat}",
        ]  # fmt: skip

    watchdog = Watchdog(
        command=command,
        heartbeat=state / "heartbeat.json",
        stale_after=stale_after,
        stop_wait=drain_grace + 30,
        can_run=_can_run(settings, engine),
    )
    stop = _stop_on_signals()
    print(
        f"vibey loop-service: engine {engine}, watchdog pid {os.getpid()}, a heartbeat older "
        f"than {stale_after:g} s restarts the service",
        flush=True,
    )
    health = None
    if settings.metrics.port is not None:  # /healthz: the pod's liveness and startup probes
        from actors.metrics import MetricsServer

        health = MetricsServer(
            port=settings.metrics.port, healthy=watchdog.healthy, ready=watchdog.ready
        ).start()
    try:
        code = watchdog.run(stop)
    finally:
        if health is not None:
            health.stop()
    return ExitCode.OK if code == 0 else ExitCode.FAILURE


def _can_run(settings: Settings, engine: str) -> Callable[[], bool]:
    """Whether the engine's binary is found on the PATH its runs get (the readiness probe)."""
    from actors.agents.roster import installed

    (spec,) = settings.roster([engine])
    return lambda: installed(spec, settings.agent_env)


def _serve(
    settings: Settings,
    spec: object,
    drain_grace: float,
    beat: Path | None,
    progress_every: float,
    *,
    metrics: bool,
) -> ExitCode:
    from actors.agents.roster import AgentSpec
    from actors.agents.service import build_service
    from actors.agents.watchdog import Heartbeat

    assert isinstance(spec, AgentSpec)
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
            heartbeat=Heartbeat(beat) if beat is not None else None,
            progress_every=progress_every,
        )
    except ValueError as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    stop = _stop_on_signals()
    print(
        f"vibey loop-service: engine {spec.id}, prefetch {spec.prefetch}, root {root}; "
        "SIGTERM or Ctrl-C drains it",
        flush=True,
    )
    health = None
    if metrics and settings.metrics.port is not None:
        from actors.metrics import MetricsServer

        can_run = _can_run(settings, spec.id)
        health = MetricsServer(
            port=settings.metrics.port, ready=lambda: service.ready.is_set() and can_run()
        ).start()
    try:
        service.run(stop)
    finally:
        if health is not None:
            health.stop()
    return ExitCode.OK
