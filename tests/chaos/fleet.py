"""What the chaos tests share: the seed they print and pass to their worker processes, and
the counts they check at the end."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from datetime import timedelta

import pika
from psycopg_pool import ConnectionPool

from tests.amqp_fixtures import Amqp
from tests.chaos.figures import figure


def chaos_seed(label: str, *, lease: timedelta | None = None) -> int:
    """``VIBEY_CHAOS_SEED`` or a fresh one, printed with how to rerun it; with ``lease``, the
    worker processes' chaos points are told it too (they read both from the environment)."""
    seed = int(os.environ.get("VIBEY_CHAOS_SEED") or random.SystemRandom().randrange(2**31))
    os.environ["VIBEY_CHAOS_SEED"] = str(seed)
    if lease is not None:
        os.environ["VIBEY_CHAOS_LEASE_S"] = str(lease.total_seconds())
    figure(f"\n{label} chaos seed: {seed} (rerun with VIBEY_CHAOS_SEED={seed})")
    return seed


def count(pool: ConnectionPool, query: str) -> int:
    with pool.connection() as conn:
        row = conn.execute(query.encode()).fetchone()
    return int(row[0]) if row else -1


def queue_depths(amqp: Amqp, queues: list[str]) -> dict[str, int]:
    connection = pika.BlockingConnection(pika.URLParameters(amqp.url))
    try:
        channel = connection.channel()
        return {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}
    finally:
        connection.close()


def await_progress(done: Callable[[], int], more: int, timeout_s: float) -> int:
    """Wait until ``done()`` grew by ``more`` (events, not a clock; ``timeout_s`` bounds it when
    nothing is left to do); returns the last count."""
    base = now = done()
    deadline = time.monotonic() + timeout_s
    while now < base + more and time.monotonic() < deadline:
        time.sleep(0.1)
        now = done()
    return now
