"""Handlers and crash points for the RabbitMQ chaos twin, loaded by its worker processes.

Every decision comes from ``VIBEY_CHAOS_SEED`` and a key that changes on every retry (the
delivery count before a claim, the attempt after it), so a seed reproduces the decisions and
no job can be killed forever.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from uuid import UUID

from actors.steps import CrashPoint
from workflows.queue import Job
from workflows.steps import Handlers, Success

SEED = int(os.environ.get("VIBEY_CHAOS_SEED", "0"))
KILL_RATE_PER_POINT = 0.07  # three points: about 20% of executions die somewhere
STALL_RATE = 0.02
LEASE_S = float(os.environ.get("VIBEY_CHAOS_LEASE_S", "3"))


def fraction(*parts: object) -> float:
    digest = hashlib.sha256(repr((SEED, *parts)).encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / 2.0**53


class Chaos:
    def reached(self, point: CrashPoint, job_id: UUID, seq: int, count: int) -> None:
        if fraction("kill", point.value, str(job_id), seq, count) < KILL_RATE_PER_POINT:
            os.kill(os.getpid(), signal.SIGKILL)
        if point is CrashPoint.AFTER_WORK and fraction("stall", str(job_id), count) < STALL_RATE:
            time.sleep(LEASE_S + 1.5)  # no heartbeat now: the settle must be refused


CRASH = Chaos()


def work(job: Job) -> Success:
    time.sleep(0.005 + 0.02 * fraction("work", str(job.id)))
    return Success({"attempt": job.attempts})


HANDLERS: Handlers = {"build.implement": work, "build.verify": work, "build.integrate": work}
