"""Handlers for the worker-drain test (``tests/integration/test_worker_drain.py``), loaded by
its worker processes. ``design.interview`` (the interactive lane) and ``build.implement`` (the
BUILD lane) alike append ``start <subject> <pid>`` to ``steps`` in the engines' workspace,
sleep the seconds their payload gives, then append ``end <subject> <pid>`` and succeed."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from workflows.queue import Job
from workflows.steps import Handlers, Success

INTERACTIVE, BUILD = "design.interview", "build.implement"


def handlers(context: Any) -> Handlers:
    log = Path(context.workspace) / "steps"

    def run(job: Job) -> Success:
        with log.open("a", encoding="utf-8") as out:
            out.write(f"start {job.subject} {os.getpid()}\n")
        time.sleep(float(job.payload.get("seconds", 0)))
        with log.open("a", encoding="utf-8") as out:
            out.write(f"end {job.subject} {os.getpid()}\n")
        return Success({"pid": os.getpid()})

    return {INTERACTIVE: run, BUILD: run}
