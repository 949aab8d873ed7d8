"""Handlers and crash points for the in-place chaos test, loaded by its worker processes.

Three-step workflows (``tests.tiny_definition.ThreeSteps``) whose steps are short, so each
settle of ``a`` or ``b`` holds the next step for the worker to run in place. The crash point
SIGKILLs the process right after such a settle committed — mid-chain, the next step's pointer
held and not yet run — for a seeded fraction of them, and first writes the kill's time and the
job's id to the worker's ``tally_dir`` (one file per process), so the test can tell how long
the held pointer waited for a drain.
"""

from __future__ import annotations

import os
import signal
import time
from uuid import UUID

from actors.steps import CrashPoint
from actors.worker import WorkerConfig
from tests.chaos.rabbit_chaos import fraction
from tests.tiny_definition import THREE_STEP_HANDLERS, THREE_STEPS
from workflows.steps import Handlers, Short

KILL_RATE = 0.03

DEFINITIONS = THREE_STEPS
HANDLERS: Handlers = {kind: Short(handler) for kind, handler in THREE_STEP_HANDLERS.items()}


class MidChain:
    """Kills after a settle (a seeded fraction): after ``a``'s or ``b``'s, mid-chain; the test
    tells those apart by the job's dependents. Each kill is first written to
    ``<tally_dir>/kills-<pid>.log`` (job, time)."""

    def __init__(self, kills: str | None) -> None:
        self.kills = kills

    def reached(self, point: CrashPoint, job_id: UUID, seq: int, count: int) -> None:
        if point is not CrashPoint.AFTER_SETTLE:
            return
        if fraction("in-place", str(job_id), count) >= KILL_RATE:
            return
        if self.kills:
            with open(os.path.join(self.kills, f"kills-{os.getpid()}.log"), "a") as out:
                out.write(f"{job_id} {time.time():.6f}\n")
        os.kill(os.getpid(), signal.SIGKILL)


def CRASH(config: WorkerConfig) -> MidChain:
    """Called by each worker process with its config: its tally_dir is where kills go."""
    return MidChain(config.tally_dir)
