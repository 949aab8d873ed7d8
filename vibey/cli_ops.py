"""Operations commands: ``vibey reconcile`` (the reconciler alone) and ``vibey queue stats``.

The ``actors`` modules (pika, Dramatiq) are imported by the commands that use them.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Annotated, Any

from cyclopts import Parameter

from store.pool import redact
from vibey.render import ExitCode
from vibey.settings import load_settings


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
        where = redact(config.pg_url if config.backend == "postgres" else config.amqp_url)
        print(
            f"vibey reconcile: every {config.reconcile_interval.total_seconds():g} s "
            f"({config.backend} backend, {where}); SIGTERM or Ctrl-C stops it",
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
