"""Run by ``test_fleet_preload.py`` in a fresh interpreter: one worker process forked from a
forkserver preloaded as the supervisor preloads it (:data:`actors.fleet.PRELOAD`), which
starts its runtime, lets its threads make their first passes, and reports every module that
imported meanwhile. Prints them as one JSON list.

Usage: ``python -m tests.integration.fleet_probe PG_URL AMQP_URL PREFIX BACKEND``
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from typing import Any, Literal, cast

from actors.config import BusSettings, DatabaseSettings, QueueSettings, RabbitMqSettings
from actors.fleet import PRELOAD
from actors.worker import WorkerConfig

SETTLE_S = 1.5  # the reconciler (every second here), the relay and the events make a pass


def child(config: WorkerConfig, found: Any) -> None:
    from actors.drive import PostgresRuntime
    from actors.worker import Runtime

    before = set(sys.modules)
    runtime: Runtime | PostgresRuntime
    runtime = PostgresRuntime(config) if config.queue.backend == "postgres" else Runtime(config)
    runtime.start()
    time.sleep(SETTLE_S)
    imported = sorted(set(sys.modules) - before)
    runtime.stop(timeout=0)
    found.put(imported)


def main(pg_url: str, amqp_url: str, prefix: str, backend: str) -> None:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp_url, prefix=prefix),
        queue=QueueSettings(
            backend=cast(Literal["rabbitmq", "postgres"], backend),
            rabbitmq=RabbitMqSettings(reconcile_interval_seconds=1),
        ),
    )
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    found = context.Queue()
    process = context.Process(target=child, args=(config, found))
    process.start()
    print(json.dumps(found.get(timeout=60)))
    process.join(timeout=60)


if __name__ == "__main__":
    main(*sys.argv[1:5])
