"""Raw Dramatiq for ``ops/bench/steps.py``: a plain RabbitmqBroker and one no-op actor.

The baseline the durable path is compared with: Dramatiq's own broker (classic queues, its
default middleware, no publisher confirms) on the same RabbitMQ. Loaded by the bench (to
enqueue) and by ``dramatiq raw_dramatiq -p 2 -t 8`` worker processes (``ops/bench`` on
``PYTHONPATH``), all configured by the environment, read once at import:

* ``VIBEY_BENCH_RAW_AMQP_URL``: the broker;
* ``VIBEY_BENCH_RAW_QUEUE``: the actor's queue (the bench picks a unique name and deletes the
  queue and its ``.DQ``/``.XQ`` siblings afterwards);
* ``VIBEY_BENCH_RAW_DIR`` (optional): each worker process writes ``<dir>/<pid>.json`` when it
  shuts down: messages processed, and ``time.time()`` when the first started and the last
  finished. The bench times the drain from these.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import Middleware

URL_ENV = "VIBEY_BENCH_RAW_AMQP_URL"
QUEUE_ENV = "VIBEY_BENCH_RAW_QUEUE"
DIR_ENV = "VIBEY_BENCH_RAW_DIR"

URL = os.environ.get(URL_ENV, "amqp://guest:guest@127.0.0.1:5672/")
QUEUE = os.environ.get(QUEUE_ENV, "vibey_bench_raw")
TALLY_DIR = os.environ.get(DIR_ENV)


class Tally(Middleware):
    """Counts processed messages; written once, at worker shutdown."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None
        self._lock = threading.Lock()

    def before_process_message(self, broker: Any, message: Any) -> None:
        if self.first is None:
            now = time.time()
            with self._lock:
                self.first = now if self.first is None else min(self.first, now)

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        now = time.time()
        with self._lock:
            self.count += 1
            self.last = now

    def after_worker_shutdown(self, broker: Any, worker: Any) -> None:
        path = os.path.join(self.directory, f"{os.getpid()}.json")
        with open(path, "w", encoding="utf-8") as out:
            json.dump({"count": self.count, "first": self.first, "last": self.last}, out)


broker = RabbitmqBroker(url=URL, confirm_delivery=False)
if TALLY_DIR:
    broker.add_middleware(Tally(TALLY_DIR))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)
def noop() -> None:
    """Does nothing: what is measured is Dramatiq and RabbitMQ."""
