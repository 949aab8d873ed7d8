"""Handlers for the poison test (``tests/chaos/test_poison.py``), loaded by its worker processes.

A job whose payload says ``poison`` SIGKILLs its own worker process on every attempt, after
its claim committed (so each attempt is counted by PostgreSQL). Every other job works for
5-25 ms, a time derived from its id (the test seeds the ids), and succeeds.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time

from workflows.queue import Job
from workflows.steps import Handlers, Success

KIND = "design.interview"


def fraction(*parts: object) -> float:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / 2.0**53


def run(job: Job) -> Success:
    if job.payload.get("poison"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.005 + 0.02 * fraction("work", str(job.id)))
    return Success({"attempt": job.attempts})


HANDLERS: Handlers = {KIND: run}
