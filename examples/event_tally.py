"""An idempotent consumer of vibey's domain events: one tally row per event, exactly once.

::

    python -m examples.event_tally --pg postgresql://… --amqp amqp://… [--events gate] [--queue q]

It binds its queue to the ``vibey.events`` exchange (every event, or one type or family) and
writes one ``example_event_tally`` row per event through :class:`actors.event_consumer.
EventConsumer`: the row and the consumer's dedupe row commit in one transaction, so however
often RabbitMQ delivers an event (duplicates, redeliveries after a crash) it is tallied once.
The table has no unique key on purpose: the exactly-once is the helper's, not a constraint's.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from actors.event_consumer import EventConsumer
from store.db import Conn
from store.event_inbox import EventInbox
from store.pool import open_pool
from workflows.events import EXCHANGE, DomainEvent, binding_key

TABLE = """
CREATE TABLE IF NOT EXISTS example_event_tally (
    event_id uuid NOT NULL,
    project_id text NOT NULL,
    event_type text NOT NULL,
    tallied_at timestamptz NOT NULL DEFAULT now()
)
"""


def tally(conn: Conn, event: DomainEvent, *, pause: float = 0.0) -> None:
    conn.execute(
        "INSERT INTO example_event_tally (event_id, project_id, event_type) VALUES (%s, %s, %s)",
        (event.event_id, event.project_id, event.event_type.value),
    )
    if pause:  # the tests kill the consumer here, inside the transaction
        print(f"handling {event.event_id}", flush=True)
        time.sleep(pause)


def consumer(
    *,
    amqp_url: str,
    pool: Any,
    queue: str = "example.event_tally",
    events: str | None = None,
    exchange: str = EXCHANGE,
    pause: float = 0.0,
) -> EventConsumer:
    with pool.connection() as conn:
        conn.execute(TABLE)
    return EventConsumer(
        url=amqp_url,
        inbox=EventInbox(pool=pool, consumer=queue),
        queue=queue,
        bindings=[binding_key(event_type=events)],
        effect=lambda conn, event: tally(conn, event, pause=pause),
        exchange=exchange,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="event_tally", description=__doc__.splitlines()[0])
    parser.add_argument("--pg", required=True)
    parser.add_argument("--amqp", required=True)
    parser.add_argument("--queue", default="example.event_tally")
    parser.add_argument("--events", default=None, help="an event type or family (gate)")
    parser.add_argument("--exchange", default=EXCHANGE)
    parser.add_argument("--pause", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    pool = open_pool(args.pg, max_size=2, name="event-tally")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        tally_consumer = consumer(
            amqp_url=args.amqp,
            pool=pool,
            queue=args.queue,
            events=args.events,
            exchange=args.exchange,
            pause=args.pause,
        )
        print("ready", flush=True)
        tally_consumer.run(stop)
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
