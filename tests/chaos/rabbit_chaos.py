"""Handlers and crash points for the RabbitMQ chaos twin, loaded by its worker processes.

Every decision comes from ``VIBEY_CHAOS_SEED`` and a key that changes on every retry (the
delivery count before a claim, the attempt after it), so a seed reproduces the decisions and
no job can be killed forever.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
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
    """Kills its process at a crash point, or stalls a step past its lease.

    A stalled step holds back its process's kills until its refused settle is recorded (its
    ``AFTER_SETTLE``): a sibling thread that draws a kill meanwhile waits, then kills. Killed
    at once, it took the stalled step down with the process (a busy sibling runs dozens of
    executions in a stall, one in five of them a kill), so that a fast fleet reached the fence
    with no settle at all (measured: 0 to 11 refused a run). Deferred, every kill still
    happens, and every stall that outlives its lease ends in a refused settle."""

    def __init__(self) -> None:
        self._stalled: set[tuple[str, int]] = set()
        self._settled = threading.Condition()

    def reached(self, point: CrashPoint, job_id: UUID, seq: int, count: int) -> None:
        if point is CrashPoint.AFTER_SETTLE:
            with self._settled:
                self._stalled.discard((str(job_id), count))
                self._settled.notify_all()
        if fraction("kill", point.value, str(job_id), seq, count) < KILL_RATE_PER_POINT:
            with self._settled:  # bounded: a stall whose settle raised never clears
                self._settled.wait_for(lambda: not self._stalled, timeout=LEASE_S + 10)
            os.kill(os.getpid(), signal.SIGKILL)
        if point is CrashPoint.AFTER_WORK and fraction("stall", str(job_id), count) < STALL_RATE:
            with self._settled:
                self._stalled.add((str(job_id), count))
            time.sleep(LEASE_S + 1.5)  # no heartbeat now: the settle must be refused


CRASH = Chaos()


def work(job: Job) -> Success:
    time.sleep(0.005 + 0.02 * fraction("work", str(job.id)))
    return Success({"attempt": job.attempts})


HANDLERS: Handlers = {"build.implement": work, "build.verify": work, "build.integrate": work}
